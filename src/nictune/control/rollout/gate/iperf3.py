"""iperf3 between a pair on a rail: first the route each end's rail
address takes to the other end, refused when it leaves by another NIC
(rails.py); then a one-off server bound to the rail's address and device,
the client bound to its own, TCP with `streams` parallel streams (as
that many one-stream processes where an end's iperf3 predates 3.16) then
(with udp:) UDP at one fixed-rate stream, both ends pinned to the rail's
NUMA-local CPUs; figures from the client's --json (all streams summed),
judged against the gate's limits and the pair's floor.

Pinning is `taskset -c CPULIST`, not iperf3's -A: -A binds to one CPU, so
iperf3 3.16's per-stream threads would all share it, and a host that is
client of one pair and server of another at once would run both on one
core.  The floor is per pair and rail, all streams together: the lower of
its two hosts' (inventory variable nictune_gate_min_gbps, else the gate's
min_gbps), since the slower end bounds what the pair can carry."""

from __future__ import annotations

import re
import time
from typing import Any, Dict, List, Optional, Tuple

from nictune.control.rollout.gate.parsers import MAX_JSON, BadOutput, parse_iperf3
from nictune.control.rollout.gate.parallel import parallel
from nictune.control.rollout.gate.rails import RAIL_SCRIPT, ROUTE_ADVICE, RailFacts, parse_rail_facts, route_problem
from nictune.control.rollout.gate.rows import fail, row
from nictune.control.rollout.gate.spec import GateSpec
from nictune.host.errors import NictuneError
from nictune.host.text import printable

FLOOR_VAR = "nictune_gate_min_gbps"

# A host's own floor: (Gbit/s, where it was set), from the inventory.
Floors = Dict[str, Tuple[float, str]]


def measure_iperf3(gate: GateSpec, pair: Tuple[str, str], rail: str, sessions: Dict[str, Any],
                   addresses: Dict, floors: Optional[Floors] = None) -> List[dict]:
    """The iperf3 rows of a pair on a rail (none without iperf3:).
    addresses: the rail addresses, and each (host, rail, "iperf3")'s RailFacts."""
    client, server = pair
    spec = gate.iperf3
    kinds = [] if spec is None else [("iperf3-tcp", False)] + ([("iperf3-udp", True)] if spec.udp_gbps else [])
    out = []
    missing = [h for h in pair if h not in sessions or (h, rail) not in addresses]
    misrouted = None if missing or not kinds else _route_problems(pair, rail, sessions, addresses)
    for tool, udp in kinds:
        r = row(client, server, rail, tool)
        out.append(r)
        if missing:
            fail(r, f"not measured: {', '.join(missing)} not reachable or no address on {rail}")
            continue
        if misrouted:
            fail(r, f"not measured: {misrouted}")
            continue
        try:
            r["figures"] = _run(gate, sessions, client, server, addresses, rail, udp, r)
        except (BadOutput, NictuneError) as e:
            fail(r, str(e))
            continue
        _judge(gate, r, udp, pair_floor(gate, pair, floors or {}))
    return out


def rail_facts(gate: GateSpec, sessions: Dict[str, Any]) -> Dict[Tuple[str, str, str], RailFacts]:
    """{(host, rail, "iperf3"): RailFacts} of every host and rail (RAIL_SCRIPT);
    a host that does not answer gets none: iperf3 then runs unbound and
    unpinned, and the route check still stands."""
    def one(item):
        name, rail = item
        try:
            result = sessions[name].run(["sh", "-c", RAIL_SCRIPT, "sh", rail], 20)
        except NictuneError:
            return item, None
        return item, parse_rail_facts(result.stdout) if result.ok else None

    return {(n, rail, "iperf3"): facts for (n, rail), facts in parallel(one, [(n, r) for n in sessions
                                                                              for r in gate.rails]) if facts}


def host_floors(hosts: List[Any]) -> Floors:
    """{name: (Gbit/s, "file:line")} of the hosts whose inventory sets
    nictune_gate_min_gbps; InventoryError naming the variable and where it
    is set for a value that is not a number from 0 to 100000."""
    from nictune.inventory.errors import InventoryError

    out: Floors = {}
    for host in hosts:
        if isinstance(host, str) or FLOOR_VAR not in host.vars:
            continue
        value = host.vars[FLOOR_VAR]
        file, line = host.where_of(FLOOR_VAR) or (None, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100000:
            raise InventoryError(file, line, f"{FLOOR_VAR} of host {host.name!r} is {printable(repr(value))[:80]}; "
                                             "give the least Gbit/s the host's rails must carry, a number from 0 "
                                             "to 100000 (the gate's iperf3 min_gbps for this host)")
        out[host.name] = (float(value), f"{file}:{line}" if file else "inventory")
    return out


def _route_problems(pair: Tuple[str, str], rail: str, sessions, addresses) -> Optional[str]:
    """Why either end's traffic to the other would not leave by `rail`."""
    client, server = pair
    problems = [route_problem(sessions[a], a, rail, addresses[(a, rail)], addresses[(b, rail)])
                for a, b in ((client, server), (server, client))]
    wrong = [p for p in problems if p]
    if not wrong:
        return None
    misrouted = any("would leave by" in p for p in wrong)
    return "; ".join(wrong) + (f": {ROUTE_ADVICE}" if misrouted else "")


def pair_floor(gate: GateSpec, pair: Tuple[str, str], floors: Floors) -> Optional[Tuple[float, str]]:
    """(Gbit/s, what set it) the pair must reach on a rail, or None."""
    default = gate.iperf3.min_gbps
    found = [(floors[h][0], f"{h}'s nictune_gate_min_gbps {floors[h][0]:g} ({floors[h][1]})") if h in floors
             else (default, f"min_gbps {default:g}") for h in pair if h in floors or default is not None]
    return min(found, key=lambda f: f[0]) if found else None


def _facts(addresses: Dict, host: str, rail: str) -> RailFacts:
    found = addresses.get((host, rail, "iperf3"))
    return found if isinstance(found, RailFacts) else RailFacts()


def _pinned(facts: RailFacts, wanted: str, argv: List[str]) -> Tuple[List[str], Optional[str]]:
    cpus = facts.cpus(wanted)
    return (["taskset", "-c", cpus, *argv] if cpus else argv), cpus


PROCESS_MARK = "==nictune-iperf3"
_PROCESS_LINE = re.compile(r"^==nictune-iperf3 ([0-9]{1,3})$", re.M)


def parse_iperf3_processes(text: str, processes: int) -> Dict[str, float]:
    """TCP figures of `processes` one-stream iperf3 clients (the gate's
    CLIENTS_SCRIPT: each one's --json after a PROCESS_MARK line), summed:
    {"gbps", "retransmits"} (retransmits when every one reported them).
    Any one missing or refused refuses the whole, naming it."""
    if len(text) > MAX_JSON:
        raise BadOutput(f"the iperf3 output is longer than {MAX_JSON // 2**20} MiB")
    marks = list(_PROCESS_LINE.finditer(text))
    if [int(m.group(1)) for m in marks] != list(range(processes)):
        raise BadOutput(f"the iperf3 output does not hold the {processes} processes' reports")
    gbps, retransmits = 0.0, []
    for i, m in enumerate(marks):
        part = text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        try:
            figures = parse_iperf3(part, streams=1)
        except BadOutput as e:
            raise BadOutput(f"iperf3 process {i + 1} of {processes}: {e}") from None
        gbps += figures["gbps"]
        retransmits.append(figures.get("retransmits"))
    out: Dict[str, float] = {"gbps": round(gbps, 6)}
    if None not in retransmits:
        out["retransmits"] = sum(retransmits)
    return out



# iperf3 before 3.16 runs every stream in one thread: the streams then run
# as one-stream processes on consecutive ports (ESnet's advice for fast
# links), started and awaited by these fixed scripts: $1 the first port,
# $2 how many, the rest the iperf3 argv, to which each adds its -p.  The
# clients' JSON goes to files and is printed after all ended, each after
# a marker line (processes writing to one pipe could interleave).
# Stopped (timeout's TERM to the group), the script waits for its
# processes: an orphan would wait as a zombie for whatever reaps orphans.
SERVERS_SCRIPT = r"""
first=$1; count=$2; shift 2
trap 'kill $pids 2>/dev/null; wait; exit 143' TERM INT
i=0
while [ "$i" -lt "$count" ]; do "$@" -p $((first + i)) & pids="$pids $!"; i=$((i + 1)); done
wait
"""
CLIENTS_SCRIPT = r"""
first=$1; count=$2; shift 2
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
trap 'kill $pids 2>/dev/null; wait; exit 143' TERM INT
i=0
while [ "$i" -lt "$count" ]; do "$@" -p $((first + i)) >"$d/$i" & pids="$pids $!"; i=$((i + 1)); done
wait
i=0
while [ "$i" -lt "$count" ]; do printf '\n%s %s\n' "$MARK" "$i"; cat "$d/$i"; i=$((i + 1)); done
""".replace("$MARK", PROCESS_MARK)


def _argvs(gate: GateSpec, rail: str, saddr: str, caddr: str, sfacts: RailFacts, cfacts: RailFacts,
           udp: bool) -> Tuple[List[str], List[str], int]:
    """The server's and the client's argv, and how many processes each runs."""
    spec, port = gate.iperf3, str(gate.port)
    streams = 1 if udp else spec.streams
    processes = streams if streams > 1 and not (sfacts.threaded and cfacts.threaded) else 1
    server = ["iperf3", "-s", "-1", "-B", saddr, *(["--bind-dev", rail] if sfacts.bind_dev else [])]
    client = ["iperf3", "-c", saddr, "-B", caddr, *(["--bind-dev", rail] if cfacts.bind_dev else [])]
    tail = ["-t", str(spec.seconds), "-P", str(streams // processes),
            *(["-u", "-b", f"{spec.udp_gbps:g}G"] if udp else (["-Z"] if spec.zerocopy else [])),
            "--connect-timeout", "5000", "--json"]
    server, _ = _pinned(sfacts, spec.cpus, server + (["-p", port] if processes == 1 else []) + ["--forceflush"])
    client, _ = _pinned(cfacts, spec.cpus, client + (["-p", port] if processes == 1 else []) + tail)
    if processes > 1:
        server = ["sh", "-c", SERVERS_SCRIPT, "sh", port, str(processes), *server]
        client = ["sh", "-c", CLIENTS_SCRIPT, "sh", port, str(processes), *client]
    return server, client, processes


def _run(gate: GateSpec, sessions, client: str, server: str, addresses, rail: str,
         udp: bool, r: dict) -> Dict[str, float]:
    spec, limit = gate.iperf3, gate.run_timeout()
    saddr, caddr = addresses[(server, rail)], addresses[(client, rail)]
    sfacts, cfacts = _facts(addresses, server, rail), _facts(addresses, client, rail)
    server_argv, client_argv, processes = _argvs(gate, rail, saddr, caddr, sfacts, cfacts, udp)
    streams = 1 if udp else spec.streams
    r.update(streams=streams, processes=processes, bind_dev=sfacts.bind_dev and cfacts.bind_dev,
             cpus={client: cfacts.cpus(spec.cpus) or "any", server: sfacts.cpus(spec.cpus) or "any"})
    started = sessions[server].start(server_argv, limit + 5)
    try:
        until = time.monotonic() + min(10.0, limit)
        for port in range(gate.port, gate.port + processes):
            if not started.wait_for(f"Server listening on {port}", max(0.0, until - time.monotonic())):
                raise BadOutput(f"the iperf3 server on {server} did not start: {started.output() or 'no output'}")
        result = sessions[client].run(client_argv, limit)
        if result.timed_out:
            raise BadOutput(f"iperf3 on {client} did not finish within {limit:g} s")
        try:
            if processes > 1:
                return parse_iperf3_processes(result.stdout, processes)
            return parse_iperf3(result.stdout, udp, streams=None if udp else streams)
        except BadOutput as e:
            raise BadOutput(str(e) if result.ok or str(e).startswith("iperf3") else result.why()) from None
    finally:
        started.stop()


def _judge(gate: GateSpec, r: dict, udp: bool, floor: Optional[Tuple[float, str]]) -> None:
    spec, f = gate.iperf3, r["figures"]
    if udp:
        if f["lost_percent"] > spec.max_loss:
            fail(r, f"lost {f['lost_percent']:g}% of datagrams, more than max_loss {spec.max_loss:g}%")
        return
    if floor is not None and f["gbps"] < floor[0]:
        fail(r, f"{f['gbps']:.3g} Gbit/s over {r['streams']} streams, less than {floor[1]}")
    if spec.max_retransmits is not None:
        if "retransmits" not in f:
            fail(r, "iperf3 reported no retransmits to check max_retransmits against")
        elif f["retransmits"] > spec.max_retransmits:
            fail(r, f"{f['retransmits']} retransmits, more than max_retransmits {spec.max_retransmits}")
