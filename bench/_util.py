"""What the benches share: running commands, medians and text tables.

The benches run as scripts (`python bench/bench_x.py`), so this module is
found next to them and imported as `_util`.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from typing import Callable, Optional


class BenchError(RuntimeError):
    pass


def stop_group(proc: subprocess.Popen) -> None:
    """SIGINT, then SIGKILL, to proc's process group, until it is empty."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, else the group never looks empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


class Commands:
    """Runs a bench's commands, each in a process group of its own, with the
    bench's environment.  On an interrupt (Ctrl-C, SIGTERM, a timeout)
    stop(proc) runs before the exception goes on, so that the bench can
    remove what the command's tree still uses (namespaces, fleets).

    merge_stderr: stderr goes into stdout (the result's stderr is "")."""

    def __init__(self, env: dict, timeout: float = 300, merge_stderr: bool = False,
                 stop: Callable[[subprocess.Popen], None] = stop_group):
        self.env = env
        self.timeout = timeout
        self.stderr = subprocess.STDOUT if merge_stderr else subprocess.PIPE
        self.stop = stop

    def spawn(self, argv: list, stdin: Optional[str] = None, timeout: Optional[float] = None,
              cwd: Optional[str] = None, env: Optional[dict] = None,
              stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
        """Run argv and wait; stdout and stderr come back as text ("" when
        sent elsewhere)."""
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=stdout, stderr=self.stderr, text=True, env=env or self.env,
                                cwd=cwd, start_new_session=True)
        try:
            out, err = proc.communicate(stdin, timeout=self.timeout if timeout is None else timeout)
        except BaseException:
            self.stop(proc)
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, out or "", err or "")

    def must(self, argv: list, stdin: Optional[str] = None, timeout: Optional[float] = None,
             env: Optional[dict] = None) -> str:
        """spawn(), and its stdout; BenchError (the end of what it said) if it failed."""
        proc = self.spawn(argv, stdin, timeout=timeout, env=env)
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip()[-800:]
            raise BenchError(f"{' '.join(argv)} (exit {proc.returncode}): {said}")
        return proc.stdout


def med(values: list) -> float:
    return statistics.median(values) if values else float("nan")


def table(rows: list, header: tuple, left: int = 1) -> str:
    """Text columns, the first `left` of them left-aligned, the rest right-aligned."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for r in [header] + rows:
        cells = [str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines)
