"""Health facts of an interface: what it is, how it is attached, and the
counters that tell whether RoCE traffic is lossless.

Read-only, and forgiving: a source this host lacks (no PCIe device behind a
veth, no RDMA device, a driver without ethtool statistics) simply leaves its
facts out; nothing here raises for a missing file.  Every sysfs path goes
through Host.path(), so tests point the Host at a fixture tree.

    driver, firmware            ethtool -i (the Host's interface facts)
    link_speed_mbps             /sys/class/net/X/speed (-1 / unknown: absent)
    pcie_speed_gts, pcie_width  /sys/class/net/X/device/current_link_{speed,width}
    pcie_max_speed_gts, pcie_max_width              .../max_link_{speed,width}
    rdma_device, rdma_port      the RDMA port whose GID table names X
    roce_gids                   that port's GIDs built from X: {index: "RoCE v2
                                IPv4" | "RoCE v1 IPv6" | ...}, from gids/<n> and
                                gid_attrs/types/<n> of the populated entries only
    counters                    ethtool statistics (ETHTOOL_GSTATS) and the
                                RDMA port's hw_counters, RoCE-relevant ones
                                (ROCE_HEALTH: the names that say "RoCE is
                                broken", each with its driver source); all
                                of them, and /sys/class/net/X/statistics,
                                for expect: counters (counters())
    ipsec_sa_offloaded,         IPsec SAs offloaded to X / in software on X
    ipsec_sa_software           (host/facts/ipsec.py), when any SA concerns X
    tls                         /proc/net/tls_stat, when the tls module is
                                loaded: the kernel's kTLS counters (TlsTxSw,
                                TlsTxDevice, TlsDecryptError, ...).  They are
                                the network namespace's, not X's: every
                                interface shows the same ones.  expect:
                                counters: takes them by name (knobs/expect.py).
    firmware_pending_reset,     devlink `dev info` of the devlink device that
    firmware_pending            has a port whose netdev is X: true when a
                                component's stored (flashed) version differs
                                from its running one, i.e. a firmware update
                                waits for a reset; firmware_pending: {component:
                                {running, stored}} of those, only when true.
                                Running kernel only; absent without devlink,
                                without a port for X, or without INFO_GET.

Counters are totals since the device last reset them (boot, driver load).
expect: counters compares their increase between two reads (knobs/
expect.py); the reads and the wait between them go through a
CounterSource: the running kernel and the wall clock, or a host's own
(Host.counter_source: tests/fakes.py FakeHost, whose recorded counters
move when its clock does).
"""

from __future__ import annotations

import array
import errno
import os
import re
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Callable, Dict, Optional, Tuple

    StatsReader = Callable[[str], Dict[str, int]]

from nictune.host.facts import rdma
from nictune.host.machine import Host, Interface
from nictune.host.facts.rdma import _read  # None when absent, or EINVAL while the link is down

# The counters that say "RoCE is broken" on mlx5, by the names the driver
# gives them, with where it does and what a rise means.  Checked against
# torvalds/linux drivers/net/ethernet/mellanox/mlx5/core/en_stats.c (commit
# 01dd7424) and drivers/infiniband/hw/mlx5/counters.c (commit 10d4de41).
# <N> is a priority, 0-7.  The profiles expect each not to rise at all on a
# lossless rail (profiles/connectx7-roce-lossless.yaml).
ROCE_HEALTH = (
    # name, source (file: table or function), a rise means
    ("tx_pause_storm_warning_events", "en_stats.c: pport_pfc_stall_stats_desc "
     "(device_stall_minor_watermark_cnt)", "the port sent pause long enough to near a PFC storm"),
    ("tx_pause_storm_error_events", "en_stats.c: pport_pfc_stall_stats_desc "
     "(device_stall_critical_watermark_cnt)", "a PFC storm: the device stopped sending pause"),
    ("rx_prio<N>_discards", "en_stats.c: pport_per_prio_traffic_stats_desc (rx_discards)",
     "frames of priority N dropped on receive: loss on what should be lossless"),
    ("rx_discards_phy", "en_stats.c: pport_2863_stats_desc (if_in_discards)",
     "the port dropped received frames (no buffer)"),
    ("link_down_events_phy", "en_stats.c: MLX5E_DECLARE_STATS_GRP_OP_FILL_STRS(phy) "
     "(phys_layer_cntrs.link_down_events)", "the link went down"),
    ("local_ack_timeout_err", "counters.c: retrans_q_cnts", "a QP's ACK timer expired: retransmission"),
    ("packet_seq_err", "counters.c: retrans_q_cnts", "a NAK for a sequence error was received"),
    ("out_of_sequence", "counters.c: out_of_seq_q_cnts", "packets arrived out of order: loss"),
    ("rx_icrc_encapsulated", "counters.c: ext_ppcnt_cnts", "RoCE packets with a bad ICRC"),
)

# Of those and the other RoCE-relevant ones, what health facts show (ethtool
# -S, en_stats.c names): per-priority PFC pause frames (pport_per_prio_pfc_
# stats_desc "rx_%s_pause"), drops for lack of receive buffers (q counter
# rx_out_of_buffer), and the ROCE_HEALTH ones above.
_ETHTOOL_COUNTERS = re.compile(
    r"^((rx|tx)_prio[0-7]_pause|rx_out_of_buffer|rx_prio[0-7]_discards|rx_discards_phy"
    r"|tx_pause_storm_(warning|error)_events|link_down_events_phy)$")
# RDMA port hw_counters (upstream mlx5_ib counters.c names): ECN marks seen
# and CNPs sent as notification point, CNPs acted on as reaction point, and
# the ROCE_HEALTH ones: out of order, sequence errors, ACK timeouts, bad ICRC.
RDMA_COUNTERS = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled",
                 "out_of_sequence", "packet_seq_err", "local_ack_timeout_err",
                 "rx_icrc_encapsulated")

# /proc/net/tls_stat, made by the tls module for each network namespace;
# net/tls/tls_proc.c (6.12) prints tls_mib_list, in this order, each line
# "%-32s\t%lu\n".  A newer kernel's further counters are read too.
TLS_STAT = "proc/net/tls_stat"
TLS_COUNTERS = ("TlsCurrTxSw", "TlsCurrRxSw", "TlsCurrTxDevice", "TlsCurrRxDevice",
                "TlsTxSw", "TlsRxSw", "TlsTxDevice", "TlsRxDevice", "TlsDecryptError",
                "TlsRxDeviceResync", "TlsDecryptRetry", "TlsRxNoPadViolation")
TLS_ABSENT = "the tls module is not loaded (no /proc/net/tls_stat)"

# Counters that are not totals but say how many there are now: the kTLS
# sockets open (net/tls/tls_main.c tls_sk_proto_cleanup decrements the
# TlsCurr* ones on close) and a veth's peer (drivers/net/veth.c
# veth_get_ethtool_stats: "peer_ifindex").  Their increase means nothing:
# expect: compares them as they read.
GAUGES = re.compile(r"^(TlsCurr[A-Za-z]+|peer_ifindex)$")

# The netdev's own statistics (Documentation/ABI/testing/sysfs-class-net-
# statistics): rx_dropped, rx_missed_errors, ... for any driver, under
# the names `ip -s link` counts; an ethtool -S one of the same name wins.
NETDEV_STATISTICS = "statistics"


def is_tls_counter(name: str) -> bool:
    """Whether an expect: counter name is one of /proc/net/tls_stat's."""
    return name in TLS_COUNTERS or bool(re.fullmatch(r"Tls[A-Z][A-Za-z]*", name))


def parse_tls_stat(text: str) -> Dict[str, int]:
    """{counter: value} from /proc/net/tls_stat's text; ValueError for a
    line that is not "<name> <number>"."""
    out: Dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or not re.fullmatch(r"[A-Za-z]+", parts[0]):
            raise ValueError(f"/proc/net/tls_stat line {number} is not '<counter> <value>'")
        out[parts[0]] = int(parts[1])
    return out


# Sysfs reports a link whose speed it does not know as -1, or as the u32
# SPEED_UNKNOWN (4294967295) on old kernels.
_UNKNOWN_SPEEDS = (-1, 0xFFFFFFFF)



class CounterSource:
    """Where ethtool statistics come from, and the clock two reads of a
    counter are apart by: the running kernel's ETHTOOL_GSTATS and the wall
    clock.  A Host rooted elsewhere than "/" (a fixture tree) has no
    ethtool statistics here: they would be this machine's same-named
    devices'.  A host whose counters are not the running kernel's brings
    its own source as Host.counter_source (tests/fakes.py FakeHost)."""

    def __init__(self, host: Host):
        self.live = host.root == "/"
        self.io = host.io

    def ethtool_stats(self, ifname: str) -> Dict[str, int]:
        if not self.live:
            return {}
        sock = self.io.inet_socket()
        try:
            return ethtool_stats(ifname, sock)
        finally:
            sock.close()

    def now(self) -> float:
        return self.io.now()

    def sleep(self, seconds: float) -> None:
        self.io.sleep(seconds)


def counter_source(host: Host) -> CounterSource:
    """The host's own counter source, or the running kernel's."""
    return host.counter_source or CounterSource(host)


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _gts(text: Optional[str]) -> Optional[float]:
    """"32.0 GT/s PCIe", "8 GT/s" -> GT/s; "Unknown" -> None."""
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?) GT/s", text or "")
    if not m:
        return None
    value = float(m.group(1))
    return int(value) if value.is_integer() else value


class Health:
    """Health facts of a Host's interfaces.

    stats: ifname -> {ethtool statistic: value}.  By default the
    ETHTOOL_GSTATS ioctl, which asks the running kernel, so only when the
    Host's root is the running system's ("/"); tests give their own.

    What it reads is kept for the instance's life (one command): forget()
    before reading again.
    """

    def __init__(self, host: Host, stats: Optional[StatsReader] = None, devlink=None):
        """devlink: what has ports() and info(handle) (netlink/devlink.py's
        Devlink); by default the Host's, when its root is "/"."""
        self.host = host
        self._devlink = devlink
        self._devlink_ports: Optional[Dict[str, str]] = None  # netdev -> devlink handle
        self._dev_info: Dict[str, object] = {}  # handle -> DevInfo, or None when unreadable
        self.source = counter_source(host)
        self._read_stats = stats if stats is not None else self.source.ethtool_stats
        self._stats: Dict[str, Dict[str, int]] = {}
        self._ports: Optional[Dict[str, list]] = None  # rdma.populated()
        self._ipsec = None  # host.ipsec.IpsecView, made on first use
        self._sa_present: Optional[bool] = None  # _any_sa()
        self._tls: Optional[Dict[str, int]] = None
        self._tls_read = False

    def of(self, iface: Interface) -> dict:
        name = iface.name
        facts: dict = {}
        if iface.driver:
            facts["driver"] = iface.driver
        if iface.firmware:
            facts["firmware"] = iface.firmware
        speed = _int(_read(self.host.path("sys/class/net", name, "speed"), self.host.io))
        if speed is not None and speed not in _UNKNOWN_SPEEDS and speed > 0:
            facts["link_speed_mbps"] = speed
        device = self.host.path("sys/class/net", name, "device")
        for fact, leaf, parse in (("pcie_speed_gts", "current_link_speed", _gts),
                                  ("pcie_width", "current_link_width", _int),
                                  ("pcie_max_speed_gts", "max_link_speed", _gts),
                                  ("pcie_max_width", "max_link_width", _int)):
            value = parse(_read(os.path.join(device, leaf), self.host.io))
            if value:  # 0 / unknown: not a PCIe link we can judge
                facts[fact] = value
        port = self.rdma_port(name)
        if port:
            facts["rdma_device"], facts["rdma_port"] = port
            kinds = self.gid_kinds(name)
            if kinds:
                facts["roce_gids"] = kinds
        counters = self.counters(name, roce_only=True)
        if counters:
            facts["counters"] = counters
        if self.host.root == "/":  # NETLINK_XFRM asks the running kernel
            try:
                usage = self.ipsec(iface) if self._any_sa() else None
            except OSError:
                usage = None
            if usage is not None and usage.sas:
                facts.update(usage.counts())
        try:
            tls = self.tls_stat()
        except ValueError:
            tls = None
        if tls:
            facts["tls"] = tls
        info = self.dev_info(name)
        if info is not None:
            pending = info.pending_firmware()
            facts["firmware_pending_reset"] = bool(pending)
            if pending:
                facts["firmware_pending"] = {c: {"running": info.running[c], "stored": info.stored[c]}
                                             for c in pending}
        return facts

    def dev_info(self, ifname: str):
        """netlink.devlink.DevInfo of the devlink device that has a port
        whose netdev is `ifname`; None without devlink, without such a
        port, or when the device does not answer INFO_GET."""
        if self._devlink_ports is None:
            self._devlink_ports = {}
            try:
                if self._devlink is None and self.host.root == "/":
                    self._devlink = self.host.devlink()
                if self._devlink is not None:
                    self._devlink_ports = {p.netdev: p.handle for p in self._devlink.ports()
                                           if p.netdev}
            except OSError:  # NetlinkError ENOENT: no devlink in this kernel
                pass
        handle = self._devlink_ports.get(ifname)
        if handle is None:
            return None
        if handle not in self._dev_info:
            try:
                self._dev_info[handle] = self._devlink.info(handle)
            except OSError:  # EOPNOTSUPP: the driver has no info_get
                self._dev_info[handle] = None
        return self._dev_info[handle]

    def tls_stat(self, fresh: bool = False) -> Optional[Dict[str, int]]:
        """The kTLS counters of /proc/net/tls_stat (the Host's root), or None
        when the tls module is not loaded; read again with `fresh`.
        ValueError when its text does not parse."""
        if fresh or not self._tls_read:
            text = _read(self.host.path(TLS_STAT), self.host.io)
            self._tls = None if text is None else parse_tls_stat(text)
            self._tls_read = True  # after the parse: bad text raises every time
        return self._tls

    def _any_sa(self) -> bool:
        """Whether the namespace holds an SA at all (netlink/sadinfo.py),
        asked once: without one no SA concerns any interface, and the SA
        dump is not worth its cost.  True when that cannot be asked: the
        dump then decides, as it always did."""
        if self._sa_present is None:
            from nictune.host.transports.netlink.sadinfo import sa_count

            try:
                self._sa_present = self._ipsec is not None or sa_count(self.host.io.netlink) > 0
            except OSError:
                self._sa_present = True
        return self._sa_present

    def ipsec(self, iface: Interface):
        """host.ipsec.Usage of `iface`: the SAs and policies that concern it.
        Raises OSError when NETLINK_XFRM cannot be dumped."""
        if self._ipsec is None:
            from nictune.host.facts.ipsec import IpsecView

            self._ipsec = IpsecView(self.host)
        return self._ipsec.of(iface.name, iface.index)

    def counters(self, ifname: str, roce_only: bool = False, fresh: bool = False) -> Dict[str, int]:
        """ethtool statistics, the RDMA port's hw_counters and (without
        roce_only) the netdev statistics of `ifname`, in that order of
        precedence for a name two of them have; with roce_only, just the
        ones that tell RoCE health.  `fresh` reads the ethtool statistics
        again rather than what this instance read before (the sysfs files
        are read every time)."""
        stats = self._ethtool_stats(ifname, fresh)
        out = {k: v for k, v in stats.items() if not roce_only or _ETHTOOL_COUNTERS.match(k)}
        port = self.rdma_port(ifname)
        if port:
            base = self.host.path(rdma.IB_CLASS, port[0], "ports", str(port[1]), "hw_counters")
            names = RDMA_COUNTERS if roce_only else _listdir(self.host.io, base)
            _read_counters(self.host.io, base, names, out)
        if not roce_only:
            base = self.host.path("sys/class/net", ifname, NETDEV_STATISTICS)
            _read_counters(self.host.io, base, _listdir(self.host.io, base), out)
        return dict(sorted(out.items()))

    def _ethtool_stats(self, ifname: str, fresh: bool = False) -> Dict[str, int]:
        if fresh or ifname not in self._stats:
            try:
                self._stats[ifname] = self._read_stats(ifname)
            except OSError:
                self._stats[ifname] = {}
        return self._stats[ifname]

    def rdma_port(self, ifname: str) -> Optional[Tuple[str, int]]:
        """(RDMA device, port) whose GID table is built from `ifname`."""
        entries = self._gid_entries().get(ifname)
        return entries[0][:2] if entries else None

    def gid_kinds(self, ifname: str) -> Dict[str, str]:
        """{index: "RoCE v2 IPv4"...} of the GIDs built from `ifname` on its
        port: what NCCL_IB_GID_INDEX points at, or what NCCL may select."""
        entries = self._gid_entries().get(ifname) or []
        port = entries[0][:2] if entries else None
        kinds = {}
        for dev, number, index in entries:
            kind = rdma.gid_kind(self.host, dev, number, index) if (dev, number) == port else None
            if kind:
                kinds[str(index)] = kind
        return kinds

    def _gid_entries(self) -> Dict[str, list]:
        if self._ports is None:
            self._ports = rdma.populated(self.host)
        return self._ports


def _read_counters(io, base: str, names, out: Dict[str, int]) -> None:
    """Each file `name` under `base` that holds a number, into `out` unless
    a source before it named it already."""
    for counter in names:
        value = _int(_read(os.path.join(base, counter), io))
        if value is not None:
            out.setdefault(counter, value)


def _listdir(io, path: str) -> list:
    try:
        return sorted(io.listdir(path))
    except OSError:
        return []


# -- ETHTOOL_GSTATS (ethtool -S) ------------------------------------------------

ETHTOOL_GSTATS = 0x1D
ETH_SS_STATS = 1
_GSTATS = struct.Struct("=II")  # cmd, n_stats; then n_stats * u64


def _stats_room(count: int) -> int:
    # The kernel writes as many entries as the set has *now*, whatever
    # length we pass, and a driver's set grows with its channel count:
    # leave room for it to have grown since we asked its size.
    return 2 * count + 64


def ethtool_stats(ifname: str, sock=None) -> Dict[str, int]:
    """Every ethtool statistic of `ifname` (ethtool -S); {} when the driver
    has none or the device does not exist."""
    from nictune.host.transports.netlink.ioctl import inet_socket, siocethtool, string_set

    own = sock is None
    if own:
        sock = inet_socket()
    try:
        names = string_set(sock, ifname, ETH_SS_STATS, room=_stats_room)
        if not names:
            return {}
        room = _stats_room(len(names))
        values = array.array("B", _GSTATS.pack(ETHTOOL_GSTATS, len(names)))
        values.extend(bytes(room * 8))
        siocethtool(sock, ifname, values)
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.EOPNOTSUPP, errno.EINVAL, errno.EOVERFLOW):
            return {}
        raise
    finally:
        if own:
            sock.close()
    raw_values = values.tobytes()
    # Each reply says how many it wrote; names and values pair up only if
    # the set did not change between the two calls.
    if _GSTATS.unpack_from(raw_values)[1] != len(names):
        return {}
    return {name: struct.unpack_from("=Q", raw_values, _GSTATS.size + i * 8)[0]
            for i, name in enumerate(names)}
