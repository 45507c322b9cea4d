"""The PCIe path of a NIC, the GPUs near it, and what GPUDirect RDMA needs of both.

Everything is read through Host.io under Host.root:

    /sys/class/net/X/device                     -> the NIC's PCI function
    /sys/bus/pci/devices/A -> /sys/devices/pci0000:00/<root port>/.../A
                                                the hops to the root port
    /sys/bus/pci/devices/A/{class,vendor,device,numa_node}
    /sys/bus/pci/devices/A/{current,max}_link_{speed,width}
    /sys/bus/pci/devices/A/config               PCI configuration space
    /sys/bus/pci/devices/A/iommu_group -> /sys/kernel/iommu_groups/N (its type)
    /sys/class/iommu, /proc/cmdline             the IOMMU and how it was asked for
    /sys/module/nvidia_peermem, /proc/modules,
    /proc/driver/nvidia/version                 GPU memory registration

Configuration space (PCIe Base Specification; the kernel's names from
include/uapi/linux/pci_regs.h):

- the capability list from PCI_CAPABILITY_LIST (0x34); the PCI Express
  capability (id 0x10) holds Device Control at +8 (PCI_EXP_DEVCTL): bit 4
  relaxed ordering (PCI_EXP_DEVCTL_RELAX_EN), bits 14:12 Max_Read_Request_Size
  (PCI_EXP_DEVCTL_READRQ, 128 << n bytes);
- the extended capability list from 0x100, each header: id in bits 15:0,
  the next offset in bits 31:20; ACS (id 0x000D, PCI_EXT_CAP_ID_ACS): its
  control register at +6 (PCI_ACS_CTRL): bit 2 P2P Request Redirect, 3 P2P
  Completion Redirect, 4 Upstream Forwarding, 5 P2P Egress Control; ATS (id
  0x000F, PCI_EXT_CAP_ID_ATS): its control register at +6, bit 15 enable.

Both lists are walked strictly and bounded: an offset outside the space or
not dword aligned, a loop, or more headers than the space can hold ends the
walk with a ValueError naming the device, never an endless loop.  Only root
can read past the first 64 bytes of `config` (drivers/pci/pci-sysfs.c
pci_read_config: others get the header alone): a short read is reported as
such.

Writes (PcieFamily) are 16-bit writes at the exact offset of the register,
through the same `config` file, which the kernel turns into
pci_user_write_config_word() -- what `setpci` does.

GPUs are functions of class 0x0300 or 0x0302 (VGA, 3D controller) from
vendor 0x10de, or those a profile names by vendor:device.  They are
numbered in PCI address order, which is nvidia-smi's and CUDA's order with
CUDA_DEVICE_ORDER=PCI_BUS_ID.  The GPUs nearest a NIC are those that share
the deepest bridge with it (a PCIe switch: NCCL's PIX/PXB); else those
under its host bridge (another root port: NCCL's PHB); else those on its
NUMA node (NCCL's NODE).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Dict, List, Optional, Tuple

PCI_DEVICES = "sys/bus/pci/devices"
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
NVIDIA = "10de"
GPU_CLASSES = ("0x0300", "0x0302")
CONFIG_SIZE = 4096
HEADER_SIZE = 64
CAP_LIST = 0x34
CAP_ID_EXP = 0x10
EXP_DEVCTL = 8
DEVCTL_RELAX_EN = 0x0010
DEVCTL_READRQ = 0x7000
EXT_CAP_START = 0x100
EXT_CAP_ID_ACS = 0x000D
EXT_CAP_ID_ATS = 0x000F
ACS_CTRL = 6
ATS_CTRL = 6
ATS_ENABLE = 0x8000
# The ACS control bits that send peer-to-peer traffic up to the root complex
# (pci_regs.h PCI_ACS_RR, PCI_ACS_CR, PCI_ACS_UF, PCI_ACS_EC), by the names
# lspci -vvv gives them in ACSCtl.
ACS_REDIRECT = (("ReqRedir", 0x0004), ("CmpltRedir", 0x0008),
                ("UpstreamFwd", 0x0010), ("EgressCtrl", 0x0020))
ACS_REDIRECT_MASK = sum(bit for _, bit in ACS_REDIRECT)
READ_REQUEST_SIZES = (128, 256, 512, 1024, 2048, 4096)


@dataclass
class Config:
    """One function's configuration space, as far as it could be read."""

    address: str
    data: bytes

    def word(self, offset: int) -> int:
        return int.from_bytes(self.data[offset:offset + 2], "little")

    def dword(self, offset: int) -> int:
        return int.from_bytes(self.data[offset:offset + 4], "little")

    def capability(self, wanted: int) -> Optional[int]:
        """Offset of the standard capability `wanted`, or None."""
        if len(self.data) < HEADER_SIZE or not self.word(0x06) & 0x0010:  # Status: Cap List
            return None
        offset, seen = self.data[CAP_LIST] & 0xFC, set()
        while offset:
            if offset < HEADER_SIZE or offset + 2 > min(len(self.data), 256) or offset in seen:
                raise ValueError(f"{self.address}: the capability list is broken at {offset:#x}")
            seen.add(offset)
            if self.data[offset] == wanted:
                return offset
            offset = self.data[offset + 1] & 0xFC
        return None

    def extended(self, wanted: int) -> Optional[int]:
        """Offset of the extended capability `wanted`, or None.  Raises
        PermissionError when only the header could be read (not root)."""
        if len(self.data) <= 256:
            if len(self.data) <= HEADER_SIZE:
                raise PermissionError(f"{self.address}: only {len(self.data)} bytes of its "
                                      "configuration space are readable (reading more needs root)")
            return None  # a conventional PCI function: no extended space
        offset, seen = EXT_CAP_START, set()
        while offset:
            if (offset < EXT_CAP_START or offset % 4 or offset + 8 > len(self.data)
                    or offset in seen):
                raise ValueError(f"{self.address}: the extended capability list is broken "
                                 f"at {offset:#x}")
            seen.add(offset)
            header = self.dword(offset)
            if header in (0, 0xFFFFFFFF):
                return None  # no extended capabilities (or the device fell off the bus)
            if header & 0xFFFF == wanted:
                return offset
            offset = header >> 20
        return None


@dataclass
class Hop:
    """One function on a path: its link as trained and at best."""

    address: str
    current_speed: Optional[str] = None  # "32.0 GT/s PCIe"
    max_speed: Optional[str] = None
    current_width: Optional[int] = None
    max_width: Optional[int] = None

    def degraded(self) -> Optional[str]:
        """How the link trained below its maximum, or None."""
        out = []
        if self.current_speed and self.max_speed and _gts(self.current_speed) < _gts(self.max_speed):
            out.append(f"{_short(self.current_speed)} of {_short(self.max_speed)}")
        if self.current_width and self.max_width and self.current_width < self.max_width:
            out.append(f"x{self.current_width} of x{self.max_width}")
        return ", ".join(out) or None


@dataclass
class Gpu:
    index: int       # in PCI address order
    address: str
    numa_node: Optional[int]
    path: List[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"GPU {self.index} ({self.address})"


def _gts(text: str) -> float:
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return 0.0


def _short(speed: str) -> str:
    return " ".join(speed.split()[:2])


class Pcie:
    """PCIe facts of one host, read once per command and kept."""

    def __init__(self, host, gpu_ids: Tuple[str, ...] = ()):
        self.host = host
        self.gpu_ids = tuple(i.lower() for i in gpu_ids)
        self._configs: Dict[str, Config] = {}
        self._gpus: Optional[List[Gpu]] = None

    # -- sysfs -------------------------------------------------------------------
    def _dev(self, address: str, *rest: str) -> str:
        if not PCI_ADDRESS.match(address):
            raise ValueError(f"{address!r} is not a PCI address")
        return self.host.path(PCI_DEVICES, address, *rest)

    def _attr(self, address: str, name: str) -> Optional[str]:
        try:
            return self.host.io.read_text(self._dev(address, name)).strip()
        except (OSError, UnicodeDecodeError):
            return None

    def _int_attr(self, address: str, name: str, base: int = 10) -> Optional[int]:
        text = self._attr(address, name)
        try:
            return int(text, base) if text is not None else None
        except ValueError:
            return None

    def nic_address(self, ifname: str) -> Optional[str]:
        """The PCI function behind a netdev (a virtio one: its virtio_pci parent)."""
        real = self.host.io.realpath(self.host.path("sys/class/net", ifname, "device"))
        for part in reversed(real.split(os.sep)):
            if PCI_ADDRESS.match(part):
                return part
        return None

    def path(self, address: str) -> List[str]:
        """The functions from the root port down to `address`, inclusive."""
        real = self.host.io.realpath(self._dev(address))
        return [p for p in real.split(os.sep) if PCI_ADDRESS.match(p)]

    def hop(self, address: str) -> Hop:
        return Hop(address, self._attr(address, "current_link_speed"),
                   self._attr(address, "max_link_speed"),
                   self._int_attr(address, "current_link_width"),
                   self._int_attr(address, "max_link_width"))

    def numa_node(self, address: str) -> Optional[int]:
        node = self._int_attr(address, "numa_node")
        return node if node is not None and node >= 0 else None

    def config(self, address: str) -> Config:
        if address not in self._configs:
            io = self.host.io
            fd = io.os_open(self._dev(address, "config"), os.O_RDONLY)
            try:
                data = io.read(fd, CONFIG_SIZE)
            finally:
                io.close(fd)
            self._configs[address] = Config(address, bytes(data[:CONFIG_SIZE]))
        return self._configs[address]

    def write_word(self, address: str, offset: int, value: int) -> None:
        """A 16-bit write at `offset` of the function's configuration space."""
        if offset % 2 or not 0 <= offset < CONFIG_SIZE - 1 or not 0 <= value <= 0xFFFF:
            raise ValueError(f"{address}: refusing a config write of {value:#x} at {offset:#x}")
        io = self.host.io
        fd = io.os_open(self._dev(address, "config"), os.O_WRONLY)
        try:
            written = io.pwrite(fd, value.to_bytes(2, "little"), offset)
        finally:
            io.close(fd)
        if written != 2:
            raise OSError(f"{address}: a config write at {offset:#x} wrote {written} bytes")
        self._configs.pop(address, None)  # read it again: the read-back decides

    # -- registers -------------------------------------------------------------------
    def devctl(self, address: str) -> Tuple[int, int]:
        """(offset, value) of the PCIe Device Control register."""
        cfg = self.config(address)
        cap = cfg.capability(CAP_ID_EXP)
        if cap is None:
            raise LookupError(f"{address} has no PCI Express capability")
        return cap + EXP_DEVCTL, cfg.word(cap + EXP_DEVCTL)

    def max_read_request(self, address: str) -> int:
        return 128 << ((self.devctl(address)[1] & DEVCTL_READRQ) >> 12)

    def relaxed_ordering(self, address: str) -> bool:
        return bool(self.devctl(address)[1] & DEVCTL_RELAX_EN)

    def acs(self, address: str) -> Optional[Tuple[int, int]]:
        """(offset of ACS control, its value), or None without ACS."""
        cfg = self.config(address)
        cap = cfg.extended(EXT_CAP_ID_ACS)
        return None if cap is None else (cap + ACS_CTRL, cfg.word(cap + ACS_CTRL))

    def ats_enabled(self, address: str) -> Optional[bool]:
        """Whether ATS is enabled; None when the function has no ATS capability."""
        cfg = self.config(address)
        cap = cfg.extended(EXT_CAP_ID_ATS)
        return None if cap is None else bool(cfg.word(cap + ATS_CTRL) & ATS_ENABLE)

    # -- GPUs ----------------------------------------------------------------------
    def gpus(self) -> List[Gpu]:
        if self._gpus is None:
            try:
                names = sorted(n for n in self.host.io.listdir(self.host.path(PCI_DEVICES))
                               if PCI_ADDRESS.match(n))
            except OSError:
                names = []
            found = [a for a in names if self._is_gpu(a)]
            self._gpus = [Gpu(i, a, self.numa_node(a), self.path(a)) for i, a in enumerate(found)]
        return self._gpus

    def _is_gpu(self, address: str) -> bool:
        vendor = (self._attr(address, "vendor") or "").lower().removeprefix("0x")
        device = (self._attr(address, "device") or "").lower().removeprefix("0x")
        if f"{vendor}:{device}" in self.gpu_ids:
            return True
        klass = (self._attr(address, "class") or "")[:6].lower()
        return vendor == NVIDIA and klass in GPU_CLASSES

    def host_bridge(self, address: str) -> Optional[str]:
        """The host bridge (root complex) above a function: "pci0000:00"."""
        real = self.host.io.realpath(self._dev(address))
        return next((p for p in real.split(os.sep) if HOST_BRIDGE.match(p)), None)

    def nearest_gpus(self, nic: str) -> Tuple[List[Gpu], str]:
        """(the GPUs nearest the NIC, how they are linked): "switch" when they
        share a bridge (a PCIe switch, or one root port); "root_complex" when
        only the host bridge (different root ports of one root complex);
        "numa" when only the NUMA node; "none" when no GPU is any of these."""
        nic_path = self.path(nic)
        best, depth = [], 0
        for gpu in self.gpus():
            shared = _common(nic_path, gpu.path)
            if shared > depth:
                best, depth = [gpu], shared
            elif shared == depth and shared:
                best.append(gpu)
        if best:
            return best, "switch"
        bridge = self.host_bridge(nic)
        same = [g for g in self.gpus() if bridge and self.host_bridge(g.address) == bridge]
        if same:
            return same, "root_complex"
        node = self.numa_node(nic)
        local = [g for g in self.gpus() if node is not None and g.numa_node == node]
        return local, ("numa" if local else "none")

    def bridges_between(self, nic: str, gpu: Gpu) -> List[str]:
        """The ports whose ACS applies to traffic between the NIC and the GPU:
        every bridge on both paths below the one they share (the root ports
        too when they share only the host bridge), as the kernel's P2P
        distance counts them (drivers/pci/p2pdma.c calc_map_type_and_dist:
        a redirecting bridge on the path sends the traffic through the host
        bridge); empty for GPUs under another host bridge."""
        nic_path = self.path(nic)
        shared = _common(nic_path, gpu.path)
        if not shared and self.host_bridge(nic) != self.host_bridge(gpu.address):
            return []
        below = nic_path[shared:-1] + gpu.path[shared:-1]
        return list(dict.fromkeys(below))


def _common(a: List[str], b: List[str]) -> int:
    """How many leading functions two paths share (the bridges above both)."""
    n = 0
    for x, y in zip(a[:-1], b[:-1]):
        if x != y:
            break
        n += 1
    return n


def redirect_names(control: int) -> List[str]:
    return [name for name, bit in ACS_REDIRECT if control & bit]


# -- the IOMMU and GPU memory registration --------------------------------------------

IOMMU_TYPES = {"identity": "passthrough", "DMA": "translated", "DMA-FQ": "translated",
               "blocked": "blocked", "unmanaged": "unmanaged"}


def cmdline_iommu(host) -> List[str]:
    """The kernel parameters that choose the IOMMU's mode, as given at boot."""
    try:
        words = host.io.read_text(host.path("proc/cmdline")).split()
    except (OSError, UnicodeDecodeError):
        return []
    prefixes = ("iommu=", "intel_iommu=", "amd_iommu=", "iommu.passthrough=", "iommu.strict=")
    return [w for w in words if w.startswith(prefixes)]


def iommu_mode(host, address: str) -> Tuple[str, str]:
    """(mode, how it was learned) for a function: "passthrough" (identity
    domain: DMA addresses are physical ones, what GPUDirect RDMA wants),
    "translated" (DMA domain), "disabled" (no IOMMU translates for it)."""
    group = host.io.realpath(host.path(PCI_DEVICES, address, "iommu_group"))
    if not host.io.isdir(group):
        try:
            units = host.io.listdir(host.path("sys/class/iommu"))
        except OSError:
            units = []
        why = "no IOMMU group" + (f" although {len(units)} IOMMU unit(s) exist" if units else
                                  ": /sys/class/iommu is empty")
        return "disabled", why
    try:
        kind = host.io.read_text(os.path.join(group, "type")).strip()
    except (OSError, UnicodeDecodeError):
        return "translated", f"IOMMU group {os.path.basename(group)} (its type is unreadable)"
    return IOMMU_TYPES.get(kind, kind), f"IOMMU group {os.path.basename(group)}, type {kind}"


NVIDIA_VERSION = "proc/driver/nvidia/version"


def gpu_registration(host) -> Tuple[List[str], str]:
    """(the ways RDMA can register GPU memory, why).  peermem: the
    nvidia_peermem module is loaded (ib_register_peer_memory_client, MLNX
    OFED's peer-memory API).  dmabuf: the NVIDIA open kernel modules are
    loaded (/proc/driver/nvidia/version says "Open Kernel Module"; the
    proprietary ones export no dma-buf), which NCCL uses through
    ibv_reg_dmabuf_mr (NCCL_DMABUF_ENABLE, Linux 5.12 or later)."""
    ways, why = [], []
    if host.io.isdir(host.path("sys/module/nvidia_peermem")) or _in_proc_modules(host, "nvidia_peermem"):
        ways.append("peermem")
        why.append("nvidia_peermem is loaded")
    try:
        version = host.io.read_text(host.path(NVIDIA_VERSION))
    except (OSError, UnicodeDecodeError):
        version = None
    if version is None:
        why.append(f"no NVIDIA driver (/{NVIDIA_VERSION} is absent)")
    elif "Open Kernel Module" in version:
        ways.append("dmabuf")
        why.append("the NVIDIA open kernel modules are loaded (dma-buf export)")
    else:
        why.append("the NVIDIA proprietary kernel modules export no dma-buf")
    return ways, "; ".join(why)


def _in_proc_modules(host, name: str) -> bool:
    try:
        text = host.io.read_text(host.path("proc/modules"))
    except (OSError, UnicodeDecodeError):
        return False
    return any(line.split(" ", 1)[0] == name for line in text.splitlines())
