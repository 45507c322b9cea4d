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
    counters                    ethtool statistics (ETHTOOL_GSTATS) and the
                                RDMA port's hw_counters, RoCE-relevant ones
    ipsec_sa_offloaded,         IPsec SAs offloaded to X / in software on X
    ipsec_sa_software           (host/ipsec.py), when any SA concerns X
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
"""

from __future__ import annotations

import array
import errno
import os
import re
import struct
from typing import Callable, Dict, Optional, Tuple

from nictune.host import rdma
from nictune.host.machine import Host, Interface
from nictune.host.rdma import _read  # None when absent, or EINVAL while the link is down

# The ethtool statistics that matter for RoCE on mlx5 (en_stats.c names):
# per-priority PFC pause frames, and drops for lack of receive buffers.
_ETHTOOL_COUNTERS = re.compile(r"^((rx|tx)_prio[0-7]_pause|rx_out_of_buffer)$")
# RDMA port hw_counters (upstream mlx5_ib counters.c names): ECN marks seen
# and CNPs sent as notification point, CNPs acted on as reaction point, and
# packets that arrived out of order (loss on a lossless class).
RDMA_COUNTERS = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled",
                 "out_of_sequence")

# /proc/net/tls_stat, made by the tls module for each network namespace;
# net/tls/tls_proc.c (6.12) prints tls_mib_list, in this order, each line
# "%-32s\t%lu\n".  A newer kernel's further counters are read too.
TLS_STAT = "proc/net/tls_stat"
TLS_COUNTERS = ("TlsCurrTxSw", "TlsCurrRxSw", "TlsCurrTxDevice", "TlsCurrRxDevice",
                "TlsTxSw", "TlsRxSw", "TlsTxDevice", "TlsRxDevice", "TlsDecryptError",
                "TlsRxDeviceResync", "TlsDecryptRetry", "TlsRxNoPadViolation")
TLS_ABSENT = "the tls module is not loaded (no /proc/net/tls_stat)"


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

StatsReader = Callable[[str], Dict[str, int]]


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
        self._read_stats = stats if stats is not None else (
            ethtool_stats if host.root == "/" else lambda ifname: {})
        self._stats: Dict[str, Dict[str, int]] = {}
        self._ports: Optional[Dict[str, Tuple[str, int]]] = None
        self._ipsec = None  # host.ipsec.IpsecView, made on first use
        self._tls: Optional[Dict[str, int]] = None
        self._tls_read = False

    def of(self, iface: Interface) -> dict:
        name = iface.name
        facts: dict = {}
        if iface.driver:
            facts["driver"] = iface.driver
        if iface.firmware:
            facts["firmware"] = iface.firmware
        speed = _int(_read(self.host.path("sys/class/net", name, "speed")))
        if speed is not None and speed not in _UNKNOWN_SPEEDS and speed > 0:
            facts["link_speed_mbps"] = speed
        device = self.host.path("sys/class/net", name, "device")
        for fact, leaf, parse in (("pcie_speed_gts", "current_link_speed", _gts),
                                  ("pcie_width", "current_link_width", _int),
                                  ("pcie_max_speed_gts", "max_link_speed", _gts),
                                  ("pcie_max_width", "max_link_width", _int)):
            value = parse(_read(os.path.join(device, leaf)))
            if value:  # 0 / unknown: not a PCIe link we can judge
                facts[fact] = value
        port = self.rdma_port(name)
        if port:
            facts["rdma_device"], facts["rdma_port"] = port
        counters = self.counters(name, roce_only=True)
        if counters:
            facts["counters"] = counters
        if self.host.root == "/":  # NETLINK_XFRM asks the running kernel
            try:
                usage = self.ipsec(iface)
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

    def tls_stat(self) -> Optional[Dict[str, int]]:
        """The kTLS counters of /proc/net/tls_stat (the Host's root), or None
        when the tls module is not loaded.  ValueError when its text does
        not parse."""
        if not self._tls_read:
            text = _read(self.host.path(TLS_STAT))
            self._tls = None if text is None else parse_tls_stat(text)
            self._tls_read = True  # after the parse: bad text raises every time
        return self._tls

    def ipsec(self, iface: Interface):
        """host.ipsec.Usage of `iface`: the SAs and policies that concern it.
        Raises OSError when NETLINK_XFRM cannot be dumped."""
        if self._ipsec is None:
            from nictune.host.ipsec import IpsecView

            self._ipsec = IpsecView()
        return self._ipsec.of(iface.name, iface.index)

    def counters(self, ifname: str, roce_only: bool = False) -> Dict[str, int]:
        """ethtool statistics and the RDMA port's hw_counters of `ifname`;
        with roce_only, just the ones that tell RoCE health."""
        stats = self._ethtool_stats(ifname)
        out = {k: v for k, v in stats.items() if not roce_only or _ETHTOOL_COUNTERS.match(k)}
        port = self.rdma_port(ifname)
        if port:
            base = self.host.path(rdma.IB_CLASS, port[0], "ports", str(port[1]), "hw_counters")
            names = RDMA_COUNTERS if roce_only else _listdir(base)
            for counter in names:
                value = _int(_read(os.path.join(base, counter)))
                if value is not None:
                    out.setdefault(counter, value)
        return dict(sorted(out.items()))

    def _ethtool_stats(self, ifname: str) -> Dict[str, int]:
        if ifname not in self._stats:
            try:
                self._stats[ifname] = self._read_stats(ifname)
            except OSError:
                self._stats[ifname] = {}
        return self._stats[ifname]

    def rdma_port(self, ifname: str) -> Optional[Tuple[str, int]]:
        """(RDMA device, port) whose GID table is built from `ifname`."""
        if self._ports is None:
            self._ports = rdma.netdev_ports(self.host)
        return self._ports.get(ifname)


def _listdir(path: str) -> list:
    try:
        return sorted(os.listdir(path))
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
    from nictune.host.netlink.ioctl import inet_socket, siocethtool, string_set

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
