"""rtnetlink for what a link change can take with it: addresses, routes and
how links stack (nictune/host/transaction/aside.py records and restores them).

Only the attributes nictune records are decoded, with their kernel ids
(include/uapi/linux/if_addr.h, rtnetlink.h, if_link.h), for the reason
rtnl.py gives; the rest is skipped undecoded.  Addresses and routes come
back as plain dicts that name their link, ready for the journal.
"""

from __future__ import annotations

import socket
import struct
from typing import Dict, List, Optional

from nictune.host.transports.netlink._pyroute2 import NLA_F_NESTED, nla, nlmsg
from nictune.host.transports.netlink.rtnl import IFF_UP, RTEXT_FILTER_SKIP_STATS, ifinfmsg
from nictune.host.transports.netlink.socket import NETLINK_ROUTE, NLM_F_ACK, NLM_F_REQUEST, NetlinkSocket

RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE = 32, 33, 34
FR_ACT_TO_TBL = 1  # a rule's action: look the packet up in FRA_TABLE
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
_CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL

FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}
_VERSION = {v: k for k, v in FAMILIES.items()}
FOREVER = 0xFFFFFFFF  # an address lifetime that never runs out
# Flags an address is created with; the others are its state (tentative,
# deprecated, dadfailed, secondary, permanent), which the kernel sets.
ADDR_FLAGS = 0x02 | 0x04 | 0x10 | 0x100 | 0x200 | 0x400  # nodad optimistic home mngtmpaddr noprefixroute autojoin
RTNH_F_ONLINK = 0x4
RT_TABLE_COMPAT = 252  # rtm_table when the table id needs RTA_TABLE's 32 bits
USER_HZ = 100  # RTA_CACHEINFO counts expiry in clock ticks


class linkmsg(nlmsg):
    """rtnl.py's link message, plus how the link stacks on others.  Not a
    subclass of it: pyroute2 compiles nla_map once per class hierarchy, and
    a subclass would decode with its parent's map once that was compiled."""

    fields = ifinfmsg.fields
    nla_map = ifinfmsg.nla_map + (
        (5, "IFLA_LINK", "uint32"),
        (10, "IFLA_MASTER", "uint32"),
        (37, "IFLA_LINK_NETNSID", "int32"),
    )

    class linkinfo(nla):  # rtnl.py's, on pyroute2's classes (rtnl.py has its own: _nlmsg.py)
        nla_flags = NLA_F_NESTED
        nla_map = ifinfmsg.linkinfo.nla_map


class addrmsg(nlmsg):
    fields = (("family", "B"), ("prefixlen", "B"), ("flags", "B"), ("scope", "B"), ("index", "I"))
    nla_map = (
        (1, "IFA_ADDRESS", "ipaddr"),
        (2, "IFA_LOCAL", "ipaddr"),
        (3, "IFA_LABEL", "asciiz"),
        (4, "IFA_BROADCAST", "ipaddr"),
        (6, "IFA_CACHEINFO", "cacheinfo"),
        (8, "IFA_FLAGS", "uint32"),
        (9, "IFA_RT_PRIORITY", "uint32"),
        (11, "IFA_PROTO", "uint8"),
    )

    class cacheinfo(nla):
        fields = (("preferred", "I"), ("valid", "I"), ("cstamp", "I"), ("tstamp", "I"))


class routemsg(nlmsg):
    fields = (("family", "B"), ("dst_len", "B"), ("src_len", "B"), ("tos", "B"), ("table", "B"),
              ("proto", "B"), ("scope", "B"), ("type", "B"), ("flags", "I"))
    nla_map = (
        (1, "RTA_DST", "ipaddr"),
        (2, "RTA_SRC", "ipaddr"),
        (4, "RTA_OIF", "uint32"),
        (5, "RTA_GATEWAY", "ipaddr"),
        (6, "RTA_PRIORITY", "uint32"),
        (7, "RTA_PREFSRC", "ipaddr"),
        (8, "RTA_METRICS", "cdata"),    # nested u32s, copied back as they came
        (9, "RTA_MULTIPATH", "cdata"),  # struct rtnexthop array
        (11, "RTA_FLOW", "uint32"),
        (12, "RTA_CACHEINFO", "cdata"),
        (15, "RTA_TABLE", "uint32"),
        (18, "RTA_VIA", "cdata"),
        (20, "RTA_PREF", "uint8"),
        (22, "RTA_ENCAP", "cdata"),
        (23, "RTA_EXPIRES", "uint32"),
        (30, "RTA_NH_ID", "uint32"),
    )


class rulemsg(nlmsg):
    """struct fib_rule_hdr and the FRA attributes nictune reads and writes
    (include/uapi/linux/fib_rules.h)."""

    fields = (("family", "B"), ("dst_len", "B"), ("src_len", "B"), ("tos", "B"),
              ("table", "B"), ("res1", "B"), ("res2", "B"), ("action", "B"), ("flags", "I"))
    nla_map = (
        (1, "FRA_DST", "ipaddr"),
        (2, "FRA_SRC", "ipaddr"),
        (3, "FRA_IIFNAME", "asciiz"),
        (6, "FRA_PRIORITY", "uint32"),
        (10, "FRA_FWMARK", "uint32"),
        (15, "FRA_TABLE", "uint32"),
        (16, "FRA_FWMASK", "uint32"),
        (17, "FRA_OIFNAME", "asciiz"),
        (21, "FRA_PROTOCOL", "uint8"),
    )


class Inet:
    """One rtnetlink socket for addresses, routes and the link stack."""

    def __init__(self, opener=None):
        self._nl = NetlinkSocket(NETLINK_ROUTE, opener=opener)

    def close(self) -> None:
        self._nl.close()

    def __enter__(self) -> "Inet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def links(self) -> List[dict]:
        """{index, name, mtu, up, kind, lower, master} of every link: lower is
        the link IFLA_LINK names in this namespace (a VLAN's or macvlan's
        parent, a veth's peer), master its bridge or bond."""
        msg = linkmsg()
        msg["attrs"] = [("IFLA_EXT_MASK", RTEXT_FILTER_SKIP_STATS)]
        out = []
        for m in self._nl.dump(msg, RTM_GETLINK, {RTM_NEWLINK: linkmsg}):
            get = m.get_attr
            info = get("IFLA_LINKINFO")
            lower = get("IFLA_LINK")
            if lower == m["index"] or get("IFLA_LINK_NETNSID") is not None:
                lower = None
            out.append({"index": m["index"], "name": get("IFLA_IFNAME"), "mtu": get("IFLA_MTU"),
                        "up": bool(m["flags"] & IFF_UP),
                        "kind": info.get_attr("IFLA_INFO_KIND") if info is not None else None,
                        "lower": lower, "master": get("IFLA_MASTER")})
        return out

    def addresses(self, names: Dict[int, str]) -> List[dict]:
        """Every IPv4 and IPv6 address, naming its link through `names`."""
        out = []
        for family in FAMILIES.values():
            msg = addrmsg()
            msg["family"] = family
            out += [_address(m, names) for m in self._nl.dump(msg, RTM_GETADDR, {RTM_NEWADDR: addrmsg})]
        return out

    def routes(self, names: Dict[int, str]) -> List[dict]:
        """Every IPv4 and IPv6 route of every table (no cached ones)."""
        out = []
        for family in FAMILIES.values():
            msg = routemsg()
            msg["family"] = family
            out += [_route(m, names) for m in self._nl.dump(msg, RTM_GETROUTE, {RTM_NEWROUTE: routemsg})]
        return out

    def add_address(self, a: dict, index: int, lifetime: Optional[tuple] = None) -> None:
        """Create address `a` (as addresses() gives it) on link `index`;
        lifetime: (preferred, valid) seconds, None for forever."""
        msg = addrmsg()
        msg["family"] = FAMILIES[a["family"]]
        msg["prefixlen"], msg["scope"], msg["index"] = a["prefixlen"], a["scope"], index
        flags = a["flags"] & ADDR_FLAGS
        msg["flags"] = flags & 0xFF
        attrs = [("IFA_LOCAL", a["local"]), ("IFA_ADDRESS", a["peer"] or a["local"]),
                 ("IFA_FLAGS", flags)]
        if a.get("broadcast"):
            attrs.append(("IFA_BROADCAST", a["broadcast"]))
        if a.get("label") and a["family"] == 4:
            attrs.append(("IFA_LABEL", a["label"]))
        if a.get("metric"):
            attrs.append(("IFA_RT_PRIORITY", a["metric"]))
        if a.get("proto"):
            attrs.append(("IFA_PROTO", a["proto"]))
        if lifetime is not None:
            attrs.append(("IFA_CACHEINFO", {"preferred": lifetime[0], "valid": lifetime[1],
                                            "cstamp": 0, "tstamp": 0}))
        msg["attrs"] = attrs
        self._nl.request(msg, RTM_NEWADDR, _CREATE)

    def delete_address(self, a: dict, index: int) -> None:
        """Delete address `a` (its local address and prefix length) from link `index`."""
        msg = addrmsg()
        msg["family"] = FAMILIES[a["family"]]
        msg["prefixlen"], msg["index"] = a["prefixlen"], index
        msg["attrs"] = [("IFA_LOCAL", a["local"]), ("IFA_ADDRESS", a.get("peer") or a["local"])]
        self._nl.request(msg, RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK)

    def add_route(self, r: dict, index: Optional[int], expires: Optional[int] = None) -> None:
        """Create single-path route `r` (as routes() gives it) through link `index`."""
        self._nl.request(_route_msg(r, index, expires), RTM_NEWROUTE, _CREATE)

    def delete_route(self, r: dict, index: Optional[int]) -> None:
        """Delete the single-path route `r` (as routes() gives it) through link `index`."""
        self._nl.request(_route_msg(r, index, None), RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK)

    def rules(self) -> List[dict]:
        """Every IPv4 and IPv6 policy routing rule, as `ip rule` lists them."""
        out = []
        for family in FAMILIES.values():
            msg = rulemsg()
            msg["family"] = family
            out += [_rule(m) for m in self._nl.dump(msg, RTM_GETRULE, {RTM_NEWRULE: rulemsg})]
        return out

    def add_rule(self, r: dict) -> None:
        """Create rule `r` (as rules() gives it) that looks up a table."""
        self._nl.request(_rule_msg(r), RTM_NEWRULE, _CREATE)

    def delete_rule(self, r: dict) -> None:
        """Delete the rule that matches `r` in every field rules() gives."""
        self._nl.request(_rule_msg(r), RTM_DELRULE, NLM_F_REQUEST | NLM_F_ACK)


def _route_msg(r: dict, index: Optional[int], expires: Optional[int]) -> routemsg:
    msg = routemsg()
    msg["family"] = FAMILIES[r["family"]]
    for field in ("dst_len", "src_len", "tos", "proto", "scope", "type"):
        msg[field] = r[field]
    msg["table"] = r["table"] if r["table"] < 256 else RT_TABLE_COMPAT
    msg["flags"] = RTNH_F_ONLINK if r.get("onlink") else 0
    attrs = [("RTA_TABLE", r["table"])]
    for attr, field in (("RTA_DST", "dst"), ("RTA_SRC", "src"), ("RTA_GATEWAY", "gateway"),
                        ("RTA_PRIORITY", "metric"), ("RTA_PREFSRC", "prefsrc"),
                        ("RTA_FLOW", "flow"), ("RTA_PREF", "pref")):
        if r.get(field) is not None:
            attrs.append((attr, r[field]))
    for attr, field in (("RTA_METRICS", "metrics"), ("RTA_VIA", "via")):
        if r.get(field):
            attrs.append((attr, bytes.fromhex(r[field])))
    if index is not None:
        attrs.append(("RTA_OIF", index))
    if expires is not None:
        attrs.append(("RTA_EXPIRES", expires))
    msg["attrs"] = attrs
    return msg


def _rule_msg(r: dict) -> rulemsg:
    msg = rulemsg()
    msg["family"] = FAMILIES[r["family"]]
    msg["src_len"], msg["dst_len"] = r["src_len"], r["dst_len"]
    msg["action"] = FR_ACT_TO_TBL
    msg["table"] = r["table"] if r["table"] < 256 else RT_TABLE_COMPAT
    attrs = [("FRA_TABLE", r["table"]), ("FRA_PRIORITY", r["priority"])]
    for attr, field in (("FRA_SRC", "src"), ("FRA_DST", "dst"), ("FRA_IIFNAME", "iif"),
                        ("FRA_OIFNAME", "oif"), ("FRA_FWMARK", "fwmark"),
                        ("FRA_FWMASK", "fwmask"), ("FRA_PROTOCOL", "proto")):
        if r.get(field) is not None:
            attrs.append((attr, r[field]))
    msg["attrs"] = attrs
    return msg


def _rule(m: rulemsg) -> dict:
    get = m.get_attr
    return {
        "family": _VERSION[m["family"]],
        "priority": get("FRA_PRIORITY") or 0,
        "src": get("FRA_SRC"), "src_len": m["src_len"],
        "dst": get("FRA_DST"), "dst_len": m["dst_len"],
        "iif": get("FRA_IIFNAME"), "oif": get("FRA_OIFNAME"),
        "fwmark": get("FRA_FWMARK"), "fwmask": get("FRA_FWMASK"),
        "table": get("FRA_TABLE") or m["table"],
        "action": m["action"],
        "proto": get("FRA_PROTOCOL"),
    }


def _address(m: addrmsg, names: Dict[int, str]) -> dict:
    get = m.get_attr
    local, address = get("IFA_LOCAL"), get("IFA_ADDRESS")
    flags = get("IFA_FLAGS")
    cache = get("IFA_CACHEINFO")
    valid = cache["valid"] if cache is not None else FOREVER
    preferred = cache["preferred"] if cache is not None else FOREVER
    return {
        "dev": names.get(m["index"]),
        "family": _VERSION[m["family"]],
        "local": local or address,
        "prefixlen": m["prefixlen"],
        "peer": address if local and address != local else None,  # point-to-point
        "broadcast": get("IFA_BROADCAST"),
        "label": get("IFA_LABEL"),
        "scope": m["scope"],
        "flags": m["flags"] if flags is None else flags,
        "metric": get("IFA_RT_PRIORITY"),
        "proto": get("IFA_PROTO"),  # None before kernel 5.18
        # Seconds left, None for forever: what `ip addr` shows as _lft.
        "preferred": None if preferred == FOREVER else preferred,
        "valid": None if valid == FOREVER else valid,
    }


def _route(m: routemsg, names: Dict[int, str]) -> dict:
    get = m.get_attr
    cache = get("RTA_CACHEINFO") or b""
    expires = struct.unpack_from("=i", cache, 8)[0] if len(cache) >= 12 else 0
    multipath = get("RTA_MULTIPATH")
    oif = get("RTA_OIF")
    return {
        "family": _VERSION[m["family"]],
        "dst": get("RTA_DST"), "dst_len": m["dst_len"],
        "src": get("RTA_SRC"), "src_len": m["src_len"],
        "tos": m["tos"],
        "table": get("RTA_TABLE") or m["table"],
        "proto": m["proto"], "scope": m["scope"], "type": m["type"],
        "onlink": bool(m["flags"] & RTNH_F_ONLINK),
        "dev": names.get(oif) if oif else None,
        "gateway": get("RTA_GATEWAY"),
        "via": (get("RTA_VIA") or b"").hex() or None,
        "metric": get("RTA_PRIORITY"),
        "prefsrc": get("RTA_PREFSRC"),
        "metrics": (get("RTA_METRICS") or b"").hex() or None,
        "flow": get("RTA_FLOW"),
        "pref": get("RTA_PREF"),
        # Whole seconds left, rounded up; None when it never expires.
        "expires": -(-expires // USER_HZ) if expires > 0 else None,
        "nexthops": _nexthops(multipath, m["family"], names) if multipath else None,
        "nh_id": get("RTA_NH_ID"),
        "encap": bool(get("RTA_ENCAP")),
    }


_RTNH = struct.Struct("=HBBi")  # struct rtnexthop: len, flags, hops, ifindex
_RTA = struct.Struct("=HH")


def _nexthops(data: bytes, family: int, names: Dict[int, str]) -> List[list]:
    """[dev, gateway, weight] of each path of a multipath route, in order."""
    out, off = [], 0
    while off + _RTNH.size <= len(data):
        length, _flags, hops, ifindex = _RTNH.unpack_from(data, off)
        if length < _RTNH.size:
            break
        gateway, at = None, off + _RTNH.size
        while at + _RTA.size <= off + length:
            alen, kind = _RTA.unpack_from(data, at)
            if alen < _RTA.size:
                break
            if kind == 5:  # RTA_GATEWAY
                gateway = socket.inet_ntop(family, data[at + _RTA.size:at + alen])
            at += (alen + 3) & ~3
        out.append([names.get(ifindex), gateway, hops + 1])
        off += (length + 3) & ~3
    return out
