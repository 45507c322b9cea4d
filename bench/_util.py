"""What the benches share: running commands, medians and text tables.

The benches run as scripts (`python bench/bench_x.py`), so this module is
found next to them and imported as `_util`.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
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


# -- the resident agent's lab: a namespace of veth rails (bench_lldp_listener.py,
# bench_resident.py) ------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of pid (/proc/PID/stat), in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_kib(pid: int) -> int:
    """VmRSS of pid, KiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class RailLab:
    """A namespace (`host`) with `rails` veth rails rail0..railN-1 (MTU 9000,
    up), their peers swp0.. in a second one (`switch`); close() removes both."""

    def __init__(self, rails: int, tag: str):
        self.host, self.switch, self.rails, self.tag = f"ntlh{tag}", f"ntls{tag}", rails, tag
        for ns in (self.host, self.switch):
            sh("ip", "netns", "add", ns)
        try:
            for i in range(rails):
                self.add_rail(i)
                sh("ip", "-n", self.host, "link", "set", f"rail{i}", "mtu", "9000", "up")
        except BaseException:
            self.close()
            raise

    def add_rail(self, i: int) -> None:
        """rail<i> in the host namespace, its peer swp<i> (up) in the switch one."""
        sh("ip", "link", "add", f"ntlb{self.tag}{i}", "type", "veth", "peer", "name", f"ntlc{self.tag}{i}")
        sh("ip", "link", "set", f"ntlb{self.tag}{i}", "netns", self.host, "name", f"rail{i}")
        sh("ip", "link", "set", f"ntlc{self.tag}{i}", "netns", self.switch, "name", f"swp{i}")
        sh("ip", "-n", self.switch, "link", "set", f"swp{i}", "up")

    def close(self) -> None:
        for ns in (self.host, self.switch):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start_resident(lab: RailLab, state: str, profile_text: str, src: str, *agent_args: str):
    """Apply `profile_text` to the lab's host namespace (nictune from `src`),
    start `nictune agent run --netns` there (its pid is the agent's: `agent
    run` execs it under `ip netns exec`) and wait until its start verify is
    done.  The Popen; stop_resident() ends it."""
    path = os.path.join(state, "profile.yaml")
    with open(path, "w") as f:
        f.write(profile_text)
    env = dict(os.environ, PYTHONPATH=src)
    nictune = [sys.executable, "-c", "from nictune.cli.app import main; main()"]
    subprocess.run(nictune + ["apply", path, "--netns", lab.host, "--state-dir", state, "--json"],
                   capture_output=True, env=env, timeout=120, check=True)
    agent = subprocess.Popen(nictune + ["agent", "run", "--netns", lab.host, "--state-dir", state,
                                        *agent_args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    status = os.path.join(state, "netns", lab.host, "agent-status.json")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # settled: its start verify is done
        try:
            with open(status) as f:
                found = json.load(f)
            if found.get("last_verify") and found["pid"] == agent.pid:
                return agent
        except (OSError, ValueError):
            pass
        if agent.poll() is not None:
            break
        time.sleep(0.2)
    stop_resident(agent)
    raise BenchError("the resident agent did not finish its start verify within 60 s")


def stop_resident(agent: subprocess.Popen) -> None:
    agent.terminate()
    try:
        agent.wait(10)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait(5)
