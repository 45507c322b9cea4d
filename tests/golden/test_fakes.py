"""The fake kernel behaves as the kernel does where nictune depends on it.

(tests/fakes.py: recorded ConnectX-7 / MANA state standing in for hardware
no kernel here has.)  Each check names the kernel behaviour it mimics.
"""

from __future__ import annotations

import errno

import pytest

from fakes import load_state, overlay
from nictune.host.transports.netlink import NetlinkError

pytestmark = pytest.mark.recorded

from shipped import P0, VF


def refused(code, call, *args, **kwargs) -> NetlinkError:
    with pytest.raises(NetlinkError) as info:
        call(*args, **kwargs)
    assert info.value.errno == code
    return info.value


def test_facts_for_selectors(cx7, maia):
    facts = {i.name: i for i in cx7.interfaces()}
    assert "lo" not in facts
    assert (facts[P0].driver, facts[P0].pci_id, facts[P0].bus_info) == ("mlx5_core", "15b3:1021", "0000:17:00.0")
    assert facts[P0].firmware == "28.39.1002 (MT_0000000838)"
    assert (facts["eth0"].driver, facts["eth0"].pci_id) == ("igb", "8086:1533")
    mana = {i.name: i for i in maia.interfaces()}
    assert (mana[VF].driver, mana[VF].pci_id, mana[VF].bus_info) == ("mana", "1414:00ba", "7870:00:00.0")
    assert (mana["eth0"].driver, mana["eth0"].pci_id, mana["eth0"].bus_info) == ("hv_netvsc", None, None)


def test_mtu_outside_the_device_range_is_einval(cx7):
    index = cx7.kernel.links[P0].index
    err = refused(errno.EINVAL, cx7.rtnl().set_link, index, mtu=9979)
    assert err.extack == "mtu greater than device maximum"
    refused(errno.EINVAL, cx7.rtnl().set_link, index, mtu=67)
    refused(errno.ENODEV, cx7.rtnl().set_link, 99, mtu=1500)
    cx7.rtnl().set_link(index, mtu=9978)
    assert cx7.kernel.links[P0].mtu == 9978
    # addrconf follows the new MTU.
    assert cx7.kernel.read_file(f"proc/sys/net/ipv6/conf/{P0}/mtu").strip() == "9978"


def test_netvsc_sets_its_vf_first(maia):
    eth0 = maia.kernel.links["eth0"]
    refused(errno.EINVAL, maia.rtnl().set_link, eth0.index, mtu=9216)  # the VF's maximum is 9000
    assert eth0.mtu == maia.kernel.links[VF].mtu == 1500
    maia.rtnl().set_link(eth0.index, mtu=9000)
    assert eth0.mtu == maia.kernel.links[VF].mtu == 9000


def test_rings_and_channels_above_the_maximum_are_einval(cx7):
    err = refused(errno.EINVAL, cx7.ethtool().set_rings, P0, {"rx": 8193})
    assert err.extack == "requested ring size exceeds maximum"
    refused(errno.EINVAL, cx7.ethtool().set_rings, P0, {"rx-mini": 1})  # maximum 0: not reported
    refused(errno.EINVAL, cx7.ethtool().set_channels, P0, {"combined": 65})
    refused(errno.EINVAL, cx7.ethtool().set_channels, P0, {"rx": 1})  # mlx5: combined only
    assert cx7.kernel.writes == []
    cx7.ethtool().set_channels(P0, {"combined": 64})
    assert cx7.ethtool().channels()[P0] == {"combined": 64, "combined-max": 64}


def test_a_missing_operation_is_eopnotsupp_and_absent_from_dumps(maia):
    assert VF not in maia.ethtool().coalesce() and VF not in maia.ethtool().pause()
    refused(errno.EOPNOTSUPP, maia.ethtool().set_coalesce, VF, {"rx-frames": 4})
    refused(errno.EOPNOTSUPP, maia.ethtool().set_pause, VF, {"rx": False})
    refused(errno.ENODEV, maia.ethtool().set_rings, "nope0", {"rx": 1024})


def test_values_are_typed_as_the_netlink_layer_wants(cx7):
    with pytest.raises(ValueError):
        cx7.ethtool().set_coalesce(P0, {"adaptive-rx": 1})
    with pytest.raises(ValueError):
        cx7.ethtool().set_rings(P0, {"rx": True})
    with pytest.raises(ValueError):
        cx7.ethtool().set_features(P0, {"rx-gro": 1})


def test_mana_rounds_rings_up_to_a_power_of_two(maia):
    maia.ethtool().set_rings(VF, {"rx": 6000, "tx": 300})
    assert maia.ethtool().rings()[VF]["rx"] == 8192 and maia.ethtool().rings()[VF]["tx"] == 512
    maia.ethtool().set_rings(VF, {"rx": 1024})
    assert maia.ethtool().rings()[VF]["rx"] == 1024
    err = refused(errno.EINVAL, maia.ethtool().set_rings, VF, {"rx": 64})
    assert "less than the min" in err.extack


def test_fixed_feature_bits_are_acked_and_reported_back(maia):
    got = maia.ethtool().set_features(VF, {"rx-vlan-hw-parse": False, "rx-gro": False, "rx-lro": False})
    # rx-lro is fixed but already off: nothing to report.
    assert got == {"rx-vlan-hw-parse": False}
    features = maia.ethtool().features()[VF]
    assert features.active["rx-vlan-hw-parse"] is True and features.active["rx-gro"] is False
    assert "rx-vlan-hw-parse" not in features.changeable
    refused(errno.EINVAL, maia.ethtool().set_features, VF, {"no-such-bit": True})


def test_faults_and_hooks(cx7):
    seen = []
    cx7.kernel.on_write.append(lambda op, ifname, values: seen.append(op))
    cx7.kernel.fail("set_channels", P0, errno.EBUSY, when=lambda v: v["combined"] == 8, times=1)
    refused(errno.EBUSY, cx7.ethtool().set_channels, P0, {"combined": 8})
    cx7.ethtool().set_channels(P0, {"combined": 8})  # only once
    assert seen == ["set_channels", "set_channels"]
    assert cx7.kernel.writes == [("set_channels", P0, {"combined": 8})]


def test_overlay_merges_by_name_and_null_deletes():
    base = load_state("cx7-host")
    state = overlay(base, {"links": [{"name": P0, "mtu": 9000}, {"name": "eth0", "delete": True}],
                           "rings": {P0: {"rx": 4096}, "eth0": None}, "pause": None})
    links = {link["name"]: link for link in state["links"]}
    assert links[P0]["mtu"] == 9000 and links[P0]["max_mtu"] == 9978 and "eth0" not in links
    assert state["rings"][P0] == {**base["rings"][P0], "rx": 4096} and "eth0" not in state["rings"]
    assert "pause" not in state
    assert base["links"][2]["mtu"] == 1500  # the recorded state is not touched
