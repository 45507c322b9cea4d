"""Confirmed commit, on the real kernel: an apply nobody confirms undoes itself.

The agent runs as it does over SSH (one JSON line in, one out, then the
"confirm" exchange), under `ip netns exec`, with the watchdog it forks.
Values are read back with `ip -j`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from netns_helpers import wait_for

import nictune
from nictune.control.remote.request import build_request
from nictune.profile.loader import load_profile_text

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
interfaces:
  rail:
    match: {name: ntv0}
    mtu: 4000
"""


def _argv(pair) -> list:
    return ["ip", "netns", "exec", pair.ns_a, sys.executable, "-m", "nictune.host.agent"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(nictune.__file__)))


def _agent(pair) -> subprocess.Popen:
    return subprocess.Popen(_argv(pair), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env())


def _applied(pair, state, timeout: float) -> subprocess.Popen:
    """An agent that applied and now waits for its confirmation."""
    agent = _agent(pair)
    agent.stdin.write(_request(state, timeout))
    agent.stdin.flush()
    report = json.loads(agent.stdout.readline())
    assert report["ok"] and report["changed"], report
    return agent


def _request(state, timeout=1.0) -> bytes:
    request = build_request("apply", load_profile_text(PROFILE, "confirm.yaml"))
    request.update(state_dir=str(state), confirm={"timeout": timeout})
    return (json.dumps(request) + "\n").encode()


def _mtu(pair) -> int:
    out = pair.run(pair.ns_a, ["ip", "-j", "link", "show", "ntv0"]).stdout
    return json.loads(out)[0]["mtu"]


def _journal(state) -> dict:
    return json.loads((state / "journal.json").read_text())


def test_unconfirmed_apply_is_rolled_back_by_the_watchdog(veth_pair, tmp_path):
    state = tmp_path / "state"
    agent = _agent(veth_pair)
    # The request, then end of input: as if the session died after the apply.
    out, _ = agent.communicate(_request(state), timeout=60)
    report = json.loads(out.splitlines()[0])
    assert report["ok"] and report["changed"], report
    assert wait_for(lambda: _journal(state)["status"] == "rolled-back")
    assert _mtu(veth_pair) == 1500
    assert _journal(state)["confirm"]["state"] == "expired"


def test_confirmed_apply_stays(veth_pair, tmp_path):
    state = tmp_path / "state"
    agent = _applied(veth_pair, state, timeout=1.0)
    agent.stdin.write(b"confirm\n")
    agent.stdin.flush()
    assert json.loads(agent.stdout.readline()) == {"nictune_confirm": "confirmed"}
    agent.stdin.close()
    agent.wait(timeout=30)
    time.sleep(1.5)  # past the timeout: a live watchdog would have acted by now
    assert _mtu(veth_pair) == 4000
    assert _journal(state)["status"] == "committed"
    assert _journal(state)["confirm"]["state"] == "confirmed"


def test_a_second_apply_waits_for_the_first_to_be_confirmed(veth_pair, tmp_path):
    state = tmp_path / "state"
    first = _applied(veth_pair, state, timeout=30.0)
    try:
        second = subprocess.run(_argv(veth_pair), input=_request(state), capture_output=True,
                                env=_env(), timeout=60)
        report = json.loads(second.stdout.splitlines()[0])
        assert report["error"]["kind"] == "locked"
        assert "awaits its controller's confirmation" in report["error"]["message"]
    finally:
        first.stdin.write(b"confirm\n")
        first.stdin.close()
        first.wait(timeout=30)
    assert _mtu(veth_pair) == 4000
