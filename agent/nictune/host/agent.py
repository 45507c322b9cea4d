"""The agent: one JSON request in, one JSON host report out.

The local CLI calls `run()` in-process; for a network namespace it runs
`python -m nictune.host.agent` under `ip netns exec`; over SSH the same module
runs from a zipapp.  One code path for every target.

Request (version 1), one line of JSON:
    {"nictune_request": 1, "command": "plan"|"apply"|"verify"|"rollback"|"show",
     "host": "label", "state_dir": "/var/lib/nictune",
     "profile": {"path": str, "doc": {...}, "sources": {"a/b": "file:line"}},
     "confirm": {"timeout": 30}}            # remote applies only: nictune/host/watchdog.py
The report is one line of JSON.  After a confirmed apply that changed
something, the agent waits for the line "confirm" and answers
{"nictune_confirm": "confirmed"|"expired"|""}.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import Optional

from nictune import REQUEST_FORMAT, __version__
from nictune.host import errors
from nictune.host import model as m
from nictune.host.errors import EXIT_OK, EXIT_PENDING, InvalidInput, NictuneError, exit_code
from nictune.host.machine import Host
from nictune.host.journal import DEFAULT_STATE_DIR
from nictune.host.model import Outcome

COMMANDS = ("plan", "apply", "verify", "rollback", "show")
NEEDS_PROFILE = ("plan", "apply", "verify")


def _validated(request) -> dict:
    if not isinstance(request, dict) or request.get("nictune_request") != REQUEST_FORMAT:
        raise InvalidInput(f"not a nictune request (want nictune_request: {REQUEST_FORMAT})")
    if request.get("command") not in COMMANDS:
        raise InvalidInput(f"unknown command {request.get('command')!r}")
    if request["command"] in NEEDS_PROFILE:
        profile = request.get("profile")
        if not isinstance(profile, dict) or not isinstance(profile.get("doc"), dict):
            raise InvalidInput("the request carries no profile document")
    return request


def execute(request: dict, host: Host, confirm: Optional[dict] = None) -> Outcome:
    """Run one validated request against `host`."""
    from nictune.host.engine import Engine

    engine = Engine(host, request.get("state_dir") or DEFAULT_STATE_DIR)
    engine.journal.confirm = confirm
    command = request["command"]
    if command == "rollback":
        return engine.rollback()
    if command == "show":
        return engine.show()
    profile = request["profile"]
    doc, sources = profile["doc"], profile.get("sources") or {}
    if command == "apply":
        return engine.apply(doc, sources, profile.get("path"))
    return engine.plan(doc, sources, command)


def report(outcome: Outcome, host_label: str, started: float) -> dict:
    """A host report: the unit every command and every fleet run returns."""
    counts: dict = {}
    for c in outcome.changes:
        counts[c.status] = counts.get(c.status, 0) + 1
    kind = outcome.error["kind"] if outcome.error else None
    code = exit_code(kind)
    if code == EXIT_OK and (counts.get(m.PENDING) or counts.get(m.DRIFT)):
        code = EXIT_PENDING
    out = {
        "host": host_label,
        "command": outcome.command,
        "ok": outcome.error is None,
        "exit_code": code,
        "changed": bool(counts.get(m.APPLIED) or counts.get(m.REVERTED) or
                        outcome.command == "rollback" and outcome.changes),
        "summary": counts,
        "changes": [c.as_dict() for c in outcome.changes],
        "warnings": outcome.warnings,
        "error": outcome.error,
        "seconds": round(time.monotonic() - started, 4),
    }
    if outcome.facts:
        out["facts"] = outcome.facts
    out.update(outcome.extra)
    return out


def run(request, host: Host | None = None, label: str | None = None,
        confirm: Optional[dict] = None) -> dict:
    """Never raises for expected failures: they become the report's error."""
    started = time.monotonic()
    label = label or (request.get("host") if isinstance(request, dict) else None) or "local"
    command = request.get("command", "?") if isinstance(request, dict) else "?"
    own_host = host is None
    host = host or Host()
    try:
        outcome = execute(_validated(request), host, confirm)
    except NictuneError as e:
        outcome = Outcome(command, error=e.as_dict())
    except Exception as e:  # noqa: BLE001 - a report, never a traceback, on the wire
        outcome = Outcome(command, error=_unexpected(e))
    finally:
        if own_host:
            host.close()
    return report(outcome, label, started)


def _unexpected(e: Exception) -> dict:
    """The report error for an exception that is not a NictuneError."""
    if isinstance(e, OSError):  # the host refused or failed us
        return errors.error(errors.SYSTEM, str(e))
    if isinstance(e, ValueError):  # a malformed value in a hand-written request
        return errors.error(errors.INVALID_INPUT, str(e))
    if os.environ.get("NICTUNE_DEBUG") == "1":
        raise e
    return errors.error(errors.SYSTEM, f"internal error: {type(e).__name__}: {e}")


def _confirm_timeout(request) -> Optional[float]:
    if not isinstance(request, dict) or request.get("command") != "apply":
        return None
    timeout = (request.get("confirm") or {}).get("timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout <= 3600:
        return float(timeout)
    return None


def _read_request():
    stdin = sys.stdin.buffer
    line = stdin.readline()
    try:
        return json.loads(line)
    except ValueError:
        return json.loads(line + stdin.read())  # a hand-written, multi-line request


def _await_confirmation(state_dir: str, token: str, timeout: float) -> str:
    from nictune.host.journal import Journal

    journal = Journal(state_dir)
    record = journal.load() or {}
    if (record.get("confirm") or {}).get("token") != token:
        return ""  # nothing was applied, nothing to confirm
    ready, _, _ = select.select([sys.stdin.buffer], [], [], timeout)
    if not ready or sys.stdin.buffer.readline().strip() != b"confirm":
        return ""  # the watchdog rolls it back when the time is up
    return journal.confirm_apply(token)


def main() -> int:
    try:
        request = _read_request()
    except ValueError as e:
        request = None
        result = report(Outcome("?", error=errors.error(errors.INVALID_INPUT,
                                                         f"request is not JSON: {e}")),
                        "local", time.monotonic())
    else:
        timeout = _confirm_timeout(request)
        armed = None
        if timeout:
            from nictune.host import watchdog

            state_dir = request.get("state_dir") or DEFAULT_STATE_DIR
            token, keep = watchdog.arm(state_dir, timeout)
            armed = (state_dir, token, keep)
            result = run(request, confirm={"token": token, "timeout": timeout})
        else:
            result = run(request)
    result["agent"] = __version__
    # One write: json.dump streams in small chunks, thousands of writes
    # when stdout is unbuffered.
    try:
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        if armed and result["ok"] and result["changed"]:
            state = _await_confirmation(armed[0], armed[1], timeout)
            sys.stdout.write(json.dumps({"nictune_confirm": state}) + "\n")
            sys.stdout.flush()
    except BrokenPipeError:
        pass  # the session is gone: the watchdog decides
    return 0


if __name__ == "__main__":
    sys.exit(main())
