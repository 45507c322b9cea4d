"""The resident agent hears ethtool's netlink monitor group (issue 14, Watch).

The agent runs as a process in a namespace (`nictune agent run --netns`,
the unit's command line run directly) with a poll interval of 60 s, so a
drift put back within a few seconds was heard, not polled.  The drift is
made by hand with `ethtool`, and every value is read back with `ethtool`.

- `ethtool -K rail0 gro off` on a link that is up: the kernel also sends an
  RTM_NEWLINK for a features change (net/ethtool/features.c
  ethnl_set_features -> netdev_features_change), so this one is heard by
  either monitor;
- `ethtool -L rail0 rx 1 tx 1` on a veth that is down: the kernel sends
  ETHTOOL_MSG_CHANNELS_NTF and no rtnetlink event at all (checked with
  `ip monitor link` next to `ethtool --monitor` on 6.18), so only the
  ethtool monitor group hears it: without it this waits for the poll.
- A kernel without the group: the agent says so in its status and polls.

Namespaces nt<tag>e, addresses from 198.18.0.0/15; the agent is killed and
the namespace removed even when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import textwrap
import time
import types

import pytest
from netns_helpers import ResidentAgent, nictune, wait_for


pytestmark = pytest.mark.netns

INTERVAL = 60.0  # the poll: far longer than any wait below
HEARD = 4.0      # seen and put back within this (the issue asks ~2 s; slack for a busy CI)


def _sh(argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode:
        raise AssertionError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


@pytest.fixture
def lab(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    ns = f"nt{secrets.token_hex(3)}e"
    _sh(["ip", "netns", "add", ns])
    try:
        # Two queues each way, so the channel count has somewhere to drift.
        _sh(["ip", "-n", ns, "link", "add", "rail0", "numtxqueues", "2", "numrxqueues", "2",
             "type", "veth", "peer", "name", "rail0p", "numtxqueues", "2", "numrxqueues", "2"])
        _sh(["ip", "-n", ns, "addr", "add", "198.18.0.9/30", "dev", "rail0"])
        _sh(["ip", "-n", ns, "link", "set", "rail0p", "up"])
        yield types.SimpleNamespace(ns_a=ns, state=tmp_path / "state", dir=tmp_path)
    finally:
        _sh(["ip", "netns", "del", ns], check=False)


def run(lab, *argv: str) -> str:
    return _sh(["ip", "netns", "exec", lab.ns_a, *argv]).stdout


def apply(lab, body: str) -> None:
    path = lab.dir / "profile.yaml"
    path.write_text(textwrap.dedent("""\
        nictune: 1
        on_drift: restore
        interfaces:
          rail:
            match: {name: rail0, driver: veth}
        """) + textwrap.indent(textwrap.dedent(body), "    "))
    code, report = nictune(lab, "apply", str(path))
    assert code == 0, report


def gro(lab) -> str:
    return next(line.split(":")[1].split()[0] for line in run(lab, "ethtool", "-k", "rail0")
                .splitlines() if line.startswith("generic-receive-offload:"))


def channels(lab) -> tuple:
    """(rx, tx) of `ethtool -l`'s current settings."""
    current = run(lab, "ethtool", "-l", "rail0").split("Current hardware settings:")[1]
    values = dict(line.split(":") for line in current.splitlines() if ":" in line)
    return int(values["RX"]), int(values["TX"])


class Agent(ResidentAgent):
    def __init__(self, lab):
        super().__init__(lab, INTERVAL, "--metrics-address", "")

    def status(self) -> dict:
        return self.report().get("agent") or {}


@contextlib.contextmanager
def started(lab):
    a = Agent(lab)
    try:
        # Up and past its start-up verify: what follows is heard, not the start.
        assert wait_for(lambda: a.status().get("last_verify") or a.proc.poll() is not None,
                        30), "the agent never verified"
        assert a.proc.poll() is None, a.stop()
        assert a.status()["ethtool_monitor"] == "subscribed", a.stop()
        yield a
    finally:
        a.stop()


def _heard(a, key: str, back) -> float:
    """Seconds until `back()` holds (read with ethtool) and the agent's
    status, written after its cycle, counts `key` drifted once, restored once."""
    started = time.monotonic()
    assert wait_for(back, HEARD + 2), a.stop()
    took = time.monotonic() - started

    def counted():
        rec = a.status()["keys"].get(key) or {}
        return rec.get("drifts") == 1 and rec.get("restores") == 1

    assert wait_for(counted, 5), (a.status()["keys"], a.stop())
    return took


def test_gro_turned_off_by_hand_is_put_back_at_once(lab):
    _sh(["ip", "-n", lab.ns_a, "link", "set", "rail0", "up"])
    apply(lab, "features: {gro: on}\n")
    assert gro(lab) == "on"
    with started(lab) as a:
        run(lab, "ethtool", "-K", "rail0", "gro", "off")
        assert _heard(a, "features:rail0:rx-gro", lambda: gro(lab) == "on") < HEARD


def test_channels_changed_on_a_down_veth_are_heard_only_through_the_ethtool_group(lab):
    apply(lab, "channels: {rx: 2, tx: 2}\n")
    assert channels(lab) == (2, 2)
    with started(lab) as a:
        run(lab, "ethtool", "-L", "rail0", "rx", "1", "tx", "1")
        assert _heard(a, "channels:rail0:rx", lambda: channels(lab) == (2, 2)) < HEARD
        assert a.status()["keys"]["channels:rail0:tx"]["restores"] == 1


def test_without_the_group_the_agent_polls_and_says_so(tmp_path, monkeypatch):
    """The real kernel asked for a group it does not have (as a kernel
    before 5.6 has no ethtool family at all)."""
    from nictune.host.resident import daemon
    from nictune.host.transports.netlink import ethmonitor

    monkeypatch.setattr(ethmonitor, "GROUP", "monitor-of-another-kernel")
    lines = []
    agent = daemon.Resident(str(tmp_path / "state"), interval=45, log=lines.append,
                              listen=False)
    assert agent.ethtool_monitor() is None
    said = agent.status["ethtool_monitor"]
    assert "no 'monitor-of-another-kernel' multicast group" in said
    assert "at the next poll, every 45 s" in said and lines == [said]
    monkeypatch.setattr(ethmonitor, "GROUP", "monitor")
    mon = agent.ethtool_monitor()
    try:
        assert mon is not None and agent.status["ethtool_monitor"] == "subscribed"
    finally:
        mon.close()
