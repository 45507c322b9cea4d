"""The PCIe path on a real kernel and real configuration space: the VM's q35
machine (tests/vm/run.py pcie_topology) puts a virtio-net NIC and a
virtio-gpu device -- the stand-in for a GPU, named by pcie.gpu_ids since
QEMU cannot give it NVIDIA's vendor id -- behind the two downstream ports
of one PCIe switch (TI X3130), under a root port; and a second virtio-net
NIC and a virtio-rng device (a second stand-in) under two root ports of
their own.  QEMU 7.2's switch downstream ports have no ACS capability (the
first test shows nictune reads that as nothing to redirect); its root
ports do, so ACS is written on the root ports between the second pair.

Facts (host/facts/pcie.py) are checked against sysfs read here and against
pciutils (`setpci`, `lspci -vvv`); MaxReadReq and ACS redirect go through
plan/apply/verify/rollback (knobs/pcie.py), read back with setpci.  What a
test changes with setpci (ACS redirect bits, as a BIOS leaves them) is put
back in a finally.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from nictune_cli import changes, nictune

from nictune.host.facts.pcie import Pcie
from nictune.host.machine import Host

# tests/vm/run.py pcie_topology
SWITCH_NIC_MAC, ROOT_NIC_MAC = "52:54:00:19:80:01", "52:54:00:19:80:02"
SWITCH_GPU, ROOT_GPU = "1af4:1050", "1af4:1044"
ROOT_PORT = "0000:00:10.0"
REDIRECT = 0x001C  # ReqRedir, CmpltRedir, UpstreamFwd


def setpci(address: str, register: str, value: str = "") -> int:
    arg = f"{register}={value}" if value else register
    out = subprocess.run(["setpci", "-s", address, arg], check=True, capture_output=True,
                         text=True).stdout
    return int(out, 16) if not value else 0


def lspci(address: str) -> str:
    return subprocess.run(["lspci", "-vvv", "-s", address], check=True, capture_output=True,
                          text=True).stdout


def netdev_with(mac: str) -> str:
    for name in sorted(os.listdir("/sys/class/net")):
        with open(f"/sys/class/net/{name}/address") as f:
            if f.read().strip() == mac:
                return name
    pytest.fail(f"no netdev with MAC {mac}: is the VM's q35 topology there?")


@pytest.fixture(scope="module")
def virtio_net():
    """virtio_net loaded for these tests, and unloaded again if loaded here
    (the other VM tests see no extra netdevs)."""
    loaded = os.path.isdir("/sys/module/virtio_net")
    subprocess.run(["modprobe", "virtio_net"], check=True)
    yield
    if not loaded:
        subprocess.run(["modprobe", "-r", "virtio_net"], check=False)


@pytest.fixture
def switch_rail(virtio_net):
    """(netdev behind the switch, facts that take the virtio-gpu for a GPU)."""
    return netdev_with(SWITCH_NIC_MAC), Pcie(Host(), (SWITCH_GPU,))


def test_the_path_and_links_are_what_sysfs_and_lspci_show(switch_rail):
    ifname, pcie = switch_rail
    nic = pcie.nic_address(ifname)
    real = os.path.realpath(f"/sys/bus/pci/devices/{nic}")
    assert pcie.path(nic) == re.findall(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", real)
    assert pcie.path(nic)[0] == ROOT_PORT and len(pcie.path(nic)) == 4  # root, up, down, NIC
    for address in pcie.path(nic):
        hop = pcie.hop(address)
        with open(f"/sys/bus/pci/devices/{address}/current_link_width") as f:
            assert hop.current_width == int(f.read())
        assert hop.max_speed and hop.current_speed
    (gpu,), relation = pcie.nearest_gpus(nic)
    assert relation == "switch" and gpu.path[:2] == pcie.path(nic)[:2]
    ports = pcie.bridges_between(nic, gpu)
    assert ports == [pcie.path(nic)[2], gpu.path[2]] and ports[0] != ports[1]
    # Device Control as setpci reads it: the same register at the same offset.
    offset, devctl = pcie.devctl(nic)
    assert devctl == setpci(nic, "CAP_EXP+8.w")
    assert pcie.max_read_request(nic) == int(re.search(r"MaxReadReq (\d+) bytes", lspci(nic))[1])
    for port in ports:  # QEMU 7.2's X3130 downstream ports: no ACS, nothing redirects
        assert "Access Control Services" not in lspci(port) and pcie.acs(port) is None


def write_profile(path, **pcie) -> str:
    lines = "".join(f"      {k}: {v}\n" for k, v in pcie.items())
    path.write_text("nictune: 1\ninterfaces:\n  rail:\n    match: {mac: '%s'}\n    pcie:\n"
                    "      gpu_ids: ['%s']\n%s" % (ROOT_NIC_MAC, ROOT_GPU, lines))
    return str(path)


@pytest.fixture
def root_rail(virtio_net):
    """(netdev, facts, the root ports between it and the virtio-rng stand-in,
    their ACS control and the NIC's Device Control as they were), put back
    with setpci afterwards whatever a test did."""
    ifname, pcie = netdev_with(ROOT_NIC_MAC), Pcie(Host(), (ROOT_GPU,))
    nic = pcie.nic_address(ifname)
    (gpu,), relation = pcie.nearest_gpus(nic)
    ports = pcie.bridges_between(nic, gpu)
    assert relation == "root_complex" and ports == [pcie.path(nic)[0], gpu.path[0]]
    before = {p: setpci(p, "ECAP_ACS+6.w") for p in ports}
    devctl = setpci(nic, "CAP_EXP+8.w")
    try:
        yield ifname, pcie, gpu, ports, before, devctl
    finally:
        for port, value in before.items():
            setpci(port, "ECAP_ACS+6.w", f"{value:04x}")
        setpci(nic, "CAP_EXP+8.w", f"{devctl:04x}")


def test_acs_redirect_is_found_applied_verified_and_rolled_back(root_rail, tmp_path):
    ifname, pcie, gpu, ports, before, _ = root_rail
    nic = pcie.nic_address(ifname)
    for port in ports:  # QEMU's root ports have ACS; the kernel left it off (no IOMMU)
        assert "Access Control Services" in lspci(port)
        assert pcie.acs(port)[1] == setpci(port, "ECAP_ACS+6.w")
    profile = write_profile(tmp_path / "acs.yaml", acs_redirect="false")
    state = ["--state-dir", str(tmp_path / "state")]
    setpci(ports[0], "ECAP_ACS+6.w", f"{REDIRECT:04x}:{REDIRECT:04x}")  # as a BIOS leaves it
    code, report, _ = nictune("verify", profile, *state)
    acs = changes(report)[(ifname, "pcie", "acs_redirect")]
    assert (code, acs["status"], acs["before"]) == (
        2, "drift", f"{ports[0]}=ReqRedir,CmpltRedir,UpstreamFwd"), acs
    assert acs["note"].startswith(
        f"ACS ReqRedir/CmpltRedir/UpstreamFwd on the port {ports[0]} between {ifname} and "
        f"GPU 0 ({gpu.address}): GPUDirect RDMA traffic goes up to the IOMMU instead of "
        "across the root complex"), acs
    code, report, _ = nictune("apply", profile, *state)
    assert code == 0, report["hosts"][0].get("error")
    assert [setpci(p, "ECAP_ACS+6.w") for p in ports] == [before[p] & ~0x003C for p in ports]
    code, report, _ = nictune("verify", profile, *state)
    assert code == 0 and changes(report)[(ifname, "pcie", "acs_redirect")]["status"] == "ok"
    code, report, _ = nictune("rollback", *state)
    assert code == 0, report["hosts"][0].get("error")
    assert setpci(ports[0], "ECAP_ACS+6.w") == before[ports[0]] | REDIRECT
    assert setpci(ports[1], "ECAP_ACS+6.w") == before[ports[1]]
    assert nic  # the NIC's own config space is not an ACS port


def test_a_read_request_size_the_device_ignores_rolls_the_apply_back(root_rail, tmp_path):
    """QEMU's virtio-net keeps Max_Read_Request_Size read-only (its DevCtl
    write mask leaves bits 14:12 alone): the write goes through, the
    read-back finds the old size, and the apply is rolled back -- the ACS
    bits it cleared first included."""
    ifname, pcie, gpu, ports, before, devctl = root_rail
    nic = pcie.nic_address(ifname)
    setpci(ports[0], "ECAP_ACS+6.w", f"{REDIRECT:04x}:{REDIRECT:04x}")
    profile = write_profile(tmp_path / "mrrs.yaml", acs_redirect="false", max_read_request=4096)
    code, report, _ = nictune("apply", profile, "--state-dir", str(tmp_path / "state"))
    (host,) = report["hosts"]
    assert code == 3 and host["error"]["kind"] == "rolled-back", host.get("error")
    assert "max_read_request" in host["error"]["message"], host["error"]
    assert setpci(nic, "CAP_EXP+8.w") == devctl
    assert setpci(ports[0], "ECAP_ACS+6.w") == before[ports[0]] | REDIRECT
