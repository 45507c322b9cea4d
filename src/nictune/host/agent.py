"""The agent: one JSON request in, one JSON host report out.

The local CLI calls `run()` in-process; for a network namespace it runs
`python -m nictune.host.agent` under `ip netns exec`; over SSH the same module
runs from a zipapp.  One code path for every target.

Request (version 1), one line of JSON:
    {"nictune_request": 1, "command": "plan"|"apply"|"verify"|"rollback"|"history"|"show",
     "host": "label", "state_dir": "/var/lib/nictune",
     "profile": {"path": str, "doc": {...}, "sources": {"a/b": "file:line"}},
     "confirm": {"timeout": 30},            # remote applies only: nictune/host/transaction/watchdog.py
     "netns": "NAME",                       # set by `--netns`: the namespace the agent runs in
     "show_file_content": false,            # true: reports carry the text of files nictune did
                                            # not write (knobs/nccl.py), else a placeholder
     "rollback": {"to": "APPLY_ID"} | {"steps": N}}  # rollback only: how far back
                                            # (engine.Engine.rollback); without it, the last apply
A rollback report adds "rolled_back": the ids of the applies it restored,
newest first.  A history report adds "history": the user's applies the
state directory keeps, newest first (engine.history_entry), and "kept".
A verify may add "learn": true: the report then carries "questions", the
reads it made of the kernel, without their answers (host/replay/probe_reads.py), for
control/remote/probe.py to ask again later without starting the agent.
A request (either version) may add "record": true: the report then carries
"snapshot" (host/replay/snapshot.py, docs/reference/report-format.md): every read a show made
on the host, recorded while it ran (for a show, the same run; for any other
read-only command (plan, verify), its own reads and a show's after it).
`show --save` and `audit --save` ask for it.
Request version 2 (BASE_FORMAT) is version 1 plus, for "plan" only,
    "base": {"path": str, "doc": {...}, "sources": {...}}
the profile before a change (control/review/change.py): the host also plans it,
with the same engine, and the report adds "base": {"changes", "warnings",
"error"}.  Nothing is written for either.  An agent that knows only
version 1 refuses such a request rather than ignore "base".
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

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune import REQUEST_FORMAT, __version__
from nictune.host import errors
from nictune.host import model as m
from nictune.host.errors import EXIT_OK, EXIT_PENDING, InvalidInput, NictuneError, exit_code
from nictune.host.machine import Host
from nictune.host.transaction.journal import DEFAULT_STATE_DIR
from nictune.host.model import Outcome
from nictune.host.validate import APPLY_ID, NETNS, matches

COMMANDS = ("plan", "apply", "verify", "rollback", "history", "show")
NEEDS_PROFILE = ("plan", "apply", "verify")
BASE_FORMAT = 2  # a request that carries a base profile (control/review/change.py)


def _validated(request) -> dict:
    if not isinstance(request, dict) or request.get("nictune_request") not in (REQUEST_FORMAT,
                                                                             BASE_FORMAT):
        raise InvalidInput(f"not a nictune request (want nictune_request: {REQUEST_FORMAT} "
                           f"or {BASE_FORMAT})")
    if request.get("nictune_request") == BASE_FORMAT or "base" in request:
        base = request.get("base")
        if (request.get("nictune_request") != BASE_FORMAT or request.get("command") != "plan"
                or not isinstance(base, dict) or not isinstance(base.get("doc"), dict)):
            raise InvalidInput(f"a base profile goes with command plan and nictune_request: "
                               f"{BASE_FORMAT}, as {{path, doc, sources}}")
    if request.get("command") not in COMMANDS:
        raise InvalidInput(f"unknown command {request.get('command')!r}")
    if request["command"] in NEEDS_PROFILE:
        profile = request.get("profile")
        if not isinstance(profile, dict) or not isinstance(profile.get("doc"), dict):
            raise InvalidInput("the request carries no profile document")
    if request.get("netns") is not None:
        _check_netns(request["netns"])
    if not isinstance(request.get("show_file_content", False), bool):
        raise InvalidInput("show_file_content must be true or false")
    if not isinstance(request.get("record", False), bool):
        raise InvalidInput("record must be true or false")
    if request.get("record") and request["command"] not in ("show", "plan", "verify"):
        raise InvalidInput("record goes with show, plan or verify: the commands that only read")
    wait = request.get("lldp_wait", 0)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 120:
        raise InvalidInput(f"lldp_wait is seconds, 0 to 120, got {str(wait)[:40]!r}")
    if request.get("learn", False) not in (True, False) or (request.get("learn") and (
            request["command"] != "verify" or request.get("record"))):
        raise InvalidInput("learn is true or false, and goes with verify alone")
    if "rollback" in request:
        _check_how_far(request)
    return request


# The most applies one rollback may walk back through: more than the
# history keeps (journal.HISTORY_KEPT) is refused there, by name.
MAX_STEPS = 1000


def _check_how_far(request: dict) -> None:
    how = request["rollback"]
    if request["command"] != "rollback" or not isinstance(how, dict) or len(how) != 1:
        raise InvalidInput("rollback goes with command rollback, as {to: APPLY_ID} or {steps: N}")
    to, steps = how.get("to"), how.get("steps")
    if "to" in how and not matches(APPLY_ID, to):
        raise InvalidInput(f"rollback to: {str(to)[:70]!r} is not an apply id (`nictune history` "
                           "lists them)")
    if "steps" in how and not (isinstance(steps, int) and not isinstance(steps, bool)
                               and 1 <= steps <= MAX_STEPS):
        raise InvalidInput(f"rollback steps: {str(steps)[:20]!r} is not a whole number from 1 to "
                           f"{MAX_STEPS}")
    if "to" not in how and "steps" not in how:
        raise InvalidInput("rollback goes with command rollback, as {to: APPLY_ID} or {steps: N}")


def _check_netns(name) -> None:
    """A request's namespace must be the one the agent runs in: files under
    /etc are then that namespace's own (knobs/nccl.py)."""
    if not matches(NETNS, name):
        raise InvalidInput(f"invalid network namespace name {name!r}")
    try:
        here, named = os.stat("/proc/self/ns/net"), os.stat(f"/run/netns/{name}")
    except OSError as e:
        raise InvalidInput(f"cannot tell whether the agent runs in network namespace {name!r}: "
                           f"{e.strerror}") from None
    if (here.st_dev, here.st_ino) != (named.st_dev, named.st_ino):
        raise InvalidInput(f"the request is for network namespace {name!r}, "
                           "but the agent does not run in it")


def execute(request: dict, host: Host, confirm: Optional[dict] = None) -> Outcome:
    """Run one validated request against `host`; with "record", add the
    snapshot of the host (host/replay/snapshot.py)."""
    if request.get("learn"):
        from nictune.host.replay import probe_reads

        outcome, questions = probe_reads.learn(host, lambda: _execute(request, host, confirm))
        outcome.extra["questions"] = questions
        return outcome
    if not request.get("record"):
        return _execute(request, host, confirm)
    from datetime import datetime, timezone

    from nictune.host.replay import snapshot
    from nictune.host.transaction.engine import Engine

    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if request["command"] == "show":
        outcome, reads = snapshot.record(host, lambda: _execute(request, host, confirm), when)
    else:
        # The command's own reads (what its profile names: an owned file's
        # own path, a counter) and a show's (every family, every interface).
        engine = Engine(host, request.get("state_dir") or DEFAULT_STATE_DIR)
        outcome, reads = snapshot.record(
            host, lambda: _then(_execute(request, host, confirm), engine.show), when)
    outcome.extra["snapshot"] = snapshot.snapshot_document(reads, __version__)
    return outcome


def _then(outcome: Outcome, also) -> Outcome:
    also()
    return outcome


def _execute(request: dict, host: Host, confirm: Optional[dict] = None) -> Outcome:
    from nictune.host.transaction.engine import Engine

    host.netns = request.get("netns")
    host.state_dir = request.get("state_dir") or DEFAULT_STATE_DIR
    host.lldp_wait = request.get("lldp_wait") or 0
    engine = Engine(host, host.state_dir)
    engine.journal.confirm = confirm
    command = request["command"]
    if command == "rollback":
        how = request.get("rollback") or {}
        return _tidied(host, engine.rollback(to=how.get("to"), steps=how.get("steps")))
    if command == "history":
        return engine.history()
    if command == "show":
        return engine.show()
    profile = request["profile"]
    doc, sources = profile["doc"], profile.get("sources") or {}
    if command == "apply":
        return _tidied(host, engine.apply(doc, sources, profile.get("path")))
    base = _base_plan(engine, request.get("base"))
    if base is None:
        return engine.plan(doc, sources, command)
    try:
        outcome = engine.plan(doc, sources, command)
    except NictuneError as e:  # the base's plan still goes back: the drift is from it
        outcome = Outcome(command, error=e.as_dict())
    outcome.extra["base"] = base
    return outcome


def _base_plan(engine, base: Optional[dict]) -> Optional[dict]:
    """The plan of the base profile (a change's "before"), read through the
    same engine as the profile's own; its failure is the base's, not the
    request's."""
    if base is None:
        return None
    try:
        out = engine.plan(base["doc"], base.get("sources") or {}, "plan")
    except NictuneError as e:
        out = Outcome("plan", error=e.as_dict())
    return {"changes": [c.as_dict() for c in out.changes], "warnings": out.warnings,
            "error": out.error}


def _tidied(host: Host, outcome: Outcome) -> Outcome:
    """After every apply and rollback, even one with nothing to write: the
    temporary files an interrupted write left beside a file nictune owns
    go (knobs/envfile.py: NCCL's, UCX's, Open MPI's, NVSHMEM's), and the
    report says so."""
    from nictune.host import knobs

    changed = {c.key.family for c in outcome.changes}
    for name in knobs.CATALOG:  # REGISTERED order, importing only the families at hand
        family = knobs.load(name) if name in changed else None
        if family is not None and hasattr(family, "tidy"):  # an OwnedFileFamily
            keys = [c.key for c in outcome.changes if c.key.family == name]
            outcome.warnings.extend(family(host).tidy(keys))
    return outcome


def _hide_host_only(changes: list) -> None:
    """Values that stay on the host (Family.shown) become their placeholders,
    here on the host, so that they never travel in a report."""
    from nictune.host.knobs import family_named

    for c in changes:
        family = family_named(c["key"]["family"])
        if family is not None:
            c["before"], c["after"] = family.shown(c["before"]), family.shown(c["after"])


def verdict(command: str, statuses: list, error: Optional[dict]) -> dict:
    """ok, exit_code, changed and summary of a report, from its changes'
    statuses and its error: the agent's own, and the controller's check of
    what a host sent (control/remote/hostreport.py), which trusts no host's sum."""
    counts: dict = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    code = exit_code(error["kind"] if error else None)
    # A key stored for a reset is pending for plan and verify; an apply did
    # all it can do for it (the reset is a hook's: docs/howto/firmware-config.md).
    waiting = counts.get(m.STAGED) and command != "apply"
    if code == EXIT_OK and (counts.get(m.PENDING) or counts.get(m.DRIFT)
                                or counts.get(m.SWITCH_MISMATCH) or waiting):
        code = EXIT_PENDING
    changed = bool(counts.get(m.APPLIED) or counts.get(m.REVERTED)
                   or command == "rollback" and statuses)
    return {"ok": error is None, "exit_code": code, "changed": changed, "summary": counts}


def report(outcome: Outcome, host_label: str, started: float, show_content: bool = False) -> dict:
    """A host report: the unit every command and every fleet run returns.
    show_content: the request asked for the text of files nictune did not write."""
    changes = [c.as_dict() for c in outcome.changes]
    if not show_content:
        _hide_host_only(changes)
        _hide_host_only((outcome.extra.get("base") or {}).get("changes") or [])
    out = {
        "host": host_label,
        "command": outcome.command,
        **verdict(outcome.command, [c.status for c in outcome.changes], outcome.error),
        "changes": changes,
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
    show_content = isinstance(request, dict) and request.get("show_file_content") is True
    return report(outcome, label, started, show_content)


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
    from nictune.host.transaction.journal import Journal

    journal = Journal(state_dir)
    try:
        record = journal.load() or {}
        if (record.get("confirm") or {}).get("token") != token:
            return ""  # nothing was applied, nothing to confirm
        ready, _, _ = select.select([sys.stdin.buffer], [], [], timeout)
        if not ready or sys.stdin.buffer.readline().strip() != b"confirm":
            return ""  # the watchdog rolls it back when the time is up
        return journal.confirm_apply(token)
    except NictuneError:
        # A journal that cannot be read or written cannot say "confirmed":
        # the watchdog rolls the apply back from what it read.
        return ""


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
            from nictune.host.transaction import watchdog

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
