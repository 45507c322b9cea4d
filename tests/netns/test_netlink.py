"""nictune.host.transports.netlink against the real kernel, cross-checked with ip(8) and ethtool(8)."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nictune.host.transports.netlink import NetlinkError
from nictune.host.transports.netlink.drvinfo import drvinfo
from nictune.host.transports.netlink.ethtool import Ethtool
from nictune.host.transports.netlink.rtnl import Rtnl
from nsenter import in_netns

pytestmark = pytest.mark.netns

# ethtool -k prints a single-bit feature under its legacy alias instead of
# its kernel name (ethtool's off_flag_def table).
_K_ALIASES = {
    "rx-checksumming": "rx-checksum",
    "generic-segmentation-offload": "tx-generic-segmentation",
    "generic-receive-offload": "rx-gro",
    "large-receive-offload": "rx-lro",
    "rx-vlan-offload": "rx-vlan-hw-parse",
    "tx-vlan-offload": "tx-vlan-hw-insert",
    "ntuple-filters": "rx-ntuple-filter",
    "receive-hashing": "rx-hashing",
}


def _need_ethtool():
    if shutil.which("ethtool") is None:
        pytest.skip("ethtool CLI not installed")


def _ip_link(pair, ns, ifname=None):
    argv = ["ip", "-j", "-d", "link", "show"] + ([ifname] if ifname else [])
    r = pair.run(ns, argv)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _ethtool_k(pair, ns, ifname):
    """{kernel name: (on, fixed)} from `ethtool -k`, alias groups dropped."""
    r = pair.run(ns, ["ethtool", "-k", ifname])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()[1:]  # "Features for X:"
    out = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\s*([\w.-]+): (on|off)( \[fixed\])?", line)
        assert m, line
        if i + 1 < len(lines) and lines[i + 1].startswith("\t") and not line.startswith("\t"):
            continue  # a group header such as tx-checksumming; its bits follow
        name = _K_ALIASES.get(m.group(1), m.group(1))
        out[name] = (m.group(2) == "on", bool(m.group(3)))
    return out


def _ethtool_l(pair, ns, ifname):
    """`ethtool -l` as our channels() dict (n/a = absent)."""
    r = pair.run(ns, ["ethtool", "-l", ifname])
    assert r.returncode == 0, r.stderr
    out, suffix = {}, None
    for line in r.stdout.splitlines():
        if line.startswith("Pre-set maximums"):
            suffix = "-max"
        elif line.startswith("Current hardware settings"):
            suffix = ""
        elif suffix is not None:
            m = re.match(r"^(RX|TX|Other|Combined):\s+(\S+)", line)
            if m and m.group(2) != "n/a":
                out[m.group(1).lower() + suffix] = int(m.group(2))
    return out


# --- rtnl -------------------------------------------------------------------


def test_links_match_ip(veth_pair):
    with in_netns(veth_pair.ns_a), Rtnl() as rt:
        ours = {link.name: link for link in rt.links()}
    theirs = {d["ifname"]: d for d in _ip_link(veth_pair, veth_pair.ns_a)}
    assert set(ours) == set(theirs) == {"lo", veth_pair.ifname}
    for name, d in theirs.items():
        link = ours[name]
        assert link.index == d["ifindex"]
        assert (link.mtu, link.txqlen) == (d["mtu"], d["txqlen"])
        assert (link.min_mtu, link.max_mtu) == (d.get("min_mtu"), d.get("max_mtu"))
        assert link.up == ("UP" in d["flags"])
        assert link.operstate == d["operstate"]
        assert link.mac == d.get("address")
        assert link.kind == d.get("linkinfo", {}).get("info_kind")
        assert (link.num_rx_queues, link.num_tx_queues) == (d["num_rx_queues"], d["num_tx_queues"])
    assert ours[veth_pair.ifname].kind == "veth"


def test_set_link_both_directions(veth_pair):
    ns, dev = veth_pair.ns_a, veth_pair.ifname
    with in_netns(ns), Rtnl() as rt:
        index = next(link.index for link in rt.links() if link.name == dev)
        rt.set_link(index, mtu=9000, txqlen=5000, up=False)
        (d,) = _ip_link(veth_pair, ns, dev)
        assert (d["mtu"], d["txqlen"], "UP" in d["flags"]) == (9000, 5000, False)

        rt.set_link(index, up=True)  # flags only: mtu/txqlen untouched
        (d,) = _ip_link(veth_pair, ns, dev)
        assert (d["mtu"], d["txqlen"], "UP" in d["flags"]) == (9000, 5000, True)

        r = veth_pair.run(ns, ["ip", "link", "set", dev, "mtu", "1400", "txqueuelen", "777", "down"])
        assert r.returncode == 0, r.stderr
        link = next(link for link in rt.links() if link.name == dev)
        assert (link.mtu, link.txqlen, link.up, link.operstate) == (1400, 777, False, "DOWN")


def test_mtu_above_max_is_einval_with_extack(veth_pair):
    with in_netns(veth_pair.ns_a), Rtnl() as rt:
        index = next(link.index for link in rt.links() if link.name == veth_pair.ifname)
        with pytest.raises(NetlinkError) as exc:
            rt.set_link(index, mtu=70000)
    assert exc.value.errno == errno.EINVAL
    if exc.value.extack is not None:  # 6.18 says "mtu greater than device maximum"
        assert "mtu" in exc.value.extack
        assert str(exc.value) == f"Invalid argument (EINVAL): {exc.value.extack}"


def test_set_link_unknown_index_is_enodev(veth_pair):
    with in_netns(veth_pair.ns_a), Rtnl() as rt:
        with pytest.raises(NetlinkError) as exc:
            rt.set_link(99999, mtu=1500)
    assert exc.value.errno == errno.ENODEV


def test_many_links_span_several_datagrams(veth_pair):
    # 40 veth pairs in ns_b: the RTM_GETLINK dump then takes 4 datagrams
    # (kernel dump skbs are <= 32 KiB), exercising the multi-recv loop.
    batch = "".join(f"link add ntb{i}x type veth peer name ntb{i}y\n" for i in range(40))
    r = subprocess.run(["ip", "-n", veth_pair.ns_b, "-batch", "-"], input=batch,
                       text=True, capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    expected = {d["ifname"] for d in _ip_link(veth_pair, veth_pair.ns_b)}
    assert len(expected) == 82
    with in_netns(veth_pair.ns_b), Rtnl() as rt:
        assert {link.name for link in rt.links()} == expected
    with in_netns(veth_pair.ns_b), Ethtool() as et:
        assert set(et.features()) == expected
        assert set(et.channels()) == expected - {"lo"}


# --- ethtool: features --------------------------------------------------------


def test_features_match_ethtool_k(veth_pair):
    _need_ethtool()
    with in_netns(veth_pair.ns_a), Ethtool() as et:
        feats = et.features()
    assert set(feats) == {"lo", veth_pair.ifname}
    for dev, f in feats.items():
        cli = _ethtool_k(veth_pair, veth_pair.ns_a, dev)
        assert f.active == {name: on for name, (on, _fixed) in cli.items()}
        assert f.changeable == {name for name, (_on, fixed) in cli.items() if not fixed}
    veth = feats[veth_pair.ifname]
    assert "rx-gro" in veth.changeable and "hw-tc-offload" not in veth.changeable


def test_set_features_both_directions(veth_pair):
    _need_ethtool()
    ns, dev = veth_pair.ns_a, veth_pair.ifname
    with in_netns(ns), Ethtool() as et:
        before = et.features()[dev].active
        want = {"rx-gro": not before["rx-gro"], "rx-udp-gro-forwarding": not before["rx-udp-gro-forwarding"]}
        assert et.set_features(dev, want) == {}
        cli = _ethtool_k(veth_pair, ns, dev)
        assert {k: cli[k][0] for k in want} == want
        # Only the listed bits changed.
        assert {k: on for k, (on, _f) in cli.items() if k not in want} == {
            k: v for k, v in before.items() if k not in want
        }

        r = veth_pair.run(ns, ["ethtool", "-K", dev, "gro", "on", "rx-udp-gro-forwarding", "off"])
        assert r.returncode == 0, r.stderr
        now = et.features()[dev].active
        assert (now["rx-gro"], now["rx-udp-gro-forwarding"]) == (True, False)


def test_set_fixed_feature_is_reported_not_applied(veth_pair):
    dev = veth_pair.ifname
    with in_netns(veth_pair.ns_a), Ethtool() as et:
        failed = et.set_features(dev, {"hw-tc-offload": True, "rx-gro": False})
        assert failed == {"hw-tc-offload": True}
        active = et.features()[dev].active
    assert active["hw-tc-offload"] is False and active["rx-gro"] is False


# --- ethtool: rings, channels, coalesce, pause --------------------------------


def test_channels_both_directions(veth_pair):
    _need_ethtool()
    ns, dev = veth_pair.ns_a, veth_pair.ifname
    with in_netns(ns), Ethtool() as et:
        chans = et.channels()
        assert set(chans) == {dev}  # lo has no channels op: skipped
        assert chans[dev] == _ethtool_l(veth_pair, ns, dev)
        assert chans[dev]["rx-max"] >= 2

        et.set_channels(dev, {"rx": 2})
        assert et.channels()[dev]["rx"] == 2
        assert _ethtool_l(veth_pair, ns, dev)["rx"] == 2

        r = veth_pair.run(ns, ["ethtool", "-L", dev, "rx", "1"])
        assert r.returncode == 0, r.stderr
        assert et.channels()[dev]["rx"] == 1

        with pytest.raises(NetlinkError) as exc:
            et.set_channels(dev, {"rx": chans[dev]["rx-max"] + 1})
        assert exc.value.errno == errno.EINVAL


def test_dumps_skip_devices_without_the_op(veth_pair):
    with in_netns(veth_pair.ns_a), Ethtool() as et:
        assert et.rings() == {}
        assert et.coalesce() == {}
        assert et.pause() == {}


@pytest.mark.parametrize(
    "method, values",
    [("set_rings", {"rx": 256}), ("set_coalesce", {"rx-usecs": 8}), ("set_pause", {"rx": False})],
)
def test_set_unsupported_op_is_eopnotsupp(veth_pair, method, values):
    with in_netns(veth_pair.ns_a), Ethtool() as et:
        with pytest.raises(NetlinkError) as exc:
            getattr(et, method)(veth_pair.ifname, values)
    assert exc.value.errno == errno.EOPNOTSUPP
    assert "(EOPNOTSUPP)" in str(exc.value)


def test_unknown_device_is_enodev(veth_pair):
    with in_netns(veth_pair.ns_a), Ethtool() as et:
        for call in (
            lambda: et.set_rings("ntnodev0", {"rx": 256}),
            lambda: et.set_channels("ntnodev0", {"rx": 1}),
            lambda: et.set_features("ntnodev0", {"rx-gro": True}),
        ):
            with pytest.raises(NetlinkError) as exc:
                call()
            assert exc.value.errno == errno.ENODEV


def test_bad_arguments_are_rejected_before_sending(veth_pair):
    with in_netns(veth_pair.ns_a), Ethtool() as et:
        for bad in ("", ".", "..", "a" * 16, "a/b", "a b", "eth0\0", "eth0\n"):
            with pytest.raises(ValueError):
                et.set_channels(bad, {"rx": 1})
        with pytest.raises(ValueError):
            et.set_channels(veth_pair.ifname, {"rx-max": 1})  # read-only
        with pytest.raises(ValueError):
            et.set_channels(veth_pair.ifname, {"rx": -1})
        with pytest.raises(ValueError):
            et.set_pause(veth_pair.ifname, {"rx": 1})  # bool wanted
        with pytest.raises(ValueError):
            et.set_features(veth_pair.ifname, {"rx gro": True})
    with pytest.raises(ValueError):
        drvinfo("../x")


# --- drvinfo, errors ------------------------------------------------------------


def test_drvinfo(veth_pair):
    _need_ethtool()
    with in_netns(veth_pair.ns_a):
        info = drvinfo(veth_pair.ifname)
    r = veth_pair.run(veth_pair.ns_a, ["ethtool", "-i", veth_pair.ifname])
    cli = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "")
               for line in r.stdout.splitlines())
    assert (info.driver, info.version, info.fw_version, info.bus_info) == (
        cli["driver"], cli["version"], cli["firmware-version"], cli["bus-info"])
    with in_netns(veth_pair.ns_a):
        assert drvinfo("lo") is None  # no get_drvinfo, no parent device
        assert drvinfo("ntnodev0") is None


def test_netlink_error_format():
    e = NetlinkError(-22, "requested ring size exceeds maximum")
    assert (e.errno, e.strerror, e.extack) == (22, "Invalid argument", "requested ring size exceeds maximum")
    assert str(e) == "Invalid argument (EINVAL): requested ring size exceeds maximum"
    assert str(NetlinkError(95)) == "Operation not supported (EOPNOTSUPP)"
    assert isinstance(e, OSError)
    again = pickle.loads(pickle.dumps(e))
    assert (again.errno, again.extack) == (22, e.extack)


def test_import_stays_light():
    # The agent's CPU budget: no pyroute2/__init__, no asyncio, no pyroute2 socket.
    code = (
        "import sys, nictune.host.transports.netlink.rtnl, nictune.host.transports.netlink.ethtool, nictune.host.transports.netlink.drvinfo;"
        "print(sorted(m for m in ('asyncio', 'pyroute2.iproute', 'pyroute2.netlink.nlsocket',"
        " 'pyroute2.netlink.generic', 'pyroute2.ndb') if m in sys.modules))"
    )
    agent = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": agent}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
