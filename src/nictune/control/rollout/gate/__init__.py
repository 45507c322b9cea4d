"""The traffic gate of a play (`gate:`): after a batch is applied and
verified, real traffic between hosts over the rails the profile tunes,
the health counters around it, and the figures against a baseline.

    gate:
      rails: [eth2, eth3]          # interfaces to exercise, on every host
      peers: traffic_peers         # optional inventory pattern to measure against
      timeout: 30                  # seconds, per measurement
      iperf3: {seconds: 5, min_gbps: 150, streams: 8, max_retransmits: 1000,
               udp: {gbps: 10, max_loss: "0.1%"}}
      ib_write_bw: {seconds: 5, min_gbps: 350}   # where RDMA devices exist
      nccl_tests: {launcher: [mpirun, -np, "{np}", -H, "{hosts}"],
                   binary: /opt/nccl-tests/build/all_reduce_perf,
                   gpus: 8, min_busbw: 150}             # where the hosts have GPUs
      counters: {max: {rx_discards_phy: 0, tx_pause_storm_error_events: 0},
                 min: {TlsTxDevice: 1}}   # must rise: kTLS offload in use
      ipsec_offload: crypto        # SAs offloaded to each rail, and used by the traffic
      baseline: gate-baseline.json # written by `nictune gate record`
      max_regression: "10%"

Pairing (pair_up): a batch of two or more hosts is a ring, each host the
client of the next (h1>h2, h2>h3, ..., hn>h1), so every host's rail both
sends and receives; with `peers:`, each batch host sends to a peer and
that peer back (peers taken in turn, never the host itself); a batch of
one without peers pairs with the host kept last by an earlier batch, both
ways; with none, the gate fails and says to name peers.  Each rail of a
host is paired with the same-named rail of its partner.  Rails run one
after the other; on a rail the pairs run at once, in rounds in which no
host is client twice or server twice (one stream in, one out per NIC).

A host's address on a rail is read from the host (`ip -j addr show dev
RAIL`: its first global IPv4 address, else IPv6), checked to be an IP
address before it reaches an iperf3 argv.  Before iperf3 runs, each end
asks its kernel how its rail address reaches the other end (`ip -j route
get PEER from OWN`): a route that leaves by another NIC (two rails in one
subnet without a policy rule per rail) refuses the measurement, "rail1's
traffic to PEER would leave by rail0", a failure, never a pass
(rails.py).  iperf3 (Debian's, 3.x) runs as a one-off server (-s -1,
bound to the rail's address) and a client bound to its own, both also
bound to the rail device (--bind-dev, where `iperf3 --version` is 3.11 or
later with "bind to device") and pinned to the CPUs local to the rail's
NIC (taskset -c, /sys/class/net/RAIL/device/local_cpulist; cpus:), TCP
with `streams` parallel streams (-P, default 8; -Z with zerocopy:; where
either end's iperf3 is older than 3.16, which runs all streams in one
thread, as that many one-stream processes on ports port, port+1, ...,
their figures summed), UDP with one; both under `timeout` and the server stopped by the controller
after the client, also on failure (control/rollout/traffic.py).  Figures
come from the client's --json output, treated as untrusted: TCP
bits_per_second of end.sum_received (what the server got, all streams
together; the streams' own figures summed where there is no sum) and
retransmits of end.sum_sent; UDP lost_percent of end.sum_received (else
end.sum).  iperf3's own field names: src/iperf_api.c iperf_print_results.
min_gbps is per pair and rail, all streams together; a host's inventory
variable nictune_gate_min_gbps replaces it for that host, and a pair is
held to the lower floor of its two hosts.

ib_write_bw (perftest, argv and report parsing in control/rollout/perftest.py)
runs between the RoCE ports of the pair's rails: each side's RDMA device,
port and GID index read from the host's GID table (GIDS_SCRIPT), the GID
NCCL would select by default (ibauto.Wanted().pick: the lowest index of a
RoCE v2 IPv4 GID); the traffic class is the gate's tclass:, else the
play's profile's (perftest.traffic_class of the play's merged profile,
inventory layers aside); the client connects to the server's rail
address.  The figure is the report's BW average (Gb/s); a report whose
header names another GID index than asked fails.  ib_send_lat is refused
as "not yet" (NOT_YET).

nccl-tests' all_reduce_perf (argv and table parsing in control/rollout/nccltests.py)
runs once per batch, not per pair, and only on the batch's own hosts
(never peers: a batch of one needs none): the site's `launcher:` argv with
its placeholders filled ({hosts}: the batch's inventory names, as Slurm
and hooks name nodes; {addresses}: their ansible_host addresses, for a
launcher that wants what the controller dials; {np}: hosts x gpus;
{gpus}; {{ }} for braces), then all_reduce_perf's argv with -g 1 (one rank
per GPU, as the nccl-tests README's mpirun example), run on the batch's
first host over the same kind of session, under `timeout` (nccl_tests'
timeout:, else the gate's, else 300 s), stdout capped (traffic.MAX_OUTPUT).
Without a launcher each host of the batch runs it alone with -g gpus, a
row per host.  The row: client the hosts comma-joined in rank order (the
first launched it), no server, rail "*", tool "nccl-tests"; figures
avg_busbw_gbytes (the "# Avg bus bandwidth" line, GB/s),
largest_busbw_gbytes (out-of-place busbw of the largest size) and
largest_bytes; its baseline entry is keyed by the batch's hosts, so a
baseline is recorded with the play's serial: as it rolls out.  It fails on a non-zero exit or a timeout (with the last
lines of the output, control characters escaped), on output that is not
one result table, on any #wrong or out-of-bounds value, and on an average
below min_busbw.

Counters (`counters: max:`) are read on both ends of every pair before
the first run and after the last, from the sources health.counters()
reads for `expect:` (host/facts/health.py): ethtool statistics (`ethtool -S`,
ETHTOOL_GSTATS), the hw_counters of the RDMA port whose GID table names
the rail (host/facts/rdma.py netdev_ports), /sys/class/net/RAIL/statistics, in
that order of precedence.  One fixed, read-only shell script over SSH
(COUNTERS_SCRIPT, the rail name its argument): no agent process, no
write.  A limited counter the host lacks fails the gate: a limit that
cannot be checked is not a pass.  `min:` is the other way round: a counter
that must rise at least that much during the traffic, for "is the offload
in use" -- which an expectation on an idle host cannot ask.  Tls* names are
the kTLS counters of /proc/net/tls_stat, which is per network namespace:
the SSH session reads the host's, so kTLS sockets in pods' namespaces are
not counted; and iperf3, ib_write_bw and nccl-tests send no kTLS, so a
TlsTxDevice minimum needs kTLS traffic of the site's running meanwhile.

IPsec (`ipsec_offload: crypto|packet`, gate/ipsec.py): before the traffic,
on every host of the batch and every rail, at least one SA offloaded to
the rail in that mode (packet counts for crypto) and no SA of the rail's
addresses in software or on another device; after it, the packets those
SAs counted rose -- the gate's traffic went through them (policies that
select it).  Read with `ip -s xfrm state list nokeys`: no keys in the
output, no agent process.

Baselines (`baseline:` + `max_regression:`): throughput figures (gbps,
and nccl-tests' avg_busbw_gbytes: REGRESSION_FIGURES) that fell more
than max_regression below the recorded ones fail, saying baseline and
now.  A figure with no baseline entry fails too (record one
with `nictune gate record`): a gate told to compare must not pass
without comparing.  Loss and retransmits have absolute limits only.

Errors in the spec are ProfileError, one paragraph naming file, line
and key.

This package, a file per concern:

    schema.py       the gate: section's JSON Schema (GATE_SCHEMA, for playbooks)
    spec.py         GateSpec and its parts; load_gate, load_play_gates, gate_of_play
    pairing.py      pair_up, rounds
    parsers.py      what hosts print, read as untrusted (iperf3, addresses, counters, GIDs)
    rows.py         a measurement's result row
    rails.py        where a rail's traffic leaves, and the host's iperf3 and NUMA facts
    iperf3.py       iperf3 between a pair on a rail, judged
    ib_write_bw.py  the pair's RDMA endpoints, and ib_write_bw between them
    nccl.py         nccl-tests' all_reduce_perf over a batch
    counters.py     the counters read around the traffic, and their rises
    ipsec.py        the SAs offloaded to each rail, and their packets around the traffic
    baselines.py    read_baseline, write_baseline, compare
    parallel.py     work on many hosts at once
    runner.py       Gate: opens the sessions, runs the above, answers; for_play builds it

Code imports from those files; the names below are kept here for the
tests, which read the gate as one thing.
"""

from nictune.control.rollout.gate.baselines import compare, read_baseline, write_baseline
from nictune.control.rollout.gate.pairing import pair_up, rounds
from nictune.control.rollout.gate.rails import RAIL_SCRIPT, RailFacts, parse_rail_facts, parse_route_dev
from nictune.control.rollout.gate.parsers import (GIDS_SCRIPT, MAX_JSON, BadOutput, parse_counters, parse_iperf3,
                                          parse_rail_address, rdma_endpoint)
from nictune.control.rollout.gate.rows import row
from nictune.control.rollout.gate.runner import Gate, _name, for_play
from nictune.control.rollout.gate.spec import GateSpec, IbWriteBwSpec, Iperf3Spec, NcclTestsSpec, load_play_gates
from nictune.host.errors import NictuneError

__all__ = ["BadOutput", "GIDS_SCRIPT", "Gate", "GateSpec", "IbWriteBwSpec", "Iperf3Spec", "MAX_JSON",
           "NcclTestsSpec", "NictuneError", "RAIL_SCRIPT", "RailFacts", "_name", "compare", "for_play",
           "load_play_gates", "pair_up", "parse_counters", "parse_iperf3", "parse_rail_address",
           "parse_rail_facts", "parse_route_dev", "rdma_endpoint", "read_baseline", "rounds", "row",
           "write_baseline"]
