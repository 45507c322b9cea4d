"""PCIe path and GPUDirect RDMA readiness (host/facts/pcie.py, knobs/pcie.py) on
a /sys tree whose GPU and ACS registers are recordings of real hosts
(tests/unit/pcie_tree.py says which).  The real kernel and config space
run in tests/vm/guest/test_pcie.py (QEMU q35 with a PCIe switch)."""

from __future__ import annotations

import os
import random

import pcie_tree as tree
import pytest
from fakes import FixtureHost

from nictune.host import model as m
from nictune.host.facts.pcie import Config, Pcie, gpu_registration, iommu_mode
from nictune.host.machine import Interface
from nictune.host.transaction.engine import Engine

IF = "ibp219s0"


class TreeHost(FixtureHost):
    """FixtureHost whose interface list survives the engine's refresh of it."""

    def __init__(self, root: str, interfaces: list):
        super().__init__(root, interfaces)
        self.tree_interfaces = interfaces

    def interfaces(self):
        return self.tree_interfaces


def host_at(root) -> FixtureHost:
    iface = Interface(name=IF, index=4, driver="mlx5_core", mac=None, pci_id="15b3:1021",
                      bus_info=tree.NIC, firmware="28.39.1002")
    return TreeHost(str(root), [iface])


def doc(pcie: dict) -> dict:
    return {"nictune": 1, "interfaces": {"rails": {"match": {"driver": "mlx5_core"}, "pcie": pcie}}}


def changes(out) -> dict:
    return {c.key.name: c for c in out.changes}


def config_word(root, address: str, offset: int) -> int:
    with open(os.path.join(root, "sys/bus/pci/devices", address, "config"), "rb") as f:
        data = f.read()
    return int.from_bytes(data[offset:offset + 2], "little")


@pytest.fixture
def dgx(tmp_path):
    tree.build(str(tmp_path), IF)
    return tmp_path


def test_the_path_the_nearest_gpu_and_the_recorded_registers(dgx):
    pcie = Pcie(host_at(dgx))
    assert pcie.nic_address(IF) == tree.NIC
    assert pcie.path(tree.NIC) == [tree.ROOT0, tree.SW_UP, tree.SW_DOWN_NIC, tree.NIC]
    gpus = pcie.gpus()
    assert [(g.index, g.address, g.numa_node) for g in gpus] == [(0, tree.GPU_FAR, 3), (1, tree.GPU_NEAR, 5)]
    near, relation = pcie.nearest_gpus(tree.NIC)
    assert ([g.address for g in near], relation) == ([tree.GPU_NEAR], "switch")
    assert pcie.bridges_between(tree.NIC, near[0]) == [tree.SW_DOWN_NIC, tree.SW_DOWN_GPU]
    # The A100's DevCtl as lspci -vvv showed it: RlxdOrd+, MaxReadReq 512 bytes.
    assert (pcie.max_read_request(tree.GPU_NEAR), pcie.relaxed_ordering(tree.GPU_NEAR)) == (512, True)
    assert pcie.acs(tree.SW_DOWN_NIC) == (tree.PORT_ACS + 6, tree.ACS_RECORDED)
    assert pcie.ats_enabled(tree.NIC) is True and pcie.ats_enabled(tree.GPU_NEAR) is None


def test_plan_explains_each_failure_by_the_traffic_it_hurts(dgx):
    out = Engine(host_at(dgx), str(dgx / "state")).plan(doc({
        "max_read_request": 4096, "relaxed_ordering": True, "acs_redirect": False,
        "ats": True, "link_at_max": True, "gpu_memory_registration": "any"}), {})
    got = changes(out)
    acs = got["acs_redirect"]
    assert acs.status == m.PENDING
    assert acs.before == (f"{tree.SW_DOWN_NIC}=ReqRedir,CmpltRedir,UpstreamFwd; "
                          f"{tree.SW_DOWN_GPU}=ReqRedir,CmpltRedir,UpstreamFwd")
    assert acs.note.startswith(
        f"ACS ReqRedir/CmpltRedir/UpstreamFwd on the port {tree.SW_DOWN_NIC} between {IF} and "
        f"GPU 1 ({tree.GPU_NEAR}); ACS ReqRedir/CmpltRedir/UpstreamFwd on the port "
        f"{tree.SW_DOWN_GPU} between {IF} and GPU 1 ({tree.GPU_NEAR}): GPUDirect RDMA traffic "
        "goes through the root complex; takes effect now")
    assert (got["max_read_request"].status, got["max_read_request"].before) == (m.PENDING, 512)
    assert got["relaxed_ordering"].status == m.OK
    assert got["ats"].status == m.OK
    assert got["link_at_max"].status == m.OK and got["link_at_max"].note.startswith("6 hop(s)")
    reg = got["gpu_memory_registration"]
    assert (reg.status, reg.before) == (m.DRIFT, "none")
    assert "NCCL stages every transfer through host memory" in reg.note


def test_apply_writes_the_exact_registers_and_rollback_restores_them(dgx):
    engine = Engine(host_at(dgx), str(dgx / "state"))
    devctl_at = tree.NIC_PCIE_CAP + 8
    before = {a: config_word(dgx, a, tree.PORT_ACS + 6) for a in (tree.SW_DOWN_NIC, tree.SW_DOWN_GPU)}
    out = engine.apply(doc({"max_read_request": 4096, "acs_redirect": False}), {}, "p.yaml")
    assert out.error is None, out.error
    assert config_word(dgx, tree.NIC, devctl_at) == (0x2037 & ~0x7000) | (5 << 12)
    for port in before:  # only the redirect bits went; SrcValid stays
        assert config_word(dgx, port, tree.PORT_ACS + 6) == 0x0001
    assert config_word(dgx, tree.SW_UP, tree.PORT_ACS + 6) == 0  # not between them: untouched
    assert config_word(dgx, tree.ROOT1, tree.PORT_ACS + 6) == 0
    verify = changes(engine.plan(doc({"max_read_request": 4096, "acs_redirect": False}), {}, "verify"))
    assert {k: c.status for k, c in verify.items()} == {"max_read_request": m.OK, "acs_redirect": m.OK}
    engine.rollback()
    assert config_word(dgx, tree.NIC, devctl_at) == 0x2037
    assert {a: config_word(dgx, a, tree.PORT_ACS + 6) for a in before} == before


def test_a_degraded_hop_is_named_with_what_it_caps(tmp_path):
    tree.build(str(tmp_path), IF, nic_link=tree.link("16.0 GT/s PCIe", 8, "32.0 GT/s PCIe", 16))
    got = changes(Engine(host_at(tmp_path), str(tmp_path / "state")).plan(doc({"link_at_max": True}), {}))
    link = got["link_at_max"]
    assert (link.status, link.before) == (m.DRIFT, False)
    assert link.note.startswith(f"{tree.NIC} at 16.0 GT/s of 32.0 GT/s, x8 of x16: RDMA and "
                                f"GPUDirect traffic of {IF} is capped by the slowest hop")


def test_a_host_without_a_gpu_near_the_nic_says_so(tmp_path):
    tree.build(str(tmp_path), IF)
    for gpu in (tree.GPU_NEAR, tree.GPU_FAR):
        os.unlink(tmp_path / "sys/bus/pci/devices" / gpu)
    got = changes(Engine(host_at(tmp_path), str(tmp_path / "state")).plan(doc({"acs_redirect": False}), {}))
    assert got["acs_redirect"].status == m.UNSUPPORTED
    assert "no GPU shares a PCIe switch, root complex or NUMA node with ibp219s0" in got["acs_redirect"].note


def test_the_header_alone_is_root_only_not_a_traceback(tmp_path):
    tree.build(str(tmp_path), IF)
    path = tmp_path / "sys/bus/pci/devices" / tree.SW_DOWN_NIC / "config"
    path.write_bytes(path.read_bytes()[:64])  # what a non-root reader gets
    got = changes(Engine(host_at(tmp_path), str(tmp_path / "state")).plan(doc({"acs_redirect": False}), {}))
    assert got["acs_redirect"].status == m.UNSUPPORTED
    assert "only 64 bytes of its configuration space are readable (reading more needs root)" in (
        got["acs_redirect"].note)


def test_broken_capability_lists_end_the_walk_with_a_reason():
    looped = tree.nic_config()
    looped[0x60 + 1] = 0x60  # PM points at itself
    with pytest.raises(ValueError, match="capability list is broken at 0x60"):
        Config("x", bytes(looped)).capability(0x10)
    ext = tree.nic_config()
    ext[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")  # AER -> itself
    with pytest.raises(ValueError, match="extended capability list is broken at 0x100"):
        Config("x", bytes(ext)).extended(0x000F)
    odd = tree.nic_config()
    odd[0x100:0x104] = (0x0001 | (0x102 << 20)).to_bytes(4, "little")  # not dword aligned
    with pytest.raises(ValueError, match="broken at 0x102"):
        Config("x", bytes(odd)).extended(0x000F)


def test_random_config_space_never_tracebacks_nor_loops():
    rng = random.Random(25)
    outcomes = {"found": 0, "none": 0, "refused": 0}
    for _ in range(3000):
        data = bytearray(tree.nic_config())
        for _ in range(rng.randint(1, 12)):
            data[rng.choice((0x06, 0x34, 0x61, 0x71, 0x100, 0x101, 0x102, 0x103,
                             0x152, 0x153, rng.randrange(4096)))] = rng.randrange(256)
        cfg = Config("fuzz", bytes(data[:rng.choice((64, 256, 4096, rng.randrange(4097)))]))
        for find in (lambda: cfg.capability(0x10), lambda: cfg.extended(0x000F)):
            try:
                outcomes["found" if find() is not None else "none"] += 1
            except (ValueError, PermissionError):
                outcomes["refused"] += 1
    print("pcie config fuzz:", outcomes)
    assert sum(outcomes.values()) == 6000 and all(outcomes.values())


def test_iommu_mode_and_gpu_registration_from_sysfs_and_proc(tmp_path):
    tree.build(str(tmp_path), IF)
    host = host_at(tmp_path)
    assert iommu_mode(host, tree.NIC) == ("disabled", "no IOMMU group: /sys/class/iommu is empty")
    group = tmp_path / "sys/kernel/iommu_groups/41"
    group.mkdir(parents=True)
    (group / "type").write_text("identity\n")
    nic = os.path.realpath(tmp_path / "sys/bus/pci/devices" / tree.NIC)
    os.symlink(os.path.relpath(group, nic), os.path.join(nic, "iommu_group"))
    assert iommu_mode(host, tree.NIC) == ("passthrough", "IOMMU group 41, type identity")
    (group / "type").write_text("DMA-FQ\n")
    assert iommu_mode(host, tree.NIC)[0] == "translated"
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n")
    (tmp_path / "proc/modules").write_text("nvidia_peermem 16384 0 - Live 0x0000000000000000\n")
    assert gpu_registration(host)[0] == ["peermem", "dmabuf"]
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n")
    (tmp_path / "proc/modules").write_text("nvidia 1 0 - Live 0x0\n")
    ways, why = gpu_registration(host)
    assert ways == [] and "proprietary kernel modules export no dma-buf" in why


def test_a_rollback_restores_acs_without_the_profile_that_named_the_gpu(tmp_path):
    """A GPU nictune knows only from pcie.gpu_ids (here another vendor's):
    the rollback, which has no profile, restores the ports the journal names."""
    tree.build(str(tmp_path), IF)
    for name, value in (("vendor", "0x1002"), ("device", "0x74a1"), ("class", "0x120000")):
        (tmp_path / "sys/bus/pci/devices" / tree.GPU_NEAR / name).write_text(value + "\n")
    engine = Engine(host_at(tmp_path), str(tmp_path / "state"))
    ports = (tree.SW_DOWN_NIC, tree.SW_DOWN_GPU)
    out = engine.apply(doc({"gpu_ids": ["1002:74a1"], "acs_redirect": False}), {}, "p.yaml")
    assert out.error is None, out.error
    assert [config_word(tmp_path, p, tree.PORT_ACS + 6) for p in ports] == [0x0001, 0x0001]
    out = Engine(host_at(tmp_path), str(tmp_path / "state")).rollback()
    assert out.error is None, out.error
    assert [config_word(tmp_path, p, tree.PORT_ACS + 6) for p in ports] == [tree.ACS_RECORDED] * 2


def test_a_gpu_under_another_root_port_counts_both_root_ports(tmp_path):
    tree.build(str(tmp_path), IF)
    os.unlink(tmp_path / "sys/bus/pci/devices" / tree.GPU_NEAR)
    pcie = Pcie(host_at(tmp_path))
    (gpu,), relation = pcie.nearest_gpus(tree.NIC)
    assert (gpu.address, relation) == (tree.GPU_FAR, "root_complex")
    assert pcie.bridges_between(tree.NIC, gpu) == [tree.ROOT0, tree.SW_UP, tree.SW_DOWN_NIC, tree.ROOT1]
