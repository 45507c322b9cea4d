"""NCCL_IB_HCA / NCCL_IB_GID_INDEX `auto` and GID-index drift (nictune.host.facts.ibauto)
on sysfs fixture trees that stand in for RDMA hardware no kernel here has:
tests/fixtures/ibauto-host (two rails, a storage port, a front-end port whose
IPv4 GID index differs; see its README) and tests/fixtures/mana-host."""

from __future__ import annotations

import ipaddress
import os

import pytest

from fakes import FakeHost, load_state
from nictune.host.facts import ibauto
from nictune.host.facts.ibauto import AutoUnresolved, gid_index_problem, resolve_auto
from nictune.host.transaction.engine import Engine
from nictune.host.knobs.nccl import parse
from nictune.host.validate import InvalidInput

RAIL0, RAIL1, STORAGE, FRONT = "enp23s0f0np0", "enp23s0f1np1", "enp41s0f0np0", "enp65s0f0np0"
RAILS = [RAIL0, RAIL1]
BOTH = {"NCCL_IB_HCA": "auto", "NCCL_IB_GID_INDEX": "auto"}


def _link(index: int, name: str, up: bool = True) -> dict:
    return {"index": index, "name": name, "mtu": 9000, "min_mtu": 68, "max_mtu": 9978,
            "txqlen": 1000, "up": up, "operstate": "UP" if up else "DOWN",
            "mac": f"0c:42:a1:5e:10:{index:02x}", "kind": None,
            "num_rx_queues": 8, "num_tx_queues": 8}


def make_host(tmp_path, down=()) -> FakeHost:
    names = ["eth0", RAIL0, RAIL1, STORAGE, FRONT]
    links = [_link(1, "lo")] + [_link(i + 2, n, up=n not in down) for i, n in enumerate(names)]
    return FakeHost({"tree": "ibauto-host", "links": links}, tmp_path / "root")


@pytest.fixture
def host(tmp_path):
    return make_host(tmp_path)


def set_gid(host, device: str, index: int, address, kind: str = "RoCE v2", ndev: str = RAIL0):
    """Rewrite one GID entry as the kernel does when an address comes or
    goes (address None: the entry is unpopulated again)."""
    port = host.path("sys/class/infiniband", device, "ports", "1")
    attrs = [os.path.join(port, "gid_attrs", part, str(index)) for part in ("types", "ndevs")]
    if address is None:
        text = "0000:" * 7 + "0000"
        for path in attrs:
            if os.path.exists(path):
                os.unlink(path)
    else:
        ip = ipaddress.ip_address(address)
        text = (ipaddress.IPv6Address("::ffff:" + address) if ip.version == 4 else ip).exploded
        for path, value in zip(attrs, (kind, ndev)):
            with open(path, "w") as f:
                f.write(value + "\n")
    with open(os.path.join(port, "gids", str(index)), "w") as f:
        f.write(text + "\n")


# -- which ports ---------------------------------------------------------------------

def test_without_interfaces_every_up_roce_port_is_taken(host):
    """interfaces=None keeps the behaviour from before the profile's interfaces
    were known: storage and front-end ports too, and so no common index."""
    env, note = resolve_auto(host, {"NCCL_IB_HCA": "auto"})
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert note.startswith("auto: mlx5_0 port 1 GID 3 (RoCE v2, 198.18.0.1), ")
    with pytest.raises(AutoUnresolved) as e:
        resolve_auto(host, BOTH)
    assert "mlx5_3 port 1 (enp65s0f0np0) has it at 5" in e.value.message
    assert "leave NCCL_IB_GID_INDEX unset" in e.value.message


def test_auto_takes_only_the_profiles_interfaces(host):
    env, note = resolve_auto(host, dict(BOTH, NCCL_IB_TC=106), RAILS)
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": 3, "NCCL_IB_TC": 106}
    assert note == ("auto from enp23s0f0np0, enp23s0f1np1: mlx5_0 port 1 GID 3 (RoCE v2, 198.18.0.1), "
                    "mlx5_1 port 1 GID 3 (RoCE v2, 198.18.0.5)")


def test_ports_come_out_in_device_order_whatever_the_interface_order(host):
    env, _ = resolve_auto(host, {"NCCL_IB_HCA": "auto"}, [FRONT, RAIL1, RAIL0])
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_3:1"


def test_interfaces_down_absent_or_without_rdma_are_left_out_and_said(tmp_path):
    host = make_host(tmp_path, down=[RAIL1])
    env, note = resolve_auto(host, BOTH, [RAIL0, RAIL1, "eth0", "bond7"])
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1" and env["NCCL_IB_GID_INDEX"] == 3
    assert note.endswith("; left out: enp23s0f1np1 (down), eth0 (no RDMA port), bond7 (not on this host)")


def test_no_port_under_the_interfaces_is_unresolved_naming_them(host):
    with pytest.raises(AutoUnresolved) as e:
        resolve_auto(host, {"NCCL_IB_HCA": "auto"}, ["eth0"])
    assert "none of the profile's interfaces has a RoCE port" in e.value.message
    assert "eth0 (no RDMA port)" in e.value.message
    with pytest.raises(AutoUnresolved, match="matched no interface here"):
        resolve_auto(host, {"NCCL_IB_HCA": "auto"}, [])


def test_a_port_found_by_its_device_when_it_has_no_gids_yet(host):
    """No address, no GIDs: the RDMA device on the interface's PCI function is
    still the interface's port, and left out for want of a GID."""
    for n in range(6):
        set_gid(host, "mlx5_1", n, None)
    env, note = resolve_auto(host, {"NCCL_IB_HCA": "auto"}, RAILS)
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert note.endswith("left out: enp23s0f1np1 (mlx5_1 port 1 has no RoCE v2 IPv4 GID)")


def test_a_vlan_gid_on_the_port_counts_as_nccl_reads_the_whole_table(host):
    set_gid(host, "mlx5_0", 2, "198.18.0.9", "IB/RoCE v1", ndev=RAIL0 + ".100")
    set_gid(host, "mlx5_0", 3, "198.18.0.9", "RoCE v2", ndev=RAIL0 + ".100")
    env, note = resolve_auto(host, BOTH, RAILS)
    assert env["NCCL_IB_GID_INDEX"] == 3 and "GID 3 (RoCE v2, 198.18.0.9)" in note


@pytest.fixture
def mana(tmp_path):
    """hv_netvsc eth0 with its MANA VF; mana_ib's GIDs are eth0's."""
    state = load_state("maia-host")
    state["tree"] = "mana-host"
    return FakeHost(state, tmp_path / "mana")


def test_mana_vf_takes_the_port_whose_gids_its_netvsc_master_owns(mana):
    vf = os.path.realpath(mana.path("sys/class/net/enP30832p0s0"))
    # What netdev_master_upper_dev_link makes: /sys/class/net/<vf>/master.
    os.symlink("../../../../../../../../devices/VMBUS:00/0001/net/eth0", os.path.join(vf, "master"))
    for interfaces in (["enP30832p0s0"], ["eth0"], ["eth0", "enP30832p0s0"]):
        env, note = resolve_auto(mana, BOTH, interfaces)
        assert env["NCCL_IB_HCA"] == "=mana_0:1" and env["NCCL_IB_GID_INDEX"] == 1, interfaces
        assert note.endswith("mana_0 port 1 GID 1 (RoCE v2, 198.18.1.4)")


def test_mana_vf_without_a_master_link_falls_back_to_its_device(mana):
    env, _ = resolve_auto(mana, BOTH, ["enP30832p0s0"])
    assert env["NCCL_IB_HCA"] == "=mana_0:1"


def test_roce_lag_port_is_found_through_the_bond_master(host):
    """RoCE LAG: one device, mlx5_bond_0, under the first PF, with its GIDs
    built on bond0; the second slave reaches it only through its master."""
    ib = host.path("sys/class/infiniband")
    os.unlink(os.path.join(ib, "mlx5_1"))
    os.rename(os.path.join(ib, "mlx5_0"), os.path.join(ib, "mlx5_bond_0"))
    ndevs = os.path.join(ib, "mlx5_bond_0", "ports", "1", "gid_attrs", "ndevs")
    for n in os.listdir(ndevs):
        with open(os.path.join(ndevs, n), "w") as f:
            f.write("bond0\n")
    for rail in RAILS:
        os.symlink("../../../../../virtual/net/bond0",
                   os.path.join(os.path.realpath(host.path("sys/class/net", rail)), "master"))
    env, note = resolve_auto(host, BOTH, [RAIL1])
    assert env == {"NCCL_IB_HCA": "=mlx5_bond_0:1", "NCCL_IB_GID_INDEX": 3}
    assert resolve_auto(host, BOTH, RAILS)[0]["NCCL_IB_HCA"] == "=mlx5_bond_0:1"


def test_interfaces_for_auto_prefers_roce_entries():
    assert ibauto.interfaces_for_auto(None) is None
    assert ibauto.interfaces_for_auto({"roce": [RAIL0], "all": [RAIL0, STORAGE]}) == [RAIL0]
    assert ibauto.interfaces_for_auto({"roce": [], "all": [STORAGE]}) == [STORAGE]


# -- which GID: NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE, NCCL_IB_ROCE_VERSION_NUM ---------------

def test_ipv6_family_takes_the_global_ipv6_roce_v2_gid(host):
    env, note = resolve_auto(host, dict(BOTH, NCCL_IB_ADDR_FAMILY="AF_INET6"), RAILS)
    assert env["NCCL_IB_GID_INDEX"] == 5
    assert note.startswith("auto (RoCE v2 IPv6 GID) from ") and "GID 5 (RoCE v2, 2001:db8:0:1::1)" in note
    # The storage port has only link-local IPv6 GIDs, which NCCL never selects.
    env, note = resolve_auto(host, dict(BOTH, NCCL_IB_ADDR_FAMILY="AF_INET6"), [RAIL0, STORAGE])
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert note.endswith("left out: enp41s0f0np0 (mlx5_2 port 1 has no RoCE v2 IPv6 GID)")


def test_address_range_selects_ports_and_gids_inside_it(host):
    env, _ = resolve_auto(host, dict(BOTH, NCCL_IB_ADDR_RANGE="198.19.0.0/16"))
    assert env["NCCL_IB_HCA"] == "=mlx5_2:1" and env["NCCL_IB_GID_INDEX"] == 3
    # The front-end's 198.18.1.1 is outside 198.18.0.0/24; host bits are masked as NCCL does.
    env, _ = resolve_auto(host, dict(BOTH, NCCL_IB_ADDR_RANGE="198.18.0.77/24"))
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and env["NCCL_IB_GID_INDEX"] == 3
    env, _ = resolve_auto(host, dict(BOTH, NCCL_IB_ADDR_FAMILY="AF_INET6",
                                     NCCL_IB_ADDR_RANGE="2001:db8:0:9::/64"))
    assert env["NCCL_IB_HCA"] == "=mlx5_3:1" and env["NCCL_IB_GID_INDEX"] == 3


def test_roce_version_one_takes_the_v1_gid(host):
    env, _ = resolve_auto(host, dict(BOTH, NCCL_IB_ROCE_VERSION_NUM=1), RAILS)
    assert env["NCCL_IB_GID_INDEX"] == 2


def test_lowest_matching_index_wins_as_in_nccl(host):
    """ncclUpdateGidIndex keeps the first valid GID of the wanted family and
    version: a second address later in the table does not replace it."""
    set_gid(host, "mlx5_0", 6, "198.18.0.2", "IB/RoCE v1")
    set_gid(host, "mlx5_0", 7, "198.18.0.2", "RoCE v2")
    env, _ = resolve_auto(host, BOTH, RAILS)
    assert env["NCCL_IB_GID_INDEX"] == 3


@pytest.mark.parametrize("env, key, says", [
    ({"NCCL_IB_ADDR_FAMILY": "AF_INET4"}, "NCCL_IB_ADDR_FAMILY", "neither AF_INET nor AF_INET6"),
    ({"NCCL_IB_ADDR_FAMILY": "af_inet6"}, "NCCL_IB_ADDR_FAMILY", "quietly use AF_INET"),
    ({"NCCL_IB_ADDR_RANGE": "198.18.0.0"}, "NCCL_IB_ADDR_RANGE", "CIDR"),
    ({"NCCL_IB_ADDR_RANGE": "198.18.0.0/33"}, "NCCL_IB_ADDR_RANGE", "CIDR"),
    ({"NCCL_IB_ADDR_RANGE": "rails/16"}, "NCCL_IB_ADDR_RANGE", "CIDR"),
    ({"NCCL_IB_ADDR_RANGE": "2001:db8::/32"}, "NCCL_IB_ADDR_RANGE", "AF_INET (the default)"),
    ({"NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ADDR_RANGE": "198.18.0.0/15"},
     "NCCL_IB_ADDR_RANGE", "IPv4 range, but NCCL_IB_ADDR_FAMILY is AF_INET6"),
    ({"NCCL_IB_ROCE_VERSION_NUM": 3}, "NCCL_IB_ROCE_VERSION_NUM", "1 or 2"),
    ({"NCCL_IB_ROCE_VERSION_NUM": True}, "NCCL_IB_ROCE_VERSION_NUM", "1 or 2"),
])
def test_bad_family_range_or_version_is_an_error_naming_the_key(host, env, key, says):
    for extra in ({"NCCL_IB_GID_INDEX": "auto"}, {"NCCL_IB_GID_INDEX": 3}):
        with pytest.raises(InvalidInput) as e:
            resolve_auto(host, dict(env, **extra), RAILS)
        assert e.value.message.startswith(key) and says in e.value.message
    assert gid_index_problem(host, dict(env, NCCL_IB_GID_INDEX=3), RAILS).startswith(key)


def test_nothing_auto_leaves_the_env_alone(host):
    env = {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": 3}
    assert resolve_auto(host, env, RAILS) == (env, "")


# -- drift of a written index --------------------------------------------------------

def test_written_index_that_still_fits_is_no_problem(host):
    assert gid_index_problem(host, {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"}) == ""
    assert gid_index_problem(host, {"NCCL_IB_GID_INDEX": 3}, RAILS) == ""
    for unset in ({}, {"NCCL_IB_GID_INDEX": "auto"}, {"NCCL_IB_GID_INDEX": -1}):
        assert gid_index_problem(host, unset, RAILS) == ""


def test_index_made_stale_by_an_address_change_is_explained_and_re_resolved(host):
    written = {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"}
    # An IPv6 address came first this boot: IPv4 is now at 4/5 on mlx5_0.
    for n, (address, kind) in enumerate([("2001:db8:0:1::1", "IB/RoCE v1"), ("2001:db8:0:1::1", "RoCE v2"),
                                          ("198.18.0.1", "IB/RoCE v1"), ("198.18.0.1", "RoCE v2")], start=2):
        set_gid(host, "mlx5_0", n, address, kind)
    assert gid_index_problem(host, written) == (
        "NCCL_IB_GID_INDEX 3 points at the RoCE v2 IPv6 GID 2001:db8:0:1::1 of mlx5_0 port 1 now; "
        "the RoCE v2 IPv4 GID is at 5")
    # Each plan or verify resolves anew: auto now finds no common index.
    with pytest.raises(AutoUnresolved, match="mlx5_0 port 1 .enp23s0f0np0. has it at 5"):
        resolve_auto(host, BOTH, RAILS)
    assert resolve_auto(host, BOTH, [RAIL0])[0]["NCCL_IB_GID_INDEX"] == 5


def test_index_pointing_at_roce_v1_empty_or_out_of_range(host):
    set_gid(host, "mlx5_1", 3, "198.18.0.5", "IB/RoCE v1", ndev=RAIL1)
    set_gid(host, "mlx5_1", 5, "198.18.0.5", "RoCE v2", ndev=RAIL1)
    assert gid_index_problem(host, {"NCCL_IB_GID_INDEX": 3}, RAILS) == (
        "NCCL_IB_GID_INDEX 3 points at the RoCE v1 IPv4 GID 198.18.0.5 of mlx5_1 port 1 now; "
        "the RoCE v2 IPv4 GID is at 5")
    set_gid(host, "mlx5_0", 3, None)  # the address left while the link flapped
    set_gid(host, "mlx5_0", 2, None)
    problem = gid_index_problem(host, {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": 3})
    assert problem == ("NCCL_IB_GID_INDEX 3 points at an empty GID entry of mlx5_0 port 1 now; "
                       "it has no RoCE v2 IPv4 GID")
    problem = gid_index_problem(host, {"NCCL_IB_HCA": "mlx5_2", "NCCL_IB_GID_INDEX": 3,
                                       "NCCL_IB_ADDR_RANGE": "198.18.0.0/16"})
    assert problem == ("NCCL_IB_GID_INDEX 3 points at the RoCE v2 IPv4 GID 198.19.0.1 (outside "
                       "NCCL_IB_ADDR_RANGE 198.18.0.0/16) of mlx5_2 port 1 now; it has no RoCE v2 "
                       "IPv4 GID in 198.18.0.0/16")


def test_drift_checks_the_ports_the_interfaces_select_when_hca_is_not_a_list(host):
    env = {"NCCL_IB_HCA": "^mlx5_9", "NCCL_IB_GID_INDEX": 3}
    assert gid_index_problem(host, env, RAILS) == ""
    assert "of mlx5_3 port 1 now; the RoCE v2 IPv4 GID is at 5" in gid_index_problem(host, env, RAILS + [FRONT])
    assert "mlx5_3" in gid_index_problem(host, env)  # interfaces=None: every up RoCE port


def test_other_libraries_get_the_same_ports_and_their_own_key_in_messages(tmp_path):
    """UCX/NVSHMEM `auto` use roce_rails and common_gid_index with their names."""
    host = make_host(tmp_path)
    wanted = ibauto.wanted_from({})
    ports, left_out = ibauto.roce_rails(host, wanted, [RAIL0, RAIL1, "eth0"], "UCX_NET_DEVICES")
    assert [(p.device, p.port, p.via) for p in ports] == [("mlx5_0", 1, RAIL0), ("mlx5_1", 1, RAIL1)]
    assert left_out == ["eth0 (no RDMA port)"]
    assert ibauto.common_gid_index(ports, wanted, "UCX_IB_GID_INDEX") == 3
    ports, _ = ibauto.roce_rails(host, wanted, [RAIL0, FRONT], "UCX_NET_DEVICES")
    with pytest.raises(AutoUnresolved) as e:
        ibauto.common_gid_index(ports, wanted, "UCX_IB_GID_INDEX")
    assert e.value.message.startswith("UCX_IB_GID_INDEX: auto needs one RoCE v2 IPv4 GID index")
    assert "NCCL" not in e.value.message
    with pytest.raises(AutoUnresolved, match="^NVSHMEM_HCA_LIST: auto found no RoCE port"):
        ibauto.roce_rails(host, wanted, ["eth0"], "NVSHMEM_HCA_LIST")


# -- through the engine: the profile's roce: entries decide the ports, and a
# verify after an address change reports the written index as drift --------

def _profile(rails: str, env: dict) -> dict:
    return {"nictune": 1,
            # The fixture has no rdma_cm configfs: the ToS is skipped, the
            # roce: section still says which interfaces are rails.
            "interfaces": {"rails": {"match": {"name": rails}, "roce": {"tos": 106},
                                     "on_unsupported": {"roce": "skip"}},
                           "storage": {"match": {"name": STORAGE}, "mtu": 9000}},
            "host": {"nccl": {"env": env}}}


def _nccl(outcome):
    return next(c for c in outcome.changes if c.key.family == "nccl")


def test_auto_names_only_the_ports_under_the_roce_entries(tmp_path):
    host = make_host(tmp_path)
    os.makedirs(host.path("etc"), exist_ok=True)
    out = Engine(host, str(tmp_path / "s")).plan(
        _profile("enp23s0f*", {"NCCL_IB_HCA": "auto", "NCCL_IB_GID_INDEX": "auto"}), {})
    env = parse(_nccl(out).after)
    # Not mlx5_2 (storage, matched by an entry without roce:) nor mlx5_3.
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"}
    assert RAIL0 in _nccl(out).note and RAIL1 in _nccl(out).note
    assert STORAGE not in _nccl(out).note.split("auto from ")[1].split(":")[0]


def test_a_written_index_that_went_stale_is_drift_with_the_reason(tmp_path):
    host = make_host(tmp_path)
    os.makedirs(host.path("etc"), exist_ok=True)
    engine = Engine(host, str(tmp_path / "s"))
    profile = _profile(FRONT, {"NCCL_IB_GID_INDEX": "auto"})
    applied = engine.apply(profile, {}, "p.yaml")
    assert applied.error is None and parse(_nccl(applied).after)["NCCL_IB_GID_INDEX"] == "5"
    assert _nccl(engine.plan(profile, {}, "verify")).status == "ok"
    # The front-end port's IPv4 address goes; an IPv6 GID takes its index,
    # and the IPv4 address comes back at another one.
    set_gid(host, "mlx5_3", 5, "2001:db8:0:9::2", ndev=FRONT)
    set_gid(host, "mlx5_3", 7, "198.18.1.1", ndev=FRONT)
    stale = _nccl(engine.plan(profile, {}, "verify"))
    assert stale.status == "drift"
    assert parse(stale.after)["NCCL_IB_GID_INDEX"] == "7"
    assert "NCCL_IB_GID_INDEX 5 points at the RoCE v2 IPv6 GID" in stale.note


def test_a_bad_address_range_refuses_the_command_naming_where(tmp_path):
    from nictune.host.errors import InvalidInput as Refused

    host = make_host(tmp_path)
    profile = _profile("enp23s0f*", {"NCCL_IB_GID_INDEX": "auto", "NCCL_IB_ADDR_RANGE": "198.18.0.0/99"})
    with pytest.raises(Refused) as e:
        Engine(host, str(tmp_path / "s")).plan(profile, {"host/nccl/env": "p.yaml:9"})
    assert e.value.message.startswith("p.yaml:9: NCCL_IB_ADDR_RANGE")


def test_ucx_files_index_that_went_stale_is_drift_with_the_reason(tmp_path):
    # The same GID move as above, under UCX's file: verify names UCX's key.
    host = make_host(tmp_path)
    os.makedirs(host.path("etc/ucx"), exist_ok=True)
    engine = Engine(host, str(tmp_path / "s"))
    profile = _profile(FRONT, {})
    profile["host"] = {"ucx": {"env": {"UCX_IB_GID_INDEX": "auto", "UCX_NET_DEVICES": "auto"}}}
    applied = engine.apply(profile, {}, "p.yaml")
    ucx = next(c for c in applied.changes if c.key.family == "ucx")
    assert applied.error is None and "UCX_IB_GID_INDEX=5" in ucx.after, ucx
    fresh = next(c for c in engine.plan(profile, {}, "verify").changes if c.key.family == "ucx")
    assert fresh.status == "ok" and "points at" not in (fresh.note or "")
    set_gid(host, "mlx5_3", 5, "2001:db8:0:9::2", ndev=FRONT)
    set_gid(host, "mlx5_3", 7, "198.18.1.1", ndev=FRONT)
    stale = next(c for c in engine.plan(profile, {}, "verify").changes if c.key.family == "ucx")
    assert stale.status == "drift"
    assert "UCX_IB_GID_INDEX 5 points at the RoCE v2 IPv6 GID" in stale.note, stale.note
