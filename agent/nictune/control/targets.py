"""Where a request runs: this host, or a network namespace on it.

Both run the same agent code.  A namespace target wraps the local one the way
pyinfra's chroot connector does: the agent is started under `ip netns exec`,
which also gives it the namespace's own /sys and /etc/netns/NAME files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

import nictune
from nictune.host.errors import TransportError
from nictune.host.journal import DEFAULT_STATE_DIR
from nictune.host.validate import NETNS, matches

AGENT_TIMEOUT = 300


class LocalTarget:
    def __init__(self, state_dir: str = DEFAULT_STATE_DIR):
        self.label = "local"
        self.state_dir = state_dir

    def run(self, request: dict) -> dict:
        from nictune.host import agent  # the engine and knobs, only when something runs here

        return agent.run(dict(request, host=self.label, state_dir=self.state_dir))


class NetnsTarget:
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
        payload = json.dumps(dict(request, host=self.label, state_dir=self.state_dir))
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


def target_for(netns: Optional[str], state_dir: str = DEFAULT_STATE_DIR):
    return NetnsTarget(netns, state_dir) if netns else LocalTarget(state_dir)
