"""ib_write_bw (perftest) between the RoCE ports of a pair's rails: each
side's RDMA device, port and GID index from the host's GID table, the
client connecting to the server's rail address (control/rollout/perftest.py builds
the argv and parses the report)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from nictune.control.rollout.gate.parallel import parallel
from nictune.control.rollout.gate.parsers import GIDS_SCRIPT, BadOutput, rdma_endpoint
from nictune.control.rollout.gate.rows import fail, row
from nictune.control.rollout.gate.spec import GateSpec
from nictune.host.errors import NictuneError


def rdma_endpoints(gate: GateSpec, sessions: Dict[str, Any]) -> Dict[Tuple[str, str, str], Any]:
    """{(host, rail, "rdma"): (Endpoint, GID address) or why not}."""
    def one(item):
        name, rail = item
        try:
            result = sessions[name].run(["sh", "-c", GIDS_SCRIPT, "sh", rail], 20)
            if not result.ok:
                return (name, rail, "rdma"), result.why()
            return (name, rail, "rdma"), rdma_endpoint(result.stdout, rail)
        except (BadOutput, NictuneError) as e:
            return (name, rail, "rdma"), str(e)

    return dict(parallel(one, [(n, rail) for n in sessions for rail in gate.rails]))


def measure_ib_write_bw(gate: GateSpec, tclass: Optional[int], pair: Tuple[str, str], rail: str,
                        sessions: Dict[str, Any], found: Dict) -> dict:
    """The ib_write_bw row of a pair on a rail; found: rail addresses and rdma_endpoints()."""
    from nictune.control.rollout import perftest

    client, server = pair
    r = row(client, server, rail, "ib_write_bw")
    ends = [found.get((h, rail, "rdma")) for h in pair]
    why = [f"{h}: {e}" for h, e in zip(pair, ends) if not isinstance(e, tuple)]
    if why or (server, rail) not in found:
        fail(r, "not measured: " + ("; ".join(why) or f"{server} has no address on {rail}"))
        return r
    ib = gate.ib_write_bw
    test = perftest.Perftest("ib_write_bw", size=ib.size, duration=ib.seconds, tclass=tclass,
                             tcp_port=ib.port)
    limit = gate.timeout if gate.timeout is not None else perftest.time_limit(test)
    (client_end, _), (server_end, _) = ends
    r["tclass"], r["gid_index"] = tclass, client_end.gid_index
    try:
        started = sessions[server].start(perftest.server_argv(test, server_end), limit + 5)
        try:
            # perftest says "Waiting for client to connect" once it
            # listens; through a pipe that line may sit in its buffer,
            # so a server still running after 2 s is taken as ready.
            started.wait_for("Waiting for client", 2.0)
            if started.chan.exit_status_ready():
                raise BadOutput(f"the ib_write_bw server on {server} exited: {started.output() or 'no output'}")
            result = sessions[client].run(perftest.client_argv(test, client_end, found[(server, rail)]), limit)
        finally:
            started.stop()
        if result.timed_out:
            raise BadOutput(f"ib_write_bw on {client} did not finish within {limit:g} s")
        if not result.ok:
            raise BadOutput(result.why())
        report = perftest.parse_bw(result.stdout, "ib_write_bw")
    except (BadOutput, NictuneError) as e:
        fail(r, str(e))
        return r
    r["figures"] = {"gbps": report.average_gbps, "peak_gbps": report.peak_gbps}
    if report.gid_index is not None and report.gid_index != client_end.gid_index:
        fail(r, f"ib_write_bw used GID index {report.gid_index}, not {client_end.gid_index} as asked")
    if ib.min_gbps is not None and report.average_gbps < ib.min_gbps:
        fail(r, f"{report.average_gbps:.3g} Gbit/s, less than min_gbps {ib.min_gbps:g}")
    return r
