"""A /sys tree of a DGX-class host's PCIe path, for host/facts/pcie.py and knobs/pcie.py.

RECORDINGS.  The GPU-specific parts are what published `lspci -vvv` runs
of real hosts show, encoded back into configuration space:

- the GPU: NVIDIA GA100 [A100 SXM4 40GB] [10de:20b0], class 0302, NUMA
  node 5, capabilities [60] Power Management, [68] Null, [78] Express (v2)
  Endpoint with DevCtl "RlxdOrd+ ExtTag+ ... MaxPayload 256 bytes,
  MaxReadReq 512 bytes" -- a DGX A100's, posted in
  https://github.com/open-mpi/hwloc/issues/653 (2024-03-07);
- the switch ports' ACS control as a host with ACS left on by the BIOS
  shows it, "ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+
  UpstreamFwd+ EgressCtrl- DirectTrans-" -- https://github.com/NVIDIA/nccl/issues/523
  (the NCCL "vendor err 81" thread);
- link speeds and widths in the kernel's sysfs text ("16.0 GT/s PCIe").

The topology (one PCIe switch per GPU/NIC pair, a ConnectX NIC 15b3:1021
beside the GPU, and a second GPU under another root port) is modelled on
NVIDIA's DGX/HGX layout; the NIC's own registers are not from a recording
(its DevCtl, ATS and the addresses are this file's).
"""

from __future__ import annotations

import os
import shutil

STATUS_CAP_LIST = 0x10
ACS_RECORDED = 0x0001 | 0x0004 | 0x0008 | 0x0010  # SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+
GPU_DEVCTL_RECORDED = 0x0007 | 0x0010 | 0x0100 | (1 << 5) | (2 << 12)  # see the docstring

ROOT0, ROOT1 = "0000:d7:00.0", "0000:06:00.0"
SW_UP, SW_DOWN_GPU, SW_DOWN_NIC = "0000:d8:00.0", "0000:d9:00.0", "0000:d9:04.0"
GPU_NEAR, NIC = "0000:da:00.0", "0000:db:00.0"
GPU_FAR = "0000:07:00.0"
NIC_PCIE_CAP, NIC_ACS_CAP, NIC_ATS_CAP = 0x70, 0x150, 0x180
PORT_PCIE_CAP, PORT_ACS = 0x68, 0x140


def config(vendor: int, device: int, klass: int, caps: list, ext: list) -> bytearray:
    """4096 bytes of configuration space.  caps: [(offset, id, body {rel: u16})];
    ext: [(offset, id, body {rel: u16})], chained in the order given."""
    data = bytearray(4096)
    data[0:2], data[2:4] = vendor.to_bytes(2, "little"), device.to_bytes(2, "little")
    data[6] = STATUS_CAP_LIST
    data[9:12] = (klass << 8).to_bytes(3, "little")  # prog-if, subclass, class
    data[0x34] = caps[0][0] if caps else 0
    for i, (offset, cap_id, body) in enumerate(caps):
        data[offset] = cap_id
        data[offset + 1] = caps[i + 1][0] if i + 1 < len(caps) else 0
        for rel, value in body.items():
            data[offset + rel:offset + rel + 2] = value.to_bytes(2, "little")
    for i, (offset, cap_id, body) in enumerate(ext):
        nxt = ext[i + 1][0] if i + 1 < len(ext) else 0
        data[offset:offset + 4] = (cap_id | (1 << 16) | (nxt << 20)).to_bytes(4, "little")
        for rel, value in body.items():
            data[offset + rel:offset + rel + 2] = value.to_bytes(2, "little")
    return data


def bridge_config(acs_control: int) -> bytearray:
    return config(0x1000, 0xc030, 0x0604, [(0x40, 0x01, {}), (PORT_PCIE_CAP, 0x10, {8: 0x0037})],
                  [(0x100, 0x0001, {}), (PORT_ACS, 0x000D, {4: 0x005f, 6: acs_control})])


def gpu_config() -> bytearray:
    return config(0x10de, 0x20b0, 0x0302,
                  [(0x60, 0x01, {}), (0x68, 0x00, {}), (0x78, 0x10, {8: GPU_DEVCTL_RECORDED})],
                  [(0x100, 0x0001, {})])


def nic_config(devctl: int = 0x2037, ats_control: int = 0x8000) -> bytearray:
    return config(0x15b3, 0x1021, 0x0200, [(0x60, 0x01, {}), (NIC_PCIE_CAP, 0x10, {8: devctl})],
                  [(0x100, 0x0001, {}), (NIC_ACS_CAP, 0x000D, {}),
                   (NIC_ATS_CAP, 0x000F, {4: 0x0020, 6: ats_control})])


def _function(root: str, chain: list, config_bytes: bytes, attrs: dict) -> None:
    real = os.path.join(root, "sys/devices/pci0000:00", *chain)
    os.makedirs(real, exist_ok=True)
    with open(os.path.join(real, "config"), "wb") as f:
        f.write(config_bytes)
    for name, value in attrs.items():
        with open(os.path.join(real, name), "w") as f:
            f.write(f"{value}\n")
    link = os.path.join(root, "sys/bus/pci/devices", chain[-1])
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(real, os.path.dirname(link)), link)


def link(speed: str, width: int, max_speed: str = "", max_width: int = 0) -> dict:
    return {"current_link_speed": speed, "current_link_width": width,
            "max_link_speed": max_speed or speed, "max_link_width": max_width or width}


def build(root: str, ifname: str = "ibp219s0", nic_link: dict = None, acs: int = ACS_RECORDED,
          nic_devctl: int = 0x2037) -> None:
    """The tree under root: /sys/class/net/<ifname> is the NIC's netdev."""
    g5 = "32.0 GT/s PCIe"
    gpu_attrs = {"vendor": "0x10de", "device": "0x20b0", "class": "0x030200", "numa_node": 5,
                 **link("16.0 GT/s PCIe", 16)}
    bridge = {"vendor": "0x1000", "device": "0xc030", "class": "0x060400", "numa_node": 5,
              **link(g5, 16)}
    _function(root, [ROOT0], bridge_config(0), {**bridge, "device": "0x09a9", "vendor": "0x8086"})
    _function(root, [ROOT0, SW_UP], bridge_config(0), bridge)
    _function(root, [ROOT0, SW_UP, SW_DOWN_GPU], bridge_config(acs), bridge)
    _function(root, [ROOT0, SW_UP, SW_DOWN_NIC], bridge_config(acs), bridge)
    _function(root, [ROOT0, SW_UP, SW_DOWN_GPU, GPU_NEAR], gpu_config(), gpu_attrs)
    _function(root, [ROOT0, SW_UP, SW_DOWN_NIC, NIC], nic_config(nic_devctl),
              {"vendor": "0x15b3", "device": "0x1021", "class": "0x020000", "numa_node": 5,
               **(nic_link or link(g5, 16))})
    _function(root, [ROOT1], bridge_config(0), bridge)
    _function(root, [ROOT1, GPU_FAR], gpu_config(), {**gpu_attrs, "numa_node": 3})
    net = os.path.join(root, "sys/class/net", ifname)
    os.makedirs(net, exist_ok=True)
    if os.path.isdir(os.path.join(net, "device")):  # a recorded state's plain files
        shutil.rmtree(os.path.join(net, "device"))
    os.symlink(os.path.relpath(os.path.join(root, "sys/bus/pci/devices", NIC), net),
               os.path.join(net, "device"))
