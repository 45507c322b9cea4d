"""A remote host's report, as the controller takes it: nothing on trust.

Whatever answers on a host (its agent, or something in its place) sends one
JSON object.  The controller keeps what it says about the host's settings,
but not what it says about itself:

- `host` is the inventory's name for the host, whatever the report claims;
- `ok`, `exit_code`, `changed` and `summary` are worked out again from the
  changes and the error kind, as the agent works them out (host/agent.py:
  report), so a host cannot report drift with exit code 0;
- every field a printer, the audit files or a rollout reads is checked for
  its type; a report that fails is a ProtocolError for that host, never a
  traceback in the controller, and never trusted in part.

Text stays as the host sent it (JSON output shows it exactly); printers
make control characters visible (host/text.py).
"""

from __future__ import annotations

import math

from nictune.host.agent import verdict
from nictune.host.errors import TransportError

# Fields only the controller sets (ssh.py, fleet.py).
_CONTROLLER_FIELDS = ("transport", "unreachable", "fabric")


class ProtocolError(TransportError):
    """The host answered, but not with a report nictune can read."""


def accept(report, label: str, command: str) -> dict:
    """The host's report, checked, with the fields the controller decides
    set by the controller.  Raises ProtocolError."""
    if not isinstance(report, dict):
        raise _bad(label, f"the report is a JSON {_kind(report)}, not an object")
    out = dict(report)
    for name in _CONTROLLER_FIELDS:
        out.pop(name, None)
    changes = _list_of(label, report.get("changes"), "changes", _dict)
    for i, change in enumerate(changes):
        _check_change(label, i, change)
    warnings = _list_of(label, report.get("warnings", []), "warnings", _str)
    error = report.get("error")
    if error is not None and not (isinstance(error, dict) and _str(error.get("kind"))
                                  and _str(error.get("message"))):
        raise _bad(label, "error is not {kind: text, message: text} or null")
    seconds = report.get("seconds", 0)
    if not _number(seconds):
        raise _bad(label, "seconds is not a number")
    for name, check in (("facts", _facts), ("profile", _dict), ("journal", _str), ("agent", _str),
                        ("rolled_back", _texts), ("history", _history), ("kept", _count)):
        if name in report and not check(report[name]):
            raise _bad(label, f"{name} is not of the type a report gives it")
    out.update(host=label, command=command, changes=changes, warnings=warnings, error=error,
               seconds=seconds, **verdict(command, [c["status"] for c in changes], error))
    return out


def _check_change(label: str, i: int, change: dict) -> None:
    key = change.get("key")
    where = f"changes[{i}]"
    if not (isinstance(key, dict) and all(_str(key.get(f)) for f in ("family", "target", "name"))):
        raise _bad(label, f"{where}.key is not {{family, target, name}} as text")
    if not (_str(change.get("status")) and change["status"]):
        raise _bad(label, f"{where}.status is not a status")
    if "before" not in change or "after" not in change:
        raise _bad(label, f"{where} has no before or after value")
    for name in ("source", "note", "disruptive"):
        if change.get(name) is not None and not _str(change[name]):
            raise _bad(label, f"{where}.{name} is not text")
    if change.get("bound") not in (None, "min", "max"):
        raise _bad(label, f"{where}.bound is not min, max or null")


def _list_of(label: str, value, name: str, check) -> list:
    if not isinstance(value, list) or not all(check(v) for v in value):
        raise _bad(label, f"{name} is not a list of what it holds")
    return value


def _facts(value) -> bool:
    return _dict(value) and all(_dict(v) for v in value.values())


def _texts(value) -> bool:
    return isinstance(value, list) and all(_str(v) for v in value)


def _history(value) -> bool:
    """An apply history (engine.history_entry): what the printer reads."""
    fields = ("id", "status", "summary")
    return isinstance(value, list) and all(
        _dict(e) and all(_str(e.get(f)) for f in fields)
        and all(e.get(f) is None or _str(e[f]) for f in ("started", "finished", "profile"))
        for e in value)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dict(value) -> bool:
    return isinstance(value, dict)


def _str(value) -> bool:
    return isinstance(value, str)


def _number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _kind(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _bad(label: str, what: str) -> ProtocolError:
    return ProtocolError(f"{label}: the agent's report cannot be used ({what}): is nictune's "
                         "agent what answers on this host?")
