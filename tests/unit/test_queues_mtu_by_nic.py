"""Rings, channels and MTU by NIC class: mlx5 ring sizes as the
driver takes them, MANA's MTU only behind a MANA VF, MANA queues left alone
under mana_ib, and disruptive changes marked.

The hosts are recorded ConnectX-7 and MANA states on the fake kernel
(tests/fakes.py), which stands in for hardware no kernel here has; the
`lower_driver` selector on real kernel devices is in
tests/netns/test_lower_driver_match.py.
"""

from __future__ import annotations

import errno
import os

import pytest

from fakes import FakeHost
from nictune.host.facts import nicclass
from nictune.host.transaction.engine import Engine
from nictune.host.knobs.ethtool import ChannelsFamily, RingsFamily
from nictune.host.knobs.link import LinkFamily
from nictune.host.model import Key, Want
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile, load_profile_text

from shipped import MAIA, P0, P1, REPO, VF

pytestmark = pytest.mark.recorded

PROFILES = os.path.join(REPO, "profiles")
MAIA_RDMA = load_profile(os.path.join(PROFILES, "maia-rdma.yaml"))


def host(tmp_path, state="cx7-host", **overlay) -> FakeHost:
    return FakeHost({"base": state, **overlay} if overlay else state, tmp_path / "root")


def plan(h: FakeHost, text: str, tmp_path):
    profile = load_profile_text(text, "p.yaml", PROFILES)
    return Engine(h, str(tmp_path / "state")).plan(profile.doc, profile.sources)


def apply(h: FakeHost, text: str, tmp_path):
    profile = load_profile_text(text, "p.yaml", PROFILES)
    return Engine(h, str(tmp_path / "state")).apply(profile.doc, profile.sources, profile.path)


def change(out, family, target, name):
    return next(c for c in out.changes if (c.key.family, c.key.target, c.key.name) == (family, target, name))


def rings_on(ifname: str, values: str) -> str:
    return f"nictune: 1\ninterfaces:\n  rail:\n    match: {{name: {ifname}}}\n    rings: {values}\n"


# -- item 2: mlx5 ring sizes ---------------------------------------------------------

def test_the_mlx5_table_has_the_driver_minimums_and_rounding():
    # en.h MLX5E_PARAMS_MINIMUM_LOG_SQ_SIZE 0x6; MINIMUM_LOG_RQ_SIZE
    # 1 + ilog2(PAGE_SIZE / 512); en_ethtool.c rounds with order_base_2.
    assert nicclass.rings_minimum("mlx5_core", "tx") == 64
    assert nicclass.rings_minimum("mlx5_core", "rx", 4096) == 16
    assert nicclass.rings_minimum("mlx5_core", "rx", 65536) == 256
    assert nicclass.rings_minimum("mana", "rx", 65536) == 128  # MIN_RX_BUFFERS_PER_QUEUE
    assert nicclass.rings_minimum("igb", "rx") == 0
    assert nicclass.rings_effective("mlx5_core", "rx", 6000) == 8192
    assert nicclass.rings_effective("mlx5_core", "tx", 8192) == 8192
    assert RingsFamily.nic_support("mlx5_core", "rings.rx").startswith(
        "16 to 8192, rounded up to a power of two")


def test_the_fake_rounds_and_refuses_mlx5_rings_as_the_driver_does(tmp_path):
    cx7 = host(tmp_path)
    cx7.ethtool().set_rings(P0, {"rx": 6000, "tx": 100})
    assert (cx7.ethtool().rings()[P0]["rx"], cx7.ethtool().rings()[P0]["tx"]) == (8192, 128)
    with pytest.raises(NetlinkError) as e:
        cx7.ethtool().set_rings(P0, {"tx": 32})
    assert e.value.errno == errno.EINVAL


def test_an_mlx5_ring_size_it_would_round_is_refused_before_writing(tmp_path):
    cx7 = host(tmp_path)
    out = apply(cx7, rings_on(P0, "{rx: 6000}"), tmp_path)
    assert out.error["kind"] == "unsupported" and cx7.kernel.writes == []
    assert change(out, "rings", P0, "rx").note == (
        "not supported by mlx5_core: rx rings are a power of two of at least 16; 6000 would "
        "become 8192: ask for 8192, or {min: 6000}")


@pytest.mark.parametrize("values, name, least", [("{tx: 32}", "tx", 64), ("{rx: 8}", "rx", 16)])
def test_mlx5_rings_below_the_minimum_are_refused_before_writing(tmp_path, values, name, least):
    cx7 = host(tmp_path)
    out = apply(cx7, rings_on(P0, values), tmp_path)
    assert out.error["kind"] == "unsupported" and cx7.kernel.writes == []
    assert change(out, "rings", P0, name).note == (
        f"not supported by mlx5_core: {name} rings below {least} are refused by the driver; "
        f"ask for at least {least}")


def test_the_mlx5_rx_minimum_follows_the_page_size(tmp_path):
    # 64 KiB pages (arm64 kernels built so): 1 << (1 + ilog2(65536 / 512)).
    arm = host(tmp_path / "a", page_size=65536)
    assert "below 256 are refused" in plan(arm, rings_on(P0, "{rx: 128}"), tmp_path / "a").changes[0].note
    x86 = host(tmp_path / "b")
    assert plan(x86, rings_on(P0, "{rx: 128}"), tmp_path / "b").changes[0].status == "pending"


def test_an_mlx5_lower_bound_applies_and_reads_back_rounded(tmp_path):
    cx7 = host(tmp_path)
    out = apply(cx7, rings_on(P0, "{rx: {min: 6000}, tx: 2048}"), tmp_path)
    assert out.error is None, out.error
    assert ("set_rings", P0, {"rx": 6000, "tx": 2048}) in cx7.kernel.writes
    assert cx7.kernel.ops["rings"][P0]["rx"] == 8192


# -- item 7 (a): lower_driver ----------------------------------------------------------

def test_an_hv_netvsc_master_has_its_vf_driver_as_lower_driver(tmp_path):
    maia = host(tmp_path, "maia-host")
    found = {i.name: i for i in maia.interfaces()}
    assert found["eth0"].lower_driver == ("mana",) and found[VF].lower_driver is None
    assert found["eth0"].matches({"driver": "hv_netvsc", "lower_driver": "mana"})
    assert found["eth0"].matches({"lower_driver": ["mlx4_en", "mana"]})
    assert not found["eth0"].matches({"lower_driver": "mlx5_core"})
    assert not found[VF].matches({"lower_driver": "mana"})


def test_the_shipped_mtu_9000_skips_a_netvsc_nic_whose_vf_is_mellanox(tmp_path):
    # The same VM with an older Accelerated Networking VF (mlx5_core): Azure
    # carries 3900 there, so MTU 9000 must not be planned on eth0.
    mlx = host(tmp_path / "m", "maia-host", drvinfo={VF: {"driver": "mlx5_core"}}, quirks=None)
    out = Engine(mlx, str(tmp_path / "m" / "state")).plan(MAIA.doc, MAIA.sources)
    assert not [c for c in out.changes if c.key.target == "eth0"]
    assert "interfaces.synthetic matched no interface on this host" in out.warnings

    mana = host(tmp_path / "n", "maia-host")
    out = Engine(mana, str(tmp_path / "n" / "state")).plan(MAIA.doc, MAIA.sources)
    assert change(out, "link", "eth0", "mtu").after == 9000


def test_lower_driver_is_a_match_key_taking_a_driver_or_a_list():
    for value in ("mana", "[mana, mlx5_core]"):
        text = f"nictune: 1\ninterfaces:\n  s:\n    match: {{lower_driver: {value}}}\n    mtu: 9000\n"
        assert load_profile_text(text, "p.yaml").doc["interfaces"]["s"]["match"]["lower_driver"]


@pytest.mark.parametrize("value", ["mana;reboot", "", "x" * 33])
def test_lower_driver_is_validated_like_driver(value):
    text = f"nictune: 1\ninterfaces:\n  s:\n    match: {{lower_driver: {value!r}}}\n    mtu: 9000\n"
    with pytest.raises(ProfileError) as e:
        load_profile_text(text, "p.yaml")
    assert "lower_driver" in str(e.value)


# -- item 7 (b): MANA queues under mana_ib -------------------------------------------
# mana_ethtool.c mana_set_channels refuses (EBUSY) only on a down port whose
# vPort a RAW QP holds (nicclass.MANA_CHANNELS_VPORT_BUSY); on an up port
# Ethernet holds the vPort and the change goes through, disruptively.

def mana_queues(section: str) -> str:
    return f"nictune: 1\ninterfaces:\n  vf:\n    match: {{driver: mana}}\n    {section}\n"


def mana_down(tmp_path, **overlay) -> FakeHost:
    return host(tmp_path, "maia-host", links=[{"name": VF, "up": False, "operstate": "DOWN"}], **overlay)


@pytest.mark.parametrize("section, key", [
    ("rings: {rx: 1024}", "rx"), ("channels: {combined: 8}", "combined")])
def test_mana_queues_change_disruptively_on_an_up_port_under_mana_ib(tmp_path, section, key):
    rdma = host(tmp_path, "maia-host", tree="mana-host")
    family = section.split(":")[0]
    planned = change(plan(rdma, mana_queues(section), tmp_path), family, VF, key)
    assert planned.status == "pending"
    assert planned.disruptive.startswith("MANA detaches and re-attaches the port")
    out = apply(rdma, mana_queues(section), tmp_path)
    assert out.error is None and change(out, family, VF, key).status == "applied"


def test_mana_channels_on_a_down_port_under_mana_ib_are_refused_in_plan(tmp_path):
    rdma = mana_down(tmp_path, tree="mana-host")
    out = apply(rdma, mana_queues("channels: {combined: 8}"), tmp_path)
    assert out.error["kind"] == "unsupported" and rdma.kernel.writes == []
    note = change(out, "channels", VF, "combined").note
    rule = nicclass.MANA_CHANNELS_VPORT_BUSY
    assert note.startswith(f"not supported by mana while {rule.when}: {rule.why} ({rule.source})")
    assert note.endswith(f"nictune cannot read whether a RAW QP holds it (mana_0 sits on {VF}): "
                         f"bring {VF} up first")


def test_mana_rings_on_a_down_port_under_mana_ib_are_planned(tmp_path):
    # mana_set_ringparam has no vPort check: a down port only records the sizes.
    rdma = mana_down(tmp_path, tree="mana-host")
    assert change(plan(rdma, mana_queues("rings: {rx: 1024}"), tmp_path), "rings", VF, "rx").status == "pending"


def test_mana_channels_on_a_down_port_without_rdma_are_planned(tmp_path):
    plain = mana_down(tmp_path)
    out = plan(plain, mana_queues("channels: {combined: 8}"), tmp_path)
    assert change(out, "channels", VF, "combined").status == "pending"


@pytest.mark.parametrize("up, raw_qp, refused", [
    (False, True, True), (True, True, False), (False, False, False)])
def test_the_mana_fake_refuses_channels_by_the_same_rule(tmp_path, up, raw_qp, refused):
    fake = host(tmp_path, "maia-host", links=[{"name": VF, "up": up}],
                quirks={VF: {"raw_qp": raw_qp, "rings_round_up_pow2": True}})
    assert nicclass.refusal("mana", "channels.combined", fake.kernel.facts(VF)) is (
        nicclass.MANA_CHANNELS_VPORT_BUSY if refused else None)
    if not refused:
        fake.ethtool().set_channels(VF, {"combined": 8})
        assert fake.ethtool().channels()[VF]["combined"] == 8
        return
    with pytest.raises(NetlinkError) as e:
        fake.ethtool().set_channels(VF, {"combined": 8})
    assert e.value.errno == errno.EBUSY and nicclass.MANA_CHANNELS_VPORT_BUSY.why in str(e.value)
    fake.ethtool().set_rings(VF, {"rx": 1024})  # no such check in mana_set_ringparam


def test_maia_rdma_does_not_ask_for_mana_queues(tmp_path):
    assert not {"rings", "channels"} & set(MAIA_RDMA.doc["interfaces"]["mana-vf"])
    rdma = host(tmp_path, "maia-host", tree="mana-host")
    out = Engine(rdma, str(tmp_path / "state")).plan(MAIA_RDMA.doc, MAIA_RDMA.sources)
    assert not [c for c in out.changes if c.key.family in ("rings", "channels")]
    assert out.error is None and not [w for w in out.warnings if "mana_ib" in w]


# -- item 7 (c): what the Maia profiles are ---------------------------------------------

@pytest.mark.parametrize("name", ["maia-mana.yaml", "maia-rdma.yaml"])
def test_the_maia_profiles_say_they_are_azure_mana_profiles(name):
    with open(os.path.join(PROFILES, name)) as f:
        header = " ".join(line.lstrip("# ").strip() for line in f if line.startswith("#"))
    assert header.startswith("An Azure MANA profile")
    assert "no public host-side knobs exist for Maia" in header.replace("No public", "no public")


# -- item 13: disruptive changes (rings, channels, MTU) ----------------------------------

def read(family, *keys):
    family.read(list(keys))
    return family


def test_mlx5_ring_channel_and_mtu_changes_are_disruptive_on_an_up_port(tmp_path):
    cx7 = host(tmp_path)
    rx, combined, mtu = Key("rings", P0, "rx"), Key("channels", P0, "combined"), Key("link", P0, "mtu")
    assert "mlx5e_ethtool_set_ringparam" in read(RingsFamily(cx7), rx).disruptive(rx, 1024, 2048)
    assert "mlx5e_ethtool_set_channels" in read(ChannelsFamily(cx7), combined).disruptive(combined, 16, 32)
    assert "mlx5e_change_mtu" in read(LinkFamily(cx7), mtu).disruptive(mtu, 1500, 9000)
    # P1 is down: mlx5 only stores the new parameters (MLX5E_STATE_OPENED clear).
    down = Key("rings", P1, "rx")
    assert read(RingsFamily(cx7), down).disruptive(down, 1024, 2048) == ""


def test_mana_and_hv_netvsc_changes_are_disruptive(tmp_path):
    maia = host(tmp_path, "maia-host")
    rx, combined, mtu = Key("rings", VF, "rx"), Key("channels", VF, "combined"), Key("link", VF, "mtu")
    assert "mana_set_ringparam" in read(RingsFamily(maia), rx).disruptive(rx, 512, 1024)
    assert "mana_set_channels" in read(ChannelsFamily(maia), combined).disruptive(combined, 16, 8)
    assert "mana_change_mtu" in read(LinkFamily(maia), mtu).disruptive(mtu, 1500, 9000)
    netvsc = Key("link", "eth0", "mtu")
    assert "netvsc_change_mtu" in read(LinkFamily(maia), netvsc).disruptive(netvsc, 1500, 9000)


def test_a_driver_not_known_to_disrupt_is_not_marked(tmp_path):
    cx7 = host(tmp_path)  # eth0 is igb
    rx, combined = Key("rings", "eth0", "rx"), Key("channels", "eth0", "combined")
    mtu, txq = Key("link", "eth0", "mtu"), Key("link", P0, "txqueuelen")
    assert read(RingsFamily(cx7), rx).disruptive(rx, 256, 512) == ""
    assert read(ChannelsFamily(cx7), combined).disruptive(combined, 4, 2) == ""
    assert read(LinkFamily(cx7), mtu).disruptive(mtu, 1500, 9000) == ""
    assert read(LinkFamily(cx7), txq).disruptive(txq, 1000, 10000) == ""


def test_taking_a_link_down_is_disruptive(tmp_path):
    cx7 = host(tmp_path)
    state = Key("link", P0, "state")
    link = read(LinkFamily(cx7), state)
    assert link.disruptive(state, "up", "down") == "the link goes down"
    assert link.disruptive(state, "up", Want("down")) == "the link goes down"
