"""Cross-layer consistency of a loaded profile: `nictune lint`.

RoCE traffic is classified at several layers that are configured in
different places, and nothing stops them from disagreeing:

    NCCL_IB_TC / roce.tos  --tos >> 2-->  DSCP  --dscp_map (trust dscp)-->  priority
    priority --pfc--> lossless, or --ecn np+rp--> lossy with congestion control
    priority --ets.prio_tc--> traffic class --tc_bw / tc_tsa--> a share of the link
    CNPs: their DSCP and priority, and a class that can send them (strict or
    with bandwidth); NCCL_IB_FIFO_TC (NCCL's credit messages): a mapped DSCP
    and a class that can send them
    the same ToS everywhere RDMA traffic takes one: roce.tos (RDMA-CM),
    roce.verbs_tos (mlx5_ib), NCCL_IB_TC, UCX_IB_TRAFFIC_CLASS,
    NVSHMEM_IB_TRAFFIC_CLASS, each with ECT in its ECN bits where ECN runs
    PFC vs link-level (global) pause, and PFC without ECN on its priority
    NCCL_IB_GID_INDEX vs RoCE mode; MTU vs RoCE MTU; ring sizes the NIC class
    rounds or refuses (nicclass.rings_effective)
    ASAP2: hw-tc-offload on a switchdev PF and its representors (and with OVS
    hw_offload), VFs wanted with tc offload on a legacy eswitch, more VFs
    than the firmware's total_vfs (or SR-IOV off there); inline
    crypto: bits a NIC class lacks, MACsec/ESP overhead against the
    interface MTU and the RoCE MTU (ESP only with mlx5 packet offload: in
    software or as crypto offload ESP never sees RoCE, which bypasses xfrm,
    and lint says that RoCE then leaves in clear); static IPsec SAs outside
    ipsec.lab: true
    PCIe (pcie:): relaxed ordering off on the NIC while NCCL registers with
    it, a max_read_request below 4096 on a GPUDirect rail, a translating
    IOMMU without ATS
    per-rail routing (routing:): tables or rule priorities two entries
    share, priorities outside nictune's band, routed rails without the ARP
    sysctls one subnet needs, or whose IPv6 addresses may move the GID a
    library file names by index

It also warns about settings whose kernel side effects a rollback can undo
only in part (nictune/host/transaction/aside.py): an MTU below 1280, `state: down`,
disable_ipv6 and the sysctls the kernel copies to every interface.

Each finding names both sides with file:line.  Lint sees the merged
profile, so per-host overrides must be merged before it runs.  Host-side
facts (which GID index is RoCE v2 here, which HCAs exist) are the agent's
job, not lint's.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..host.facts import nicclass
from ..host.facts.rdma import IB_MTUS, ROCE_HEADERS, roce_mtu
from ..host.transaction.aside import IPV6_MIN_MTU
from ..host.knobs import routing
from ..host.knobs.nccl import HCA_ITEM, nccl_list
from ..host.knobs.sysctl import SPREAD, normalise, spread_note
from .loader import Profile, load_profile

ERROR, WARNING = "error", "warning"

MACSEC_SECTAG_SCI, MACSEC_ICV, ETH_PAYLOAD = 16, 16, 1500
# RFC 4303 ESP with RFC 4106 AES-GCM, transport mode: SPI and sequence (8),
# IV (8), pad length and next header (2), up to 3 bytes of padding, ICV (16).
ESP_OVERHEAD = 8 + 8 + 2 + 3 + 16

# IB_MTUS, ROCE_HEADERS, roce_mtu: the kernel's RoCE MTU rule (host/facts/rdma.py).

# NVIDIA's usual RoCE recipe puts CNPs on DSCP 48 / priority 6, a class of
# their own that no PFC pause can hold back.
CNP_PRIO_RECOMMENDED = 6

# RFC 3168 section 5: the low two bits of the IPv4 ToS / IPv6 traffic class
# are the ECN field: 10 is ECT(0), 01 ECT(1), 00 Not-ECT, 11 CE.  A switch
# that finds congestion marks ECT packets CE and drops Not-ECT ones instead,
# so DCQCN only sees the congestion of ECT traffic (106 = DSCP 26 + ECT(0)).
ECT = {2: "ECT(0)", 1: "ECT(1)"}
ECN_FIELD = {0: "Not-ECT", 3: "CE"}

# Where RDMA traffic takes its ToS on the host side: (name, profile key path).
# NCCL src/transport/net_ib/connect.cc: the QPs' GRH traffic_class is
# NCCL_IB_TC (default 0); UCX src/uct/ib/base/ib_iface.c
# uct_ib_iface_config_table: UCX_IB_TRAFFIC_CLASS, whose "auto" selects 106 on
# RoCE v2; NVSHMEM's env_defs (NVSHMEMI_ENV_DEF IB_TRAFFIC_CLASS): default 0.
HOST_TCS = (
    ("NCCL_IB_TC", ("host", "nccl", "env", "NCCL_IB_TC")),
    ("UCX_IB_TRAFFIC_CLASS", ("host", "ucx", "env", "UCX_IB_TRAFFIC_CLASS")),
    ("NVSHMEM_IB_TRAFFIC_CLASS", ("host", "nvshmem", "env", "NVSHMEM_IB_TRAFFIC_CLASS")),
)
# What each library sends with when its variable is unset (None: NCCL's own
# rule, nccl-tc-unset, covers it).
HOST_TC_DEFAULT = {"UCX_IB_TRAFFIC_CLASS": (106, "UCX's auto selects 106 on RoCE v2"),
                   "NVSHMEM_IB_TRAFFIC_CLASS": (0, "NVSHMEM sends with traffic class 0 (DSCP 0)")}
ENTRY_TCS = (("roce.tos", "tos"), ("roce.verbs_tos", "verbs_tos"))
# The sections that hand variables to jobs (host/knobs/jobenv.py).
JOB_ENV_SECTIONS = ("slurm_task_prolog", "enroot_environ", "environment")

# Drivers whose ports come up with link-level (global, 802.3x) pause on.
# mlx5 keeps global pause (pptx/pprx) and PFC (pfctx/pfcrx) in one port
# register, PFCC (drivers/net/ethernet/mellanox/mlx5/core/port.c
# mlx5_set_port_pause, mlx5_set_port_pfc); the driver never writes pause at
# probe (only mlx5e_ethtool_set_pauseparam in en_ethtool.c does), so the
# firmware's default stays: "Both Tx and Rx global pause frames are enabled
# by default", and the PFC recipe disables them first (NVIDIA mlx5 driver
# documentation, Flow Control).
GLOBAL_PAUSE_AT_BOOT = {"mlx5_core": "mlx5 ports come up with global pause on (firmware default)"}

# What every side-effect finding adds: what a rollback puts back, and what not.
ROLLBACK_PART = ("nictune rollback puts back the addresses, routes and sysctls it records before "
                 "the apply, not neighbour entries, multicast memberships, sockets bound to a "
                 "removed address or what router advertisements taught the host")

# NVIDIA's ConnectX performance tuning: the largest PCIe read request (4 KB).
PCIE_READ_REQUEST_WANTED = 4096

_HCA_ITEM = re.compile(HCA_ITEM)


def hca_syntax_ok(value: str) -> bool:
    """NCCL_IB_HCA in NCCL's list syntax (knobs/nccl.py), with items it can parse."""
    _, exclude, exact = nccl_list(value)
    items = value[int(exclude) + int(exact):].split(",")
    return all(_HCA_ITEM.fullmatch(item) for item in items)


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str          # "error" | "warning"
    message: str
    locations: Tuple[str, ...]  # "file:line" of each side

    def as_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "locations": list(self.locations)}

    @property
    def text(self) -> str:
        """code: message (file:line, ...) -- how the CLI shows a finding."""
        return f"{self.code}: {self.message} ({', '.join(self.locations)})"

    def __str__(self) -> str:
        return f"{self.severity}: {self.text}"


def _ipsec_mode(expected: Any) -> Any:
    """expect.ipsec_offload's mode: "crypto", or {if_present: crypto}'s."""
    return expected.get("if_present") if isinstance(expected, dict) else expected


def _esp_on_entry(entry: dict, crypto: dict, at) -> Tuple[Optional[str], Optional[str]]:
    """(where ESP packet offload is asked for, where other ESP is), each
    the profile location or None."""
    expected = _ipsec_mode((entry.get("expect") or {}).get("ipsec_offload"))
    ipsec = entry.get("ipsec") if isinstance(entry.get("ipsec"), dict) else {}
    sas = [sa for sa in ipsec.get("sas") or () if isinstance(sa, dict)]
    if expected == "packet":
        return at("expect", "ipsec_offload"), None
    if any(sa.get("offload") == "packet" for sa in sas):
        return at("ipsec", "sas"), None
    if crypto.get("esp") is True:
        return None, at("crypto", "esp")
    if expected == "crypto":
        return None, at("expect", "ipsec_offload")
    return None, at("ipsec", "sas") if sas else None


def lint_file(path: str) -> List[Finding]:
    """Load (schema and extends included) and lint; raises ProfileError."""
    return lint(load_profile(path))


def lint(profile: Profile) -> List[Finding]:
    return _Linter(profile).run()


def _number(value: Any) -> Optional[int]:
    """An NCCL value as an integer ("106" and 106 alike), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,9}", value):
        return int(value)
    return None


def _wanted_number(value: Any) -> Optional[int]:
    """An exact MTU, or the bound of {min: N} / {max: N}."""
    if isinstance(value, dict) and len(value) == 1:
        value = next(iter(value.values()))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _get(doc: Any, *keys: str) -> Any:
    """doc[k1][k2]..., or None where a level is missing or not a mapping:
    lint reads sections the schema may not have (yet) defensively."""
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _ecn_bits(tos: int) -> str:
    return ECT.get(tos & 3) or ECN_FIELD[tos & 3]


class _Linter:
    def __init__(self, profile: Profile):
        self.p = profile
        self.doc = profile.doc
        self.findings: List[Finding] = []
        self.env: Dict[str, Any] = ((self.doc.get("host") or {}).get("nccl") or {}).get("env") or {}
        # Host-wide traffic classes that are set: name -> (value, "file:line").
        self.host_tcs: Dict[str, Tuple[int, str]] = {}
        for tc_name, keys in HOST_TCS:
            value = _number(_get(self.doc, *keys))
            if value is not None:
                self.host_tcs[tc_name] = (value, self.p.source(*keys))
        # The same variables delivered to jobs (host/knobs/jobenv.py) beat the
        # libraries' files: each is one more traffic class to agree with.
        for section in JOB_ENV_SECTIONS:
            for tc_name, _keys in HOST_TCS:
                keys = ("host", section, "env", tc_name)
                value = _number(_get(self.doc, *keys))
                if value is not None:
                    self.host_tcs[f"{tc_name} (host.{section})"] = (value, self.p.source(*keys))
        self.ect_reported: set = set()  # host values already found Not-ECT

    def add(self, code: str, severity: str, message: str, *locations: str) -> None:
        self.findings.append(Finding(code, severity, message, tuple(dict.fromkeys(locations))))

    def nccl(self, name: str) -> str:
        return self.p.source("host", "nccl", "env", name)

    def run(self) -> List[Finding]:
        entries = self.doc.get("interfaces") or {}
        for name, entry in entries.items():
            roce = entry.get("roce")
            if isinstance(roce, dict):
                _Entry(self, name, entry, roce).run()
            self.entry_side_effects(name, entry)
            if isinstance(entry.get("macsec"), dict):
                self.macsec_rules(name, entry)
            self.offload_rules(name, entry, entries)
            self.rings_rules(name, entry)
            if isinstance(entry.get("pcie"), dict):
                self.pcie_rules(name, entry["pcie"])
        self.host_side_effects()
        self.routing_rules(entries)
        self.nccl_rules(entries)
        self.host_tc_rules(entries)
        self.agreement_rules()
        return self.findings

    # -- PCIe settings that slow GPUDirect RDMA (knobs/pcie.py) ---------------
    def pcie_rules(self, name: str, pcie: dict) -> None:
        at = lambda key: self.p.source("interfaces", name, "pcie", key)  # noqa: E731
        gpudirect = any(k in pcie for k in ("acs_redirect", "gpu_memory_registration", "ats"))
        ordering = _number(self.env.get("NCCL_IB_PCI_RELAXED_ORDERING"))
        if pcie.get("relaxed_ordering") is False and ordering in (1, 2):
            self.add("pcie-relaxed-ordering-off", WARNING,
                     f"NCCL_IB_PCI_RELAXED_ORDERING {ordering} registers memory with relaxed "
                     f"ordering, but {name} turns relaxed ordering off on the NIC: GPUDirect RDMA "
                     "writes into GPU memory are then strictly ordered behind each other",
                     self.nccl("NCCL_IB_PCI_RELAXED_ORDERING"), at("relaxed_ordering"))
        size = _number(pcie.get("max_read_request"))
        if gpudirect and size is not None and size < PCIE_READ_REQUEST_WANTED:
            self.add("pcie-read-request-small", WARNING,
                     f"{name} asks for GPUDirect RDMA but a {size}-byte max_read_request: the NIC "
                     f"reads GPU memory in {size}-byte requests, {PCIE_READ_REQUEST_WANTED // size} "
                     f"times as many as at {PCIE_READ_REQUEST_WANTED}, which NVIDIA's ConnectX "
                     "tuning asks for", at("max_read_request"))
        if pcie.get("iommu") == "translated" and "gpu_memory_registration" in pcie and (
                pcie.get("ats") is not True):
            self.add("pcie-iommu-translated", WARNING,
                     f"{name} expects a translating IOMMU without ATS: every GPUDirect RDMA "
                     "transfer waits for an IOMMU translation in the root complex (iommu=pt at "
                     "boot, or ATS on the NIC, avoids it)", at("iommu"))
    # -- fleet agreement: variables compared that the profile never sets --------
    def agreement_rules(self) -> None:
        """agreement.env names variables the hosts' files must share; a file
        the profile does not write is not in the hosts' reports, so nothing
        is compared (control/review/agreement.py)."""
        wanted = _get(self.doc, "agreement", "env")
        if not isinstance(wanted, dict):
            return
        host = self.doc.get("host") or {}
        for family, names in wanted.items():
            if not isinstance(names, list) or isinstance(host.get(family), dict):
                continue
            self.add("agreement-file-unset", WARNING,
                     f"agreement.env.{family} lists {', '.join(map(str, names))}, but the profile "
                     f"writes no host.{family} file: the hosts' reports carry no {family} values, "
                     "so nothing of it is compared", self.p.source("agreement", "env", family))

    # -- ring sizes the NIC class would round or refuse -----------------------
    def rings_rules(self, name: str, entry: dict) -> None:
        """The class table (nicclass.py) knows each driver's ring limits and
        whether it rounds: a size it rounds reads back different, fails
        verification and rolls the apply back; one out of its limits is
        refused (RingsFamily.check does the same at plan time)."""
        rings = entry.get("rings")
        driver_sel = _get(entry, "match", "driver")
        if not isinstance(rings, dict) or driver_sel is None:
            return
        for driver in _as_list(driver_sel):
            nic = nicclass.for_driver(driver)
            if nic is None or not nic.rings:
                continue
            for key, want in rings.items():
                self.ring_rule(name, driver, nic, key, want)

    def ring_rule(self, name: str, driver: str, nic: Any, key: str, want: Any) -> None:
        limits, value = nic.rings.get(key), _wanted_number(want)
        if limits is None or value is None:
            return
        bound = next(iter(want)) if isinstance(want, dict) else None
        at = (self.p.source("interfaces", name, "rings", key),
              self.p.source("interfaces", name, "match", "driver"))
        # The minimum some drivers derive from the page size (mlx5 rx) is
        # taken for 4 KiB pages: lint does not know the host's.
        least, most = nicclass.rings_minimum(driver, key), limits[1]
        pages = " with 4 KiB pages" if key in nic.rings_page_bytes else ""
        # {min: N} is met by anything up to the maximum, {max: N} by anything
        # down to the minimum: only a bound past the other end is unmeetable.
        if (value > most and bound != "max") or (value < least and bound != "min"):
            self.add("rings-out-of-range", ERROR,
                     f"interfaces.{name}: rings.{key} {value} is outside {least}..{most}, what "
                     f"{driver} takes for {key} rings{pages}: the driver refuses it", *at)
            return
        effective = nicclass.rings_effective(driver, key, value)
        if bound is None and effective != value:
            how = " up to a power of two" if nic.rings_round_up_pow2 else ""
            self.add("rings-rounded", WARNING,
                     f"interfaces.{name}: rings.{key} {value} reads back {effective}: {driver} "
                     f"rounds {key} rings{how}, so verify sees drift and the apply rolls back; "
                     f"ask for {effective}, or {{min: {value}}}", *at)

    # -- the traffic class of every RDMA user on the host ---------------------
    def host_tc_rules(self, entries: dict) -> None:
        """UCX_IB_TRAFFIC_CLASS and NVSHMEM_IB_TRAFFIC_CLASS against
        NCCL_IB_TC when no entry gives a roce.tos or verbs_tos to compare
        each with (then _Entry.traffic_class_rules does it per entry)."""
        for name, (value, at) in self.host_tcs.items():
            if name != "NCCL_IB_TC" and not 0 <= value <= 255:
                self.add("traffic-class-invalid", ERROR,
                         f"{name} {value} is not a traffic class byte from 0 to 255", at)
        if any(isinstance(e.get("roce"), dict) and
               any(e["roce"].get(k) is not None for _, k in ENTRY_TCS) for e in entries.values()):
            return
        valid = [(n, va) for n, va in self.host_tcs.items() if 0 <= va[0] <= 255]
        ref = valid[0] if valid else None
        for name, (value, at) in valid[1:]:
            if value != ref[1][0]:
                self.add("traffic-class-mismatch", ERROR,
                         f"{name} is {value} but {ref[0]} is {ref[1][0]}: RDMA traffic of the two "
                         "libraries would land in different DSCPs, and so priorities",
                         at, ref[1][1])

    # -- MACsec: overhead against the MTU, offload against the NIC class -------
    def macsec_rules(self, name: str, entry: dict) -> None:
        from ..host.knobs.macsec import MacsecFamily

        sec = entry["macsec"]
        mtu = _wanted_number(entry.get("mtu"))
        # drivers/net/macsec.c macsec_extra_len(true): SecTAG with SCI (16)
        # plus the ICV; the link is made with the parent's MTU minus that.
        overhead = MACSEC_SECTAG_SCI + (_number(sec.get("icv_len")) or MACSEC_ICV)
        if mtu is not None and mtu - overhead < ETH_PAYLOAD:
            self.add("macsec-shrinks-mtu", WARNING,
                     f"interfaces.{name}: MACsec takes {overhead} bytes (SecTAG with SCI and "
                     f"ICV), so the macsec link's MTU is {mtu - overhead}, below {ETH_PAYLOAD}; "
                     f"an MTU of at least {ETH_PAYLOAD + overhead} on the interface carries "
                     f"{ETH_PAYLOAD}-byte packets over MACsec",
                     self.p.source("interfaces", name, "mtu"),
                     self.p.source("interfaces", name, "macsec"))
        offload = sec.get("offload")
        if offload in ("phy", "mac"):
            driver_sel = (entry.get("match") or {}).get("driver")
            drivers = _as_list(driver_sel) if driver_sel is not None else []
            for driver in drivers:
                why = MacsecFamily.nic_support(driver, "macsec.offload")
                why = why if why and why.startswith("not supported") else (
                    MacsecFamily.offload_refused(driver, offload))  # nicclass's driver rule
                if why:
                    self.add("macsec-offload-unsupported", ERROR,
                             f"interfaces.{name}: macsec offload {offload} on {driver}: {why}",
                             self.p.source("interfaces", name, "macsec", "offload"),
                             self.p.source("interfaces", name, "match", "driver"))

        self.macsec_key_rules(name, sec)

    def macsec_key_rules(self, name: str, sec: dict) -> None:
        """Static keys only with an XPN cipher (knobs/macsec.py says why)."""
        from ..host.knobs.macsec import XPN_CIPHERS

        given = [k for k in ("tx_sa", "rx", "port") if k in sec]
        if sec.get("keys") == "mka" and given:
            self.add("macsec-mka-with-sas", ERROR,
                     f"interfaces.{name}: macsec keys: mka with {', '.join(given)}: the MKA "
                     "daemon owns the SAs and the SCI of its link; nictune writes none",
                     *(self.p.source("interfaces", name, "macsec", k) for k in given))
        static = sec.get("keys", "static") == "static" and ("tx_sa" in sec or sec.get("rx"))
        cipher = sec.get("cipher", "gcm-aes-128")
        if static and cipher not in XPN_CIPHERS:
            self.add("macsec-static-key-nonce-reuse", ERROR,
                     f"interfaces.{name}: static MACsec keys with {cipher}: every re-install "
                     "repeats (SCI, PN) nonces under the key and a 32-bit PN runs out in minutes "
                     "at 400 Gb/s; use keys: mka (wpa_supplicant owns the keys), or for a lab "
                     "gcm-aes-xpn-128/256 (nictune keeps a PN mark per key)",
                     self.p.source("interfaces", name, "macsec", "cipher")
                     if "cipher" in sec else self.p.source("interfaces", name, "macsec"))

    # -- ASAP2 and inline crypto: tc offload, crypto bits, their overhead ------
    def offload_rules(self, name: str, entry: dict, entries: dict) -> None:
        from ..host.knobs.crypto import CRYPTO_BITS, CryptoFamily

        at = lambda *keys: self.p.source("interfaces", name, *keys)  # noqa: E731
        features = entry.get("features") if isinstance(entry.get("features"), dict) else {}
        tc = features.get("hw-tc-offload")
        switchdev = (entry.get("eswitch") or {}).get("mode") == "switchdev"
        flavour = _as_list((entry.get("match") or {}).get("flavour"))
        representor = bool(flavour) and set(flavour) <= {"pcivf", "pcipf"} and any(
            (e.get("eswitch") or {}).get("mode") == "switchdev" for e in entries.values())
        ovs_offload = ((self.doc.get("host") or {}).get("ovs") or {}).get("hw_offload") is True
        if (switchdev or representor) and tc is False:
            what = "the eswitch is in switchdev" if switchdev else "it matches representors"
            self.add("switchdev-tc-offload-off", ERROR,
                     f"interfaces.{name}: hw-tc-offload off while {what}: tc flower rules (OVS "
                     "hw-offload, Kubernetes SR-IOV) stay in software on it",
                     at("features", "hw-tc-offload"),
                     at("eswitch", "mode") if switchdev else at("match", "flavour"))
        elif switchdev and tc is None and ovs_offload:
            self.add("switchdev-tc-offload-missing", WARNING,
                     f"interfaces.{name}: OVS hw_offload is on and the eswitch in switchdev, but "
                     "the entry leaves hw-tc-offload as the device has it (mlx5 turns it on by "
                     "itself in switchdev, on the uplink and every representor; other drivers may "
                     "not): set features: {hw-tc-offload: true} here and on the representors, "
                     "which plan then checks",
                     at("eswitch", "mode"), self.p.source("host", "ovs", "hw_offload"))
        self.vfs_without_switchdev(name, entry, tc, ovs_offload)
        self.vfs_beyond_firmware(name, entry)
        self.vf_attrs_in_switchdev(name, entry, entries)
        crypto = entry.get("crypto") if isinstance(entry.get("crypto"), dict) else {}
        for key, value in crypto.items():
            bit = CRYPTO_BITS.get(key)
            if bit in features:
                self.add("crypto-feature-twice", ERROR,
                         f"interfaces.{name}: crypto.{key} and features.{bit} set the same "
                         "ethtool bit; keep one", at("crypto", key), at("features", bit))
            driver_sel = (entry.get("match") or {}).get("driver")
            for driver in (_as_list(driver_sel) if value is True and driver_sel else []):
                why = CryptoFamily.nic_support(driver, f"crypto.{key}")
                if why and why.startswith("not supported"):
                    self.add("crypto-unsupported", ERROR,
                             f"interfaces.{name}: crypto.{key} on {driver}: {why}",
                             at("crypto", key), at("match", "driver"))
        self.crypto_overhead_rule(name, entry, crypto)
        self.static_sa_rule(name, entry)

    def vfs_without_switchdev(self, name: str, entry: dict, tc: Any, ovs_offload: bool) -> None:
        """VFs asked for, and tc offload asked for them (hw-tc-offload on the
        PF, or OVS hw_offload), with the eswitch legacy or left as it is: in
        legacy mode there are no representors, and VF traffic goes through
        the NIC's legacy switch, which offloads no tc flower rule."""
        at = lambda *keys: self.p.source("interfaces", name, *keys)  # noqa: E731
        sriov = entry.get("sriov") if isinstance(entry.get("sriov"), dict) else {}
        numvfs = _wanted_number(sriov.get("numvfs"))
        mode = (entry.get("eswitch") or {}).get("mode") if isinstance(entry.get("eswitch"), dict) else None
        if not numvfs or numvfs <= 0 or mode == "switchdev" or not (tc is True or ovs_offload):
            return
        why, where = ("hw-tc-offload on", at("features", "hw-tc-offload")) if tc is True else (
            "OVS hw_offload on", self.p.source("host", "ovs", "hw_offload"))
        state = "legacy" if mode == "legacy" else "not set (legacy on a fresh device)"
        self.add("sriov-offload-legacy-eswitch", WARNING,
                 f"interfaces.{name}: {numvfs} VF(s) with {why}, but the eswitch mode is "
                 f"{state}: a legacy eswitch has no representors and offloads no tc flower "
                 "rule for VF traffic; set eswitch: {mode: switchdev} on this entry",
                 at("sriov", "numvfs"), where, *((at("eswitch", "mode"),) if mode else ()))

    def vfs_beyond_firmware(self, name: str, entry: dict) -> None:
        """More VFs asked for than the firmware configuration this entry
        stores offers (firmware.total_vfs caps the PCI function's
        sriov_totalvfs from the next reboot on), or VFs with SR-IOV off in
        the firmware: the write of sriov_numvfs would be refused (ERANGE)
        once that configuration runs."""
        at = lambda *keys: self.p.source("interfaces", name, *keys)  # noqa: E731
        sriov = entry.get("sriov") if isinstance(entry.get("sriov"), dict) else {}
        firmware = entry.get("firmware") if isinstance(entry.get("firmware"), dict) else {}
        numvfs = _wanted_number(sriov.get("numvfs"))
        if not numvfs or numvfs <= 0:
            return
        total = _number(firmware.get("total_vfs"))
        if total is not None and numvfs > total:
            self.add("sriov-beyond-firmware-vfs", ERROR,
                     f"interfaces.{name}: sriov.numvfs {numvfs} is more than the firmware's "
                     f"total_vfs {total}: the PCI function offers at most {total} VFs "
                     "(sriov_totalvfs) once that configuration runs; raise firmware.total_vfs "
                     "or ask for fewer VFs", at("sriov", "numvfs"), at("firmware", "total_vfs"))
        if firmware.get("sriov_enabled") is False:
            self.add("sriov-disabled-in-firmware", ERROR,
                     f"interfaces.{name}: {numvfs} VF(s) asked for, with firmware.sriov_enabled "
                     "false: the PCI function has no SR-IOV capability once that configuration "
                     "runs", at("sriov", "numvfs"), at("firmware", "sriov_enabled"))

    def vf_attrs_in_switchdev(self, name: str, entry: dict, entries: dict) -> None:
        """VF attributes the driver refuses in switchdev (nicclass rules:
        mlx5 vlan/qos/trust/spoofchk), on an entry whose eswitch this profile
        puts in switchdev (an error on mlx5, a warning when the entry names
        no driver), or whose driver's eswitch another entry puts there (a
        warning: it depends on whether both match the same PF)."""
        at = lambda *keys: self.p.source("interfaces", name, *keys)  # noqa: E731
        sriov = entry.get("sriov") if isinstance(entry.get("sriov"), dict) else {}
        vfs = sriov.get("vfs") if isinstance(sriov.get("vfs"), dict) else {}
        drivers = _as_list((entry.get("match") or {}).get("driver")) if (
            entry.get("match") or {}).get("driver") is not None else []
        if not vfs:
            return
        own = (entry.get("eswitch") or {}).get("mode") == "switchdev" if isinstance(
            entry.get("eswitch"), dict) else False
        other = next((n for n, e in entries.items() if n != name and isinstance(e, dict)
                      and isinstance(e.get("eswitch"), dict) and e["eswitch"].get("mode") == "switchdev"
                      and set(drivers) & set(_as_list((e.get("match") or {}).get("driver")))), None)
        if not own and other is None:
            return
        where = at("eswitch", "mode") if own else self.p.source("interfaces", other, "eswitch", "mode")
        for driver in drivers or ["mlx5_core"]:
            for vf, attrs in vfs.items():
                for attr, value in (attrs.items() if isinstance(attrs, dict) else ()):
                    # VLAN 0, trust and spoofchk off are what a new VF reads:
                    # plan writes nothing for them, so the driver refuses nothing.
                    found = value and nicclass.vf_write_refused(driver, attr, value,
                                                                nicclass.SWITCHDEV)
                    if not found:
                        continue
                    severity = ERROR if own and drivers else WARNING
                    whose = ("the eswitch of this entry is in switchdev" if own else
                             f"interfaces.{other} puts a {driver} eswitch in switchdev")
                    self.add("vf-attr-refused-in-switchdev", severity,
                             f"interfaces.{name}: sriov.vfs.{vf}.{attr} while {whose}"
                             + ("" if drivers else " (the entry names no driver: on mlx5)")
                             + f": {found.why} [{found.source}]",
                             at("sriov", "vfs", str(vf), attr), where)
    def static_sa_rule(self, name: str, entry: dict) -> None:
        """Static SAs: refused outside a lab (the plan refuses them too), and
        a warning in a lab, since nothing rekeys them."""
        from ..host.knobs.ipsec import LAB_WHY  # the family's words, one text

        ipsec = entry.get("ipsec")
        if not isinstance(ipsec, dict) or not ipsec.get("sas"):
            return
        at = lambda *keys: self.p.source("interfaces", name, "ipsec", *keys)  # noqa: E731
        if ipsec.get("lab") is not True:
            self.add("ipsec-static-sa-outside-lab", ERROR,
                     f"interfaces.{name}: ipsec.sas without ipsec.lab: true: {LAB_WHY}; let an "
                     "IKE daemon (strongSwan hw_offload, libreswan nic-offload) install the SAs "
                     "and check them with expect: {ipsec_offload: {if_present: crypto}}",
                     at("sas"))
        else:
            self.add("ipsec-static-sa", WARNING,
                     f"interfaces.{name}: static SAs (lab): {LAB_WHY}; each expires at its hard "
                     "lifetime and its traffic then stops until a new key and SPI are applied",
                     at("sas"), at("lab"))

    def crypto_overhead_rule(self, name: str, entry: dict, crypto: dict) -> None:
        """MACsec, or ESP packet offload, on a RoCE entry take bytes from every
        RoCE frame: the RoCE MTU the rail's MTU gives may drop a step.  ESP
        in software or crypto offload never sees RoCE (RDMA bypasses xfrm)."""
        if not isinstance(entry.get("roce"), dict):
            return
        at = lambda *keys: self.p.source("interfaces", name, *keys)  # noqa: E731
        layers = []
        sec = entry.get("macsec")
        if isinstance(sec, dict):
            layers.append((MACSEC_SECTAG_SCI + (_number(sec.get("icv_len")) or MACSEC_ICV),
                           "MACsec (SecTAG with SCI and ICV)", at("macsec")))
        packet, esp = _esp_on_entry(entry, crypto, at)
        if packet:
            layers.append((ESP_OVERHEAD, "ESP packet offload (mlx5 steers RoCE v2 between the "
                           "SA's addresses through it, lib/ipsec_fs_roce.c, where the firmware "
                           "offers it; transport mode, AES-GCM; tunnel mode adds the outer IP "
                           "header)", packet))
        elif esp:
            self.add("esp-leaves-roce-clear", WARNING,
                     f"interfaces.{name}: ESP here runs in software or as crypto offload, which "
                     "never covers RoCE: RDMA traffic bypasses xfrm and leaves in clear. Only "
                     "mlx5 packet offload steers RoCE v2 through an SA (lib/ipsec_fs_roce.c); "
                     "MACsec covers every frame", esp)
        mtu = _wanted_number(entry.get("mtu"))
        if mtu is None or roce_mtu(mtu) is None:
            return
        for overhead, what, where in layers:
            left = roce_mtu(mtu - overhead)
            if left != roce_mtu(mtu):
                self.add("crypto-overhead-caps-roce-mtu", WARNING,
                         f"interfaces.{name}: {what} takes {overhead} bytes of every frame, so "
                         f"RoCE traffic it protects gets a RoCE MTU of {left or 'below 256'} "
                         f"instead of {roce_mtu(mtu)} at MTU {mtu}; an MTU of at least "
                         f"{roce_mtu(mtu) + ROCE_HEADERS + overhead} keeps it",
                         at("mtu"), where)

    # -- kernel side effects a rollback undoes only in part -------------------
    def entry_side_effects(self, name: str, entry: dict) -> None:
        mtu = _wanted_number(entry.get("mtu"))
        if mtu is not None and mtu < IPV6_MIN_MTU:
            self.add("mtu-drops-ipv6", WARNING,
                     f"interfaces.{name}: MTU {mtu} is below {IPV6_MIN_MTU}, the IPv6 minimum: the "
                     "kernel removes IPv6 from the interface and the devices stacked on it "
                     f"(addresses, routes, IPv6 sysctls); {ROLLBACK_PART}",
                     self.p.source("interfaces", name, "mtu"))
        if entry.get("state") == "down":
            self.add("state-down-drops-routes", WARNING,
                     f"interfaces.{name}: state down makes the kernel remove the interface's routes "
                     f"and IPv6 addresses and take its VLANs down; {ROLLBACK_PART}",
                     self.p.source("interfaces", name, "state"))
        if normalise((entry.get("sysctl") or {}).get("ipv6.disable_ipv6", 0)) == 1:
            self.add("disable-ipv6-drops-addresses", WARNING,
                     f"interfaces.{name}: disable_ipv6 1 makes the kernel remove the interface's IPv6 "
                     f"addresses and routes; {ROLLBACK_PART}",
                     self.p.source("interfaces", name, "sysctl", "ipv6.disable_ipv6"))

    def host_side_effects(self) -> None:
        for key, value in ((self.doc.get("host") or {}).get("sysctl") or {}).items():
            at = self.p.source("host", "sysctl", key)
            if key in SPREAD:
                lro = (", not LRO, which the kernel switches off on every device when forwarding "
                       "goes on") if SPREAD[key][1] == "forwarding" else ""
                self.add("sysctl-spreads-to-interfaces", WARNING,
                         f"host sysctl {key}: {spread_note(key)}, over each interface's own value; "
                         f"nictune rollback puts back the values it records before the apply{lro}", at)
            where = _disabled_ipv6_on(key)
            if where and normalise(value) == 1:
                self.add("disable-ipv6-drops-addresses", WARNING,
                         f"host sysctl {key} 1 makes the kernel remove the IPv6 addresses and routes "
                         f"of {where}; {ROLLBACK_PART}", at)

    # -- per-rail routing (knobs/routing.py) ------------------------------------
    def routing_rules(self, entries: dict) -> None:
        """Tables and priorities that two entries would share, priorities
        outside nictune's band, and the ARP sysctls rails in one subnet need."""
        claims: Dict[str, list] = {"table": [], "priority": []}
        for name, entry in entries.items():
            spec = entry.get("routing")
            if not isinstance(spec, dict):
                continue
            for what, default in (("table", routing.DEFAULT_TABLE), ("priority", routing.DEFAULT_PRIORITY)):
                numbers = routing.claimed(spec.get(what, default))
                at = self.p.source("interfaces", name, "routing", what) if what in spec \
                    else self.p.source("interfaces", name, "routing")
                for other, other_numbers, other_at in claims[what]:
                    if numbers & other_numbers:
                        self.add("routing-collision", ERROR,
                                 f"interfaces.{name} and interfaces.{other}: their routing {what} ranges overlap "
                                 f"at {min(numbers & other_numbers)} (N+rail claims N to "
                                 f"N+{routing.MAX_RAILS - 1}): give each entry its own range", at, other_at)
                claims[what].append((name, numbers, at))
            self.routing_band(name, spec)
            self.routing_arp(name, entry)
            self.stable_gids(name, entry)

    def routing_band(self, name: str, spec: dict) -> None:
        low, high = routing.PRIORITY_BAND
        numbers = routing.claimed(spec.get("priority", routing.DEFAULT_PRIORITY))
        if numbers and not (low <= min(numbers) and max(numbers) <= high):
            self.add("routing-priority-outside-band", WARNING,
                     f"interfaces.{name}: routing priorities {min(numbers)}-{max(numbers)} leave "
                     f"nictune's band {low}-{high}: below it they are looked at before the "
                     "operator's usual rules and may shadow them; from 32766 on, after the main table",
                     self.p.source("interfaces", name, "routing", "priority"))

    def routing_arp(self, name: str, entry: dict) -> None:
        """The routing family brings the ARP and rp_filter sysctls of the
        rails' layout as defaults (knobs/routing.py ONE_SUBNET, PER_RAIL);
        a value the profile sets itself overrides them, and one the layout
        makes wrong is worth a word: arp_ignore 0 or rp_filter 1 on rails
        that may share a subnet (the layout is known here only from declared
        addresses; the plan learns it from the host), arp_announce
        other than 2 on any.  The kernel takes the larger of conf.all and
        the interface's own value (ip-sysctl.rst)."""
        spec, sysctls = entry.get("routing") or {}, entry.get("sysctl") or {}
        host = (self.doc.get("host") or {}).get("sysctl") or {}
        keys = routing.ONE_SUBNET if "address" not in spec or \
            routing.declared_one_subnet(spec["address"]) else routing.PER_RAIL
        for key in keys:
            everywhere = f"net.ipv4.conf.all.{key[5:]}"
            if key not in sysctls and everywhere not in host:
                continue  # the family's default holds
            own = _as_int(sysctls[key]) if key in sysctls else routing.ONE_SUBNET[key]
            if max(own, _as_int(host.get(everywhere))) in routing.GOOD[key]:
                continue
            at = self.p.source("interfaces", name, "sysctl", key) if key in sysctls \
                else self.p.source("host", "sysctl", everywhere)
            self.add("routing-arp-sysctl-overridden", WARNING,
                     f"interfaces.{name}: routing with {key} {max(own, _as_int(host.get(everywhere)))} "
                     f"(the routing family's default is {routing.ONE_SUBNET[key]}): rails that share a "
                     "subnet then answer ARP for each other or drop traffic that arrives on another "
                     "rail, and the peer's traffic to one rail's address arrives on another",
                     at, self.p.source("interfaces", name, "routing"))

    def stable_gids(self, name: str, entry: dict) -> None:
        """Rails whose GID index a library file names by number need IPv6
        addresses that do not come and go: each one takes or frees a RoCE
        GID slot, and the IPv4 GID can land at another index."""
        numbered = [(section, key) for section, key in GID_INDEX_KEYS
                    if _number(_get(self.doc, "host", section, "env", key)) is not None]
        if not numbered:
            return
        sysctls = entry.get("sysctl") or {}
        if _as_int(sysctls.get("ipv6.disable_ipv6")) == 1:
            return
        missing = [f"{key} {value}" for key, value in STABLE_GID_SYSCTLS
                   if sysctls.get(key) is None or _as_int(sysctls.get(key)) != value]
        if missing:
            section, key = numbered[0]
            self.add("gid-index-may-move", WARNING,
                     f"interfaces.{name}: {key} names a GID index, but the rails do not set "
                     f"{', '.join(missing)}: a SLAAC or generated link-local address takes a GID "
                     "slot and the RoCE v2 IPv4 GID can move to another index",
                     self.p.source("interfaces", name, "routing"),
                     self.p.source("host", section, "env", key))

    # -- NCCL, whole profile -------------------------------------------------
    def nccl_rules(self, entries: dict) -> None:
        hca = self.env.get("NCCL_IB_HCA")
        if hca is not None and str(hca) != "auto" and not hca_syntax_ok(str(hca)):
            self.add("nccl-ib-hca-syntax", ERROR,
                     f"NCCL_IB_HCA {str(hca)!r} is not NCCL's syntax: an optional '^' (exclude) and "
                     "'=' (exact names), then comma-separated device[:port] items such as "
                     "=mlx5_0:1,mlx5_1:1", self.nccl("NCCL_IB_HCA"))
        tc = self.env.get("NCCL_IB_TC")
        if tc is not None and not 0 <= (_number(tc) if _number(tc) is not None else -1) <= 255:
            self.add("nccl-tc-invalid", ERROR,
                     f"NCCL_IB_TC {tc!r} is not a traffic class byte from 0 to 255",
                     self.nccl("NCCL_IB_TC"))
        fifo = self.env.get("NCCL_IB_FIFO_TC")
        if fifo is not None and not 0 <= (_number(fifo) if _number(fifo) is not None else -1) <= 255:
            self.add("nccl-tc-invalid", ERROR,
                     f"NCCL_IB_FIFO_TC {fifo!r} is not a traffic class byte from 0 to 255",
                     self.nccl("NCCL_IB_FIFO_TC"))
        self.socket_ifname(entries)

    def socket_ifname(self, entries: dict) -> None:
        value = self.env.get("NCCL_SOCKET_IFNAME")
        if value is None:
            return
        globs = {name: _as_list(entry.get("match", {}).get("name"))
                 for name, entry in entries.items() if entry.get("match", {}).get("name")}
        if not globs:
            return  # no entry names interfaces: only the host can tell (the agent checks)
        items, exclude, exact = nccl_list(str(value))
        hits = [entry for entry, patterns in globs.items()
                if any(_overlap(item, exact, pat) for item in items for pat in patterns)]
        if exclude:
            spared = [entry for entry, patterns in globs.items()
                      if not all(any(_covered(item, exact, pat) for item in items) for pat in patterns)]
            if not spared:
                self.add("nccl-socket-ifname-no-entry", WARNING,
                         f"NCCL_SOCKET_IFNAME {value!r} excludes every interface the profile names "
                         f"({', '.join(sorted(globs))})", self.nccl("NCCL_SOCKET_IFNAME"),
                         *(self.p.source("interfaces", e, "match", "name") for e in sorted(globs)))
        elif not hits:
            self.add("nccl-socket-ifname-no-entry", WARNING,
                     f"NCCL_SOCKET_IFNAME {value!r} selects none of the interfaces the profile names "
                     f"by name ({', '.join(sorted(globs))}): NCCL's bootstrap would use an interface "
                     "this profile does not tune", self.nccl("NCCL_SOCKET_IFNAME"),
                     *(self.p.source("interfaces", e, "match", "name") for e in sorted(globs)))


# Library files that may name a GID index by number, and the rails' IPv6
# sysctls that keep the GID table from moving: no generated addresses
# (addr_gen_mode 1: none), no router advertisements.
GID_INDEX_KEYS = (("nccl", "NCCL_IB_GID_INDEX"), ("ucx", "UCX_IB_GID_INDEX"),
                  ("nvshmem", "NVSHMEM_IB_GID_INDEX"))
STABLE_GID_SYSCTLS = (("ipv6.addr_gen_mode", 1), ("ipv6.accept_ra", 0))


def _as_int(value: Any) -> int:
    """A sysctl value the profile gives, as an int; 0 (the kernel's default) when unset or not one."""
    value = normalise(value) if value is not None else 0
    return value if isinstance(value, int) else 0


def _disabled_ipv6_on(key: str) -> str:
    """Which interfaces host sysctl `key` disables IPv6 on, or ''."""
    prefix, suffix = "net.ipv6.conf.", ".disable_ipv6"
    if not (key.startswith(prefix) and key.endswith(suffix)) or len(key) <= len(prefix + suffix):
        return ""
    ifname = key[len(prefix):-len(suffix)]
    return {"all": "every interface", "default": ""}.get(ifname, ifname)


def _as_list(value: Any) -> List[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _literal(pattern: str) -> str:
    """The part of a glob before its first wildcard."""
    return re.split(r"[*?\[]", pattern, 1)[0]


def _overlap(item: str, exact: bool, pattern: str) -> bool:
    """Whether NCCL item (a name prefix, or with '=' an exact name) and an
    entry's name glob can select the same interface."""
    if exact or fnmatch.fnmatchcase(item, pattern):
        return fnmatch.fnmatchcase(item, pattern)
    literal = _literal(pattern)
    if literal == pattern:  # a plain name: the prefix must start it
        return pattern.startswith(item)
    # "item..." and "literal<wildcard>..." meet when one starts the other.
    return literal.startswith(item) or item.startswith(literal)


def _covered(item: str, exact: bool, pattern: str) -> bool:
    """Whether NCCL item selects every interface the glob can match."""
    literal = _literal(pattern)
    if exact:
        return literal == pattern == item
    return literal.startswith(item)


class _Entry:
    """The rules of one interface entry with a roce: section."""

    def __init__(self, linter: _Linter, name: str, entry: dict, roce: dict):
        self.l, self.name, self.entry, self.roce = linter, name, entry, roce
        self.ecn = roce.get("ecn") or {}
        self.ets = roce.get("ets") or {}
        self.dscp_map = {int(k): v for k, v in (roce.get("dscp_map") or {}).items()}
        # mlx5: trust is dscp as soon as the APP table has DSCP entries.
        self.trust = roce.get("trust") or ("dscp" if self.dscp_map else None)
        self.np = set(self.ecn.get("np") or [])
        self.rp = set(self.ecn.get("rp") or [])
        # ECN is "configured" when the entry turns it on for some priority; an
        # ecn section with CNP settings only leaves the enables as they are.
        self.ecn_on = bool(self.np or self.rp)

    def at(self, *keys: str) -> str:
        return self.l.p.source("interfaces", self.name, "roce", *keys)

    def add(self, code: str, severity: str, message: str, *locations: str) -> None:
        self.l.add(code, severity, f"interfaces.{self.name}: {message}", *locations)

    def run(self) -> None:
        self.trust_rules()
        prio = self.tos_rules()
        if prio is not None:
            self.priority_rules(prio)
        self.ets_sum()
        self.pfc_unused()
        self.cnp_rules()
        self.cnp_class_rule()
        self.traffic_class_rules()
        self.ect_rules()
        self.fifo_tc_rules()
        self.pause_rules()
        self.pfc_without_ecn()
        self.gid_index_rule()
        self.mtu_rule()
        self.headroom_rules()

    def starved_class(self, prio: Any) -> Optional[int]:
        """The traffic class `prio` maps to (ets.prio_tc) when that class is
        not strict and gets no bandwidth, else None.  mlx5 puts zero-share
        ETS classes in the lowest group, below every other ETS and strict
        class (en_dcbnl.c mlx5e_build_tc_group: MLX5E_LOWEST_PRIO_GROUP, the
        others one up; mlx5e_build_tc_tx_bw splits that group's 100% among
        them), so they send only when nothing else has anything to send."""
        prio_tc = self.ets.get("prio_tc")
        if not isinstance(prio, int) or prio_tc is None or not 0 <= prio < len(prio_tc):
            return None
        tc = prio_tc[prio]
        tsa = (self.ets.get("tc_tsa") or [None] * 8)[tc] if 0 <= tc < 8 else None
        bw = (self.ets.get("tc_bw") or [None] * 8)[tc] if 0 <= tc < 8 else None
        return tc if tsa in ("ets", None) and bw == 0 else None

    def ets_at(self) -> List[str]:
        return [self.at("ets", "prio_tc"), self.at("ets", "tc_bw"),
                *([self.at("ets", "tc_tsa")] if self.ets.get("tc_tsa") else [])]

    def cnp_class_rule(self) -> None:
        cnp_dscp, cnp_prio = self.ecn.get("cnp_dscp"), self.ecn.get("cnp_prio")
        where = [self.at("ecn", "cnp_prio")]
        if cnp_prio is None and cnp_dscp is not None and self.trust == "dscp":
            cnp_prio = self.dscp_map.get(cnp_dscp)
            where = [self.at("ecn", "cnp_dscp"), self.at("dscp_map")]
        tc = self.starved_class(cnp_prio)
        if tc is None:
            return
        self.add("cnp-class-starved", ERROR,
                 f"CNPs go out on priority {cnp_prio}, traffic class {tc} (ets.prio_tc), which is "
                 "not strict and gets 0% (ets.tc_bw): mlx5 puts zero-bandwidth ETS classes below "
                 "every other class (mlx5e_build_tc_group), so CNPs wait exactly when congestion is "
                 f"worst; make traffic class {tc} strict (NVIDIA's recipe) or give it a share",
                 *where, *self.ets_at())

    # -- one ToS for all RDMA traffic on the port -------------------------------
    def own_tcs(self) -> List[Tuple[str, int, str]]:
        return [(label, _number(self.roce.get(key)), self.at(key)) for label, key in ENTRY_TCS
                if _number(self.roce.get(key)) is not None]

    def traffic_class_rules(self) -> None:
        """roce.tos, roce.verbs_tos and every library's traffic class must be
        one value (nccl-tc-mismatch, in tos_rules, is NCCL_IB_TC vs roce.tos)."""
        own = self.own_tcs()
        if not own:
            return
        ref_label, ref, ref_at = own[0]
        for label, value, at in own[1:] + [(n, v, a) for n, (v, a) in self.l.host_tcs.items()]:
            if value == ref or (label == "NCCL_IB_TC" and ref_label == "roce.tos"):
                continue
            self.add("traffic-class-mismatch", ERROR,
                     f"{label} is {value} but {ref_label} is {ref}: that traffic would carry DSCP "
                     f"{value >> 2}, not {ref >> 2}, and so not be in the RoCE class", at, ref_at)
        if ref_label != "roce.tos" and "NCCL_IB_TC" not in self.l.env and self.l.env:
            self.add("nccl-tc-unset", WARNING,
                     f"{ref_label} is {ref} but NCCL_IB_TC is not set: NCCL sends with traffic "
                     "class 0 (DSCP 0)", ref_at, self.l.p.source("host", "nccl", "env"))
        for name, keys in HOST_TCS:
            section = _get(self.l.doc, *keys[:2])
            if name in self.l.host_tcs or name not in HOST_TC_DEFAULT or not isinstance(section, dict):
                continue
            default, why = HOST_TC_DEFAULT[name]
            if default != ref:
                self.add("traffic-class-unset", WARNING,
                         f"{ref_label} is {ref} but {name} is not set: {why}, so its RDMA traffic "
                         "would not be in the RoCE class", ref_at, self.l.p.source(*keys[:2]))

    def ect_rules(self) -> None:
        if not self.ecn_on:
            return
        host = [(n, v, a) for n, (v, a) in self.l.host_tcs.items() if n not in self.l.ect_reported]
        for label, value, at in self.own_tcs() + host:
            if not 0 <= value <= 255 or value & 3 in ECT:
                continue
            if label in self.l.host_tcs:
                self.l.ect_reported.add(label)
            self.not_ect(label, value, at)

    def not_ect(self, label: str, value: int, at: str) -> None:
        prios = ", ".join(map(str, sorted(self.np | self.rp)))
        self.add("tos-not-ect", WARNING,
                 f"{label} {value} has {_ecn_bits(value)} in its ECN bits (the low two, RFC 3168) "
                 f"while ECN is on for priority {prios}: a congested switch marks ECT packets and "
                 "drops the others, so DCQCN never slows that traffic down; "
                 f"{(value & ~3) | 2} is DSCP {value >> 2} with ECT(0)", at, self.at("ecn"))

    def fifo_tc_rules(self) -> None:
        """NCCL_IB_FIFO_TC (NCCL 2.22.3+, env.rst): the traffic class of the
        receiver's QPs, which carry the CTS (credit) RDMA writes
        (src/transport/net_ib/connect.cc ncclIbReceiverQpsCreateToRts);
        meant for "a high priority, low-latency traffic class" so credits are
        not delayed behind data.  Unmapped, it lands on priority 0 behind bulk
        traffic; in a class without bandwidth, it waits behind everything."""
        fifo = _number(self.l.env.get("NCCL_IB_FIFO_TC"))
        if fifo is None or not 0 <= fifo <= 255 or self.trust != "dscp" or not self.dscp_map:
            return
        where = self.l.nccl("NCCL_IB_FIFO_TC")
        prio = self.dscp_map.get(fifo >> 2)
        if prio is None:
            self.add("fifo-tc-unmapped", WARNING,
                     f"NCCL_IB_FIFO_TC {fifo} is DSCP {fifo >> 2}, which dscp_map does not map: "
                     "NCCL's credit (CTS) messages would fall into priority 0, behind bulk "
                     "traffic, the opposite of what NCCL_IB_FIFO_TC is for", where, self.at("dscp_map"))
            return
        tc = self.starved_class(prio)
        if tc is not None:
            self.add("fifo-tc-starved", ERROR,
                     f"NCCL_IB_FIFO_TC {fifo} is DSCP {fifo >> 2}, priority {prio}, traffic class "
                     f"{tc}, which is not strict and gets 0% (ets.tc_bw): NCCL's credit messages "
                     "would wait behind every other class and stall the data behind them",
                     where, self.at("dscp_map"), *self.ets_at())
        if prio in self.np | self.rp and fifo & 3 not in ECT:
            self.not_ect("NCCL_IB_FIFO_TC", fifo, where)

    # -- PFC against link-level pause and ECN ----------------------------------
    def pause_rules(self) -> None:
        """Global (802.3x) pause stops every priority, the lossy ones too,
        and mlx5 keeps it in the same port register as PFC (PFCC) and will
        not run both: NVIDIA's PFC recipes turn it off first."""
        pfc = self.roce.get("pfc") or []
        if not pfc:
            return
        pause = self.entry.get("pause") if isinstance(self.entry.get("pause"), dict) else {}
        prios = ("priority " if len(pfc) == 1 else "priorities ") + ", ".join(map(str, pfc))
        at = lambda key: self.l.p.source("interfaces", self.name, "pause", key)  # noqa: E731
        on = [k for k in ("rx", "tx") if pause.get(k) is True]
        if on:
            self.add("pfc-with-global-pause", ERROR,
                     f"PFC is on for {prios} and link-level pause {' and '.join(on)} too: global "
                     "pause stops every priority, the lossy ones included (and mlx5 keeps both in "
                     "one port register, PFCC, and will not run both); set pause: {rx: false, "
                     "tx: false}",
                     *(at(k) for k in on), self.at("pfc"))
            return
        unset = [k for k in ("rx", "tx") if pause.get(k) is None]
        driver_sel = _get(self.entry, "match", "driver")
        known = [d for d in (_as_list(driver_sel) if driver_sel is not None else [])
                 if d in GLOBAL_PAUSE_AT_BOOT]
        if unset and known:
            self.add("pfc-global-pause-unset", WARNING,
                     f"PFC is on for {prios} but the entry leaves pause {' and '.join(unset)} "
                     f"as the device has it: {GLOBAL_PAUSE_AT_BOOT[known[0]]}, and global pause "
                     "cannot run beside PFC; set pause: {rx: false, tx: false}",
                     self.at("pfc"), self.l.p.source("interfaces", self.name, "match", "driver"))

    def pfc_without_ecn(self) -> None:
        """A lossless priority without DCQCN has only pause to slow senders:
        congestion spreads back hop by hop (pause storms, head-of-line
        blocking of the flows that share the paused queues).  Only when the
        entry turns ECN on somewhere: without np/rp the profile leaves the
        device's ECN enables as they are, which lint cannot see."""
        if not self.ecn_on:
            return
        used = set(self.dscp_map.values()) if self.trust == "dscp" and self.dscp_map else None
        for prio in sorted(set(self.roce.get("pfc") or [])):
            if (used is not None and prio not in used) or prio == self.ecn.get("cnp_prio"):
                continue  # pfc-unused-priority and cnp-prio-lossless say it
            missing = [n for n, on in (("np", self.np), ("rp", self.rp)) if prio not in on]
            if missing:
                self.add("pfc-without-ecn", WARNING,
                         f"PFC is on for priority {prio} but ECN {' and '.join(missing)} "
                         f"{'are' if len(missing) > 1 else 'is'} not: a "
                         "lossless priority without DCQCN only has pause frames to slow senders, "
                         "so congestion spreads as pause storms and head-of-line blocking; add "
                         f"{prio} to ecn.np and ecn.rp", self.at("pfc"), self.at("ecn"))

    def trust_rules(self) -> None:
        if self.roce.get("trust") == "pcp" and self.dscp_map:
            self.add("trust-pcp-with-dscp-map", ERROR,
                     "trust pcp classifies by the VLAN priority, but dscp_map maps DSCPs (and on mlx5 "
                     "any DSCP entry switches trust to dscp): drop one of them",
                     self.at("trust"), self.at("dscp_map"))

    def tos_rules(self) -> Optional[int]:
        """NCCL_IB_TC against tos; returns the RoCE priority when it is known."""
        tos = self.roce.get("tos")
        env = self.l.env
        if tos is None:
            return None
        nccl_tc = _number(env["NCCL_IB_TC"]) if "NCCL_IB_TC" in env else None
        if "NCCL_IB_TC" in env and nccl_tc is not None and nccl_tc != tos:
            self.add("nccl-tc-mismatch", ERROR,
                     f"NCCL_IB_TC is {nccl_tc} but roce.tos is {tos}: NCCL sets the traffic class of "
                     "its own QPs from NCCL_IB_TC, so its traffic would not be in the RoCE class",
                     self.l.nccl("NCCL_IB_TC"), self.at("tos"))
        elif "NCCL_IB_TC" not in env and env:
            self.add("nccl-tc-unset", WARNING,
                     f"roce.tos is {tos} but NCCL_IB_TC is not set: NCCL ignores the RDMA-CM default "
                     "ToS and sends with traffic class 0 (DSCP 0)",
                     self.at("tos"), self.l.p.source("host", "nccl", "env"))
        if self.trust != "dscp" or not self.dscp_map:
            return None  # trust pcp: the priority comes from the VLAN tag, not the ToS
        dscp = tos >> 2
        if dscp not in self.dscp_map:
            self.add("tos-dscp-unmapped", ERROR,
                     f"roce.tos {tos} is DSCP {dscp}, which dscp_map does not map to a priority: "
                     "RoCE traffic would fall into priority 0",
                     self.at("tos"), self.at("dscp_map"))
            return None
        return self.dscp_map[dscp]

    def priority_rules(self, prio: int) -> None:
        tos = self.roce["tos"]
        pfc = self.roce.get("pfc")
        np_, rp = self.ecn.get("np"), self.ecn.get("rp")
        lossless = pfc is not None and prio in pfc
        lossy = np_ is not None and rp is not None and prio in np_ and prio in rp
        if not lossless and not lossy and (pfc is not None or self.ecn):
            where = [self.at("pfc")] if pfc is not None else []
            where += [self.at("ecn")] if self.ecn else []
            self.add("roce-prio-unprotected", ERROR,
                     f"RoCE traffic (tos {tos}, DSCP {tos >> 2}) is priority {prio}, which has neither "
                     "PFC on (lossless) nor ECN np and rp on (lossy with congestion control)",
                     self.at("tos"), self.at("dscp_map"), *where)
        prio_tc = self.ets.get("prio_tc")
        if prio_tc is None or len(prio_tc) <= prio:
            return
        tc = prio_tc[prio]
        tsa = (self.ets.get("tc_tsa") or [None] * 8)[tc] if tc < 8 else None
        bw = (self.ets.get("tc_bw") or [None] * 8)[tc] if tc < 8 else None
        if tsa in ("ets", None) and bw == 0:
            self.add("roce-tc-no-bandwidth", ERROR,
                     f"RoCE priority {prio} is traffic class {tc} (ets.prio_tc), which gets 0% of the "
                     "link (ets.tc_bw) and is not strict",
                     self.at("ets", "prio_tc"), self.at("ets", "tc_bw"), self.at("tos"))

    def ets_sum(self) -> None:
        bw, tsa = self.ets.get("tc_bw"), self.ets.get("tc_tsa")
        if not bw:
            return
        ets_tcs = [i for i in range(len(bw)) if tsa is None or (i < len(tsa) and tsa[i] == "ets")]
        total = sum(bw[i] for i in ets_tcs)
        if ets_tcs and total != 100:
            self.add("ets-bandwidth-sum", ERROR,
                     f"the ETS traffic classes ({', '.join(map(str, ets_tcs))}) get {total}% of the "
                     "link in ets.tc_bw; they must add up to 100 (mlx5 refuses anything else)",
                     self.at("ets", "tc_bw"), *([self.at("ets", "tc_tsa")] if tsa else []))

    def pfc_unused(self) -> None:
        pfc = self.roce.get("pfc") or []
        if self.trust != "dscp" or not self.dscp_map:
            return
        used = set(self.dscp_map.values())
        for prio in sorted(set(pfc) - used):
            self.add("pfc-unused-priority", WARNING,
                     f"PFC is on for priority {prio}, but no DSCP in dscp_map maps to it: a lossless "
                     "class no traffic uses only adds pause-frame risk",
                     self.at("pfc"), self.at("dscp_map"))

    def cnp_rules(self) -> None:
        cnp_dscp, cnp_prio = self.ecn.get("cnp_dscp"), self.ecn.get("cnp_prio")
        pfc = self.roce.get("pfc") or []
        if cnp_prio is not None and cnp_prio in pfc:
            self.add("cnp-prio-lossless", WARNING,
                     f"CNPs go out on priority {cnp_prio}, which has PFC on: a paused priority delays "
                     "the very notifications that should slow senders down (NVIDIA's recipe: CNP "
                     f"priority {CNP_PRIO_RECOMMENDED}, DSCP 48, no PFC)",
                     self.at("ecn", "cnp_prio"), self.at("pfc"))
        if cnp_dscp is None or self.trust != "dscp" or not self.dscp_map:
            return
        if cnp_dscp not in self.dscp_map:
            self.add("cnp-dscp-unmapped", WARNING,
                     f"CNPs carry DSCP {cnp_dscp}, which dscp_map does not map: with trust dscp the "
                     "receiving port puts them in priority 0, behind bulk traffic",
                     self.at("ecn", "cnp_dscp"), self.at("dscp_map"))
        elif cnp_prio is not None and self.dscp_map[cnp_dscp] != cnp_prio:
            self.add("cnp-dscp-prio-mismatch", ERROR,
                     f"CNPs are sent with priority {cnp_prio} but DSCP {cnp_dscp}, which dscp_map "
                     f"maps to priority {self.dscp_map[cnp_dscp]}: ports that trust DSCP and ports "
                     "that trust PCP would queue them differently",
                     self.at("ecn", "cnp_prio"), self.at("ecn", "cnp_dscp"), self.at("dscp_map"))

    def gid_index_rule(self) -> None:
        gid = self.l.env.get("NCCL_IB_GID_INDEX")
        if self.roce.get("mode") == "v1" and gid is not None and _number(gid) is not None and _number(gid) >= 0:
            self.add("gid-index-roce-v1", ERROR,
                     f"NCCL_IB_GID_INDEX is fixed at {gid} while roce.mode is v1: a fixed index is "
                     "meant to pick the RoCE v2 IPv4 GID; use mode v2, or NCCL_IB_GID_INDEX auto "
                     "(resolved on each host)",
                     self.l.nccl("NCCL_IB_GID_INDEX"), self.at("mode"))

    def mtu_rule(self) -> None:
        mtu = _wanted_number(self.entry.get("mtu"))
        if mtu is None:
            return
        got = roce_mtu(mtu)
        if got != IB_MTUS[0]:
            need = IB_MTUS[0] + ROCE_HEADERS
            self.add("mtu-caps-roce-mtu", WARNING,
                     f"MTU {mtu} leaves {mtu - ROCE_HEADERS} bytes after the {ROCE_HEADERS} bytes of "
                     f"RoCE headers, so the RoCE MTU is {got or 'below 256'} instead of 4096; an MTU "
                     f"of at least {need} (9000 is usual) carries 4096-byte RoCE packets",
                     self.l.p.source("interfaces", self.name, "mtu"), self.at())

    def headroom_rules(self) -> None:
        """mlx5 sizes PFC headroom for the cable length only while software
        owns the port buffers, which a buffer write makes it do for good
        (nicclass.MLX5_CABLE_LENGTH_NO_EFFECT, MLX5_BUFFER_WRITE_ONE_WAY)."""
        drivers = _as_list(_get(self.entry, "match", "driver"))
        if drivers and "mlx5_core" not in drivers:
            return
        length, buffer = self.roce.get("pfc_cable_length"), self.roce.get("buffer")
        if length is not None and not buffer:
            rule = nicclass.MLX5_CABLE_LENGTH_NO_EFFECT
            self.add("cable-length-without-buffers", WARNING,
                     f"pfc_cable_length {length} without roce.buffer: no effect while the firmware "
                     f"owns the buffers (the default): {rule.why} ({rule.source})",
                     self.at("pfc_cable_length"))
        elif buffer and length is None:
            rule = nicclass.MLX5_BUFFER_WRITE_ONE_WAY
            self.add("buffers-without-cable-length", WARNING,
                     "roce.buffer without pfc_cable_length: the headroom is sized for "
                     f"{nicclass.MLX5_DEFAULT_CABLE_LENGTH} m, the driver's default; set the real "
                     f"cable length. The write is one-way: {rule.why} ({rule.source})",
                     self.at("buffer"))
