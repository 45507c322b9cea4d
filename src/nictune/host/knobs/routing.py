"""Per-rail policy routing over rtnetlink: a table of its own for each rail,
the rule "from this rail's addresses look up that table", and the table's
routes (the rail's connected subnet, optionally a default route through a
gateway on the rail).

Why: with several rails in one subnet the main table has one connected
route per rail for the same prefix and the kernel takes the first, so a
packet from rail 1's address leaves by rail 0 (and a reply to a ping bound
to rail 1 comes back through rail 0).  A table per rail, chosen by source
address, makes each rail's traffic leave by its own port.

Keys, one per rule and per route, so that a plan shows each with its source
line: `rule from ADDR` and `route DST` (DST: the rail's subnet or default).
Their value is the rule or route as `ip` prints it, or "absent".  A rule
or route is written with nictune's protocol number (RTPROT_NICTUNE, shown
by `ip rule`/`ip route` as proto 245), and a rollback deletes only what
it added: the journal holds "absent" as the value before, and the delete
names the exact rule or route, so one that someone else added (without
nictune's protocol, or different in any field) is never removed.

Numbers: `table` and `priority` take a number or "N+rail", N plus the rail's
index among the interfaces the entry matched, in the kernel's order.  The
default priorities sit in the band 30000-32765: after the rules operators
usually write (lower numbers are looked at first, so nictune never shadows
theirs) and before the main table's rule at 32766.  Lint refuses two
entries whose tables or priorities collide.

Sysctls: each rail also gets the ARP and rp_filter sysctls its layout needs
(ONE_SUBNET or PER_RAIL, below) as sysctl-family keys marked model.Default:
the sysctl family reads, writes and rolls them back (defaults_for loads
it), and a value the profile sets itself for the same key replaces the
default in engine.Desire.add instead of conflicting with it.
"""

from __future__ import annotations

import ipaddress

from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.knobs.base import Family
from nictune.host.model import Default, Desired, Key, Unsupported, Want

PRESENT, ABSENT = "present", "absent"
UNREAD = "rules and routes"  # the one key of a rail whose addresses cannot be read
RTPROT_NICTUNE = 245  # rtm_protocol / FRA_PROTOCOL of what nictune writes
DEFAULT_TABLE = "100+rail"
DEFAULT_PRIORITY = "30100+rail"
PRIORITY_BAND = (30000, 32765)
# Tables the kernel owns: unspec, compat, default, main, local.
RESERVED_TABLES = (0, 252, 253, 254, 255)
RAIL_NUMBER = r"^[0-9]{1,10}\+rail$"
RAIL_ADDRESS = r"^[0-9.]{7,15}/[0-9]{1,2}(\+rail)?$"
ONE_ADDRESS = r"^[0-9.]{7,15}/[0-9]{1,2}$"
IPV4 = r"^((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])$"
_SCOPE_LINK, _SCOPE_UNIVERSE, _RTN_UNICAST = 253, 0, 1


# What one "N+rail" claims for lint's collision check: N to N + MAX_RAILS - 1.
MAX_RAILS = 32
# The per-interface sysctls each layout needs, as defaults a profile's own
# sysctl: values override (model.Default), and the values that do for lint.
# The kernel takes the larger of conf.all and the interface's own value for
# all three (Documentation/networking/ip-sysctl.rst).
#  - ONE_SUBNET, every rail in one subnet: the kernel answers an ARP request
#    for any local address on any port (arp_ignore 0), so a peer learns rail
#    1's address at rail 0's MAC; arp_ignore 1 answers only on the port that
#    holds the address.  arp_announce 2 puts the sending port's own address in
#    its ARP requests, so that no peer learns another rail's address with this
#    port's MAC.  rp_filter 2, loose: ip-sysctl.rst recommends loose mode "if
#    using asymmetric routing or other complicated routing"; strict mode checks
#    the reverse path, and in one subnet the main table routes the subnet by
#    rail 0 alone (only the rules cover the rails' own addresses), so traffic
#    to anything else that arrives on rail 1 (broadcasts, another address) is
#    dropped.
#  - PER_RAIL, each rail in a subnet of its own: a request for rail N's
#    address reaches rail N only and the main table's connected routes match
#    the ports, so arp_ignore and a strict rp_filter stay as the host has them;
#    arp_announce 2 still keeps another rail's address out of a port's ARP
#    requests (a packet sent from one rail's address by another port).
ONE_SUBNET = {"ipv4.arp_ignore": 1, "ipv4.arp_announce": 2, "ipv4.rp_filter": 2}
PER_RAIL = {"ipv4.arp_announce": 2}
GOOD = {"ipv4.arp_ignore": (1, 2), "ipv4.arp_announce": (2,), "ipv4.rp_filter": (0, 2)}


def claimed(spec) -> set:
    """The numbers a `table`/`priority` value may take over the rails (lint)."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return {spec}
    if isinstance(spec, str) and spec.endswith("+rail") and spec[:-5].isdigit():
        base = int(spec[:-5])
        return set(range(base, base + MAX_RAILS))
    return set()


def rail_address(spec, index: int):
    """(address, prefixlen) a `routing.address` value declares for the rail
    at `index`: "198.18.7.1/24" as is, "198.18.7.1/24+rail" that address
    plus the index, a list (one address per rail, such as an inventory's
    host variable gives) its index-th item; None when it is not one (or runs
    out of the subnet, or of the list)."""
    if isinstance(spec, list):
        return rail_address(spec[index], 0) if index < len(spec) and isinstance(spec[index], str) \
            and not spec[index].endswith("+rail") else None
    text, plus = (spec[:-5], index) if spec.endswith("+rail") else (spec, 0)
    try:
        iface = ipaddress.IPv4Interface(text)
        address = iface.ip + plus
    except ValueError:
        return None
    net = iface.network
    if address not in net or (net.prefixlen < 31 and address in (net.network_address,
                                                                  net.broadcast_address)):
        return None
    return str(address), iface.network.prefixlen


def declared_one_subnet(spec) -> bool:
    """Whether a `routing.address` value puts the rails in one subnet: a
    +rail pattern does, a list does when two of its subnets overlap."""
    if isinstance(spec, str):
        return spec.endswith("+rail")
    nets = [ipaddress.ip_network(a, strict=False) for a in spec or ()
            if isinstance(a, str) and rail_address(a, 0)]
    return any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])


def rail_number(spec, index: int) -> int:
    """A `table`/`priority` value for the rail at `index`: a number as is,
    "N+rail" as N + index."""
    if isinstance(spec, int):
        return spec
    return int(str(spec).split("+")[0]) + index


class RoutingFamily(Family):
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    # routing: brings the rails' ARP sysctls as defaults that sysctl: overrides:
    # rails in one subnet get arp_ignore 1, arp_announce 2, rp_filter 2 (loose);
    # rails in subnets of their own get arp_announce 2.
    routing:
      table: 100+rail          # rail 0 -> table 100, rail 1 -> 101 ...
      priority: 30100+rail     # the rule's priority (30000-32765 by default)
      address: 198.18.0.1/24+rail   # optional: rail 0 gets .1, rail 1 .2 ...
      gateway: 198.18.0.254    # optional: a default route in the rail's table
"""
    name = "routing"
    position = 105
    position_note = ("after the link settings: a rail's routes are added through a link that is "
                     "up, with its addresses in place")
    sections = ("routing",)
    settings = ("routing.table", "routing.priority", "routing.address", "routing.gateway")
    defaults_for = ("sysctl",)

    @classmethod
    def plan_reads(cls, host) -> None:
        # The addresses expand reads, and the rules and routes read() does.
        names = {link.index: link.name for link in host.links()}
        with host.inet() as inet:
            inet.addresses(names)
            inet.rules()
            inet.routes(names)

    @classmethod
    def schema(cls, s):
        number = {"anyOf": [s.integer(1, s.U32),
                            s.text(RAIL_NUMBER, 16, words="N+rail: N plus the rail's index")]}
        return {"entry": {"routing": s.section(
            "Policy routing for each interface of the entry: a table of its own, the rule "
            "'from its addresses look up that table', and the table's routes. It brings the "
            "per-interface sysctls of the rails' layout as defaults the entry's own sysctl: "
            "values override: rails in one subnet (a +rail address, or a subnet another "
            "interface shares) get arp_ignore 1, arp_announce 2 and rp_filter 2 (loose); rails "
            "in subnets of their own get arp_announce 2.",
            {
                "table": {**number, "description": "The rail's routing table: a number, or "
                          "N+rail (default 100+rail). 0 and 252-255 are the kernel's."},
                "priority": {**number, "description": "The rule's priority: a number, or N+rail "
                             "(default 30100+rail). Keep it above the operator's rules and "
                             "below the main table's 32766."},
                "address": {"anyOf": [
                    s.text(RAIL_ADDRESS, 24, words="an IPv4 address/prefix, optionally followed by +rail"),
                    {"type": "array", "minItems": 1, "maxItems": MAX_RAILS,
                     "items": s.text(ONE_ADDRESS, 18, words="an IPv4 address/prefix")}],
                    "description": "An IPv4 address the rail must have, with its prefix length; "
                    "+rail adds the rail's index (198.18.7.1/24+rail: rail 0 gets .1, rail 1 .2); "
                    "or a list, one address per rail in match order (an inventory host variable "
                    "`nictune: {interfaces: {ENTRY: {routing: {address: [...]}}}}` can give each "
                    "host its own). nictune adds it, and a rollback removes it only when nictune "
                    "added it."},
                "gateway": s.text(IPV4, 15, "A gateway on the rail's subnet: the rail's table "
                                  "gets a default route through it.", words="an IPv4 address"),
            })}}

    def __init__(self, host):
        super().__init__(host)
        self._rail_of: dict = {}     # id(section) -> [targets], for the rail index
        self._addresses = None       # [(ifname, address, prefixlen)]
        self._unread = ""            # why the addresses could not be read
        self._rules: list = []
        self._routes: list = []

    # -- profile -> keys ------------------------------------------------------
    def expand(self, target, sections, source):
        spec = sections["routing"] or {}
        rails = self._rail_of.setdefault(id(spec), [])
        rails.append(target)
        index = len(rails) - 1
        table = rail_number(spec.get("table", DEFAULT_TABLE), index)
        priority = rail_number(spec.get("priority", DEFAULT_PRIORITY), index)
        if table in RESERVED_TABLES:
            raise InvalidInput(f"{source('routing', 'table')}: routing.table {table} for {target} "
                               "is one of the kernel's tables (0, 252-255); choose another")
        out = []
        found = self._rail_addresses(target)
        if self._unread:
            return [Desired(Key(self.name, target, UNREAD), Want(PRESENT), source("routing"))]
        if spec.get("address"):
            declared = rail_address(spec["address"], index)
            if declared is None and isinstance(spec["address"], list) and index >= len(spec["address"]):
                raise InvalidInput(f"{source('routing', 'address')}: routing.address lists "
                                   f"{len(spec['address'])} addresses, but the entry matched "
                                   f"{target} too (rail {index}): give one address per rail")
            if declared is None:
                shown = spec["address"][index] if isinstance(spec["address"], list) else spec["address"]
                raise InvalidInput(f"{source('routing', 'address')}: routing.address "
                                   f"{str(shown)[:40]!r} for {target} (rail {index}) is "
                                   "not an IPv4 address with a prefix length")
            out.append(Desired(Key(self.name, target, _address_name(*declared)), Want(PRESENT),
                               source("routing", "address")))
            found = list(dict.fromkeys(found + [declared]))
        for address, prefixlen in found:
            net = ipaddress.ip_network(f"{address}/{prefixlen}", strict=False)
            rule = {"family": 4, "priority": priority, "src": address, "src_len": 32,
                    "dst": None, "dst_len": 0, "table": table, "proto": RTPROT_NICTUNE}
            out.append(self._want(target, rule,
                                  source("routing", "priority" if "priority" in spec else "table")))
            route = _route(table, str(net.network_address), net.prefixlen, target, address,
                           _SCOPE_LINK, None)
            out.append(self._want(target, route, source("routing", "table")))
        if spec.get("gateway"):
            route = _route(table, None, 0, target, None, _SCOPE_UNIVERSE, spec["gateway"])
            out.append(self._want(target, route, source("routing", "gateway")))
        return out + self._sysctl_defaults(target, spec, found, source("routing"))

    def _sysctl_defaults(self, target: str, spec: dict, found: list, where: str) -> list:
        """The ARP and rp_filter sysctls of the rail's layout (ONE_SUBNET or
        PER_RAIL), as sysctl keys the profile's own values override.  One
        subnet: a +rail address pattern (every rail in its subnet), a list
        of addresses two of which share a subnet, or a subnet of this
        rail's that another interface of the host shares."""
        mine = [ipaddress.ip_network(f"{a}/{p}", strict=False) for a, p in found]
        others = [ipaddress.ip_network(f"{a}/{p}", strict=False)
                  for dev, a, p in self._addresses or () if dev != target]
        shared = declared_one_subnet(spec.get("address")) or any(
            m.overlaps(o) for m in mine for o in others)
        label = f"{where} (routing default: {'rails in one subnet' if shared else 'a subnet per rail'})"
        # The sysctl family's key (SysctlFamily.key_for), written by it.
        return [Default(Key("sysctl", target, f"net.ipv4.conf.{target}.{short[5:]}"), Want(value),
                        label.strip())
                for short, value in (ONE_SUBNET if shared else PER_RAIL).items()]

    def _want(self, target: str, what: dict, where: str) -> Desired:
        return Desired(Key(self.name, target, _name(what)), Want(PRESENT), where)

    def _rail_addresses(self, target: str) -> list:
        """The IPv4 addresses of `target` as (address, prefixlen).  A host
        whose addresses cannot be read (a snapshot, which does not record
        rtnetlink) is no error here: read() answers for UNREAD."""
        if self._addresses is None:
            try:
                names = {link.index: link.name for link in self.host.links()}
                with self.host.inet() as inet:
                    self._addresses = [(a["dev"], a["local"], a["prefixlen"])
                                       for a in inet.addresses(names) if a["family"] == 4]
            except (OSError, ValueError, NictuneError) as e:
                self._addresses, self._unread = [], str(e)
        return [(a, p) for dev, a, p in self._addresses if dev == target]

    # -- host -> values ---------------------------------------------------------
    def read(self, keys):
        names = {link.index: link.name for link in self.host.links()}
        with self.host.inet() as inet:
            self._rules = inet.rules()
            self._routes = inet.routes(names)
            self._addresses = [(a["dev"], a["local"], a["prefixlen"])
                               for a in inet.addresses(names) if a["family"] == 4]
        out = {}
        for key in keys:
            what = parse(key)
            if key.name == UNREAD:
                out[key] = Unsupported(f"cannot read the addresses of {key.target}: {self._unread}")
            elif what is None:
                out[key] = Unsupported(f"not a rule or route nictune writes: {key.name[:80]!r}")
            elif "local" in what:
                out[key] = PRESENT if any(a[0] == key.target and a[1:] == (what["local"], what["prefixlen"])
                                          for a in self._addresses) else ABSENT
            elif _present(what, self._rules if "priority" in what else self._routes):
                out[key] = PRESENT
            else:
                out[key] = ABSENT
        return out

    def check(self, key, want):
        what = parse(key)
        if what is None or "priority" not in what:
            return None
        for rule in self._rules:
            # nictune's own rules into the same table (a rail with two
            # addresses) share the priority by design.
            ours = rule["proto"] == RTPROT_NICTUNE and rule["table"] == what["table"]
            if rule["priority"] == what["priority"] and rule["family"] == 4 and not ours:
                return (f"priority {what['priority']} already holds another rule (from "
                        f"{rule['src'] or 'all'} lookup {rule['table']}): choose another priority")
        return None

    # -- values -> host -----------------------------------------------------------
    def apply(self, items):
        # Addresses first (a route's source must be one), rules last: a rule
        # that points at an empty table would send the rail's traffic
        # nowhere for the moment in between.
        with self.host.inet() as inet:
            for key, value in sorted(items, key=lambda kv: _STAGE[kv[0].name.split()[0]]):
                self._write(inet, key, value)
        self.host.forget()

    def revert(self, items):
        # Rules first: the rail's traffic goes back to the main table before
        # the routes it used go away.
        with self.host.inet() as inet:
            for key, value in sorted(items, key=lambda kv: -_STAGE[kv[0].name.split()[0]]):
                self._write(inet, key, value)
        self.host.forget()

    def _write(self, inet, key: Key, value) -> None:
        what = parse(key)
        if what is None:
            raise ValueError(f"not a rule or route nictune writes: {key.name[:80]!r}")
        is_rule = "priority" in what
        if "local" in what:
            if value == ABSENT:
                inet.delete_address(what, self._index(key.target))
            else:
                inet.add_address(what, self._index(key.target))
        elif value == ABSENT:
            if is_rule:
                inet.delete_rule(what)
            else:
                inet.delete_route(what, self._index(what["dev"]))
        elif is_rule:
            inet.add_rule(what)
        else:
            inet.add_route(what, self._index(what["dev"]))

    def _index(self, ifname: str) -> int:
        for link in self.host.links():
            if link.name == ifname:
                return link.index
        raise OSError(f"no interface {ifname}")

    # -- host -> profile ----------------------------------------------------------
    def show(self, target):
        return {}


_RULE_FIELDS = ("priority", "src", "src_len", "dst", "dst_len", "table", "proto")
_ROUTE_FIELDS = ("table", "dst", "dst_len", "dev", "gateway", "prefsrc", "proto", "scope")


def _route(table: int, dst, dst_len: int, dev: str, prefsrc, scope: int, gateway) -> dict:
    return {"family": 4, "table": table, "dst": dst, "dst_len": dst_len, "src": None,
            "src_len": 0, "tos": 0, "proto": RTPROT_NICTUNE, "scope": scope,
            "type": _RTN_UNICAST, "dev": dev, "gateway": gateway, "prefsrc": prefsrc,
            "metric": None}


def _same(a: dict, b: dict, fields: tuple) -> bool:
    return all(a.get(f) == b.get(f) for f in fields)


def _present(what: dict, found: list) -> bool:
    fields = _RULE_FIELDS if "priority" in what else _ROUTE_FIELDS
    return any(f.get("family") == 4 and _same(f, what, fields) for f in found)


def _name(what: dict) -> str:
    """The key name of a rule or route: the rule or route as `ip` shows it,
    whole, so that a rollback (which has the key and the value before, not
    the profile) deletes exactly what was added."""
    if "priority" in what:
        return f"rule {what['priority']} from {what['src']} lookup {what['table']}"
    if what["gateway"]:
        return f"route default via {what['gateway']} table {what['table']}"
    return f"route {what['dst']}/{what['dst_len']} table {what['table']} src {what['prefsrc']}"


_STAGE = {"address": 0, "route": 1, "rule": 2}


def _address_name(address: str, prefixlen: int) -> str:
    return f"address {address}/{prefixlen}"


def parse(key: Key):
    """The address, rule or route dict a key name (_name, _address_name)
    stands for; None for a name that is not one (a journal edited by hand)."""
    words = key.name.split()
    try:
        if len(words) == 2 and words[0] == "address":
            iface = ipaddress.IPv4Interface(words[1])
            return {"family": 4, "local": str(iface.ip), "prefixlen": iface.network.prefixlen,
                    "peer": None, "scope": _SCOPE_UNIVERSE, "flags": 0}
        if len(words) == 6 and words[0] == "rule" and words[2] == "from" and words[4] == "lookup":
            ipaddress.IPv4Address(words[3])
            return {"family": 4, "priority": int(words[1]), "src": words[3], "src_len": 32,
                    "dst": None, "dst_len": 0, "table": int(words[5]), "proto": RTPROT_NICTUNE}
        if len(words) == 6 and words[:3] == ["route", "default", "via"] and words[4] == "table":
            ipaddress.IPv4Address(words[3])
            return _route(int(words[5]), None, 0, key.target, None, _SCOPE_UNIVERSE, words[3])
        if len(words) == 6 and words[0] == "route" and words[2] == "table" and words[4] == "src":
            net = ipaddress.IPv4Network(words[1])
            ipaddress.IPv4Address(words[5])
            return _route(int(words[3]), str(net.network_address), net.prefixlen, key.target,
                          words[5], _SCOPE_LINK, None)
    except ValueError:
        return None
    return None
