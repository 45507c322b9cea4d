"""NCCL_IB_HCA / NCCL_IB_GID_INDEX `auto` (nictune.host.facts.ibauto) on real GID
tables: two soft-RoCE (rdma_rxe) links in the test VM, checked against sysfs
read independently (rxe.sysfs_gid_table).  Only the profile's interface is
taken, and an address change that moves the IPv4 GID to another index is
explained by gid_index_problem and followed by a new resolve."""

from __future__ import annotations

import time

from nictune.host.facts import ibauto
from nictune.host.machine import Host
from rxe import GID_WAIT, ipv4_mapped_gid, leftovers, sh, soft_roce, sysfs_gid_table

V6 = "2001:db8:10::1"
V6_GID = "2001:0db8:0010:0000:0000:0000:0000:0001"
BOTH = {"NCCL_IB_HCA": "auto", "NCCL_IB_GID_INDEX": "auto"}


def wait_for(ibdev: str, ok, what: str) -> list:
    """The GID table once ok(table) holds (rxe fills it from a workqueue)."""
    deadline = time.monotonic() + GID_WAIT
    while True:
        table = sysfs_gid_table(ibdev)
        if ok(table):
            return table
        if time.monotonic() > deadline:
            raise AssertionError(f"{ibdev}: {what} after {GID_WAIT:.0f} s: {table}")
        time.sleep(0.5)


def v2_index(table: list, gid: str):
    return min((i for i, g, kind, _ in table if g == gid and kind == "RoCE v2"), default=None)


def test_auto_takes_the_profiles_link_and_follows_an_address_change():
    with soft_roce("198.18.10.1", "198.18.10.2") as rail, \
            soft_roce("198.18.10.5", "198.18.10.6") as other:
        host = Host("/")
        v4 = ipv4_mapped_gid(rail.address)
        before = v2_index(sysfs_gid_table(rail.ibdev), v4)

        env, note = ibauto.resolve_auto(host, dict(BOTH), [rail.ifname])
        assert env == {"NCCL_IB_HCA": f"={rail.ibdev}:1", "NCCL_IB_GID_INDEX": before}, note
        assert other.ibdev not in note
        both, _ = ibauto.resolve_auto(host, {"NCCL_IB_HCA": "auto"}, [rail.ifname, other.ifname])
        assert sorted(both["NCCL_IB_HCA"][1:].split(",")) == sorted([f"{rail.ibdev}:1", f"{other.ibdev}:1"])
        written = {"NCCL_IB_HCA": env["NCCL_IB_HCA"], "NCCL_IB_GID_INDEX": str(before)}
        assert ibauto.gid_index_problem(host, written, [rail.ifname]) == ""

        # The IPv4 address goes; an IPv6 one comes first; the IPv4 one comes back.
        sh("ip", "addr", "del", f"{rail.address}/30", "dev", rail.ifname)
        wait_for(rail.ibdev, lambda t: v2_index(t, v4) is None, "the IPv4 GID is still there")
        time.sleep(3)  # the kernel frees the slot from a work item (cache.c free_gid_work)
        sh("ip", "-6", "addr", "add", f"{V6}/64", "dev", rail.ifname, "nodad")
        wait_for(rail.ibdev, lambda t: v2_index(t, V6_GID) is not None, "no IPv6 GID")
        sh("ip", "addr", "add", f"{rail.address}/30", "dev", rail.ifname)
        table = wait_for(rail.ibdev, lambda t: v2_index(t, v4) is not None, "no IPv4 GID again")
        after, v6_at = v2_index(table, v4), v2_index(table, V6_GID)
        print(f"{rail.ibdev}: IPv4 GID {before} -> {after}, IPv6 GID at {v6_at}")  # shown by -rA
        assert after != before, f"the IPv4 GID came back at the same index {before}: {table}"

        at_before = [(g, kind) for i, g, kind, _ in table if i == before]
        what = (f"the RoCE v2 IPv6 GID {V6}" if at_before == [(V6_GID, "RoCE v2")]
                else "an empty GID entry")
        assert ibauto.gid_index_problem(host, written, [rail.ifname]) == (
            f"NCCL_IB_GID_INDEX {before} points at {what} of {rail.ibdev} port 1 now; "
            f"the RoCE v2 IPv4 GID is at {after}"), table
        assert ibauto.resolve_auto(host, dict(BOTH), [rail.ifname])[0]["NCCL_IB_GID_INDEX"] == after
        v6_env, _ = ibauto.resolve_auto(host, dict(BOTH, NCCL_IB_ADDR_FAMILY="AF_INET6"), [rail.ifname])
        assert v6_env["NCCL_IB_GID_INDEX"] == v6_at
        ranged, _ = ibauto.resolve_auto(host, dict(BOTH, NCCL_IB_ADDR_RANGE="198.18.10.4/30"),
                                        [rail.ifname, other.ifname])
        assert ranged["NCCL_IB_HCA"] == f"={other.ibdev}:1"
    assert not leftovers(rail) and not leftovers(other)
