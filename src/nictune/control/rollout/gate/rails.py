"""Which NIC a rail's traffic really leaves by, and what the host's iperf3
can do there: read before iperf3 runs, so that a measurement that would
leave by another rail is refused instead of passed.

Two rails in one subnet (common on multi-rail AI hosts) give the host two
connected routes for that subnet; without a policy rule per rail address
the kernel takes the first for every source address, so traffic from
rail1's address leaves by rail0 (iperf3's -B sets the source address
only).  route_problem() asks the host's kernel with `ip -j route get PEER
from OWN` -- the route an unbound socket (NCCL's socket transport, the
peer's ACKs, storage) gets -- and names the device it would leave by.
iperf3's --bind-dev (SO_BINDTODEVICE) would force its own sockets out of
the rail, but the replies still follow the routing and ARP of both hosts,
so a rail that passes only because iperf3 binds its sockets proves
nothing about the traffic the rail is for: the gate binds (where iperf3
can) AND refuses a wrong route.

RAIL_SCRIPT reads, for the rail in $1, `iperf3 --version` (3.11 fixed
--bind-dev for TCP, ChangeLog "Fix --bind-dev for TCP streams (#1153)";
3.16 runs each stream in its own thread) and the NIC's NUMA node and
local CPUs from /sys/class/net/RAIL/device/{numa_node,local_cpulist}
(absent on virtual devices: then iperf3 runs unpinned under "numa")."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional, Tuple

from nictune.control.rollout.gate.parsers import MAX_JSON, BadOutput, clean

BIND_DEV_SINCE = (3, 11)
THREADED_SINCE = (3, 16)

RAIL_SCRIPT = r"""
printf 'iperf3 %s\n' "$(iperf3 --version 2>/dev/null | head -c 4000 | tr '\n' ' ')"
printf 'numa_node %s\n' "$(head -c 64 "/sys/class/net/$1/device/numa_node" 2>/dev/null)"
printf 'local_cpulist %s\n' "$(head -c 4096 "/sys/class/net/$1/device/local_cpulist" 2>/dev/null)"
"""
_VERSION = re.compile(r"^iperf ([0-9]{1,3})\.([0-9]{1,3})")
_CPULIST = re.compile(r"^[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?){0,1023}$")


@dataclass(frozen=True)
class RailFacts:
    """What RAIL_SCRIPT found on one host for one rail."""
    version: Optional[Tuple[int, int]] = None  # iperf3's, None when it did not answer
    bind_dev: bool = False                     # --bind-dev works for TCP here
    numa_node: Optional[int] = None
    local_cpus: Optional[str] = None           # the NIC's local_cpulist, checked

    @property
    def threaded(self) -> bool:
        return self.version is not None and self.version >= THREADED_SINCE

    def cpus(self, wanted: str) -> Optional[str]:
        """The CPU list to run iperf3 on (taskset -c), None for unpinned."""
        if wanted == "any":
            return None
        if wanted == "numa":
            return self.local_cpus
        return wanted


def parse_rail_facts(text: str) -> RailFacts:
    """RailFacts from RAIL_SCRIPT's output (untrusted: what does not parse
    is left out, never guessed)."""
    found = {}
    for line in text.splitlines()[:8]:
        key, _, value = line.partition(" ")
        found.setdefault(key, value.strip())
    version = None
    m = _VERSION.match(found.get("iperf3", ""))
    if m:
        version = (int(m.group(1)), int(m.group(2)))
    node = found.get("numa_node", "")
    cpus = found.get("local_cpulist", "")
    return RailFacts(
        version=version,
        # The feature list names it when iperf3 was built with SO_BINDTODEVICE.
        bind_dev=version is not None and version >= BIND_DEV_SINCE and "bind to device" in found.get("iperf3", ""),
        numa_node=int(node) if node.isdigit() and len(node) <= 5 else None,  # -1: no node
        local_cpus=cpus if _CPULIST.match(cpus) else None)


def parse_route_dev(text: str) -> str:
    """The device of `ip -j route get`'s answer."""
    if len(text) > MAX_JSON:
        raise BadOutput("the ip route output is too long")
    try:
        doc = json.loads(text or "[]")
    except (ValueError, RecursionError):
        raise BadOutput("the ip route output is not JSON") from None
    routes = [r for r in doc if isinstance(r, dict)] if isinstance(doc, list) else []
    dev = routes[0].get("dev") if routes else None
    if not isinstance(dev, str) or not dev:
        raise BadOutput("ip route get named no device")
    return clean(dev, 64)


def route_problem(session, host: str, rail: str, own: str, peer: str) -> Optional[str]:
    """Why `host`'s traffic from its `rail` address `own` to `peer` would
    not leave by `rail`, else None.  A run of `ip` that fails is a problem
    too: a route that cannot be checked is not a pass."""
    argv = ["ip", "-j", "route", "get", peer, "from", own]
    result = session.run(argv, 10)
    if not result.ok:
        return f"{host}: cannot tell how {rail}'s traffic to {peer} leaves ({result.why()})"
    try:
        dev = parse_route_dev(result.stdout)
    except BadOutput as e:
        return f"{host}: cannot tell how {rail}'s traffic to {peer} leaves ({e})"
    if dev == rail:
        return None
    return f"{host}: {rail}'s traffic to {peer} would leave by {dev} (ip route get {peer} from {own})"


# Said once after the misrouted ends of a pair.
ROUTE_ADVICE = ("so iperf3 would measure another NIC than the rail: give each rail's address a route of its own "
                "(`ip rule add from ADDRESS table N` and the subnet's route on the rail in table N), and "
                "arp_ignore=1 and arp_announce=2, so each NIC answers for its own address only")
