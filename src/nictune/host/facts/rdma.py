"""RDMA devices, their ports and GID tables, read from sysfs under Host.root.

    /sys/class/infiniband/<dev>/ports/<port>/gids/<n>            the GID text
    /sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<n> "RoCE v2" | "IB/RoCE v1"
    /sys/class/infiniband/<dev>/ports/<port>/gid_attrs/ndevs/<n> the netdev

Unpopulated entries read as all zeros, and their types/ndevs reads fail
with EINVAL (in containers too): such entries are skipped, never errors.
RoCE v2 over IPv4 uses the IPv4-mapped GID ::ffff:a.b.c.d, which is what
NCCL_IB_GID_INDEX must point at.

Also the rdma_cm configfs directory of a device, which exists only while
someone holds it: mkdir before reading or writing, rmdir afterwards (the
values stay on the cma_device, as mlnx-tools' cma_roce_mode relies on).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Dict, Iterator, Optional, Tuple

from nictune.host.validate import IBDEV, check, matches

IB_CLASS = "sys/class/infiniband"
CM_CONFIGFS = "sys/kernel/config/rdma_cm"
ROCE_V2 = "RoCE v2"
ROCE_V1 = "IB/RoCE v1"
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


# include/rdma/ib_addr.h iboe_get_mtu(): the netdev MTU minus the RoCE
# headers (GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 bytes)
# is rounded down to an IB MTU of 256..4096.  RoCE drivers report it as
# the port's active MTU (mlx5_ib, rxe: min(its maximum, this)); sysfs has
# no file for it, so it is worked out from the netdev MTU.
ROCE_HEADERS = 96
IB_MTUS = (4096, 2048, 1024, 512, 256)


def roce_mtu(netdev_mtu: int) -> Optional[int]:
    """The RoCE path MTU a netdev MTU allows, as the kernel computes it."""
    room = netdev_mtu - ROCE_HEADERS
    return next((m for m in IB_MTUS if room >= m), None)


def check_ibdev(name: object) -> str:
    """mlx5_0, mana_0, rxe0 ... (the kernel allows more; we refuse anything
    that could leave the directory or reach a shell)."""
    return check(IBDEV, name, "RDMA device name")


@dataclass(frozen=True)
class Gid:
    device: str
    port: int
    index: int
    gid: str             # as sysfs shows it: 8 groups of 4 hex digits
    type: Optional[str]  # ROCE_V2, ROCE_V1, or None when unreadable
    ndev: Optional[str]

    @property
    def ipv4(self) -> Optional[str]:
        """The IPv4 address of an IPv4-mapped GID, else None."""
        import ipaddress  # only here: kept off the agent's start-up

        try:
            addr = ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None
        return str(addr.ipv4_mapped) if addr.ipv4_mapped else None


def _read(path: str, io=None) -> Optional[str]:
    """A sysfs attribute, or None when it is absent or unreadable (EINVAL
    on unpopulated GID entries).  io: the host's port (Host.io); the
    running host's when None (the resident's metrics)."""
    try:
        return (io or _live()).read_text(path).strip()
    except (OSError, UnicodeDecodeError):
        return None


def _live():
    from nictune.host.transports.io import LIVE

    return LIVE


def _numbers(io, path: str) -> list:
    try:
        return sorted(int(n) for n in io.listdir(path) if n.isdigit())
    except OSError:
        return []


def devices(host) -> list:
    try:
        return sorted(d for d in host.io.listdir(host.path(IB_CLASS)) if matches(IBDEV, d))
    except OSError:
        return []


def ports(host, device: str) -> list:
    return _numbers(host.io, host.path(IB_CLASS, check_ibdev(device), "ports"))


def link_layer(host, device: str, port: int) -> Optional[str]:
    return _read(host.path(IB_CLASS, check_ibdev(device), "ports", str(port), "link_layer"), host.io)


def gids(host, device: str, port: int) -> list:
    """Populated GID entries of one port, by index."""
    base = host.path(IB_CLASS, check_ibdev(device), "ports", str(port))
    out = []
    io = host.io
    for n in _numbers(io, os.path.join(base, "gids")):
        text = _read(os.path.join(base, "gids", str(n)), io)
        if not text or text == _ZERO_GID:
            continue
        out.append(Gid(device, port, n, text,
                       _read(os.path.join(base, "gid_attrs", "types", str(n)), io),
                       _read(os.path.join(base, "gid_attrs", "ndevs", str(n)), io)))
    return out


def netdev_ports(host) -> Dict[str, Tuple[str, int]]:
    """{netdev: (device, port)} for every netdev a GID entry is built from;
    the first port in device and port order wins."""
    return {netdev: entries[0][:2] for netdev, entries in populated(host).items()}


def populated(host) -> Dict[str, list]:
    """{netdev: [(device, port, index), ...]}: the populated GID entries
    built from each netdev, in device, port and index order.  Reads only
    gid_attrs/ndevs: an unpopulated entry's read fails (EINVAL), so an
    entry that names a netdev is a populated one."""
    found: Dict[str, list] = {}
    for dev in devices(host):
        for port in ports(host, dev):
            ndevs = host.path(IB_CLASS, dev, "ports", str(port), "gid_attrs", "ndevs")
            for n in _numbers(host.io, ndevs):
                netdev = _read(os.path.join(ndevs, str(n)), host.io)
                if netdev:
                    found.setdefault(netdev, []).append((dev, port, n))
    return found


def gid_kind(host, device: str, port: int, index: int) -> Optional[str]:
    """"RoCE v2 IPv4", "RoCE v1 IPv6", "RoCE v2 IPv6 link-local"... of one
    populated entry, as NCCL tells GIDs apart (getGidAddrFamily,
    linkLocalGid); None when unreadable.  From the text alone, without
    ipaddress: kept off the agent's start-up."""
    base = host.path(IB_CLASS, check_ibdev(device), "ports", str(port))
    kind = _read(os.path.join(base, "gid_attrs", "types", str(index)), host.io)
    gid = _read(os.path.join(base, "gids", str(index)), host.io)
    if not kind or not gid or gid == _ZERO_GID:
        return None
    version = "RoCE v2" if kind == ROCE_V2 else "RoCE v1"
    if gid.startswith("0000:0000:0000:0000:0000:ffff:"):
        return f"{version} IPv4"
    return f"{version} IPv6" + (" link-local" if gid.startswith("fe80:0000:0000:0000:") else "")


def port_of(host, ifname: str) -> Optional[tuple]:
    """(device, port) whose GIDs belong to ifname; else the RDMA device
    that sits on ifname's own device (a port with no address has no GIDs
    yet), on its first port."""
    found = netdev_ports(host).get(ifname)
    if found:
        return found
    netdev = host.io.realpath(host.path("sys/class/net", ifname, "device"))
    if not host.io.isdir(netdev):
        return None
    for dev in devices(host):
        ibparent = host.io.realpath(host.path(IB_CLASS, dev, "device"))
        # mlx5: the same PCI function; mana: an auxiliary device below it.
        if ibparent == netdev or ibparent.startswith(netdev + os.sep):
            found = ports(host, dev)
            if found:
                return dev, found[0]
    return None


@contextlib.contextmanager
def cm_device(host, device: str) -> Iterator[str]:
    """The rdma_cm configfs directory of `device`, held for the block."""
    root = host.path(CM_CONFIGFS)
    if not host.io.isdir(root):
        raise FileNotFoundError(
            "rdma_cm configfs is not available (load rdma_cm and mount configfs on "
            "/sys/kernel/config)")
    path = os.path.join(root, check_ibdev(device))
    made = False
    if not host.io.isdir(path):
        host.io.mkdir(path)  # configfs creates ports/<n>/ for the device
        made = True
    try:
        yield path
    finally:
        if made:
            host.io.rmdir(path)
