"""Where a request runs: this host, or a network namespace on it.

Both run the same agent code.  A namespace target wraps the local one the way
pyinfra's chroot connector does: the agent is started under `ip netns exec`,
which also gives it the namespace's own /sys and /etc/netns/NAME files.
Remote hosts are control/ssh.py's SshTarget.  All three are a `Target`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional, Protocol, runtime_checkable

import nictune
from nictune.host.errors import TransportError
from nictune.host.journal import DEFAULT_STATE_DIR
from nictune.host.validate import NETNS, matches

AGENT_TIMEOUT = 300


@runtime_checkable
class Target(Protocol):
    """What the CLI and the fleet runner need from a place to run a request.

    A target is any object with these two members (no base class to
    inherit): LocalTarget, NetnsTarget and control/ssh.py's SshTarget.  It
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
            request (dict): the agent request (control/request.py:
                build_request).  The target adds ``host`` (its label) and
                ``state_dir`` (the host's own) before sending it.

        Returns:
            dict: the host report (docs/report-format.md, HOST) whose
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

    def argv(self) -> list:
        return ["ip", "netns", "exec", self.name, sys.executable, "-m", "nictune.host.agent"]

    def run(self, request: dict) -> dict:
        # The agent's /etc is the host's but for the files `ip netns exec`
        # binds from /etc/netns/NAME/: it must know which namespace it is in.
        payload = json.dumps(dict(request, host=self.label, state_dir=self.state_dir,
                                  netns=self.name))
        package_root = os.path.dirname(os.path.dirname(nictune.__file__))
        env = dict(os.environ, PYTHONPATH=package_root, LANG="C")
        try:
            proc = subprocess.run(self.argv(), input=payload, capture_output=True, text=True,
                                  timeout=AGENT_TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.label}: the agent did not answer in {AGENT_TIMEOUT} s")
        try:
            return json.loads(proc.stdout)
        except ValueError:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise TransportError(f"{self.label}: the agent failed (exit {proc.returncode}): {tail}")


def target_for(netns: Optional[str], state_dir: str = DEFAULT_STATE_DIR) -> Target:
    return NetnsTarget(netns, state_dir) if netns else LocalTarget(state_dir)
