"""Drain hooks: commands a play runs on the controller around each batch.

    hooks:
      before_batch: [kubectl, drain, "{host}", --ignore-daemonsets]
      after_batch: [kubectl, uncordon, "{host}"]
      cleanup: [scontrol, delete, "reservationname=nictune-{rollout}-{batch}"]
      timeout: 600        # seconds per command; default 300, at most 86400

A hook is an argv list, never a shell string: nictune runs no shell, so a
host name can never become shell syntax (write [sh, -c, "..."] to ask for
one).  Placeholders: `{host}` runs the command once per host of the batch,
in batch order; `{hosts}` once with the batch's names joined by ","; with
neither, once per batch; `{batch}` is the batch number; `{rollout}` names
this rollout (a UTC time and a random suffix, the same in every batch),
so that `nictune-{rollout}-{batch}` names a Slurm reservation no other
batch or rollout uses.  `{{` and `}}` are literal braces.  Both {host} and {hosts} in one command, or any other
`{...}`, is refused when the playbook loads.  Inventories refuse host
names that start with "-" or hold ",", blanks or control characters
(inventory/hostnames.py); here again, before anything runs, a batch with
such a name is refused, and so is an argument that a placeholder would
turn into an option ("{host}" filled with "-o..."): the hook fails with
the reason and nothing of it runs.

after_batch runs once before_batch has succeeded, after the gates and any
rollback, and stops at its first failing command.  cleanup runs after
every batch that started, whatever happened to it: a before_batch that
failed half-way (a reservation created, then a wait that timed out), a
failed after_batch, even an exception or Ctrl-C in the middle of the
batch; each of its commands runs even when the one before it failed.
Undo there what before_batch sets up (delete the reservation), and write
it so that it also works when that was never set up.  A relative program path with
a "/" (scripts/drain.sh) is relative to the playbook's directory, like its
profile paths; a bare name is looked up in PATH.

Each command runs with stdin /dev/null, in a process group of its own that
is killed whole (SIGTERM, then SIGKILL) when its timeout ends, so a hook
cannot leave a `kubectl drain` running behind a rollout that moved on.  Its
environment adds NICTUNE_HOOK (before_batch/after_batch/cleanup), NICTUNE_BATCH,
NICTUNE_ROLLOUT, NICTUNE_HOSTS (the batch's names, ",") and, per host, NICTUNE_HOST;
after_batch and cleanup also NICTUNE_STOP (why the batch stopped, or "") and, per host,
NICTUNE_OUTCOME (kept, rolled-back, rollback-failed, ...); after_batch, per host,
NICTUNE_RESET: the reset that host's stored firmware configuration waits for (reboot,
fw_activate, driver_reinit) or "" (docs/howto/firmware-config.md).  Only
the tail of its output (stdout and stderr together) is kept, control
characters escaped (host/text.py), for the rollout report.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from nictune.control.outcome import Outcome
from nictune.host.errors import HOOK_FAILED
from nictune.host.text import printable
from nictune.inventory.hostnames import host_name_problem
from nictune.profile.check import locate
from nictune.profile.errors import ProfileError, dotted, show
from nictune.profile.schema import register_words
from nictune.profile.yamlpos import Parsed

WHEN = ("before_batch", "after_batch", "cleanup")
DEFAULT_TIMEOUT = 300
MAX_TIMEOUT = 86400
MAX_COMMANDS = 32
TAIL_BYTES = 4096          # of each command's output, kept for the report
KILL_GRACE = 5.0           # seconds between SIGTERM and SIGKILL of a timed-out group

ARG_TEXT = r"^[^\x00]*$"
register_words({ARG_TEXT: "text of up to 4096 characters without NUL"})

_ARGV = {"type": "array", "items": {"type": "string", "pattern": ARG_TEXT, "maxLength": 4096},
         "minItems": 1, "maxItems": 256}
_COMMANDS = {"anyOf": [_ARGV, {"type": "array", "items": _ARGV, "minItems": 1, "maxItems": MAX_COMMANDS}]}
HOOKS_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "description": "Commands run on the controller around each batch (control/rollout/hooks.py): argv lists, never a "
                   "shell string. {host}: once per host of the batch, in order; {hosts}: once, the batch's "
                   "names joined by ','; neither: once per batch; {batch}: the batch number; {rollout}: this "
                   "rollout's name; {{ and }}: literal braces. A failing before_batch stops the rollout "
                   "before the batch is written; after_batch runs whenever before_batch succeeded, also "
                   "after a rollback; cleanup runs after every batch that started, whatever happened.",
    "properties": {
        "before_batch": {**_COMMANDS, "description": "A command (argv list) or a list of them, run in order "
                                                     "before the batch is applied, e.g. a drain."},
        "after_batch": {**_COMMANDS, "description": "A command (argv list) or a list of them, run in order "
                                                    "after the batch's gates (and rollback), e.g. a resume."},
        "cleanup": {**_COMMANDS, "description": "A command (argv list) or a list of them, run after every "
                                                "batch that started, even when before_batch failed half-way "
                                                "or the batch broke off; every command runs even if one "
                                                "before it fails, e.g. deleting a reservation."},
        "timeout": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT,
                    "description": f"Seconds each command may take; its whole process group is killed after. "
                                   f"Default {DEFAULT_TIMEOUT}."},
    },
    "additionalProperties": False,
}

# {{, }}, a {name}, or a brace standing alone (an error).
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
PLACEHOLDERS = ("host", "hosts", "batch", "rollout")


@dataclass(frozen=True)
class Hook:
    """One command of a hook, as written, with where it was written."""

    when: str                     # before_batch or after_batch
    argv: Tuple[str, ...]
    where: str                    # "file:line"
    per_host: bool                # it has {host}: one run per host of the batch


@dataclass(frozen=True)
class Hooks:
    before_batch: Tuple[Hook, ...] = ()
    after_batch: Tuple[Hook, ...] = ()
    cleanup: Tuple[Hook, ...] = ()
    timeout: int = DEFAULT_TIMEOUT
    where: str = ""               # "file:line" of the hooks: key


# -- loading -------------------------------------------------------------------

def shell_strings(parsed: Parsed, index: int) -> None:
    """Refuse a hook written as a shell string, before the schema says only
    "expected a list": the fix is to split it, and nictune runs no shell."""
    hooks = parsed.doc[index].get("hooks") if isinstance(parsed.doc[index], dict) else None
    if not isinstance(hooks, dict):
        return
    for when in WHEN:
        value = hooks.get(when)
        if isinstance(value, str):
            strings = [((), value)]
        elif isinstance(value, list) and any(isinstance(v, list) for v in value):
            strings = [((i,), v) for i, v in enumerate(value) if isinstance(v, str)]  # in a list of argvs
        else:
            strings = []  # an argv, or what the schema will explain
        for sub, text in strings:
            path = (index, "hooks", when) + sub
            raise ProfileError(*locate(parsed.positions, path), dotted(path),
                               f"{show(text)} is a shell string; a hook is an argv list, run without a "
                               f"shell, e.g. [kubectl, cordon, \"{{host}}\"] "
                               f"(for shell syntax write [sh, -c, \"...\"] and quote with care)")


def load_hooks(parsed: Parsed, index: int, base_dir: str = "") -> Optional[Hooks]:
    """The play's hooks: (checked by the playbook schema), placeholders
    checked; a relative program path with a "/" (scripts/drain.sh) is
    relative to the playbook's directory, as its profile paths are, not to
    wherever nictune was started.  A bare name is looked up in PATH."""
    raw = parsed.doc[index].get("hooks")
    if raw is None:
        return None
    file, line = locate(parsed.positions, (index, "hooks"))
    found: Dict[str, Tuple[Hook, ...]] = {}
    for when in WHEN:
        value = raw.get(when)
        if value is None:
            found[when] = ()
            continue
        listed = [((), value)] if isinstance(value[0], str) else [((i,), v) for i, v in enumerate(value)]
        found[when] = tuple(_hook(parsed, (index, "hooks", when) + sub, when, argv, base_dir)
                            for sub, argv in listed)
    return Hooks(found["before_batch"], found["after_batch"], found["cleanup"],
                 raw.get("timeout", DEFAULT_TIMEOUT), f"{file}:{line}")


def _hook(parsed: Parsed, path: tuple, when: str, argv: List[str], base_dir: str) -> Hook:
    seen = set()
    for i, arg in enumerate(argv):
        at = path + (i,)
        try:
            names = _names(arg)
        except ValueError as e:
            raise ProfileError(*locate(parsed.positions, at), dotted(at), str(e)) from None
        seen.update(names)
    if not argv[0]:
        raise ProfileError(*locate(parsed.positions, path + (0,)), dotted(path + (0,)),
                           "the program to run must not be empty")
    if "/" not in argv[0] and any(c.isspace() for c in argv[0]):
        # [kubectl cordon {host}]: one word with spaces is a shell string in a list.
        raise ProfileError(*locate(parsed.positions, path + (0,)), dotted(path + (0,)),
                           f"{show(argv[0])} is not a program name (it has a space): a hook is an argv "
                           f"list, one item per word, e.g. [kubectl, cordon, \"{{host}}\"]")
    if "host" in seen and "hosts" in seen:
        raise ProfileError(*locate(parsed.positions, path), dotted(path),
                           "uses both {host} and {hosts}: {host} runs the command once per host, {hosts} once "
                           "for the whole batch; choose one, or write two commands")
    program = argv[0]
    if "/" in program and not os.path.isabs(program) and "{" not in program:
        program = os.path.normpath(os.path.join(base_dir, program))
    file, line = locate(parsed.positions, path)
    return Hook(when, (program, *argv[1:]), f"{file}:{line}", "host" in seen)


def _names(arg: str) -> List[str]:
    """The placeholders in one argument; ValueError for an unknown one."""
    names = []
    for m in _TOKEN.finditer(arg):
        if m.group() in ("{{", "}}"):
            continue
        if m.group(1) is None:
            raise ValueError(f"{show(arg)} has a lone {m.group()!r}; write {m.group() * 2} for a literal brace")
        if m.group(1) not in PLACEHOLDERS:
            raise ValueError(f"{show(arg)} has the unknown placeholder {{{printable(m.group(1))[:40]}}}; the "
                             f"placeholders are {{host}}, {{hosts}}, {{batch}} and {{rollout}} (write {{{{ and }}}} for "
                             f"literal braces)")
        names.append(m.group(1))
    return names


# -- running -------------------------------------------------------------------

def commands(hook: Hook, number: int, names: Sequence[str],
             rollout: str = "") -> List[Tuple[List[str], Optional[str]]]:
    """The argv lists the hook runs for a batch, each with its host (per-host
    hooks) or None, in batch order.  ValueError, saying why, for a host name
    that could become an option or several hosts, or an argument a
    placeholder turns into an option."""
    for name in names:
        problem = host_name_problem(name)
        if problem:
            raise ValueError(problem)
    joined = ",".join(names)
    targets: List[Optional[str]] = list(names) if hook.per_host else [None]
    return [([filled_argument(arg, _fill(arg, host or "", joined, number, rollout)) for arg in hook.argv], host)
            for host in targets]


def filled_argument(written: str, filled: str) -> str:
    """filled, unless a placeholder made it an option: an argument written
    "{host}" must stay an operand whatever the value ("-oProxyCommand=...")."""
    if filled.startswith("-") and not written.startswith("-"):
        raise ValueError(f"{printable(repr(written))[:80]} would become the option {printable(repr(filled))[:80]}")
    return filled


def _fill(arg: str, host: str, hosts: str, number: int, rollout: str) -> str:
    values = {"host": host, "hosts": hosts, "batch": str(number), "rollout": rollout}
    return _TOKEN.sub(lambda m: {"{{": "{", "}}": "}"}.get(m.group()) or values[m.group(1)], arg)


def run_hooks(hooks: Optional[Hooks], when: str, number: int, names: Sequence[str],
              stop: str = "", outcomes: Optional[Dict[str, str]] = None,
              rollout: str = "", resets: Optional[Dict[str, str]] = None
              ) -> Tuple[List[dict], Optional[dict]]:
    """Run the batch's `when` hooks in order, up to the first that fails
    (cleanup: every one, whatever failed before it).  Returns every result,
    and the first failed one (or None).  after_batch and cleanup hooks
    also learn how the batch ended: NICTUNE_STOP (the stop's kind, "" when
    the batch passed) and, per host, NICTUNE_OUTCOME (kept, unchanged,
    failed, rolled-back, rollback-failed, not-started), so a resume can
    leave alone a node a human must look at.  after_batch also gets, per
    host, NICTUNE_RESET: the reset a kept host's firmware configuration
    waits for (reboot, fw_activate, driver_reinit), or "" (playbook.py
    reset_due): nictune never resets a host itself, the hook does."""
    results: List[dict] = []
    if hooks is None:
        return results, None
    keep_going = when == "cleanup"
    env = {"NICTUNE_HOOK": when, "NICTUNE_BATCH": str(number), "NICTUNE_HOSTS": ",".join(names)}
    if rollout:
        env["NICTUNE_ROLLOUT"] = rollout
    if outcomes is not None:
        env["NICTUNE_STOP"] = stop
    first_failed: Optional[dict] = None
    for hook in getattr(hooks, when):
        try:
            argvs = commands(hook, number, names, rollout)
        except ValueError as e:
            argvs, result = [], _refused(hook, str(e))
            results.append(result)
            first_failed = first_failed or result
        for argv, host in argvs:
            extra = env if host is None else dict(env, NICTUNE_HOST=host, **(
                {"NICTUNE_OUTCOME": outcomes.get(host, "")} if outcomes is not None else {}), **(
                {"NICTUNE_RESET": resets.get(host, "")} if resets is not None else {}))
            result = run_command(argv, extra, hooks.timeout)
            result.update(hook=when, source=hook.where, **({"host": host} if host is not None else {}))
            results.append(result)
            if not result["ok"]:
                first_failed = first_failed or result
                if not keep_going:
                    return results, first_failed
        if first_failed is not None and not keep_going:
            return results, first_failed
    return results, first_failed


def _refused(hook: Hook, why: str) -> dict:
    """The result of a hook nictune would not run: as written, and why."""
    return {"argv": list(hook.argv), "exit_code": None, "seconds": 0.0, "output": "",
            **Outcome.failed(HOOK_FAILED, f"was not run: {why}").fields(),
            "hook": hook.when, "source": hook.where}


def run_command(argv: List[str], env: Dict[str, str], timeout: float) -> dict:
    """Run argv without a shell; the result dict of the rollout report:
    argv, exit_code, seconds, output, and an Outcome's fields (control/outcome.py)."""
    start = time.monotonic()
    result: Dict[str, Any] = {"argv": list(argv), "exit_code": None, "seconds": 0.0, "output": ""}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env})
    except (OSError, ValueError) as e:
        why = f"cannot start {printable(argv[0])}: {printable(getattr(e, 'strerror', None) or e)}"
        return {**result, **Outcome.failed(HOOK_FAILED, why).fields()}
    tail = _Tail(proc.stdout)
    why: Optional[str] = None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        why = f"timed out after {timeout:g} s; its process group was killed"
    except BaseException:
        # Ctrl-C: the hook's session of its own never saw the terminal's SIGINT.
        _kill_group(proc)
        raise
    finally:
        # The hook's own exit ends the wait; a child it left holding the
        # output open must not hold the rollout too.
        tail.thread.join(timeout=2.0)
        if not tail.thread.is_alive():
            proc.stdout.close()
    result["seconds"] = round(time.monotonic() - start, 3)
    result["output"] = tail.text()
    if why is None:
        result["exit_code"] = proc.returncode
        if proc.returncode != 0:
            why = (f"exited with {proc.returncode}" if proc.returncode > 0 else
                   f"killed by signal {-proc.returncode}")
    return {**result, **(Outcome(True) if why is None else Outcome.failed(HOOK_FAILED, why)).fields()}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the hook's whole process group, SIGKILL after a grace."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        if wait is None:
            proc.wait()
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; children that ignored SIGTERM may not be.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


class _Tail:
    """Reads a pipe to its end in a thread, keeping only the last TAIL_BYTES."""

    def __init__(self, pipe: Any):
        self.data = bytearray()
        self.pipe = pipe
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        fd = self.pipe.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self.data += chunk
            del self.data[:-TAIL_BYTES]

    def text(self) -> str:
        data = bytes(self.data)
        text = data.decode("utf-8", "replace")
        return "\n".join(printable(line) for line in text.split("\n"))
