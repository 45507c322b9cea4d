"""Knob families on their own: names, normalising, paths, limits, files.

Families that talk to the kernel run on the fake kernel (tests/fakes.py,
recorded ConnectX-7 / MANA state); sysctl and NCCL files live under a
temporary Host.root.
"""

from __future__ import annotations

import os
import stat

import pytest

from nictune.host.machine import Host
from nictune.host.knobs.ethtool import (
    FEATURE_ALIASES,
    ApplyRefused,
    ChannelsFamily,
    CoalesceFamily,
    FeaturesFamily,
    RingsFamily,
)
from nictune.host.knobs.link import LinkFamily
from nictune.host.knobs.nccl import HEADER, NcclFamily, parse, render
from nictune.host.knobs.sysctl import GLOBAL_NOTE, SysctlFamily, normalise
from nictune.host.model import HOST, Key, Unsupported, Want
from nictune.host.validate import InvalidInput

from shipped import P0, VF


def no_source(*parts):
    return "p.yaml:1"


# -- Want -----------------------------------------------------------------------

@pytest.mark.parametrize("raw, want", [
    (9000, Want(9000)),
    ({"min": 32}, Want(32, "min")),
    ({"max": 5000}, Want(5000, "max")),
    (True, Want(True)),
    ("up", Want("up")),
    ({"other": 1}, Want({"other": 1})),  # not a bound: the schema refuses it earlier
])
def test_want_parse(raw, want):
    assert Want.parse(raw) == want
    assert Want.parse(raw).as_json() == raw


@pytest.mark.parametrize("want, current, ok", [
    (Want(32, "min"), 32, True),
    (Want(32, "min"), 48, True),
    (Want(32, "min"), 16, False),
    (Want(5000, "max"), 5000, True),
    (Want(5000, "max"), 1000, True),
    (Want(5000, "max"), 10000, False),
    # A bound is only met by a number: not by a bool, text, nothing or unreadable.
    (Want(1, "min"), True, False),
    (Want(1, "min"), "2", False),
    (Want(1, "min"), None, False),
    (Want(1, "min"), Unsupported("no such device"), False),
    (Want(9000), 9000, True),
    (Want(9000), 9001, False),
    (Want("up"), "down", False),
    (Want(True), {"tx-tcp-segmentation": True, "tx-tcp6-segmentation": False}, False),
])
def test_want_bounds(want, current, ok):
    assert want.satisfied_by(current) is ok


# -- sysctl ---------------------------------------------------------------------

@pytest.mark.parametrize("raw, norm", [
    ("1\n", 1),
    (" 2 ", 2),
    ("-1\n", -1),
    (1, 1),
    (True, 1),
    (False, 0),
    ("4096\t131072\t6291456\n", "4096 131072 6291456"),  # how tcp_rmem reads back
    ([4096, 131072, 6291456], "4096 131072 6291456"),    # how profiles write it
    ("4096  131072 6291456", "4096 131072 6291456"),
    ("cubic\n", "cubic"),
    ("32768\t60999\n", "32768 60999"),
])
def test_sysctl_normalise(raw, norm):
    assert normalise(raw) == norm


def test_sysctl_keys_host_and_interface(tmp_path):
    fam = SysctlFamily(Host(str(tmp_path)))
    assert fam.key_for(HOST, "net.ipv4.tcp_ecn") == Key("sysctl", HOST, "net.ipv4.tcp_ecn")
    assert fam.key_for("eth0", "ipv4.rp_filter") == Key("sysctl", "eth0", "net.ipv4.conf.eth0.rp_filter")
    assert fam.key_for("eth0", "ipv6.mtu") == Key("sysctl", "eth0", "net.ipv6.conf.eth0.mtu")
    assert fam.path(Key("sysctl", HOST, "net.ipv4.tcp_ecn")) == str(tmp_path / "proc/sys/net/ipv4/tcp_ecn")


@pytest.mark.parametrize("target, short", [
    (HOST, "kernel.numa_balancing"),       # not under net.
    (HOST, "net.ipv4.conf.all/../../x"),
    (HOST, "net..ipv4"),
    ("eth0", "ipv4.conf.all.rp_filter"),   # interface keys are ipv4.<leaf>
    ("eth0", "net.ipv4.conf.eth0.rp_filter"),
    ("eth0", "ipv5.rp_filter"),
])
def test_sysctl_names_are_checked(tmp_path, target, short):
    with pytest.raises(InvalidInput):
        SysctlFamily(Host(str(tmp_path))).key_for(target, short)


def test_sysctl_path_of_an_interface_with_dots(tmp_path):
    # VLAN eth0.100: the dotted name would split wrongly; /proc/sys uses it whole.
    host = Host(str(tmp_path))
    fam = SysctlFamily(host)
    key = fam.key_for("eth0.100", "ipv4.rp_filter")
    assert key.name == "net.ipv4.conf.eth0.100.rp_filter"
    assert fam.path(key) == str(tmp_path / "proc/sys/net/ipv4/conf/eth0.100/rp_filter")
    os.makedirs(tmp_path / "proc/sys/net/ipv4/conf/eth0.100")
    (tmp_path / "proc/sys/net/ipv4/conf/eth0.100/rp_filter").write_text("1\n")
    assert fam.read([key]) == {key: 1}
    fam.apply([(key, 2)])
    assert (tmp_path / "proc/sys/net/ipv4/conf/eth0.100/rp_filter").read_text() == "2"
    assert fam.read([key]) == {key: 2}


def test_sysctl_expand_normalises_and_checks_values(tmp_path):
    fam = SysctlFamily(Host(str(tmp_path)))
    got = fam.expand(HOST, {"sysctl": {"net.ipv4.tcp_rmem": [4096, 131072, 6291456],
                                       "net.ipv4.tcp_ecn": 1,
                                       "net.core.rmem_max": {"min": 1048576}}}, no_source)
    assert [(d.key.name, d.want) for d in got] == [
        ("net.ipv4.tcp_rmem", Want("4096 131072 6291456")),
        ("net.ipv4.tcp_ecn", Want(1)),
        ("net.core.rmem_max", Want(1048576, "min")),
    ]
    with pytest.raises(InvalidInput):
        fam.expand(HOST, {"sysctl": {"net.ipv4.tcp_ecn": "1\nnet.core.rmem_max=1"}}, no_source)
    with pytest.raises(InvalidInput):
        fam.expand(HOST, {"sysctl": {"net.ipv4.tcp_congestion_control": "bbr; reboot"}}, no_source)


def test_sysctl_read_missing_and_global_note(tmp_path):
    fam = SysctlFamily(Host(str(tmp_path)))
    host_key = Key("sysctl", HOST, "net.core.busy_poll")
    if_key = fam.key_for("eth9", "ipv4.rp_filter")
    got = fam.read([host_key, if_key])
    assert got[host_key] == Unsupported("no such sysctl in this kernel or namespace")
    assert got[if_key] == Unsupported("no such sysctl for eth9 in this kernel or namespace")
    assert fam.note(host_key) == GLOBAL_NOTE
    assert fam.note(Key("sysctl", HOST, "net.ipv4.tcp_ecn")) == ""


def test_sysctl_write_error_names_the_key(tmp_path):
    fam = SysctlFamily(Host(str(tmp_path)))
    with pytest.raises(OSError) as info:
        fam.apply([(Key("sysctl", HOST, "net.ipv4.tcp_ecn"), 1)])
    assert "net.ipv4.tcp_ecn=1" in str(info.value)


# -- NCCL -----------------------------------------------------------------------

def test_nccl_render_exact_lines():
    text = render({"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_IB_TC": 106, "NCCL_IB_PCI_RELAXED_ORDERING": True,
                   "NCCL_IB_SPLIT_DATA_ON_QPS": False, "NCCL_DEBUG": "WARN"})
    assert text == (HEADER + "NCCL_IB_HCA==mlx5_0,mlx5_1\nNCCL_IB_TC=106\nNCCL_IB_PCI_RELAXED_ORDERING=1\n"
                    "NCCL_IB_SPLIT_DATA_ON_QPS=0\nNCCL_DEBUG=WARN\n")
    assert render({}) == HEADER
    # Written verbatim: only what NCCL and a shell sourcing the file both take literally.
    assert render({"NCCL_X": "^=a,b:1/c+d@e%f-g.h_i"}).endswith("NCCL_X=^=a,b:1/c+d@e%f-g.h_i\n")


@pytest.mark.parametrize("env", [
    {"NCCL_DEBUG": "WARN\nNCCL_IB_HCA=evil"},
    {"NCCL_DEBUG": "WARN\rX"},
    {"NCCL_DEBUG": "a\x00b"},
    {"NCCL_DEBUG": "x" * 901},
    # NCCL trims nothing: a blank at either end would become part of the value.
    {"NCCL_DEBUG": " WARN"},
    {"NCCL_DEBUG": "WARN\t"},
    {"nccl_debug": "WARN"},
    {"NCCL_": "1"},
    {"NCCL_DEBUG ": "WARN"},
    {"LD_PRELOAD": "/tmp/x.so"},
    {"NCCL_DEBUG=INFO\nNCCL_X": "1"},
])
def test_nccl_render_refuses_bad_names_and_values(env):
    with pytest.raises(InvalidInput):
        render(env)


def test_nccl_parse_round_trips_render():
    env = {"NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_TC": 106, "NCCL_IB_PCI_RELAXED_ORDERING": True}
    assert parse(render(env)) == {"NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_TC": "106",
                                  "NCCL_IB_PCI_RELAXED_ORDERING": "1"}
    assert parse("# comment\n\nNCCL_A=1=2\nnot a setting\n") == {"NCCL_A": "1=2"}


def test_nccl_file_read_write_and_remove(tmp_path):
    host = Host(str(tmp_path))
    fam = NcclFamily(host)
    (desired,) = fam.expand(HOST, {"nccl": {"env": {"NCCL_IB_TC": 106}}}, no_source)
    key = desired.key
    assert key == Key("nccl", HOST, "/etc/nccl.conf")
    assert desired.want == Want(HEADER + "NCCL_IB_TC=106\n")
    # No /etc under the root: unsupported, not "absent".
    assert isinstance(fam.read([key])[key], Unsupported)
    os.makedirs(tmp_path / "etc")
    assert fam.read([key]) == {key: None}
    fam.apply([(key, desired.want.value)])
    path = tmp_path / "etc/nccl.conf"
    assert path.read_text() == desired.want.value
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path / "etc") == ["nccl.conf"]  # no temp file left behind
    assert fam.read([key]) == {key: desired.want.value}
    fam.apply([(key, None)])  # "there was no file"
    assert not path.exists()


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/../etc/passwd", "/etc/nccl.conf/", "etc/nccl.conf",
                                  "/etc/nccl conf", "/etc//nccl.conf"])
def test_nccl_path_is_checked(tmp_path, path):
    with pytest.raises(InvalidInput):
        NcclFamily(Host(str(tmp_path))).expand(HOST, {"nccl": {"path": path, "env": {}}}, no_source)


# -- features -------------------------------------------------------------------

@pytest.mark.parametrize("alias, name", [
    ("gro", "rx-gro"), ("lro", "rx-lro"), ("rxhash", "rx-hashing"), ("ntuple", "rx-ntuple-filter"),
    ("rx", "rx-checksum"), ("gso", "tx-generic-segmentation"), ("rxvlan", "rx-vlan-hw-parse"),
    ("txvlan", "tx-vlan-hw-insert"),
    # Kernel names pass through; several-bit aliases stay as written.
    ("rx-gro", "rx-gro"), ("hw-tc-offload", "hw-tc-offload"), ("tso", "tso"), ("tx", "tx"), ("sg", "sg"),
])
def test_feature_alias_normalisation(cx7, alias, name):
    assert FeaturesFamily(cx7).key_name(alias) == name


@pytest.mark.parametrize("bad", ["GRO", "rx gro", "", "x" * 65, "rx-gro;reboot"])
def test_feature_names_are_checked(cx7, bad):
    with pytest.raises(InvalidInput):
        FeaturesFamily(cx7).key_name(bad)


def test_feature_aliases_name_real_kernel_bits(cx7):
    bits = set(cx7.kernel.features[P0]["active"])
    # ufo's bit left the kernel in 4.14; ethtool keeps the alias.
    assert set(FEATURE_ALIASES.values()) - bits == {"tx-udp-fragmentation"}
    key = Key("features", P0, "tx-udp-fragmentation")
    assert isinstance(FeaturesFamily(cx7).read([key])[key], Unsupported)


def test_tso_group_stands_for_the_changeable_bits(cx7):
    fam = FeaturesFamily(cx7)
    tso, gro, tx = (Key("features", P0, n) for n in ("tso", "rx-gro", "tx"))
    got = fam.read([tso, gro, tx])
    # mlx5: ecn and accecn segmentation are fixed off and left alone;
    # mangleid is changeable and off, so the group reads bit by bit.
    assert fam._bits(P0, "tso", False) == ["tx-tcp-accecn-segmentation", "tx-tcp-ecn-segmentation",
                                           "tx-tcp-mangleid-segmentation", "tx-tcp-segmentation",
                                           "tx-tcp6-segmentation"]
    assert got[tso] == {"tx-tcp-mangleid-segmentation": False, "tx-tcp-segmentation": True,
                        "tx-tcp6-segmentation": True}
    assert got[gro] is True
    assert got[tx] is True  # only tx-checksum-ip-generic is changeable
    assert fam.check(tso, Want(False)) is None

    fam.apply([(tso, False)])
    active = cx7.kernel.features[P0]["active"]
    assert cx7.kernel.writes[-1] == ("set_features", P0, {
        "tx-tcp-mangleid-segmentation": False, "tx-tcp-segmentation": False, "tx-tcp6-segmentation": False})
    assert fam.read([tso]) == {tso: False}
    # Restoring the mixed before-value puts each bit back.
    fam.apply([(tso, got[tso])])
    assert fam.read([tso]) == {tso: got[tso]}
    assert active["tx-tcp-ecn-segmentation"] is False


def test_fixed_and_unknown_features(maia):
    fam = FeaturesFamily(maia)
    rxvlan, lro, typo = Key("features", VF, "rx-vlan-hw-parse"), Key("features", VF, "rx-lro"), \
        Key("features", VF, "rx-hashin")
    got = fam.read([rxvlan, lro, typo, Key("features", "nope0", "rx-gro")])
    assert got[rxvlan] is True and got[lro] is False
    assert fam.check(rxvlan, Want(False)) == "rx-vlan-hw-parse is fixed on this device"
    assert fam.check(lro, Want(True)) == "rx-lro is fixed on this device"
    assert got[typo] == Unsupported("the device has no feature 'rx-hashin'; did you mean 'rx-hashing'?")
    assert got[Key("features", "nope0", "rx-gro")] == Unsupported(
        "no such interface, or it has no ethtool features")


def test_a_bit_the_kernel_does_not_change_is_a_refusal(cx7):
    fam = FeaturesFamily(cx7)
    key = Key("features", P0, "hw-tc-offload")
    fam.read([key])
    # The driver stops offering the bit between read and write (e.g. a
    # dependent feature changed): the kernel ACKs, and lists it as not applied.
    cx7.kernel.features[P0]["changeable"].discard("hw-tc-offload")
    with pytest.raises(ApplyRefused, match="did not change hw-tc-offload"):
        fam.apply([(key, True)])


# -- rings, channels, coalesce ---------------------------------------------------

def test_ring_and_channel_limits_come_from_the_device(cx7, maia):
    rings, channels = RingsFamily(cx7), ChannelsFamily(cx7)
    rx = Key("rings", P0, "rx")
    assert rings.read([rx, Key("rings", P0, "rx-mini")]) == {
        rx: 1024, Key("rings", P0, "rx-mini"): Unsupported("the driver does not report rings rx-mini")}
    assert rings.check(rx, Want(8192)) is None
    assert rings.check(rx, Want(8193)) == "rings rx 8193 is above the device maximum 8192"
    assert rings.check(rx, Want(16384, "min")) == "rings rx 16384 is above the device maximum 8192"
    combined = Key("channels", P0, "combined")
    channels.read([combined, Key("channels", P0, "rx")])
    assert channels.check(combined, Want(64)) is None
    assert channels.check(combined, Want(65)) == "channels combined 65 is above the device maximum 64"
    assert channels.read([Key("channels", P0, "rx")]) == {
        Key("channels", P0, "rx"): Unsupported("the driver does not report channels rx")}

    mana_rings = RingsFamily(maia)
    tx = Key("rings", VF, "tx")
    mana_rings.read([tx])
    assert mana_rings.check(tx, Want(16384)) is None  # MANA's tx maximum is twice rx's
    assert mana_rings.check(tx, Want(16385)) == "rings tx 16385 is above the device maximum 16384"
    # MANA rounds ring sizes up to a power of two: an exact 1000 would read
    # back as 1024 and fail verification, so it is refused before writing.
    assert mana_rings.check(tx, Want(1000)) == (
        "not supported by mana: tx rings are a power of two of at least 128; 1000 would "
        "become 1024: ask for 1024, or {min: 1000}")
    assert mana_rings.check(tx, Want(1000, "min")) is None
    assert mana_rings.check(tx, Want(1024)) is None
    # mlx5 rounds up as well (mlx5e_ethtool_set_ringparam: order_base_2).
    assert "1000 would become 1024" in rings.check(rx, Want(1000))


def test_a_driver_without_the_operation(maia):
    coalesce = CoalesceFamily(maia)
    key = Key("coalesce", VF, "adaptive-rx")
    assert coalesce.read([key]) == {key: Unsupported("the driver does not support coalesce settings")}
    assert coalesce.check(key, Want(True)) is None  # no limits: the read said it all
    assert coalesce.show(VF) == {}


def test_params_apply_one_message_per_device(cx7):
    rings = RingsFamily(cx7)
    keys = [Key("rings", P0, "rx"), Key("rings", P0, "tx"), Key("rings", "eth0", "rx")]
    rings.read(keys)
    rings.apply([(keys[0], 4096), (keys[1], 2048), (keys[2], 1024)])
    assert cx7.kernel.writes == [("set_rings", P0, {"rx": 4096, "tx": 2048}),
                                 ("set_rings", "eth0", {"rx": 1024})]
    assert rings.read(keys) == dict(zip(keys, (4096, 2048, 1024)))


# -- link -----------------------------------------------------------------------

def test_mtu_limits_come_from_the_device(cx7):
    fam = LinkFamily(cx7)
    mtu, lo_mtu = Key("link", P0, "mtu"), Key("link", "lo", "mtu")
    got = fam.read([mtu, Key("link", P0, "state"), Key("link", P0, "txqueuelen"), lo_mtu,
                    Key("link", "nope0", "mtu")])
    assert got[mtu] == 1500 and got[Key("link", P0, "state")] == "up"
    assert got[Key("link", P0, "txqueuelen")] == 1000
    assert got[Key("link", "nope0", "mtu")] == Unsupported("no such interface")
    assert fam.check(mtu, Want(9978)) is None
    assert fam.check(mtu, Want(9000, "min")) is None
    assert fam.check(mtu, Want(9979)) == "MTU 9979 is above the device maximum 9978"
    assert fam.check(Key("link", "eth0", "mtu"), Want(9216)) == "MTU 9216 is above the device maximum 9190"
    # loopback reports min/max 0: no bound at all.
    assert fam.check(lo_mtu, Want(65535)) is None
    assert fam.check(Key("link", P0, "txqueuelen"), Want(10 ** 9)) is None


def test_link_apply_is_one_request_per_device(cx7):
    fam = LinkFamily(cx7)
    keys = {n: Key("link", "enp23s0f1np1", n) for n in ("mtu", "txqueuelen", "state")}
    fam.read(list(keys.values()))
    fam.apply([(keys["mtu"], 9000), (keys["txqueuelen"], 10000), (keys["state"], "up")])
    assert cx7.kernel.writes == [("set_link", "enp23s0f1np1", {"mtu": 9000, "txqlen": 10000, "up": True})]
    assert fam.read(list(keys.values())) == {keys["mtu"]: 9000, keys["txqueuelen"]: 10000, keys["state"]: "up"}
