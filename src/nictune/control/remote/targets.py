"""Where a request runs: this host, or a network namespace on it.

Both run the same agent code.  A namespace target wraps the local one the way
pyinfra's chroot connector does: the agent is started under `ip netns exec`,
which also gives it the namespace's own /sys and /etc/netns/NAME files.
Remote hosts are control/remote/ssh.py's SshTarget.  All three are a `Target`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Optional, Protocol, runtime_checkable

import nictune
from nictune.host.errors import Interrupted, NictuneError, TransportError
from nictune.host.transaction.journal import (APPLYING, COMMITTED, DEFAULT_STATE_DIR, ROLLED_BACK, Journal)
from nictune.host.validate import NETNS, matches

AGENT_TIMEOUT = 300


@runtime_checkable
class Target(Protocol):
    """What the CLI and the fleet runner need from a place to run a request.

    A target is any object with these two members (no base class to
    inherit): LocalTarget, NetnsTarget and control/remote/ssh.py's SshTarget.  It
    is made for one host before anything runs; making it may raise a
    NictuneError (a namespace that does not exist, a bad setting).

    Attributes:
        label (str): the host's name in reports: ``local``,
            ``netns:NAME``, or the inventory name of a remote host.
    """

    label: str

    def run(self, request: dict) -> dict:
        """Run one agent request on the host and return its report.

        Args:
            request (dict): the agent request (control/remote/request.py:
                build_request).  The target adds ``host`` (its label) and
                ``state_dir`` (the host's own) before sending it.

        Returns:
            dict: the host report (docs/reference/report-format.md, HOST) whose
            ``host`` is this target's label.  Whatever went wrong on the
            host (a bad value, a refused write, a rollback) is in the report
            and its ``exit_code``, never raised.

        Raises:
            TransportError: the agent could not be started or reached, did
                not answer in time, or gave no report to read.
        """


class LocalTarget:
    """A Target: the agent in this process, on this host."""

    def __init__(self, state_dir: str = DEFAULT_STATE_DIR):
        self.label = "local"
        self.state_dir = state_dir

    def run(self, request: dict) -> dict:
        from nictune.host import agent  # the engine and knobs, only when something runs here

        return agent.run(dict(request, host=self.label, state_dir=self.state_dir))


class NetnsTarget:
    """A Target: the agent under `ip netns exec NAME`, with a state
    directory of the namespace's own; the request names the namespace, so
    that the agent writes its own /etc/netns/NAME files, not the host's."""

    def __init__(self, name: str, state_dir: str = DEFAULT_STATE_DIR):
        if not matches(NETNS, name):
            raise TransportError(f"invalid network namespace name {name!r}")
        if not os.path.exists(f"/run/netns/{name}"):
            raise TransportError(f"there is no network namespace named {name!r} "
                                 "(see `ip netns list`; `nictune lab up` makes a demo one)")
        self.name = name
        self.label = f"netns:{name}"
        # Each namespace is a host of its own: its own journal and lock.
        self.state_dir = os.path.join(state_dir, "netns", name)
        self.rollback_command = f"nictune rollback --netns {name}" + (
            f" --state-dir {state_dir}" if state_dir != DEFAULT_STATE_DIR else "")

    def argv(self) -> list:
        return ["ip", "netns", "exec", self.name, sys.executable, "-m", "nictune.host.agent"]

    def run(self, request: dict) -> dict:
        # The agent's /etc is the host's but for the files `ip netns exec`
        # binds from /etc/netns/NAME/: it must know which namespace it is in.
        payload = json.dumps(dict(request, host=self.label, state_dir=self.state_dir,
                                  netns=self.name))
        package_root = os.path.dirname(os.path.dirname(nictune.__file__))
        env = dict(os.environ, PYTHONPATH=package_root, LANG="C")
        since = time.time()
        try:
            proc = subprocess.run(self.argv(), input=payload, capture_output=True, text=True,
                                  timeout=AGENT_TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.label}: the agent did not answer in {AGENT_TIMEOUT} s")
        try:
            return json.loads(proc.stdout)
        except ValueError:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            # The namespace's journal is on this machine: say what it holds.
            raise ended_without_report(f"{self.label}: {_how_it_ended(proc.returncode, tail)}",
                                       request["command"], Journal(self.state_dir), since,
                                       self.rollback_command) from None


def _how_it_ended(returncode: int, tail: str) -> str:
    if returncode < 0:  # subprocess: killed by that signal
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"the agent was killed by signal {-returncode} ({name}) before it reported"
    return f"the agent failed (exit {returncode}) before it reported: {tail}"


def ended_without_report(what: str, command: str, journal: Journal, since: float,
                         rollback: str) -> NictuneError:
    """The error of an apply or rollback whose agent ended without a report
    (killed, crashed): what its journal, read here, says was left behind.
    `since` is when the agent was started; `rollback` the command to run.
    An apply cut off mid-write is Interrupted (the host was reached and
    may be partly changed), the rest TransportError."""
    if command not in ("apply", "rollback"):
        return TransportError(what)
    try:
        record = journal.load()
    except NictuneError as e:
        return TransportError(f"{what}; its journal in {journal.dir} cannot be read ({e}): the "
                              f"host may be partly changed: look at the journal, then `{rollback}`")
    mine = record is not None and record.get("started", 0) >= since
    if command == "rollback":
        if record is not None and record["status"] == ROLLED_BACK and record.get("finished", 0) >= since:
            return TransportError(f"{what}, after its journal recorded apply {record['id']} as "
                                  "rolled back: the host has its before-values (a rollback "
                                  "--to or --steps may have meant older applies too: `nictune "
                                  "history` shows which are still in place)")
        return TransportError(f"{what}; the journal in {journal.dir} does not record the rollback "
                              "as done, so the host may be partly restored: `"
                              f"{rollback}` restores the before-values again")
    if not mine:
        return TransportError(f"{what}; it journaled nothing in {journal.dir}, so it wrote "
                              "nothing: the host is as it was")
    changes = record.get("changes") or []
    if record["status"] == APPLYING:
        return Interrupted(f"{what}, in the middle of apply {record['id']}: the host may be "
                           f"partly changed; the journal in {journal.dir} holds the "
                           f"{len(changes)} before-value(s) it was writing over "
                           f"({_keys_of(changes)}): `{rollback}` restores them (until then "
                           "every apply there is refused)")
    if record["status"] == COMMITTED:
        return TransportError(f"{what}, after its apply {record['id']} committed: the host has "
                              f"the profile ({len(changes)} change(s)); `{rollback}` undoes it")
    return TransportError(f"{what}, after its apply {record['id']} failed (its journal in "
                          f"{journal.dir} says {record['status']})")


def _keys_of(changes: list, shown: int = 5) -> str:
    names = [f"{c['key'].get('family')} {c['key'].get('name')} on {c['key'].get('target')}"
             for c in changes[:shown] if isinstance(c, dict) and isinstance(c.get("key"), dict)]
    return ", ".join(names) + (f" and {len(changes) - shown} more" if len(changes) > shown else "")


def target_for(netns: Optional[str], state_dir: str = DEFAULT_STATE_DIR) -> Target:
    return NetnsTarget(netns, state_dir) if netns else LocalTarget(state_dir)
