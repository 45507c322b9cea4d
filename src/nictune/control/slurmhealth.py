"""`nictune slurm-health PROFILE`: Slurm's HealthCheckProgram (or a prolog) on a node.

One run: verify this node's profile, then tell slurmctld.

* The verify goes through the resident agent's socket (<state dir>/agent.sock,
  host/resident/daemon.py) when the agent runs from the archive agent install
  put at <state dir>/resident/nictune-agent.pyz: the same fresh read of the
  kernel, without starting Python's imports again.  Otherwise, or when the
  socket refuses, the agent runs here (control/remote/targets.py), as `nictune
  verify` does.  Either way within a time budget: a check that overruns it
  says so and drains nothing (slowness is not drift).
* Drift (or an error of the verify) drains the node with a reason naming the
  first setting: `nictune: sysctl net.ipv4.tcp_ecn 2 != 1`.  The reason and
  the node are also recorded in <state dir>/slurm-health.json.
* A clean node is resumed only when nictune drained it: its Slurm reason
  starts with REASON_PREFIX AND equals the one recorded here.  A node
  drained by someone else (another reason) is never resumed, and its reason
  is never overwritten.
* No drain storm: before draining, slurmctld is asked (sinfo) how many nodes
  are already drained with this very reason.  If draining this one would put
  more than `max_drained_percent` of the nodes (at least one node is always
  allowed) down for the same reason, it is a fleet-wide profile error, not
  a node's fault: nothing is drained, and the storm is reported once per
  node and reason (the record remembers it).

Exit codes: 0 the node is clean, or left as it is (storm, someone else's
drain); 1 drained (drift); 2 the check could not run (budget, Slurm or
profile error).  As a prolog, a non-zero exit makes Slurm drain the node too.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from nictune.host.errors import NictuneError

REASON_PREFIX = "nictune: "
RECORD_NAME = "slurm-health.json"
SOCKET_NAME = "agent.sock"  # host/resident/daemon.py SOCKET_NAME
ARCHIVE = os.path.join("resident", "nictune-agent.pyz")  # control/install/agent_install.py
MAX_REASON = 120  # Slurm keeps longer reasons, but sinfo's columns and people do not
DRAINED_STATES = ("drained", "draining", "drain")
EXIT_CLEAN, EXIT_DRAINED, EXIT_FAILED = 0, 1, 2


class BudgetExceeded(Exception):
    pass


@dataclass
class Outcome:
    node: str
    action: str          # clean | drained | resumed | storm | left | failed
    reason: str = ""
    message: str = ""
    via: str = ""        # resident | local
    seconds: float = 0.0
    exit_code: int = EXIT_CLEAN
    changes: List[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def line(self) -> str:
        text = f"nictune slurm-health: {self.node} {self.action}"
        if self.reason:
            text += f": {self.reason}"
        if self.message:
            text += f" ({self.message})"
        return text


# -- the verify ------------------------------------------------------------------------


def _within(budget: float, run: Callable[[], dict]) -> dict:
    """run() or BudgetExceeded after `budget` seconds (SIGALRM: the main thread)."""
    def expired(signum, frame):
        raise BudgetExceeded(f"the check took longer than its budget of {budget:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        return run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def via_resident(request: dict, state_dir: str, budget: float) -> Optional[dict]:
    """The resident agent's answer through its socket, or None when no
    resident agent runs here from agent install's archive, or it refuses."""
    path, archive = os.path.join(state_dir, SOCKET_NAME), os.path.join(state_dir, ARCHIVE)
    if not (os.path.exists(path) and os.path.isfile(archive)):
        return None
    with open(archive, "rb") as f:
        agent_id = hashlib.sha256(f.read()).hexdigest()
    line = json.dumps(dict(request, state_dir=state_dir, agent_id=agent_id)).encode() + b"\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(budget)
            s.connect(path)
            s.sendall(line)
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        answer = json.loads(data)
    except (OSError, ValueError):
        return None
    return None if not isinstance(answer, dict) or "refused" in answer else answer


def verify(request: dict, state_dir: str, netns: Optional[str], budget: float) -> Tuple[dict, str]:
    """This node's verify report and how it was made ("resident" | "local")."""
    def run() -> Tuple[dict, str]:
        if netns is None:
            answer = via_resident(request, state_dir, budget)
            if answer is not None:
                return answer, "resident"
        from nictune.control.remote.targets import target_for

        return target_for(netns, state_dir).run(request), "local"

    box: dict = {}
    _within(budget, lambda: box.setdefault("r", run()))
    return box["r"]


def _shown(value) -> str:
    return "absent" if value is None else str(value)


def drift_reason(report: dict) -> str:
    """"" for a clean report, else the Slurm reason naming the first setting."""
    if report.get("error"):
        message = report["error"].get("message", "") if isinstance(report["error"], dict) else str(report["error"])
        return _cut(f"{REASON_PREFIX}verify failed: {message}")
    drifted = [c for c in report.get("changes", []) if c.get("status") not in ("ok", "unchanged", "skipped")]
    if not drifted and report.get("exit_code", 0) == 0:
        return ""
    if not drifted:
        return _cut(f"{REASON_PREFIX}verify exit {report.get('exit_code')}")
    first = drifted[0]
    key = first.get("key", {})
    target = "" if key.get("target") in (None, "host") else f"{key['target']} "
    text = (f"{REASON_PREFIX}{target}{key.get('family', '')} {key.get('name', '')} "
            f"{_shown(first.get('before'))} != {_shown(first.get('after'))}")
    if len(drifted) > 1:
        text += f" (+{len(drifted) - 1} more)"
    return _cut(text)


def _cut(text: str) -> str:
    text = " ".join(text.split())  # one line: Slurm's reason is one field
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


# -- Slurm -----------------------------------------------------------------------------


class SlurmError(NictuneError):
    pass


def _slurm(argv: List[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{argv[0]}: {e}")
    if result.returncode != 0:
        raise SlurmError(f"{' '.join(argv[:3])}: exit {result.returncode}: {result.stderr.strip()[:200]}")
    return result.stdout


def node_table() -> Dict[str, Tuple[str, str]]:
    """Every node: (state, reason), from slurmctld (sinfo; a node in two
    partitions is listed twice, the same)."""
    out = _slurm(["sinfo", "-h", "-N", "-o", "%N|%T|%E"])
    table = {}
    for row in out.splitlines():
        name, state, reason = (row.split("|", 2) + ["", ""])[:3]
        table[name.strip()] = (state.strip().rstrip("*~#!%$@^-").lower(), reason.strip())
    return table


def drain(node: str, reason: str) -> None:
    _slurm(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])


def resume(node: str) -> None:
    _slurm(["scontrol", "update", f"nodename={node}", "state=resume"])


# -- the record --------------------------------------------------------------------------


def load_record(state_dir: str) -> dict:
    try:
        with open(os.path.join(state_dir, RECORD_NAME)) as f:
            record = json.load(f)
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def save_record(state_dir: str, record: dict) -> None:
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, RECORD_NAME)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


# -- one check ----------------------------------------------------------------------------


def is_storm(table: Dict[str, Tuple[str, str]], node: str, reason: str, max_percent: float) -> bool:
    """Would draining `node` put more than max_percent of the nodes down for this reason?"""
    same = sum(1 for name, (state, why) in table.items()
               if name != node and why == reason and state in DRAINED_STATES)
    allowed = max(1, int(len(table) * max_percent / 100))
    return same + 1 > allowed


def act(node: str, reason: str, state_dir: str, max_percent: float) -> Outcome:
    """Tell slurmctld what the verify found."""
    table = node_table()
    if node not in table:
        raise SlurmError(f"slurmctld knows no node {node!r} (set --node)")
    state, current = table[node]
    record = load_record(state_dir)
    ours = current.startswith(REASON_PREFIX) and current == record.get("drained")
    drained = state in DRAINED_STATES
    if not reason:
        if drained and ours:
            resume(node)
            save_record(state_dir, {})
            return Outcome(node, "resumed", current)
        if drained:
            return Outcome(node, "left", current, "drained by someone else: not resumed")
        return Outcome(node, "clean")
    if drained and not ours:
        return Outcome(node, "left", reason, f"already drained by someone else ({current})",
                       exit_code=EXIT_DRAINED)
    if drained and current == reason:
        return Outcome(node, "drained", reason, "already", exit_code=EXIT_DRAINED)
    if is_storm(table, node, reason, max_percent):
        first = record.get("storm") != reason
        save_record(state_dir, dict(record, storm=reason))
        return Outcome(node, "storm", reason, "fleet-wide: more than the drain threshold of nodes have this "
                       "drift; not drained" + ("" if first else " (reported before)"))
    drain(node, reason)
    save_record(state_dir, {"drained": reason, "node": node, "at": time.time()})
    return Outcome(node, "drained", reason, exit_code=EXIT_DRAINED)


def check(request: dict, node: str, state_dir: str, netns: Optional[str], budget: float,
          max_percent: float) -> Outcome:
    started = time.monotonic()
    try:
        report, via = verify(request, state_dir, netns, budget)
        reason = drift_reason(report)
        outcome = act(node, reason, state_dir, max_percent)
        outcome.via, outcome.changes = via, [c for c in report.get("changes", [])
                                             if c.get("status") not in ("ok", "unchanged")]
    except BudgetExceeded as e:
        outcome = Outcome(node, "failed", message=str(e), exit_code=EXIT_FAILED)
    except NictuneError as e:
        outcome = Outcome(node, "failed", message=str(e), exit_code=EXIT_FAILED)
    outcome.seconds = round(time.monotonic() - started, 4)
    return outcome
