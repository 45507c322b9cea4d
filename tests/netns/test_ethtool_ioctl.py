"""The SIOCETHTOOL fallback (nictune.host.transports.netlink.ethtool_ioctl) against the real kernel.

It must answer exactly as the netlink backend does, and what it writes is
read back with ethtool(8).
"""

from __future__ import annotations

import array
import errno
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nictune.host.machine import Host
from nictune.host.transports.netlink import NetlinkError
from nictune.host.transports.netlink.ethtool import Ethtool
from nictune.host.transports.netlink.ethtool_ioctl import EthtoolIoctl
from nsenter import in_netns

AGENT_ROOT = str(Path(__file__).resolve().parents[2] / "src")


def _need_ethtool():
    if shutil.which("ethtool") is None:
        pytest.skip("ethtool CLI not installed")


def _cli_features(pair, ifname) -> dict:
    """`ethtool -k` as {printed name: on}."""
    r = pair.run(pair.ns_a, ["ethtool", "-k", ifname])
    assert r.returncode == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines()[1:]:  # "Features for X:"
        m = re.match(r"^\s*([\w.-]+): (on|off)", line)
        assert m, line
        out[m.group(1)] = m.group(2) == "on"
    return out


def _cli_current_channels(pair, ifname) -> dict:
    """The "Current hardware settings" part of `ethtool -l` (n/a left out)."""
    r = pair.run(pair.ns_a, ["ethtool", "-l", ifname])
    assert r.returncode == 0, r.stderr
    current = r.stdout.split("Current hardware settings")[1]
    return {k.lower(): int(v) for k, v in re.findall(r"^(RX|TX|Other|Combined):\s+(\d+)", current, re.M)}


# --- against the netlink backend --------------------------------------------------


@pytest.mark.netns
def test_reads_equal_the_netlink_backend(veth_pair):
    ns, dev = veth_pair.ns_a, veth_pair.ifname
    with in_netns(ns), Ethtool() as nl, EthtoolIoctl() as io:
        assert io.feature_names() == nl.feature_names()
        feats = io.features()
        assert set(feats) == {"lo", dev}  # every device: lo has GFEATURES too
        assert feats == nl.features()  # active and changeable, every bit
        assert "rx-gro" in feats[dev].changeable and "hw-tc-offload" not in feats[dev].changeable

        chans = io.channels()
        assert set(chans) == {dev}  # lo: EOPNOTSUPP, left out
        assert chans == nl.channels()
        assert chans[dev]["rx-max"] >= 2

        # veth has no ring/coalesce/pause ops: the GET ioctl says EOPNOTSUPP
        # for every device, so every dump is empty, as over netlink.
        for name in ("lo", dev):
            for get_cmd in (0x10, 0x0E, 0x12):  # GRINGPARAM, GCOALESCE, GPAUSEPARAM
                buf = array.array("B", struct.pack("=I", get_cmd) + bytes(88))  # fits them all
                with pytest.raises(NetlinkError) as exc:
                    io._ioctl(name, buf)
                assert exc.value.errno == errno.EOPNOTSUPP
        assert (io.rings(), io.coalesce(), io.pause()) == ({}, {}, {})
        assert (nl.rings(), nl.coalesce(), nl.pause()) == ({}, {}, {})


# --- writes, read back with ethtool(8) ----------------------------------------------


@pytest.mark.netns
def test_set_features_read_back_by_cli(veth_pair):
    _need_ethtool()
    dev = veth_pair.ifname
    with in_netns(veth_pair.ns_a), EthtoolIoctl() as io:
        before = _cli_features(veth_pair, dev)
        for gro in (not before["generic-receive-offload"], before["generic-receive-offload"]):
            assert io.set_features(dev, {"rx-gro": gro}) == {}
            now = _cli_features(veth_pair, dev)
            assert now["generic-receive-offload"] is gro
            # Only the requested bit moved.
            assert {k: v for k, v in now.items() if k != "generic-receive-offload"} == {
                k: v for k, v in before.items() if k != "generic-receive-offload"}
        assert io.features()[dev].active["rx-gro"] is before["generic-receive-offload"]


@pytest.mark.netns
def test_fixed_feature_is_reported_not_applied(veth_pair):
    dev = veth_pair.ifname
    with in_netns(veth_pair.ns_a), EthtoolIoctl() as io:
        # SFEATURES answers ETHTOOL_F_UNSUPPORTED; the bits come from a read-back.
        assert io.set_features(dev, {"hw-tc-offload": True, "rx-gro": False}) == {"hw-tc-offload": True}
        active = io.features()[dev].active
        assert active["hw-tc-offload"] is False and active["rx-gro"] is False
        # Asking a fixed bit for the value it already has is no refusal.
        assert io.set_features(dev, {"hw-tc-offload": False}) == {}
        # Errors as over netlink: unknown name, never-changeable bit.
        for wanted, code in (({"rx-no-such": True}, errno.EOPNOTSUPP),
                             ({"vlan-challenged": True}, errno.EINVAL)):
            with pytest.raises(NetlinkError) as exc:
                io.set_features(dev, wanted)
            assert exc.value.errno == code


@pytest.mark.netns
def test_set_channels_read_back_by_cli(veth_pair):
    _need_ethtool()
    ns, dev = veth_pair.ns_a, veth_pair.ifname
    with in_netns(ns), EthtoolIoctl() as io:
        before = io.channels()[dev]
        io.set_channels(dev, {"rx": 2})
        assert _cli_current_channels(veth_pair, dev) == {"rx": 2, "tx": before["tx"]}  # tx kept
        assert io.channels()[dev]["rx"] == 2
        r = veth_pair.run(ns, ["ethtool", "-L", dev, "rx", "1"])
        assert r.returncode == 0, r.stderr
        assert io.channels()[dev]["rx"] == 1
        with pytest.raises(NetlinkError) as exc:
            io.set_channels(dev, {"rx": before["rx-max"] + 1})
        assert exc.value.errno == errno.EINVAL


# --- errors ---------------------------------------------------------------------------


@pytest.mark.netns
def test_errors_match_the_netlink_backend(veth_pair):
    dev = veth_pair.ifname
    with in_netns(veth_pair.ns_a), EthtoolIoctl() as io:
        for method, values in (("set_rings", {"rx": 256}), ("set_coalesce", {"rx-usecs": 8}),
                               ("set_pause", {"rx": False})):
            with pytest.raises(NetlinkError) as exc:
                getattr(io, method)(dev, values)
            assert exc.value.errno == errno.EOPNOTSUPP
            assert "(EOPNOTSUPP)" in str(exc.value)
        for call in (lambda: io.set_rings("ntnodev0", {"rx": 256}),
                     lambda: io.set_channels("ntnodev0", {"rx": 1}),
                     lambda: io.set_features("ntnodev0", {"rx-gro": True})):
            with pytest.raises(NetlinkError) as exc:
                call()
            assert exc.value.errno == errno.ENODEV
        # Keys only ethtool netlink has: refused, not silently dropped.
        with pytest.raises(NetlinkError) as exc:
            io.set_coalesce(dev, {"cqe-mode-rx": True})
        assert exc.value.errno == errno.EOPNOTSUPP
        # Caller mistakes are ValueError before anything is sent, as in Ethtool.
        for bad in (lambda: io.set_channels("a/b", {"rx": 1}),
                    lambda: io.set_channels(dev, {"rx-max": 1}),
                    lambda: io.set_channels(dev, {"rx": -1}),
                    lambda: io.set_pause(dev, {"rx": 1}),
                    lambda: io.set_coalesce(dev, {"cqe-mode-rx": 1}),
                    lambda: io.set_features(dev, {"rx gro": True})):
            with pytest.raises(ValueError):
                bad()


# --- backend choice -----------------------------------------------------------------------


def test_host_picks_the_backend(monkeypatch):
    monkeypatch.delenv("NICTUNE_ETHTOOL", raising=False)
    with Host() as host:
        assert type(host.ethtool()) is Ethtool

    def no_family(self):
        raise NetlinkError(errno.ENOENT)  # what CTRL_CMD_GETFAMILY answers on < 5.6

    monkeypatch.setattr(Ethtool, "_resolve_family", no_family)
    with Host() as host:
        assert type(host.ethtool()) is EthtoolIoctl

    def denied(self):
        raise NetlinkError(errno.EPERM)

    monkeypatch.setattr(Ethtool, "_resolve_family", denied)
    with Host() as host:
        with pytest.raises(NetlinkError):
            host.ethtool()  # only a missing family falls back

    monkeypatch.undo()
    monkeypatch.setenv("NICTUNE_ETHTOOL", "ioctl")
    with Host() as host:
        assert type(host.ethtool()) is EthtoolIoctl


# --- end to end: the agent on the ioctl backend ---------------------------------------------


@pytest.mark.netns
def test_agent_applies_through_the_ioctl_backend(veth_pair, tmp_path):
    _need_ethtool()
    ns, dev = veth_pair.ns_a, veth_pair.ifname
    gro = _cli_features(veth_pair, dev)["generic-receive-offload"]
    doc = {
        "nictune": 1,
        "interfaces": {
            "rail": {
                "match": {"name": dev, "driver": "veth"},
                "channels": {"rx": 2},
                "features": {"gro": not gro, "rx-udp-gro-forwarding": True},
            }
        },
    }
    request = {"nictune_request": 1, "command": "apply", "host": "t", "state_dir": str(tmp_path / "state"),
               "profile": {"path": "p.yaml", "doc": doc, "sources": {}}}
    # Proof that the ioctl backend did the work: the netlink one is made to
    # blow up in the agent process (sitecustomize runs before the agent).
    (tmp_path / "sitecustomize.py").write_text(
        "import nictune.host.transports.netlink.ethtool as m\n"
        "def _no(self, *a, **k):\n"
        "    raise AssertionError('the netlink ethtool backend was used')\n"
        "m.Ethtool.__init__ = _no\n")
    env = {**os.environ, "NICTUNE_ETHTOOL": "ioctl", "LANG": "C",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), AGENT_ROOT])}
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "nictune.host.agent"],
                          input=json.dumps(request), capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == 0, report
    applied = {(c["key"]["family"], c["key"]["name"]) for c in report["changes"] if c["status"] == "applied"}
    assert {("channels", "rx"), ("features", "rx-gro")} <= applied, report
    feats = _cli_features(veth_pair, dev)
    assert feats["generic-receive-offload"] is (not gro) and feats["rx-udp-gro-forwarding"]
    assert _cli_current_channels(veth_pair, dev)["rx"] == 2

    # The same without the env var falls on the poisoned netlink backend:
    # the poison works, so the run above really used the ioctl.
    env.pop("NICTUNE_ETHTOOL")
    request["command"] = "plan"
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "nictune.host.agent"],
                          input=json.dumps(request), capture_output=True, text=True, env=env, timeout=60)
    assert "the netlink ethtool backend was used" in proc.stdout + proc.stderr
