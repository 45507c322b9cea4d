"""What a change takes with it: kernel side effects that restoring its key
does not undo, recorded before an apply and put back after a rollback.

Some writes make the kernel change more than the key (as of kernel 6.18):
- an MTU below 1280, the IPv6 minimum, removes IPv6 from the link: its
  addresses, routes and IPv6 sysctls (addrconf_ifdown() with unregister);
  when the MTU goes back up, the sysctls come back from conf.default;
- devices stacked on a link (macvlan, VLAN) take its MTU when it drops
  below theirs and keep it when it goes back up; a bridge follows its port;
- `state: down` removes the link's routes and IPv6 addresses (unless
  keep_addr_on_down), and takes its VLANs down with it;
- disable_ipv6 = 1 removes the link's IPv6 addresses and routes;
- a rail address knobs/routing.py adds is deleted again by a rollback, and
  when it was the link's last IPv4 address the kernel flushes every IPv4
  route through the link with it (fib_disable_ip);
- ip_forward and the conf.all keys of knobs/sysctl.py's SPREAD set the leaf
  on every interface (and all.accept_redirects for IPv4 forwarding).

So before an apply's first write, the engine asks affected() which pending
changes do that, stores what snapshot() records in the journal, and after a
rollback has restored the keys, restore() puts back what is still missing
and returns what it could not: a rollback that cannot put everything back
is a failed rollback, never "restored".

What is recorded, and why:
- the MTU and admin state of the links concerned, with the devices stacked
  on them and the bridges or bonds above them;
- their addresses, but the kernel's own (IFA_PROTO kernel_lo, kernel_ra,
  kernel_ll: loopback, SLAAC and link-local addresses, which the kernel
  makes again when IPv6 comes back on the link or the next router
  advertisement arrives).  An address with a lifetime goes back with the
  lifetime it has left, and not at all when that has run out (it would
  have gone anyway).  Kernels before 5.18 do not mark the kernel's
  addresses: their link-local ones are recorded too, and putting one back
  is harmless (the kernel makes the same one);
- their routes in every table, but the kernel's own and learned ones
  (proto kernel: connected, local and broadcast routes, which come back with
  their addresses; proto ra and redirect).  Multipath routes and routes
  through nexthop objects or with encapsulation are checked, not rebuilt;
- the IPv6 sysctls of links whose MTU drops below 1280, and for a SPREAD
  key, the leaf of every interface and of conf.default.
Not recorded, and said in plans: neighbour entries, multicast memberships,
sockets bound to a removed address, LRO (which the kernel switches off on
every device when forwarding goes on).

A link that no longer exists at rollback has nothing left to restore and
is skipped; the keys of the apply report their own links.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Callable, Dict, List, Optional, Tuple

from nictune.host.errors import NictuneError
from nictune.host.knobs.sysctl import SPREAD, SPREAD_ALSO, SysctlFamily, spread_note
from nictune.host.model import HOST, Change, Key, Unsupported
from nictune.host.validate import IFNAME, matches

RECORD_FORMAT = 1
IPV6_MIN_MTU = 1280
EVERY_LINK = "*"
# Kinds of device that follow the link they are stacked on (IFLA_LINK).
STACKED_KINDS = frozenset({"vlan", "macvlan", "macvtap", "ipvlan", "ipvtap", "macsec"})
KERNEL_ADDRESSES = frozenset({1, 2, 3})  # IFAPROT_KERNEL_LO, _RA, _LL
LEARNED_ROUTES = frozenset({1, 2, 9})    # RTPROT_REDIRECT, _KERNEL, _RA
TABLES = {253: "default", 254: "main", 255: "local"}
PROTOS = {3: "boot", 4: "static", 16: "dhcp"}

_ADDRESSING = ("neighbour entries, multicast memberships, sockets bound to a removed address, "
               "and addresses and routes learned from router advertisements")
_SPREAD_LOST = {
    "forwarding": "LRO, which the kernel switches off on every device when forwarding goes on",
    "addr_gen_mode": "the link-local addresses the kernel generates in each mode",
}
_RESTORES = "rollback restores the addresses, routes and sysctls that nictune records before the first write"


@dataclass(frozen=True)
class Effect:
    """What one pending change makes the kernel do beyond its key."""

    key: Key
    what: str                      # for plans; "" when nothing needs saying
    links: Tuple[str, ...] = ()    # links whose addressing it can take (EVERY_LINK: all)
    ipv6_conf: bool = False        # ... whose IPv6 sysctls the kernel recreates
    spread: Optional[Tuple[str, str]] = None  # (family, leaf) it sets on every interface
    lost: str = _ADDRESSING        # what a rollback does not put back

    def warning(self) -> str:
        return f"{self.what}; {_RESTORES}; other state, such as {self.lost}, is not"


def affected(changes: list) -> List[Effect]:
    """The effects of the pending `changes` that restoring their keys does not undo."""
    found = (_link_effect(c) if c.key.family == "link" else
             _sysctl_effect(c) if c.key.family == "sysctl" else
             _routing_effect(c) if c.key.family == "routing" else None for c in changes)
    return [e for e in found if e is not None]


def warnings(changes: list) -> List[str]:
    """One plan warning per pending change with such an effect."""
    return [e.warning() for e in affected(changes) if e.what]


def _number(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _link_effect(c: Change) -> Optional[Effect]:
    key = c.key
    before, after = _number(c.before), _number(c.after)
    if key.name == "mtu" and before is not None and after is not None and after < before:
        if after < IPV6_MIN_MTU <= before:
            return Effect(key, f"{key.target}: MTU {after} is below {IPV6_MIN_MTU}, the IPv6 minimum, "
                               "so the kernel removes IPv6 from it and from the devices stacked on it "
                               "(addresses, routes and IPv6 sysctls)", (key.target,), ipv6_conf=True)
        # The link itself loses nothing here, but devices stacked on it keep
        # the lower MTU: a rollback puts theirs back, nothing to warn about.
        return Effect(key, "", (key.target,))
    if key.name == "state" and c.after == "down" and c.before != "down":
        return Effect(key, f"{key.target}: state down makes the kernel remove its routes and IPv6 "
                           "addresses, and take the VLANs on it down", (key.target,))
    return None


def _routing_effect(c: Change) -> Optional[Effect]:
    """An address nictune adds to a rail (knobs/routing.py) is deleted again
    by a rollback; when it is the link's last IPv4 address the kernel then
    flushes every route through the link (fib_inetaddr_event ->
    fib_disable_ip), the operator's too: record them, to put them back."""
    if c.key.name.startswith("address ") and c.before == "absent" and c.after != "absent":
        return Effect(c.key, "", (c.key.target,))
    return None


def _sysctl_effect(c: Change) -> Optional[Effect]:
    key = c.key
    if key.target == HOST and key.name in SPREAD:
        fam, leaf = SPREAD[key.name]
        what = f"{key.name}: {spread_note(key.name)}"
        if leaf == "disable_ipv6":
            return Effect(key, what + ", and disabling IPv6 removes every interface's IPv6 "
                                      "addresses and routes", (EVERY_LINK,), spread=(fam, leaf))
        return Effect(key, what, spread=(fam, leaf), lost=_SPREAD_LOST.get(leaf, _ADDRESSING))
    ifname = _conf_link(key.name, "ipv6", "disable_ipv6")
    if ifname not in (None, "all", "default") and c.after == 1 and c.before != 1:
        return Effect(key, f"{ifname}: disable_ipv6 1 makes the kernel remove its IPv6 addresses "
                           "and routes", (ifname,))
    return None


def _conf_link(name: str, fam: str, leaf: str) -> Optional[str]:
    """The interface of sysctl net.<fam>.conf.<interface>.<leaf>, or None."""
    prefix, suffix = f"net.{fam}.conf.", f".{leaf}"
    if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix):
        return name[len(prefix):-len(suffix)]
    return None


# -- before the first write ---------------------------------------------------

def snapshot(host, effects: List[Effect]) -> Optional[dict]:
    """What `effects` can take, as a JSON-able record for the journal (None
    when there is nothing to record).  Raises NictuneError when the kernel
    cannot be read: an apply must not go ahead without it."""
    if not effects:
        return None
    try:
        with host.inet() as inet:
            links = inet.links()
            names = {link["index"]: link["name"] for link in links}
            concerned = _stacks(links, {n for e in effects for n in e.links})
            addresses = [a for a in inet.addresses(names)
                         if a["dev"] in concerned and a["proto"] not in KERNEL_ADDRESSES]
            routes = [r for r in inet.routes(names)
                      if _through(r, concerned) and r["proto"] not in LEARNED_ROUTES]
    except OSError as e:
        raise NictuneError(f"cannot read the addresses and routes that {effects[0].key} and the "
                           f"like can take with them ({e}), so nothing was written") from None
    ipv6_conf = _stacks(links, {n for e in effects if e.ipv6_conf for n in e.links})
    spread = sorted({e.spread for e in effects if e.spread})
    return {
        "format": RECORD_FORMAT,
        "taken": time.time(),
        "because": [str(e.key) for e in effects],
        "links": {link["name"]: {"mtu": link["mtu"], "up": link["up"]}
                  for link in links if link["name"] in concerned},
        "addresses": addresses,
        "routes": routes,
        "sysctl": _sysctls(host, sorted(ipv6_conf), spread),
    }


def _stacks(links: list, names: set) -> set:
    """`names` with every link stacked on them and every master above them."""
    if EVERY_LINK in names:
        return {link["name"] for link in links}
    by_index = {link["index"]: link for link in links}
    found, todo = set(), [link for link in links if link["name"] in names]
    while todo:
        link = todo.pop()
        if link["name"] in found:
            continue
        found.add(link["name"])
        todo += [up for up in links if up["lower"] == link["index"] and up["kind"] in STACKED_KINDS]
        if link["master"] in by_index:
            todo.append(by_index[link["master"]])
    return found


def _through(route: dict, links: set) -> bool:
    return route["dev"] in links or any(nh[0] in links for nh in route["nexthops"] or ())


def _sysctls(host, ipv6_conf: list, spread: list) -> list:
    """[target, name, value] of the sysctls to put back: every IPv6 sysctl of
    the `ipv6_conf` links, and each spread leaf of every interface and of
    conf.default (names as SysctlFamily.key_for takes them)."""
    fam = SysctlFamily(host)
    keys = []
    for link in ipv6_conf:
        if matches(IFNAME, link):
            keys += [fam.key_for(link, f"ipv6.{leaf}") for leaf in _listdir(host, "ipv6", link)]
    for family, leaf in spread:
        for target in _listdir(host, family):
            if target == "default":
                keys.append(fam.key_for(HOST, f"net.{family}.conf.default.{leaf}"))
            elif target != "all" and matches(IFNAME, target):
                keys.append(fam.key_for(target, f"{family}.{leaf}"))
        keys += [fam.key_for(HOST, name) for name in SPREAD_ALSO.get((family, leaf), ())]
    values = fam.read(keys)
    # Unreadable (stable_secret until set) and read-only ones cannot be put back.
    return [[k.target, _short(k), values[k]] for k in keys
            if not isinstance(values[k], Unsupported) and host.io.access(fam.path(k), os.W_OK)]


def _listdir(host, family: str, *sub: str) -> list:
    try:
        return sorted(host.io.listdir(host.path("proc/sys/net", family, "conf", *sub)))
    except OSError:
        return []


def _short(key: Key) -> str:
    """The key's name as key_for() takes it back."""
    return key.name if key.target == HOST else SysctlFamily.label(key.target, key.name)


# -- after the keys were restored ---------------------------------------------

def restore(host, record: Optional[dict]) -> List[str]:
    """Put back what the record holds and the host lacks, once a rollback has
    restored the keys.  Returns what could not be put back, one line each:
    empty when the links are as recorded."""
    if not record:
        return []
    try:
        return _restore(host, record)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        return [f"the journal's record of what the apply took with it is damaged ({type(e).__name__}: "
                f"{e}): addresses, routes and sysctls were not all restored"]
    except OSError as e:
        return [f"cannot read or restore addresses and routes: {e}"]
    finally:
        host.forget()  # links were written: the next read asks the kernel


def _restore(host, record: dict) -> List[str]:
    if record.get("format") != RECORD_FORMAT:
        raise ValueError(f"unknown format {record.get('format')!r}")
    elapsed = max(0.0, time.time() - float(record["taken"]))
    with host.inet() as inet:
        failed = _restore_links(host, inet, record["links"])
        failed += _restore_sysctls(host, inet, record["sysctl"])
        failed += _restore_addresses(inet, record["addresses"], elapsed)
        failed += _restore_routes(inet, record["routes"], elapsed)
    return failed


def _converge(todo: list, attempt: Callable) -> Dict[int, str]:
    """Try each item until a round brings no progress (an upper's MTU waits for
    its lower's, a route for the one its gateway is reached through).
    Returns {index in todo: last error} of those that never went through."""
    errors: Dict[int, str] = {}
    pending = list(range(len(todo)))
    while pending:
        errors = {}
        for i in pending:
            try:
                attempt(todo[i])
            except (OSError, ValueError, NictuneError) as e:
                errors[i] = str(e)
        if len(errors) == len(pending):
            break
        pending = list(errors)
    return errors


def _restore_links(host, inet, recorded: dict) -> List[str]:
    current = {link["name"]: link for link in inet.links()}
    todo = [(name, want) for name, want in recorded.items() if name in current and
            (current[name]["mtu"], current[name]["up"]) != (want["mtu"], want["up"])]
    rtnl = host.rtnl()
    errors = _converge(todo, lambda item: rtnl.set_link(
        current[item[0]]["index"], mtu=int(item[1]["mtu"]), up=bool(item[1]["up"])))
    now = {link["name"]: link for link in inet.links()}
    failed = []
    for i, (name, want) in enumerate(todo):
        link = now.get(name)
        if link is None or (link["mtu"], link["up"]) == (want["mtu"], want["up"]):
            continue
        failed.append(f"link {name}: MTU {link['mtu']} and {_updown(link['up'])}, was "
                      f"{want['mtu']} and {_updown(want['up'])}" + _because(errors, i))
    return failed


def _updown(up: bool) -> str:
    return "up" if up else "down"


def _because(errors: dict, i: int) -> str:
    return f" ({errors[i]})" if i in errors else ""


def _restore_sysctls(host, inet, recorded: list) -> List[str]:
    links = {link["name"] for link in inet.links()}
    fam = SysctlFamily(host)
    wanted = {}
    for target, name, value in recorded:
        if target == HOST or (matches(IFNAME, target) and target in links):
            wanted[fam.key_for(target, name)] = value
    current = fam.read(list(wanted))
    # disable_ipv6 last: it decides whether the others (and the addresses) take.
    todo = sorted((k for k in wanted if current[k] != wanted[k]),
                  key=lambda k: (k.name.endswith(".disable_ipv6"), k))
    errors = _converge([(k, wanted[k]) for k in todo], lambda item: fam.apply([item]))
    now = fam.read(todo)
    return [f"sysctl {k.name}: {_shown(now[k])}, was {wanted[k]}" + _because(errors, i)
            for i, k in enumerate(todo) if now[k] != wanted[k]]


def _shown(value) -> str:
    return value.reason if isinstance(value, Unsupported) else f"now {value}"


def _restore_addresses(inet, recorded: list, elapsed: float) -> List[str]:
    index = {link["name"]: link["index"] for link in inet.links()}
    names = {i: n for n, i in index.items()}
    present = {_address_id(a) for a in inet.addresses(names)}
    todo = []
    for a in recorded:
        lifetime = _lifetime(a, elapsed)
        if a["dev"] in index and _address_id(a) not in present and lifetime != "expired":
            todo.append((a, lifetime))
    errors = _converge(todo, lambda item: inet.add_address(item[0], index[item[0]["dev"]], item[1]))
    present = {_address_id(a) for a in inet.addresses(names)}
    return [f"address {_address_text(a)}" + _because(errors, i)
            for i, (a, _) in enumerate(todo) if _address_id(a) not in present]


def _address_id(a: dict) -> tuple:
    return (a["dev"], a["family"], a["local"], a["prefixlen"], a["peer"])


def _address_text(a: dict) -> str:
    peer = f" peer {a['peer']}" if a["peer"] else ""
    return f"{a['local']}/{a['prefixlen']}{peer} on {a['dev']}"


def _lifetime(a: dict, elapsed: float):
    """(preferred, valid) seconds left for an address with a lifetime, None
    for a permanent one, "expired" when its valid lifetime has run out."""
    if a["valid"] is None and a["preferred"] is None:
        return None
    from nictune.host.transports.netlink.inet import FOREVER

    valid = FOREVER if a["valid"] is None else int(a["valid"] - elapsed)
    if valid <= 0:
        return "expired"
    preferred = FOREVER if a["preferred"] is None else max(0, int(a["preferred"] - elapsed))
    return preferred, valid


def _restore_routes(inet, recorded: list, elapsed: float) -> List[str]:
    index = {link["name"]: link["index"] for link in inet.links()}
    names = {i: n for n, i in index.items()}
    present = {_route_id(r) for r in inet.routes(names)}
    todo = []
    for r in recorded:
        devs = [r["dev"]] if r["nexthops"] is None else [nh[0] for nh in r["nexthops"]]
        expires = None if r["expires"] is None else int(r["expires"] - elapsed)
        if _route_id(r) in present or any(d is not None and d not in index for d in devs):
            continue
        if expires is None or expires > 0:
            todo.append((r, expires))
    errors = _converge(todo, lambda item: _add_route(inet, index, *item))
    present = {_route_id(r) for r in inet.routes(names)}
    return [f"route {_route_text(r)}" + _because(errors, i)
            for i, (r, _) in enumerate(todo) if _route_id(r) not in present]


def _add_route(inet, index: dict, r: dict, expires: Optional[int]) -> None:
    if r["nexthops"] is not None or r["nh_id"] is not None or r["encap"]:
        raise ValueError("nictune does not rebuild multipath routes, routes through nexthop "
                         "objects or encapsulating routes")
    inet.add_route(r, index.get(r["dev"]), expires)


def _route_id(r: dict) -> tuple:
    paths = tuple(tuple(nh) for nh in r["nexthops"]) if r["nexthops"] is not None else None
    return (r["family"], r["table"], r["dst"], r["dst_len"], r["src"], r["src_len"], r["tos"],
            r["metric"], r["type"], r["dev"], r["gateway"], r["via"], paths)


def _route_text(r: dict) -> str:
    """The route the way `ip route` shows it."""
    dst = f"{r['dst']}/{r['dst_len']}" if r["dst"] else "default"
    parts = [dst]
    if r["nexthops"] is not None:
        parts += [f"nexthop via {gw} dev {dev}" if gw else f"nexthop dev {dev}"
                  for dev, gw, _ in r["nexthops"]]
    else:
        parts += [f"via {r['gateway']}"] if r["gateway"] else []
        parts += [f"dev {r['dev']}"] if r["dev"] else []
    parts.append(f"table {TABLES.get(r['table'], r['table'])}")
    if r["proto"] in PROTOS:
        parts.append(f"proto {PROTOS[r['proto']]}")
    if r["metric"] is not None:
        parts.append(f"metric {r['metric']}")
    return " ".join(parts)
