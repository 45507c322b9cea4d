"""iperf3 between a pair on a rail: a one-off server bound to the rail's
address, the client bound to its own, TCP then (with udp:) UDP; figures
from the client's --json, judged against the gate's limits."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from nictune.control.rollout.gate.parsers import BadOutput, parse_iperf3
from nictune.control.rollout.gate.rows import fail, row
from nictune.control.rollout.gate.spec import GateSpec
from nictune.host.errors import NictuneError


def measure_iperf3(gate: GateSpec, pair: Tuple[str, str], rail: str, sessions: Dict[str, Any],
                   addresses: Dict) -> List[dict]:
    """The iperf3 rows of a pair on a rail (none without iperf3:)."""
    client, server = pair
    spec = gate.iperf3
    kinds = [] if spec is None else [("iperf3-tcp", False)] + ([("iperf3-udp", True)] if spec.udp_gbps else [])
    out = []
    for tool, udp in kinds:
        r = row(client, server, rail, tool)
        out.append(r)
        missing = [h for h in pair if h not in sessions or (h, rail) not in addresses]
        if missing:
            fail(r, f"not measured: {', '.join(missing)} not reachable or no address on {rail}")
            continue
        try:
            r["figures"] = _run(gate, sessions, client, server, addresses, rail, udp)
        except (BadOutput, NictuneError) as e:
            fail(r, str(e))
            continue
        _judge(gate, r, udp)
    return out


def _run(gate: GateSpec, sessions, client: str, server: str, addresses, rail: str,
         udp: bool) -> Dict[str, float]:
    spec, limit = gate.iperf3, gate.run_timeout()
    saddr, caddr, port = addresses[(server, rail)], addresses[(client, rail)], str(gate.port)
    started = sessions[server].start(["iperf3", "-s", "-1", "-B", saddr, "-p", port, "--forceflush"],
                                     limit + 5)
    try:
        if not started.wait_for("Server listening", min(10.0, limit)):
            raise BadOutput(f"the iperf3 server on {server} did not start: {started.output() or 'no output'}")
        argv = ["iperf3", "-c", saddr, "-B", caddr, "-p", port, "-t", str(spec.seconds),
                "--connect-timeout", "5000", "--json"]
        if udp:
            argv += ["-u", "-b", f"{spec.udp_gbps:g}G"]
        result = sessions[client].run(argv, limit)
        if result.timed_out:
            raise BadOutput(f"iperf3 on {client} did not finish within {limit:g} s")
        try:
            return parse_iperf3(result.stdout, udp)
        except BadOutput as e:
            raise BadOutput(str(e) if result.ok or str(e).startswith("iperf3:") else result.why()) from None
    finally:
        started.stop()


def _judge(gate: GateSpec, r: dict, udp: bool) -> None:
    spec, f = gate.iperf3, r["figures"]
    if udp:
        if f["lost_percent"] > spec.max_loss:
            fail(r, f"lost {f['lost_percent']:g}% of datagrams, more than max_loss {spec.max_loss:g}%")
        return
    if spec.min_gbps is not None and f["gbps"] < spec.min_gbps:
        fail(r, f"{f['gbps']:.3g} Gbit/s, less than min_gbps {spec.min_gbps:g}")
    if spec.max_retransmits is not None:
        if "retransmits" not in f:
            fail(r, "iperf3 reported no retransmits to check max_retransmits against")
        elif f["retransmits"] > spec.max_retransmits:
            fail(r, f"{f['retransmits']} retransmits, more than max_retransmits {spec.max_retransmits}")
