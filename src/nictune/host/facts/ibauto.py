"""`auto` RDMA device lists and GID indexes, resolved on the host.

NCCL_IB_HCA: auto becomes `=dev:port,...` of the RoCE ports that serve the
profile's interfaces, and NCCL_IB_GID_INDEX: auto the one GID index NCCL
would select itself on every one of those ports.  Both are read from the
GID tables under /sys/class/infiniband (nictune.host.facts.rdma) each time a
command expands the profile, so a plan or verify after an address change
or a port flap sees the index as it is now; gid_index_problem() says why a
written number no longer fits, for verify to report as drift.

Which ports.  `interfaces` are the names the profile's entries matched on
this host (interfaces_for_auto(): the entries with a roce: section, else
every entry), so storage and front-end ports the profile does not tune
stay out.  A port serves an interface when one of its GIDs is built on
that netdev or on the netdev's master (`/sys/class/net/<if>/master`, made
by net/core/dev.c __netdev_adjacent_dev_insert): mana_ib builds its GIDs on
the hv_netvsc master of the MANA VF (drivers/infiniband/hw/mana/device.c
mana_ib_probe: ib_device_set_netdev(netdev_master_upper_dev_get_rcu(VF))),
a RoCE LAG device on the bond.  Failing that, the RDMA device that sits on
the interface's own device (rdma.port_of: a port with no address yet has
no GIDs).  An interface that is down, or has no RDMA port, or whose port
has no GID of the wanted kind, is left out and the plan note says so.
With interfaces=None (a caller without the profile's interfaces): every
RoCE port with a wanted GID whose netdev is up, as before this module.

Which GID.  NCCL (src/transport/net_ib/connect.cc ncclIbGetGidIndex and
ncclUpdateGidIndex, since 2.21.5; net_ib.cc there) walks the port's GID
table and keeps the lowest index whose GID is of family
NCCL_IB_ADDR_FAMILY (AF_INET by default: an IPv4-mapped GID, getGidAddrFamily),
inside NCCL_IB_ADDR_RANGE when that is set (matchGidAddrPrefix), neither
unset nor link-local (validGid), and whose gid_attrs/types entry says RoCE
version NCCL_IB_ROCE_VERSION_NUM (2 by default, ncclIbRoceGetVersionNum).
`auto` takes the same GID, so the index nictune writes is the one NCCL
would have chosen.  NCCL silently falls back to AF_INET, or ignores the
range, for a value it cannot parse (envIbAddrFamily, envIbAddrRange);
nictune refuses such a value instead, naming the key (wanted_from()).

When to leave NCCL_IB_GID_INDEX unset.  From NCCL 2.21 (2.21.5-1, "Net/IB:
add support for dynamic GID detection"; docs/userguide/source/env.rst:
NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE, NCCL_IB_ROCE_VERSION_NUM "since
2.21") the default of NCCL_IB_GID_INDEX is -1 and NCCL selects the GID
itself, per port and per connection, with the rule above: on hosts whose
NCCL is 2.21 or later, leave NCCL_IB_GID_INDEX out (set NCCL_IB_ADDR_FAMILY
/ NCCL_IB_ADDR_RANGE to steer it) and nothing can go stale.  Before 2.21
the default was 0, the RoCE v1 link-local GID, so older NCCL needs a
number: `auto` writes it, and verify reports when it stops fitting.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Dict, Iterable, List, Optional, Tuple

from nictune.host.facts import rdma
from nictune.host.errors import UNSUPPORTED, NictuneError
from nictune.host.validate import IFNAME, InvalidInput, matches

AUTO = "auto"
HCA, GID_INDEX = "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"
FAMILY, RANGE, VERSION = "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE", "NCCL_IB_ROCE_VERSION_NUM"
FAMILIES = {"AF_INET": 4, "AF_INET6": 6}  # envIbAddrFamily compares these exactly
# gid_attrs/types text -> RoCE version (ncclIbRoceGetVersionNum; the kernel
# writes "IB/RoCE v1" or "RoCE v2", drivers/infiniband/core/cache.c).
_VERSIONS = {rdma.ROCE_V1: 1, "RoCE v1": 1, rdma.ROCE_V2: 2}


class AutoUnresolved(NictuneError):
    """An `auto` value this host cannot resolve."""

    kind = UNSUPPORTED


# -- what GID is wanted ------------------------------------------------------------

@dataclass(frozen=True)
class Wanted:
    """The GIDs NCCL would select: family, range, RoCE version."""

    family: str = "AF_INET"
    network: Optional[object] = None  # ipaddress.IPv4Network / IPv6Network
    version: int = 2

    def __str__(self) -> str:
        """"RoCE v2 IPv4 GID", "RoCE v2 IPv6 GID in 2001:db8::/32"."""
        text = f"RoCE v{self.version} IPv{FAMILIES[self.family]} GID"
        return text + (f" in {self.network}" if self.network is not None else "")

    def why_not(self, gid: rdma.Gid) -> str:
        """"" when NCCL would select `gid`, else what it is instead."""
        addr, family, link_local = _address(gid.gid)
        version = _VERSIONS.get(gid.type or "")
        if addr is None:
            return f"the GID {gid.gid!r}, which is not an address"
        if version is None:
            return f"the GID {addr}, whose RoCE type cannot be read"
        shown = f"RoCE v{version} IPv{family} GID {addr}"
        if link_local:
            return f"the link-local {shown}"
        if version != self.version or family != FAMILIES[self.family]:
            return f"the {shown}"
        if self.network is not None and addr not in self.network:
            return f"the {shown} (outside {RANGE} {self.network})"
        return ""

    def pick(self, table: Iterable[rdma.Gid]) -> Optional[rdma.Gid]:
        """The GID NCCL selects from a port's table: the lowest such index."""
        return next((g for g in sorted(table, key=lambda g: g.index) if not self.why_not(g)), None)


def _address(gid: str):
    """(address, 4 or 6, link-local) of a GID's text; (None, None, False) if
    it is not one.  An IPv4-mapped GID is IPv4 (getGidAddrFamily)."""
    import ipaddress  # only here and for a range: kept off the agent's start-up

    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return None, None, False
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped, 4, False
    # linkLocalGid: fe80::/64 only, as NCCL tests the first 64 bits.
    return addr, 6, addr.packed[:8] == b"\xfe\x80" + bytes(6)


def wanted_from(env: dict) -> Wanted:
    """The Wanted of an NCCL env, its NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE
    and NCCL_IB_ROCE_VERSION_NUM checked: InvalidInput naming the key for a
    value NCCL would silently replace by its default."""
    family = env.get(FAMILY)
    if family is None or family == "":
        family = "AF_INET"
    elif family not in FAMILIES:
        raise InvalidInput(f"{FAMILY} {family!r} is neither AF_INET nor AF_INET6 (NCCL would "
                           "quietly use AF_INET instead: src/transport/net_ib envIbAddrFamily)")
    network = None
    text = env.get(RANGE)
    if text not in (None, ""):
        import ipaddress  # only for a range: kept off the agent's start-up

        try:
            if not isinstance(text, str) or "/" not in text:
                raise ValueError("no /prefix length")
            network = ipaddress.ip_network(text, strict=False)  # NCCL masks host bits itself
        except ValueError as e:
            raise InvalidInput(f"{RANGE} {text!r} is not an address range in CIDR form "
                               f"(198.18.0.0/15, 2001:db8::/32): {e}; NCCL would ignore it "
                               "(envIbAddrRange)") from None
        if network.version != FAMILIES[family]:
            raise InvalidInput(f"{RANGE} {text} is an IPv{network.version} range, but "
                               f"{FAMILY} is {family}" + (" (the default)" if FAMILY not in env else "")
                               + ": NCCL would ignore the range (envIbAddrRange)")
    version = env.get(VERSION)
    if version is None or version == "":
        version = 2
    else:
        number = str(version).strip() if not isinstance(version, bool) else ""
        if number not in ("1", "2"):
            raise InvalidInput(f"{VERSION} {version!r} is not a RoCE version (1 or 2)")
        version = int(number)
    return Wanted(family, network, version)


# -- which ports --------------------------------------------------------------------

@dataclass(frozen=True)
class Port:
    """A RoCE port auto takes, and the GID NCCL would select on it."""

    device: str
    port: int
    via: str                 # the interface it serves (or the GID's netdev)
    gid: Optional[rdma.Gid]  # None: the port has no wanted GID


def _natural(text: str) -> list:
    """mlx5_2 before mlx5_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _roce_tables(host) -> Dict[Tuple[str, int], list]:
    """{(device, port): populated GIDs} of every Ethernet (RoCE) port."""
    tables = {}
    for device in sorted(rdma.devices(host), key=_natural):
        for port in rdma.ports(host, device):
            if rdma.link_layer(host, device, port) not in (None, "Ethernet"):
                continue  # InfiniBand ports have no RoCE GIDs
            tables[(device, port)] = rdma.gids(host, device, port)
    return tables


def _master(host, ifname: str) -> Optional[str]:
    try:
        target = host.io.readlink(host.path("sys/class/net", ifname, "master"))
    except OSError:
        return None
    return os.path.basename(target)


def _ports_of(host, ifname: str, tables: dict) -> List[Tuple[str, int]]:
    """The RoCE ports whose GIDs are built on ifname or on its master, else
    the one on ifname's own device (rdma.port_of)."""
    names = {ifname, _master(host, ifname)} - {None}
    found = [p for p, table in tables.items() if any(g.ndev in names for g in table)]
    if not found:
        by_device = rdma.port_of(host, ifname)
        if by_device in tables:
            found = [by_device]
    return found


def interfaces_for_auto(profile_interfaces: Optional[dict]) -> Optional[list]:
    """The interfaces auto resolves from, out of Family.profile_interfaces
    ({"roce": [...], "all": [...]}): those of entries with a roce: section,
    else those of every entry; None when the profile has no entries."""
    if profile_interfaces is None:
        return None
    return list(profile_interfaces.get("roce") or profile_interfaces.get("all") or [])


def select(host, wanted: Wanted, interfaces: Optional[Iterable[str]] = None) -> Tuple[list, list]:
    """([Port], [why each interface is left out]): the RoCE ports serving
    `interfaces` that are up, by device, each with the GID NCCL would select
    (gid None when it has none of the wanted kind).  interfaces=None: every
    RoCE port with a wanted GID whose netdev is up."""
    tables = _roce_tables(host)
    up = {link.name for link in host.links() if link.up}
    if interfaces is None:
        ports = []
        for (device, port), table in tables.items():
            gid = wanted.pick(g for g in table if g.ndev in up)
            if gid is not None:
                ports.append(Port(device, port, gid.ndev or "", gid))
        return ports, []
    known = {link.name for link in host.links()}
    chosen: Dict[Tuple[str, int], Port] = {}
    left_out = []
    for ifname in dict.fromkeys(interfaces):
        if not matches(IFNAME, ifname) or ifname not in known:
            left_out.append(f"{ifname} (not on this host)")
            continue
        if ifname not in up:
            left_out.append(f"{ifname} (down)")
            continue
        found = _ports_of(host, ifname, tables)
        if not found:
            left_out.append(f"{ifname} (no RDMA port)")
        for key in found:
            chosen.setdefault(key, Port(key[0], key[1], ifname, wanted.pick(tables[key])))
    ports = [chosen[key] for key in tables if key in chosen]  # device order
    return ports, left_out


# -- resolving and checking ---------------------------------------------------------

def _is_auto(value) -> bool:
    return isinstance(value, str) and value.lower() == AUTO


def resolve_auto(host, env: dict, interfaces: Optional[Iterable[str]] = None) -> tuple:
    """(env with NCCL_IB_HCA / NCCL_IB_GID_INDEX `auto` resolved, a plan note
    saying from what).  Raises InvalidInput for a bad NCCL_IB_ADDR_FAMILY,
    NCCL_IB_ADDR_RANGE or NCCL_IB_ROCE_VERSION_NUM (checked whether or not
    anything is auto), AutoUnresolved when this host has no answer."""
    wanted = wanted_from(env)
    auto = [n for n in (HCA, GID_INDEX) if _is_auto(env.get(n))]
    if not auto:
        return env, ""
    if interfaces is not None:
        interfaces = list(interfaces)
    ports, left_out = roce_rails(host, wanted, interfaces, " and ".join(auto))
    resolved = dict(env)
    if HCA in auto:
        resolved[HCA] = "=" + ",".join(f"{p.device}:{p.port}" for p in ports)
    if GID_INDEX in auto:
        resolved[GID_INDEX] = common_gid_index(ports, wanted, GID_INDEX)
    return resolved, note(wanted, interfaces, ports, left_out)


def roce_rails(host, wanted: Wanted, interfaces: Optional[list], keys: str) -> Tuple[list, list]:
    """([Port], [left out, each with why]): the ports `auto` takes, every one
    with a wanted GID.  AutoUnresolved (naming `keys`, the variables being
    resolved) when there is none.  For other libraries' `auto` as well
    (UCX_NET_DEVICES, NVSHMEM_HCA_LIST): their lists are these ports."""
    ports, left_out = select(host, wanted, interfaces)
    with_gid = [p for p in ports if p.gid is not None]
    left_out += [f"{p.via} ({p.device} port {p.port} has no {wanted})"
                 for p in ports if p.gid is None]
    if with_gid:
        return with_gid, left_out
    if interfaces is None:
        where = f"no RDMA port whose netdev is up has a {wanted}"
    elif not interfaces:
        where = "the profile's entries matched no interface here"
    else:
        where = (f"none of the profile's interfaces has a RoCE port with a {wanted}: "
                 + ", ".join(left_out))
    raise AutoUnresolved(
        f"{keys}: auto found no RoCE port here: {where} (see /sys/class/infiniband/*/ports/*/gids); "
        "give the value explicitly or bring the rails up with their addresses first")


def common_gid_index(ports: list, wanted: Wanted, key: str) -> int:
    """The one index of the wanted GID on every port of roce_rails(), for
    `key` (NCCL_IB_GID_INDEX, UCX_IB_GID_INDEX ...: one number for all
    ports); AutoUnresolved naming each port's index when they differ."""
    indexes = {p.gid.index for p in ports}
    if len(indexes) == 1:
        return ports[0].gid.index
    each = ", ".join(f"{p.device} port {p.port} ({p.gid.ndev}) has it at {p.gid.index}" for p in ports)
    unset = (f"leave {key} unset (NCCL 2.21 and later select the GID per port), "
             if key == GID_INDEX else "")
    raise AutoUnresolved(
        f"{key}: auto needs one {wanted} index common to every RoCE port, but {each}; "
        f"{unset}set it per host, or give the ports the same address layout")


def note(wanted: Wanted, interfaces: Optional[list], ports: list, left_out: list) -> str:
    """What a plan says `auto` resolved from: the ports and GIDs taken, and
    the interfaces left out."""
    head = "auto" + (f" ({wanted})" if wanted != Wanted() else "")
    if interfaces is not None:
        head += " from " + ", ".join(interfaces)
    each = ", ".join(f"{p.device} port {p.port} GID {p.gid.index} "
                     f"(RoCE v{_VERSIONS[p.gid.type]}, {_address(p.gid.gid)[0]})" for p in ports)
    return f"{head}: {each}" + (f"; left out: {', '.join(left_out)}" if left_out else "")


def _index(value) -> Optional[int]:
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _named_ports(hca, tables: dict) -> Optional[list]:
    """The RoCE ports an explicit NCCL_IB_HCA list names (NCCL's syntax:
    '=' exact names, else prefixes; dev[:port]), or None when it names no
    list to go by (unset, auto, or an exclusion '^...')."""
    if not isinstance(hca, str) or not hca or _is_auto(hca) or hca.startswith("^"):
        return None
    exact = hca.startswith("=")
    found = []
    for item in (hca[1:] if exact else hca).split(","):
        name, _, rest = item.partition(":")
        port = _index(rest.split(":")[0]) if rest else None
        for device, number in tables:
            if (device == name if exact else device.startswith(name)) and port in (None, number):
                found.append((device, number))
    return [key for key in tables if key in found]


def gid_index_problem(host, env: dict, interfaces: Optional[Iterable[str]] = None,
                      index_key: str = GID_INDEX, devices_key: str = HCA) -> str:
    """"" or why the numeric NCCL_IB_GID_INDEX of `env` does not point at a
    GID NCCL would select on every port it applies to: the ports its
    NCCL_IB_HCA list names, else those auto would take from `interfaces`.
    Another library's file (ucx.conf: UCX_IB_GID_INDEX, UCX_NET_DEVICES, an
    exact dev:port list) is asked the same with its own keys.
    Never raises: a bad NCCL_IB_ADDR_* value is itself the problem."""
    index = _index(env.get(index_key))
    if index is None or index < 0:
        return ""  # unset, auto or -1: NCCL (or auto) selects it
    try:
        wanted = wanted_from(env)
    except InvalidInput as e:
        return e.message
    tables = _roce_tables(host)
    devices = env.get(devices_key)
    if devices_key != HCA and isinstance(devices, str) and devices and not _is_auto(devices) \
            and devices.lower() != "all":
        devices = "=" + devices  # UCX names devices exactly
    named = _named_ports(devices, tables)
    if named is None:
        ports, _ = select(host, wanted, interfaces)
        named = [(p.device, p.port) for p in ports]
    problems = []
    for device, port in named:
        table = tables[(device, port)]
        at = next((g for g in table if g.index == index), None)
        what = "an empty GID entry" if at is None else wanted.why_not(at)
        if not what:
            continue
        best = wanted.pick(table)
        where = (f"the {wanted} is at {best.index}" if best is not None
                 else f"it has no {wanted}")
        problems.append(f"{index_key} {index} points at {what} of {device} port {port} now; {where}")
    return "; ".join(problems)
