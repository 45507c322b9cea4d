"""Soft-RoCE on a real kernel (rdma_rxe in the test VM, tests/vm/run.py):
GID discovery, the rdma_cm RoCE mode and ToS through plan/apply/rollback,
and NCCL_IB_HCA / NCCL_IB_GID_INDEX `auto`, each checked against what the
kernel shows through other readers (sysfs read here, `cat`, `rdma -j`).

The CLI runs in-process through Typer's CliRunner on the guest itself
(LocalTarget): one Python process for everything, as guest userspace is
slow under emulation.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Iterator

import pytest
from typer.testing import CliRunner

from rxe import ipv4_mapped_gid, leftovers, sh, soft_roce, sysfs_gid_table
from nictune.host.facts import rdma
from nictune.cli.app import app
from nictune.host.machine import Host
from roce_gid import roce_v2_ipv4


def expected_gid_index(sr) -> int:
    """The lowest RoCE v2 GID of sr's IPv4 address on sr's netdev, from sysfs."""
    want = ipv4_mapped_gid(sr.address)
    return min(index for index, gid, kind, ndev in sysfs_gid_table(sr.ibdev)
               if gid == want and kind == "RoCE v2" and ndev == sr.ifname)


def nictune(*args: str) -> tuple:
    """(exit code, JSON report) of one nictune command."""
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


def changes(report: dict) -> dict:
    (host,) = report["hosts"]
    return {(c["key"]["family"], c["key"]["name"]): c for c in host["changes"]}


@contextlib.contextmanager
def cm_dir(cm: str, ibdev: str) -> Iterator[str]:
    """The device's rdma_cm configfs directory, held for the block (as
    mlnx-tools' cma_roce_mode does: the values outlive the rmdir)."""
    path = os.path.join(cm, ibdev)
    made = not os.path.isdir(path)
    if made:
        os.mkdir(path)
    try:
        yield os.path.join(path, "ports", "1")
    finally:
        if made:
            os.rmdir(path)


def cm_values(cm: str, ibdev: str) -> tuple:
    with cm_dir(cm, ibdev) as port:
        return tuple(sh("cat", os.path.join(port, name)).stdout.strip()
                     for name in ("default_roce_mode", "default_roce_tos"))


def test_discovery_matches_sysfs_and_the_rdma_tool(softroce):
    host = Host("/")
    assert softroce.ibdev in rdma.devices(host)
    assert rdma.ports(host, softroce.ibdev) == [1]
    assert rdma.link_layer(host, softroce.ibdev, 1) == "Ethernet"
    assert rdma.port_of(host, softroce.ifname) == (softroce.ibdev, 1)

    # The whole populated table, entry by entry, as sysfs shows it.
    ours = [(g.index, g.gid, g.type, g.ndev) for g in rdma.gids(host, softroce.ibdev, 1)]
    assert ours == sysfs_gid_table(softroce.ibdev)

    gid = roce_v2_ipv4(host, softroce.ibdev, 1, softroce.ifname)
    assert gid is not None
    assert (gid.index, gid.ipv4, gid.gid) == (
        expected_gid_index(softroce), softroce.address, ipv4_mapped_gid(softroce.address))

    links = json.loads(sh("rdma", "-j", "link", "show").stdout)
    (link,) = [entry for entry in links if entry["ifname"] == softroce.ibdev]
    assert (link["port"], link["netdev"], link["state"]) == (1, softroce.ifname, "ACTIVE")


def test_health_facts_give_what_fleet_agreement_compares(softroce):
    """The kinds of the port's GIDs built from the netdev (host/facts/health.py),
    as sysfs shows them."""
    from nictune.host.facts.health import Health

    host = Host("/")
    [iface] = [i for i in host.interfaces() if i.name == softroce.ifname]
    facts = Health(host).of(iface)
    kinds = {int(index): kind for index, kind in facts["roce_gids"].items()}
    table = [row for row in sysfs_gid_table(softroce.ibdev) if row[3] == softroce.ifname]
    assert table and set(kinds) == {index for index, _, _, _ in table}
    assert kinds[expected_gid_index(softroce)] == "RoCE v2 IPv4"
    for index, gid, kind, _ in table:
        assert kinds[index].startswith("RoCE v2" if kind == "RoCE v2" else "RoCE v1"), (index, kind)
        assert kinds[index].endswith("IPv4") == gid.startswith("0000:0000:0000:0000:0000:ffff:"), (index, gid)


def roce_profile(tmp_path, sr, mode: str, tos: int) -> str:
    path = tmp_path / f"roce-{mode}-{tos}.yaml"
    path.write_text(
        "nictune: 1\n"
        "interfaces:\n"
        "  rail:\n"
        f"    match: {{name: {sr.ifname}}}\n"
        f"    roce: {{mode: {mode}, tos: {tos}}}\n")
    return str(path)


def test_roce_mode_and_tos_plan_apply_read_back_rollback(softroce, rdma_cm, tmp_path):
    # rxe is RoCE v2 only (its GIDs are all v2), so mode is already as
    # wanted and the ToS carries the change.
    assert cm_values(rdma_cm, softroce.ibdev) == ("RoCE v2", "0")
    profile = roce_profile(tmp_path, softroce, "v2", 106)
    state = ["--state-dir", str(tmp_path / "state")]

    code, report = nictune("plan", profile, *state)
    assert code == 2, report
    mode, tos = changes(report)[("roce", "mode")], changes(report)[("roce", "tos")]
    assert (mode["before"], mode["after"], mode["status"]) == ("v2", "v2", "ok")
    assert (tos["before"], tos["after"], tos["status"]) == (0, 106, "pending")
    assert tos["note"].startswith(f"rdma_cm {softroce.ibdev} port 1")
    assert cm_values(rdma_cm, softroce.ibdev) == ("RoCE v2", "0")  # plan wrote nothing

    code, report = nictune("apply", profile, *state)
    assert code == 0, report
    assert changes(report)[("roce", "tos")]["status"] == "applied"
    assert cm_values(rdma_cm, softroce.ibdev) == ("RoCE v2", "106")

    code, report = nictune("verify", profile, *state)
    assert code == 0, report

    code, report = nictune("rollback", *state)
    assert code == 0, report
    assert cm_values(rdma_cm, softroce.ibdev) == ("RoCE v2", "0")
    # nictune held the configfs directory only while it used it.
    assert not os.path.exists(os.path.join(rdma_cm, softroce.ibdev))


def test_a_mode_the_device_refuses_rolls_the_apply_back(softroce, rdma_cm, tmp_path):
    """The kernel answers EINVAL to RoCE v1 on rxe: the apply fails and the
    ToS it may already have written is restored."""
    profile = roce_profile(tmp_path, softroce, "v1", 96)
    code, report = nictune("apply", profile, "--state-dir", str(tmp_path / "state"))
    assert code == 3, report
    (host,) = report["hosts"]
    assert host["error"]["kind"] == "rolled-back", host["error"]
    assert "default_roce_mode" in host["error"]["message"], host["error"]
    assert cm_values(rdma_cm, softroce.ibdev) == ("RoCE v2", "0")


def test_nccl_auto_resolves_to_the_discovered_device_and_gid(softroce, tmp_path):
    conf = tmp_path / "nccl.conf"
    profile = tmp_path / "nccl.yaml"
    profile.write_text(
        "nictune: 1\n"
        "host:\n"
        "  nccl:\n"
        f"    path: {conf}\n"
        f"    allowed_dirs: [{tmp_path}]\n"
        "    env: {NCCL_IB_HCA: auto, NCCL_IB_GID_INDEX: auto, NCCL_IB_TC: 106}\n")

    code, report = nictune("plan", str(profile), "--state-dir", str(tmp_path / "state"))
    assert code == 2, report
    change = changes(report)[("nccl", str(conf))]
    env = dict(line.split("=", 1) for line in change["after"].splitlines()
               if line and not line.startswith("#"))
    index = expected_gid_index(softroce)
    assert env == {"NCCL_IB_HCA": f"={softroce.ibdev}:1", "NCCL_IB_GID_INDEX": str(index),
                   "NCCL_IB_TC": "106"}
    assert f"{softroce.ibdev} port 1 GID {index} (RoCE v2, {softroce.address})" in change["note"]
    assert not conf.exists()


def test_teardown_removes_everything_even_after_a_failure():
    with pytest.raises(RuntimeError, match="test body failed"):
        with soft_roce("198.18.0.5", "198.18.0.6") as sr:
            present = leftovers(sr)
            raise RuntimeError("test body failed")
    assert len(present) == 4, present  # sysfs device, rdma link, netdev, namespace
    assert leftovers(sr) == []
