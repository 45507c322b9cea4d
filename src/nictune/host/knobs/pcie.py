"""PCIe and GPUDirect RDMA readiness of a rail: what its NIC's PCIe path does to GPU traffic.

    pcie:
      gpu_ids: ["10de:2330"]        # GPUs beyond NVIDIA's VGA/3D classes (vendor:device)
      max_read_request: 4096        # now: Device Control bits 14:12 (setpci CAP_EXP+8.w)
      relaxed_ordering: true        # now: Device Control bit 4
      acs_redirect: false           # now: ACS control of the ports between NIC and GPU
      ats: true                     # expected: set by firmware (ATS_ENABLED) and the IOMMU driver
      iommu: passthrough            # expected: set at boot (iommu=pt)
      link_at_max: true             # expected: every hop trained at its best speed and width
      gpu_memory_registration: any  # expected: nvidia_peermem or the open modules' dma-buf

Two families share the section.  PcieFamily (`pcie`) writes what takes
effect at once, through the function's sysfs `config` file, a 16-bit write
at the register's offset (what `setpci` does), verified by reading back:

- max_read_request: the largest read the NIC asks for in one request.
  GPUDirect RDMA sends read the GPU's memory through the NIC's read
  requests; NVIDIA's tuning guides for ConnectX ask for the maximum
  (4096).  The kernel also sets it at boot (pcie_set_readrq, and
  pci=pcie_bus_perf caps it at the MPS): a reboot undoes nictune's write;
  verify then reports drift, and the resident agent restores it where the
  profile says on_drift: restore.
- relaxed_ordering: whether the NIC may set the Relaxed Ordering attribute;
  off, a GPU's writes through a PCIe switch wait behind each other.
- acs_redirect: false clears Request Redirect, Completion Redirect, Upstream
  Forwarding and Egress Control on every port between the NIC and its
  nearest GPUs (facts/pcie.py bridges_between).  With them on, every
  NIC<->GPU transfer goes up to the root complex and back, at a fraction
  of the switch's bandwidth (NCCL's "GPU Direct RDMA" then gains nothing).
  The kernel sets them at boot when an IOMMU is on (pci_enable_acs,
  drivers/pci/pci.c): a reboot undoes the write.  Its value reads as false,
  or as the bits set per port ("0000:02:00.0=ReqRedir,CmpltRedir"), which
  is what a rollback writes back.

GpudirectFamily (`gpudirect`) only reads, and says when a value changes:

- ats: Address Translation Services enabled on the NIC (the IOMMU driver
  enables it, drivers/pci/ats.c pci_enable_ats, when the firmware
  advertises it: mlxconfig ATS_ENABLED, then a firmware reset or reboot);
- iommu: the NIC's IOMMU domain type (/sys/kernel/iommu_groups/N/type):
  passthrough (identity), translated (DMA, DMA-FQ) or disabled (no IOMMU translates for it); chosen at boot
  (iommu=pt, intel_iommu=on, amd_iommu=..., iommu.passthrough=1);
- link_at_max: every hop from the NIC to the root port, and to its nearest
  GPUs, trained at its maximum speed and width (a retrain or reseat);
- gpu_memory_registration: peermem, dmabuf or any (facts/pcie.py
  gpu_registration): loading a module (now) or another driver (reboot).
"""

from __future__ import annotations

from typing import Optional

from nictune.host.knobs.base import Family
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import PCI_ID, InvalidInput, check

SECTION = "pcie"
GPU_IDS = "gpu_ids"
MRRS, RELAXED, ACS = "max_read_request", "relaxed_ordering", "acs_redirect"
ATS, IOMMU, LINK, REGISTRATION = "ats", "iommu", "link_at_max", "gpu_memory_registration"
RUNTIME_KEYS = (MRRS, RELAXED, ACS)
EXPECTED_KEYS = (ATS, IOMMU, LINK, REGISTRATION)
IOMMU_MODES = ("passthrough", "translated", "disabled")
REGISTRATIONS = ("peermem", "dmabuf", "any")
# What ACS redirect does to NIC<->GPU traffic, by how the two are linked
# (facts/pcie.py nearest_gpus); under different host bridges it does nothing.
ACS_HURTS = {
    "switch": ": GPUDirect RDMA traffic goes through the root complex",
    "root_complex": (": GPUDirect RDMA traffic goes up to the IOMMU instead of across the root "
                     "complex"),
}
ACS_RELATIONS = tuple(ACS_HURTS)
ACS_OFF = False  # what acs_redirect reads as with no redirect bit set
# When each key takes effect, for the reference and plans.
TAKES_EFFECT = {
    MRRS: "now (config write); the kernel sets it again at boot",
    RELAXED: "now (config write); the kernel sets it again at boot",
    ACS: "now (config write); the kernel sets it again at boot (pci_enable_acs)",
    ATS: "at a firmware reset or reboot (mlxconfig ATS_ENABLED; the IOMMU driver enables it)",
    IOMMU: "at boot (kernel command line: iommu=pt, intel_iommu=, amd_iommu=)",
    LINK: "at a link retrain, reseat or reboot",
    REGISTRATION: "when nvidia_peermem is loaded (now) or the NVIDIA open modules are (reboot)",
}


def _gpu_ids(sections: dict, where: str) -> tuple:
    ids = (sections.get(SECTION) or {}).get(GPU_IDS) or []
    if not isinstance(ids, list):
        raise InvalidInput(f"{where}: {SECTION}.{GPU_IDS} is {ids!r}; it takes a list of vendor:device")
    return tuple(check(PCI_ID, i, "GPU vendor:device") for i in ids)


class _PcieBase(Family):
    sections = (SECTION,)
    keys: tuple = ()

    def __init__(self, host):
        super().__init__(host)
        self._gpu_ids: tuple = ()
        self._facts = None
        self._notes: dict = {}  # Key -> what read saw, for note()

    def pcie(self):
        if self._facts is None:
            from nictune.host.facts.pcie import Pcie

            self._facts = Pcie(self.host, self._gpu_ids)
        return self._facts

    def expand(self, target, sections, source):
        section = sections.get(SECTION) or {}
        ids = _gpu_ids(sections, source(SECTION, GPU_IDS) or SECTION)
        if ids:
            self._gpu_ids = tuple(dict.fromkeys(self._gpu_ids + ids))
            self._facts = None
        return [Desired(Key(self.name, target, name), Want(section[name]), source(SECTION, name))
                for name in self.keys if name in section]

    def read(self, keys):
        out = {}
        for key in keys:
            reason = _unsupported(self.driver_of(key.target))
            if reason:
                out[key] = Unsupported(reason)
                continue
            try:
                out[key] = self._read_key(key)
            except PermissionError as e:
                out[key] = Unsupported(str(e))
            except (OSError, ValueError, LookupError) as e:
                out[key] = Unsupported(f"cannot read {key.name} of {key.target}: {e}")
        return out

    def _nic(self, ifname: str) -> str:
        address = self.pcie().nic_address(ifname)
        if address is None:
            raise LookupError(f"{ifname} is not a PCI device")
        return address

    def _nearest(self, ifname: str):
        """(NIC address, nearest GPUs, relation) or raise LookupError."""
        nic = self._nic(ifname)
        gpus, relation = self.pcie().nearest_gpus(nic)
        if not gpus:
            raise LookupError(f"no GPU shares a PCIe switch, root complex or NUMA node with {ifname} ({nic}); "
                              f"name a stand-in with {SECTION}.{GPU_IDS}")
        return nic, gpus, relation

    def note(self, key):
        seen = self._notes.get(key, "")
        return "; ".join(n for n in (seen, "takes effect " + TAKES_EFFECT[key.name]) if n)

    @classmethod
    def nic_support(cls, driver, setting):
        name = setting.rpartition(".")[2]
        return _unsupported(driver) or (
            ("takes effect " + TAKES_EFFECT[name]) if name in TAKES_EFFECT else None)


def _unsupported(driver: Optional[str]) -> Optional[str]:
    if driver == "mana":
        return ("not supported by mana: a VF in an Azure VM, whose PCIe path, ACS and IOMMU "
                "are the Azure host's (the VM sees an emulated config space)")
    return None


class PcieFamily(_PcieBase):

    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    pcie:
      max_read_request: 4096
      relaxed_ordering: true
      acs_redirect: false
"""
    name = "pcie"
    position = 26
    position_note = ("PCI config space, before the netdev settings: nothing else depends on it "
                     "and it never drops the link")
    settings = tuple(f"{SECTION}.{k}" for k in (GPU_IDS,) + RUNTIME_KEYS)
    keys = RUNTIME_KEYS
    offline_plan = "reads PCI configuration space, which a snapshot does not record"

    def __init__(self, host):
        super().__init__(host)
        # target -> the ports a rollback wrote ACS back to, which its read-back
        # reads (a rollback has no profile to find the GPUs by: gpu_ids)
        self._restored: dict = {}

    @classmethod
    def schema(cls, s):
        return {"entry": {SECTION: s.section(
            "The NIC's PCIe path and GPUDirect RDMA readiness (pcie and gpudirect families): "
            "max_read_request, relaxed_ordering and acs_redirect are written now through PCI "
            "configuration space; the others are expectations, read only.", {
                GPU_IDS: {"type": "array", "maxItems": 16, "items": s.text(PCI_ID, 9),
                          "description": "vendor:device of GPUs beyond NVIDIA's (vendor 10de, "
                                         "class 0300/0302), or of a stand-in for one."},
                MRRS: {"enum": [128, 256, 512, 1024, 2048, 4096],
                       "description": "PCIe Max_Read_Request_Size of the NIC in bytes (Device "
                                      "Control bits 14:12), written now."},
                RELAXED: {"type": "boolean",
                          "description": "Relaxed ordering enable of the NIC (Device Control "
                                         "bit 4), written now."},
                ACS: {"const": False,
                      "description": "false: clear ACS Request/Completion Redirect, Upstream "
                                     "Forwarding and Egress Control on the ports between the "
                                     "NIC and its nearest GPUs, so GPUDirect RDMA stays in the "
                                     "PCIe switch; written now."},
            }, minProperties=1)}}

    def _read_key(self, key):
        pcie = self.pcie()
        if key.name == MRRS:
            return pcie.max_read_request(self._nic(key.target))
        if key.name == RELAXED:
            return pcie.relaxed_ordering(self._nic(key.target))
        return self._read_acs(key)

    def _read_acs(self, key):
        from nictune.host.facts.pcie import redirect_names

        if key.target in self._restored:  # a rollback's read-back: the ports it wrote
            return self._acs_of(self._restored[key.target])
        nic, gpus, relation = self._nearest(key.target)
        if relation not in ACS_RELATIONS:
            self._notes[key] = (f"{gpus[0].name} is under another host bridge than {key.target}: "
                                "GPUDirect RDMA traffic crosses the CPUs' interconnect whatever ACS says")
            return ACS_OFF
        parts, hurt = [], []
        for gpu in gpus:
            for port in self.pcie().bridges_between(nic, gpu):
                acs = self.pcie().acs(port)
                names = redirect_names(acs[1]) if acs else []
                if names:
                    hurt.append(f"ACS {'/'.join(names)} on the port {port} between {key.target} "
                                f"and {gpu.name}")
                    parts.append(f"{port}={','.join(names)}")
        if hurt:
            self._notes[key] = "; ".join(dict.fromkeys(hurt)) + ACS_HURTS[relation]
        else:
            self._notes[key] = f"no ACS redirect between {key.target} and " + ", ".join(g.name for g in gpus)
        return "; ".join(dict.fromkeys(parts)) or ACS_OFF

    def _acs_of(self, ports: list):
        from nictune.host.facts.pcie import redirect_names

        parts = []
        for port in ports:
            acs = self.pcie().acs(port)
            names = redirect_names(acs[1]) if acs else []
            if names:
                parts.append(f"{port}={','.join(names)}")
        return "; ".join(parts) or ACS_OFF

    def check(self, key: Key, want: Want) -> Optional[str]:
        if key.name == MRRS and want.value not in (128, 256, 512, 1024, 2048, 4096):
            return f"{want.value} is not a PCIe read request size"
        return None

    def apply(self, items):
        for key, value in items:
            if key.name == ACS:
                self._write_acs(key, value)
            else:
                self._write_devctl(key, value)

    def _write_devctl(self, key, value) -> None:
        from nictune.host.facts.pcie import DEVCTL_READRQ, DEVCTL_RELAX_EN, READ_REQUEST_SIZES

        nic = self._nic(key.target)
        offset, devctl = self.pcie().devctl(nic)
        if key.name == MRRS:
            if value not in READ_REQUEST_SIZES:
                raise ValueError(f"{value} is not a PCIe read request size")
            devctl = (devctl & ~DEVCTL_READRQ) | (READ_REQUEST_SIZES.index(value) << 12)
        else:
            devctl = (devctl | DEVCTL_RELAX_EN) if value else (devctl & ~DEVCTL_RELAX_EN)
        self.pcie().write_word(nic, offset, devctl)

    def _write_acs(self, key, value) -> None:
        """value: false (the redirect bits cleared on every port between the
        NIC and its nearest GPUs), or what a read showed ("PORT=ReqRedir,
        CmpltRedir; ..."): those bits set on those ports and the other
        redirect bits cleared there.  The second is what a rollback writes,
        from the journal, without the profile that named the GPUs."""
        from nictune.host.facts.pcie import ACS_REDIRECT, ACS_REDIRECT_MASK

        wanted = _parse_acs(value)
        if wanted:
            ports = self._restored[key.target] = list(wanted)
        else:
            nic, gpus, relation = self._nearest(key.target)
            ports = [] if relation not in ACS_RELATIONS else list(dict.fromkeys(
                p for g in gpus for p in self.pcie().bridges_between(nic, g)))
        bits = dict(ACS_REDIRECT)
        for port in ports:
            acs = self.pcie().acs(port)
            if acs is None:
                if port in wanted:
                    raise ValueError(f"{port} has no ACS capability to restore")
                continue
            offset, control = acs
            new = (control & ~ACS_REDIRECT_MASK) | sum(bits[n] for n in wanted.get(port, ()))
            if new != control:
                self.pcie().write_word(port, offset, new)


def _parse_acs(value) -> dict:
    from nictune.host.facts.pcie import ACS_REDIRECT, PCI_ADDRESS

    if value is False or value == "off":
        return {}
    names = {n for n, _ in ACS_REDIRECT}
    out = {}
    for part in str(value).split(";"):
        port, _, bits = part.strip().partition("=")
        chosen = [b for b in bits.split(",") if b]
        if not PCI_ADDRESS.match(port) or not chosen or not set(chosen) <= names:
            raise ValueError(f"{value!r} is not an ACS redirect state nictune wrote or read")
        out[port] = chosen
    return out


class GpudirectFamily(_PcieBase):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    pcie:
      ats: true
      iommu: passthrough
      link_at_max: true
      gpu_memory_registration: any
"""
    name = "gpudirect"
    position = 111
    position_note = "never written: read after everything else"
    settings = tuple(f"{SECTION}.{k}" for k in EXPECTED_KEYS)
    keys = EXPECTED_KEYS
    read_only = True
    offline_plan = "reads PCI configuration space, which a snapshot does not record"

    @classmethod
    def schema(cls, s):
        # Shares pcie: with PcieFamily, which describes the section.
        return {"entry": {SECTION: {"type": "object", "additionalProperties": False, "properties": {
            ATS: {"type": "boolean",
                  "description": "ATS enabled on the NIC (its ATS capability's control); set by "
                                 "firmware and the IOMMU driver at reset or boot: expected, "
                                 "read only."},
            IOMMU: {"enum": list(IOMMU_MODES),
                    "description": "The NIC's IOMMU domain: passthrough (identity, iommu=pt), "
                                   "translated or disabled; chosen at boot: expected, read only."},
            LINK: {"type": "boolean",
                   "description": "Every hop from the NIC to its root port and to its nearest "
                                  "GPUs trained at its maximum speed and width: expected."},
            REGISTRATION: {"enum": list(REGISTRATIONS),
                           "description": "How RDMA registers GPU memory: nvidia_peermem, the "
                                          "NVIDIA open modules' dma-buf, or any: expected."},
        }}}}

    def met(self, key, want, current):
        if key.name == REGISTRATION:
            return isinstance(current, str) and (
                current != "none" if want.value == "any" else want.value in current.split("+"))
        return super().met(key, want, current)

    def _read_key(self, key):
        if key.name == ATS:
            return self._read_ats(key)
        if key.name == IOMMU:
            return self._read_iommu(key)
        if key.name == LINK:
            return self._read_link(key)
        return self._read_registration(key)

    def _read_ats(self, key):
        nic = self._nic(key.target)
        enabled = self.pcie().ats_enabled(nic)
        if enabled is None:
            return Unsupported(f"{key.target} ({nic}) has no ATS capability")
        if not enabled:
            from nictune.host.facts.pcie import iommu_mode

            _, how = iommu_mode(self.host, nic)
            self._notes[key] = (f"ATS off on {key.target} ({how}): the IOMMU driver enables it at "
                                "boot when the firmware offers it (mlxconfig ATS_ENABLED); without "
                                "it, translated GPUDirect RDMA traffic waits for the root complex's "
                                "IOMMU on every transfer")
        return enabled

    def _read_iommu(self, key):
        from nictune.host.facts.pcie import cmdline_iommu, iommu_mode

        mode, how = iommu_mode(self.host, self._nic(key.target))
        asked = cmdline_iommu(self.host)
        self._notes[key] = how + ("; kernel command line: " + " ".join(asked) if asked else
                                  "; no IOMMU parameter on the kernel command line")
        if mode == "translated":
            self._notes[key] += (": every GPUDirect RDMA transfer goes through IOMMU "
                                 "translation (iommu=pt at boot avoids it)")
        return mode

    def _read_link(self, key):
        nic = self._nic(key.target)
        pcie = self.pcie()
        paths = [("", pcie.path(nic))]
        try:
            _, gpus, relation = self._nearest(key.target)
        except LookupError:
            gpus, relation = [], "none"
        if relation in ACS_RELATIONS:  # their paths meet below the CPUs' interconnect
            paths += [(g.name, g.path) for g in gpus]
        slow = []
        for owner, path in paths:
            for address in path:
                degraded = pcie.hop(address).degraded()
                if degraded:
                    slow.append(f"{address} at {degraded}" + (f" (towards {owner})" if owner else ""))
        hops = len({a for _, p in paths for a in p})
        self._notes[key] = ("; ".join(dict.fromkeys(slow)) + f": RDMA and GPUDirect traffic of "
                            f"{key.target} is capped by the slowest hop" if slow else
                            f"{hops} hop(s) at their maximum")
        return not slow

    def _read_registration(self, key):
        from nictune.host.facts.pcie import gpu_registration

        ways, why = gpu_registration(self.host)
        self._notes[key] = why + ("" if ways else ": GPUDirect RDMA cannot register GPU memory, "
                                  "NCCL stages every transfer through host memory")
        return "+".join(ways) or "none"
