"""The traffic gate of a play (`gate:`): after a batch is applied and
verified, real traffic between hosts over the rails the profile tunes,
the health counters around it, and the figures against a baseline.

    gate:
      rails: [eth2, eth3]          # interfaces to exercise, on every host
      peers: traffic_peers         # optional inventory pattern to measure against
      timeout: 30                  # seconds, per measurement
      iperf3: {seconds: 5, min_gbps: 150, max_retransmits: 1000,
               udp: {gbps: 10, max_loss: "0.1%"}}
      ib_write_bw: {seconds: 5, min_gbps: 350}   # where RDMA devices exist
      nccl_tests: {launcher: [mpirun, -np, "{np}", -H, "{hosts}"],
                   binary: /opt/nccl-tests/build/all_reduce_perf,
                   gpus: 8, min_busbw: 150}             # where the hosts have GPUs
      counters: {max: {rx_discards_phy: 0, tx_pause_storm_error_events: 0}}
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
address before it reaches an iperf3 argv.  iperf3 (Debian's, 3.x) runs
as a one-off server (-s -1, bound to the rail's address) and a client
bound to its own, both under `timeout` and the server stopped by the
controller after the client, also on failure (control/traffic.py).
Figures come from the client's --json output, treated as untrusted: TCP
bits_per_second of end.sum_received (what the server got) and
retransmits of end.sum_sent; UDP lost_percent of end.sum_received (else
end.sum).  iperf3's own field names: src/iperf_api.c iperf_print_results.

ib_write_bw (perftest, argv and report parsing in control/perftest.py)
runs between the RoCE ports of the pair's rails: each side's RDMA device,
port and GID index read from the host's GID table (GIDS_SCRIPT), the GID
NCCL would select by default (ibauto.Wanted().pick: the lowest index of a
RoCE v2 IPv4 GID); the traffic class is the gate's tclass:, else the
play's profile's (perftest.traffic_class of the play's merged profile,
inventory layers aside); the client connects to the server's rail
address.  The figure is the report's BW average (Gb/s); a report whose
header names another GID index than asked fails.  ib_send_lat is refused
as "not yet" (NOT_YET).

nccl-tests' all_reduce_perf (argv and table parsing in control/nccltests.py)
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
reads for `expect:` (host/health.py): ethtool statistics (`ethtool -S`,
ETHTOOL_GSTATS), the hw_counters of the RDMA port whose GID table names
the rail (host/rdma.py netdev_ports), /sys/class/net/RAIL/statistics, in
that order of precedence.  One fixed, read-only shell script over SSH
(COUNTERS_SCRIPT, the rail name its argument): no agent process, no
write.  A limited counter the host lacks fails the gate: a limit that
cannot be checked is not a pass.

Baselines (`baseline:` + `max_regression:`): throughput figures (gbps,
and nccl-tests' avg_busbw_gbytes: REGRESSION_FIGURES) that fell more
than max_regression below the recorded ones fail, saying baseline and
now.  A figure with no baseline entry fails too (record one
with `nictune gate record`): a gate told to compare must not pass
without comparing.  Loss and retransmits have absolute limits only.

Errors in the spec are ProfileError, one paragraph naming file, line
and key.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import math
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.text import printable
from nictune.host.validate import IFNAME, matches
from nictune.inventory.hostnames import host_name_problem
from nictune.profile.check import check, locate
from nictune.profile.errors import ProfileError, dotted
from nictune.profile.schema import register_words
from nictune.profile.yamlpos import Parsed, Path

# -- the schema -------------------------------------------------------------------

RAIL_NAME = r"^(?!\.{1,2}$)(?!-)[A-Za-z0-9_.@-]{1,15}$"
GATE_PERCENT = r"^(100(\.0{1,3})?|[0-9]{1,2}(\.[0-9]{1,3})?)%$"
COUNTER_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.:\[\]-]{0,127}$"
PEERS_PATTERN = r"^[^\x00-\x1f\x7f]{1,1000}$"  # the play's HOST_PATTERN
register_words({
    RAIL_NAME: "an interface name: 1-15 letters, digits, '_', '.', '@' or '-', not starting with '-'",
    GATE_PERCENT: 'a percentage from "0%" to "100%" with up to 3 decimals ("0.1%")',
    COUNTER_NAME: "a counter name as ethtool -S or sysfs gives it (letters, digits, '_', '.', ':', '-')",
})

MAX_SECONDS = 3600
DEFAULT_PORT = 5201
NOT_YET = ("ib_send_lat",)
DEFAULT_PERFTEST_PORT = 18515  # perftest_parameters.h DEF_PORT

_IPERF3_SCHEMA = {
    "type": "object",
    "description": "iperf3 between each pair, TCP, and UDP with udp:.",
    "properties": {
        "seconds": {"type": "integer", "minimum": 1, "maximum": 600,
                    "description": "Length of each run (iperf3 -t). Default 5."},
        "min_gbps": {"type": "number", "minimum": 0, "maximum": 100000,
                     "description": "TCP: the least Gbit/s the server must receive."},
        "max_retransmits": {"type": "integer", "minimum": 0, "maximum": 2**62,
                            "description": "TCP: the most retransmitted segments the client may count."},
        "udp": {"type": "object", "additionalProperties": False,
                "description": "Also a UDP run at a fixed rate, for loss.",
                "properties": {
                    "gbps": {"type": "number", "minimum": 0.001, "maximum": 100000,
                             "description": "The rate to send at (iperf3 -u -b)."},
                    "max_loss": {"type": "string", "pattern": GATE_PERCENT, "maxLength": 8,
                                 "description": "The most datagrams lost, as a percentage (\"0.1%\")."}},
                "required": ["gbps", "max_loss"]},
    },
    "additionalProperties": False,
}

_IB_WRITE_BW_SCHEMA = {
    "type": "object",
    "description": "perftest ib_write_bw between each pair over the rail's RoCE port (where RDMA devices "
                   "exist), with the GID NCCL would use and the profile's traffic class.",
    "properties": {
        "seconds": {"type": "integer", "minimum": 1, "maximum": 600,
                    "description": "Length of each run (-D). Default 5."},
        "size": {"type": "integer", "minimum": 1, "maximum": 8388608,
                 "description": "Message size in bytes (-s). Default 65536."},
        "min_gbps": {"type": "number", "minimum": 0, "maximum": 100000,
                     "description": "The least average Gbit/s (BW average[Gb/sec])."},
        "tclass": {"type": "integer", "minimum": 0, "maximum": 255,
                   "description": "Traffic class byte (--tclass). Default: the play's profile's "
                                  "(roce.verbs_tos, NCCL_IB_TC, roce.tos: perftest.traffic_class)."},
        "port": {"type": "integer", "minimum": 1024, "maximum": 65535,
                 "description": "TCP port of perftest's out-of-band exchange (-p). Default 18515."},
    },
    "additionalProperties": False,
}

LAUNCHER_ARG = r"^[^\x00-\x1f\x7f]{1,4096}$"
NCCL_PLACEHOLDERS = ("hosts", "addresses", "np", "gpus")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")  # as control/hooks.py's

_NCCL_TESTS_SCHEMA = {
    "type": "object",
    "description": "nccl-tests all_reduce_perf once per batch, across its hosts through the site's launcher "
                   "(where the hosts have GPUs and nccl-tests), with a bus bandwidth floor.",
    "properties": {
        "launcher": {"type": "array", "maxItems": 256,
                     "items": {"type": "string", "pattern": LAUNCHER_ARG, "maxLength": 4096},
                     "description": "The site's MPI/Slurm launcher, an argv list put before all_reduce_perf's, "
                                    "run on the batch's first host. Placeholders: {hosts} (the batch's inventory "
                                    "names, comma-joined), {addresses} (their ansible_host addresses), {np} "
                                    "(hosts x gpus ranks), {gpus}; {{ and }} for literal braces. Empty or absent: "
                                    "all_reduce_perf alone on each host of the batch, with -g gpus."},
        "binary": {"type": "string", "minLength": 1, "maxLength": 4096,
                   "description": "all_reduce_perf on the hosts: an absolute path ending in /all_reduce_perf, "
                                  "or all_reduce_perf (found on PATH). Default all_reduce_perf."},
        "gpus": {"type": "integer", "minimum": 1, "maximum": 64,
                 "description": "GPUs per host. With a launcher one rank per GPU (-g 1); without, -g gpus. "
                                "Default 8."},
        "min_bytes": {"type": "integer", "minimum": 1, "maximum": 1 << 40,
                      "description": "Smallest message size in bytes (-b). Default 1 GiB."},
        "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1 << 40,
                      "description": "Largest message size in bytes (-e). Default 1 GiB."},
        "step_factor": {"type": "integer", "minimum": 2, "maximum": 1024,
                        "description": "Size multiplier from one row to the next (-f). Default 2."},
        "iterations": {"type": "integer", "minimum": 1, "maximum": 100000,
                       "description": "Timed iterations per size (-n). Default 20."},
        "warmup": {"type": "integer", "minimum": 0, "maximum": 100000,
                   "description": "Warm-up iterations per size (-w). Default 5."},
        "min_busbw": {"type": "number", "minimum": 0, "maximum": 100000,
                      "description": "The least average bus bandwidth, GB/s (\"# Avg bus bandwidth\")."},
        "timeout": {"type": "number", "minimum": 1, "maximum": MAX_SECONDS,
                    "description": "Seconds the run may take, launcher included; then it is killed. "
                                   "Default: the gate's timeout:, else 300."},
    },
    "additionalProperties": False,
}

GATE_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "title": "gate",
    "description": "Traffic between hosts after a batch is applied and verified (control/gate.py); "
                   "a failed gate rolls the batch back.",
    "properties": {
        "rails": {"type": "array", "minItems": 1, "maxItems": 64, "uniqueItems": True,
                  "items": {"type": "string", "pattern": RAIL_NAME, "maxLength": 15},
                  "description": "Interfaces to exercise, by name, on every host of the pair."},
        "peers": {"type": "string", "pattern": PEERS_PATTERN, "maxLength": 1000,
                  "description": "Inventory pattern of hosts to measure the batch against. Default: the batch's "
                                 "hosts with each other (a ring); a batch of one with the host an earlier batch kept."},
        "timeout": {"type": "number", "minimum": 1, "maximum": MAX_SECONDS,
                    "description": "Seconds one measurement may take, start to end. Default: its length + 15."},
        "port": {"type": "integer", "minimum": 1024, "maximum": 65535,
                 "description": "TCP/UDP port of the iperf3 servers. Default 5201."},
        "iperf3": _IPERF3_SCHEMA,
        "ib_write_bw": _IB_WRITE_BW_SCHEMA,
        "nccl_tests": _NCCL_TESTS_SCHEMA,
        "counters": {"type": "object", "additionalProperties": False,
                     "description": "Health counters read on both ends before and after the traffic.",
                     "properties": {"max": {
                         "type": "object", "minProperties": 1, "maxProperties": 256,
                         "propertyNames": {"type": "string", "pattern": COUNTER_NAME, "maxLength": 128},
                         "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 2**62},
                         "description": "counter name -> the most it may rise during the traffic."}},
                     "required": ["max"]},
        "baseline": {"type": "string", "minLength": 1, "maxLength": 4096,
                     "description": "JSON file of figures written by `nictune gate record`, relative to the "
                                    "playbook's directory."},
        "max_regression": {"type": "string", "pattern": GATE_PERCENT, "maxLength": 8,
                           "description": "How far below its baseline a throughput figure may fall (\"10%\")."},
        **{name: {"type": "object", "description": "Not yet supported by this nictune."} for name in NOT_YET},
    },
    "required": ["rails"],
    "additionalProperties": False,
}


# -- the spec -------------------------------------------------------------------------

@dataclass
class Iperf3Spec:
    seconds: int = 5
    min_gbps: Optional[float] = None
    max_retransmits: Optional[int] = None
    udp_gbps: Optional[float] = None
    max_loss: Optional[float] = None  # percent


@dataclass
class IbWriteBwSpec:
    seconds: int = 5
    size: int = 65536
    min_gbps: Optional[float] = None
    tclass: Optional[int] = None     # None: the profile's, if it sets one
    port: int = DEFAULT_PERFTEST_PORT


@dataclass
class NcclTestsSpec:
    launcher: List[str] = field(default_factory=list)
    binary: str = "all_reduce_perf"
    gpus: int = 8
    min_bytes: int = 1 << 30
    max_bytes: int = 1 << 30
    step_factor: int = 2
    iterations: int = 20
    warmup: int = 5
    min_busbw: Optional[float] = None
    timeout: float = 300.0

    def test(self, hosts: int):
        """The nccltests.AllReducePerf of a run over `hosts` hosts: one rank
        per GPU under a launcher (as mpirun -np hosts*gpus ... -g 1, the
        nccl-tests README's multi-node example), else one process with
        every GPU of its host."""
        from nictune.control import nccltests

        return nccltests.AllReducePerf(
            min_bytes=self.min_bytes, max_bytes=self.max_bytes, step_factor=self.step_factor,
            gpus=1 if self.launcher else self.gpus, iterations=self.iterations, warmup=self.warmup,
            check=True, binary=self.binary)

    def argv(self, names: Sequence[str], addresses: Sequence[str]) -> List[str]:
        """The launcher, its placeholders filled for these hosts, and
        all_reduce_perf's argv after it.  InvalidInput for a name or address
        that would read as an option or as several hosts ("," joins them)."""
        from nictune.control import nccltests
        from nictune.control.hooks import filled_argument

        for what, value in [("host name", n) for n in names] + [("address", a) for a in addresses]:
            if host_name_problem(value):
                raise InvalidInput(f"nccl-tests was not run: the {what} {printable(repr(value))[:80]} cannot go "
                                   "into the launcher's {hosts}/{addresses} (it starts with '-' or holds ',', "
                                   "blanks or control characters)")
        values = {"hosts": ",".join(names), "addresses": ",".join(addresses),
                  "np": str(len(names) * self.gpus), "gpus": str(self.gpus)}
        fill = [_TOKEN.sub(lambda m: {"{{": "{", "}}": "}"}.get(m.group()) or values[m.group(1)], arg)
                for arg in self.launcher]
        try:
            fill = [filled_argument(written, filled) for written, filled in zip(self.launcher, fill)]
        except ValueError as e:
            raise InvalidInput(f"nccl-tests was not run: {e}") from None
        return fill + nccltests.argv(self.test(len(names)))


def _launcher_problem(args: Sequence[str]) -> Optional[Tuple[int, str]]:
    """(index, why) of the first launcher argument with a brace that is not
    a placeholder, else None."""
    if args and args[0].startswith("-"):
        return 0, f"{printable(repr(args[0]))[:80]} is an option, not a program: the launcher starts with one"
    for i, arg in enumerate(args):
        for m in _TOKEN.finditer(arg):
            if m.group() in ("{{", "}}"):
                continue
            if m.group(1) is None:
                return i, (f"{printable(repr(arg))[:80]} has a lone {m.group()!r}; write {m.group() * 2} "
                           "for a literal brace")
            if m.group(1) not in NCCL_PLACEHOLDERS:
                return i, (f"{printable(repr(arg))[:80]} has the unknown placeholder "
                           f"{{{printable(m.group(1))[:40]}}}; the placeholders are {{hosts}}, {{addresses}}, "
                           "{np} and {gpus} (write {{ and }} for literal braces)")
    return None


@dataclass
class GateSpec:
    rails: List[str]
    source: str                                  # "file:line" of gate:
    peers: Optional[str] = None
    timeout: Optional[float] = None
    port: int = DEFAULT_PORT
    iperf3: Optional[Iperf3Spec] = None
    ib_write_bw: Optional[IbWriteBwSpec] = None
    nccl_tests: Optional[NcclTestsSpec] = None
    counters: Dict[str, int] = field(default_factory=dict)
    baseline: Optional[str] = None               # resolved path
    max_regression: Optional[float] = None       # percent

    def run_timeout(self) -> float:
        seconds = max(self.iperf3.seconds if self.iperf3 else 0,
                      self.ib_write_bw.seconds if self.ib_write_bw else 0)
        return self.timeout if self.timeout is not None else seconds + 15


def _percent(text: str) -> float:
    return float(text[:-1])


def load_gate(parsed: Parsed, at: Path = (), base_dir: str = ".") -> GateSpec:
    """The gate: mapping at `at` in a parsed playbook; ProfileError naming
    file, line and key for anything wrong."""
    node: Any = parsed.doc
    for part in at:
        node = node[part]
    check(node, parsed.positions, parsed.plain, GATE_SCHEMA, prefix=at)

    def refuse(key: Path, message: str) -> ProfileError:
        return ProfileError(*locate(parsed.positions, at + key), dotted(at + key), message)

    for name in NOT_YET:
        if name in node:
            raise refuse((name,), f"{name} gates are not supported by this nictune yet; "
                                  "use iperf3: for now")
    if "iperf3" not in node and "ib_write_bw" not in node and "nccl_tests" not in node:
        raise refuse((), "a gate needs traffic to measure: add iperf3:, ib_write_bw: or nccl_tests: (counters "
                         "and baselines are read around it)")
    iperf3 = None
    if "iperf3" in node:
        raw = node["iperf3"]
        udp = raw.get("udp") or {}
        iperf3 = Iperf3Spec(seconds=raw.get("seconds", 5), min_gbps=raw.get("min_gbps"),
                            max_retransmits=raw.get("max_retransmits"), udp_gbps=udp.get("gbps"),
                            max_loss=_percent(udp["max_loss"]) if udp else None)
    ib = None
    if "ib_write_bw" in node:
        raw = node["ib_write_bw"]
        ib = IbWriteBwSpec(seconds=raw.get("seconds", 5), size=raw.get("size", 65536),
                           min_gbps=raw.get("min_gbps"), tclass=raw.get("tclass"),
                           port=raw.get("port", DEFAULT_PERFTEST_PORT))
    nccl = _load_nccl_tests(node, refuse) if "nccl_tests" in node else None
    for name, tool in (("iperf3", iperf3), ("ib_write_bw", ib)):
        if tool is not None and "timeout" in node and node["timeout"] <= tool.seconds:
            raise refuse(("timeout",), f"{node['timeout']:g} s leaves no time for a {tool.seconds} s "
                                       f"{name} run: make it longer than {name}.seconds")
    if ("baseline" in node) != ("max_regression" in node):
        given, missing = ("baseline", "max_regression") if "baseline" in node else ("max_regression", "baseline")
        raise refuse((given,), f"{given} goes with {missing}: name both, or neither")
    baseline = node.get("baseline")
    if baseline is not None and not os.path.isabs(baseline):
        baseline = os.path.normpath(os.path.join(base_dir, baseline))
    file, line = locate(parsed.positions, at)
    return GateSpec(
        rails=list(node["rails"]), source=f"{file}:{line}", peers=node.get("peers"),
        timeout=node.get("timeout"), port=node.get("port", DEFAULT_PORT), iperf3=iperf3, ib_write_bw=ib,
        nccl_tests=nccl, counters=dict((node.get("counters") or {}).get("max") or {}), baseline=baseline,
        max_regression=_percent(node["max_regression"]) if "max_regression" in node else None)


def _load_nccl_tests(node: dict, refuse) -> NcclTestsSpec:
    from nictune.control import nccltests
    from nictune.host.errors import InvalidInput

    raw = node["nccl_tests"]
    bad = _launcher_problem(raw.get("launcher") or [])
    if bad:
        raise refuse(("nccl_tests", "launcher", bad[0]), bad[1])
    spec = NcclTestsSpec(
        launcher=list(raw.get("launcher") or []), binary=raw.get("binary", nccltests.BINARY),
        **{k: raw[k] for k in ("gpus", "min_bytes", "max_bytes", "step_factor", "iterations", "warmup",
                               "min_busbw") if k in raw},
        timeout=raw.get("timeout", node.get("timeout", 300.0)))
    if spec.min_bytes > spec.max_bytes:
        raise refuse(("nccl_tests", "min_bytes"), f"{spec.min_bytes} is above max_bytes {spec.max_bytes}")
    if spec.binary != nccltests.BINARY and not spec.binary.startswith("/"):
        raise refuse(("nccl_tests", "binary"), f"{printable(repr(spec.binary))[:200]} is not an absolute path: "
                                               f"give one ending in /{nccltests.BINARY}, or {nccltests.BINARY}")
    try:
        nccltests.argv(spec.test(1))
    except InvalidInput as e:
        raise refuse(("nccl_tests", "binary"), f"{e}: give an absolute path ending in "
                                               f"/{nccltests.BINARY}, or {nccltests.BINARY}") from None
    return spec


def load_play_gates(path: str) -> List[Optional[GateSpec]]:
    """Each play's gate (None for a play without one) of the playbook at path."""
    from nictune.profile import yamlpos

    parsed = yamlpos.parse_file(path, "playbook")
    if not isinstance(parsed.doc, list):
        raise ProfileError(path, None, "", "a playbook is a list of plays")
    base = os.path.dirname(path)
    return [load_gate(parsed, (i, "gate"), base) if isinstance(play, dict) and play.get("gate") is not None
            else None for i, play in enumerate(parsed.doc)]


def gate_of_play(play) -> Optional[GateSpec]:
    """The gate of a loaded playbook.Play, found again in its file by the
    play's "file:line" (the spec's errors need the lines)."""
    if getattr(play, "gate", None) is None:
        return None
    from nictune.profile import yamlpos

    file, _, line = play.source.rpartition(":")
    parsed = yamlpos.parse_file(file, "playbook")
    for i in range(len(parsed.doc)):
        if locate(parsed.positions, (i,)) == (file, int(line)) and isinstance(parsed.doc[i], dict):
            return load_gate(parsed, (i, "gate"), os.path.dirname(file))
    raise ProfileError(file, int(line), "gate", "the play is no longer in its file (changed meanwhile?)")


# -- pairing ---------------------------------------------------------------------------

def pair_up(batch: Sequence[str], peers: Sequence[str], kept: Sequence[str]) -> List[Tuple[str, str]]:
    """(client, server) pairs for a batch (see the module's docstring)."""
    batch = list(dict.fromkeys(batch))
    others = [p for p in dict.fromkeys(peers)]
    pairs: List[Tuple[str, str]] = []
    if others:
        turn = 0
        for host in batch:
            choices = [p for p in others if p != host]
            if not choices:
                continue
            peer = choices[turn % len(choices)]
            turn += 1
            pairs += [(host, peer), (peer, host)]
    elif len(batch) >= 2:
        pairs = [(host, batch[(i + 1) % len(batch)]) for i, host in enumerate(batch)]
    elif batch and [k for k in kept if k != batch[0]]:
        peer = [k for k in kept if k != batch[0]][-1]
        pairs = [(batch[0], peer), (peer, batch[0])]
    return pairs


def rounds(pairs: Sequence[Tuple[str, str]]) -> List[List[Tuple[str, str]]]:
    """Pairs in rounds where no host is a client twice or a server twice."""
    out: List[List[Tuple[str, str]]] = []
    for client, server in pairs:
        for r in out:
            if all(c != client and s != server for c, s in r):
                r.append((client, server))
                break
        else:
            out.append([(client, server)])
    return out


# -- untrusted output --------------------------------------------------------------------

MAX_JSON = 4 * 2**20
_MAX_BPS = 1e15  # 1 Pbit/s: more is not a measurement
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class BadOutput(ValueError):
    pass


def _clean(text: str, limit: int = 200) -> str:
    return _CONTROL.sub(" ", text)[:limit]


def _number(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise BadOutput(f"{what} is not a number from {low:g} to {high:g}")
    return float(value)


def _mapping(parent: Any, key: str, what: str) -> dict:
    value = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(value, dict):
        raise BadOutput(f"{what} has no {key} mapping")
    return value


def parse_iperf3(text: str, udp: bool = False) -> Dict[str, float]:
    """Figures of an iperf3 client's --json output: {"gbps", "retransmits"}
    (TCP; retransmits only when reported) or {"gbps", "lost_percent"} (UDP).
    Raises BadOutput for an error iperf3 reports or output that is not its
    JSON (too long, too deep, wrong types, numbers out of range)."""
    if len(text) > MAX_JSON:
        raise BadOutput(f"the iperf3 output is longer than {MAX_JSON // 2**20} MiB")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise BadOutput("the iperf3 output is not JSON") from None
    if not isinstance(doc, dict):
        raise BadOutput("the iperf3 output is not a JSON object")
    if doc.get("error") is not None:
        raise BadOutput(f"iperf3: {_clean(str(doc['error']))}")
    end = _mapping(doc, "end", "the iperf3 output")
    received = end.get("sum_received")
    figures: Dict[str, float] = {}
    if udp:
        loss_from = received if isinstance(received, dict) and "lost_percent" in received \
            else _mapping(end, "sum", "the iperf3 output's end")
        figures["lost_percent"] = _number(loss_from.get("lost_percent"), "lost_percent", 0, 100)
        bps_from = received if isinstance(received, dict) else loss_from
    else:
        bps_from = _mapping(end, "sum_received", "the iperf3 output's end")
        sent = end.get("sum_sent")
        if isinstance(sent, dict) and sent.get("retransmits") is not None:
            figures["retransmits"] = int(_number(sent["retransmits"], "retransmits", 0, 2**62))
    bps = _number(bps_from.get("bits_per_second"), "bits_per_second", 0, _MAX_BPS)
    figures["gbps"] = round(bps / 1e9, 6)
    return figures


def parse_rail_address(text: str, rail: str) -> str:
    """The address to use on `rail`, from `ip -j addr show dev RAIL`: the
    first global IPv4 one, else the first global IPv6 one."""
    if len(text) > MAX_JSON:
        raise BadOutput("the ip output is too long")
    try:
        doc = json.loads(text or "[]")
    except (ValueError, RecursionError):
        raise BadOutput("the ip output is not JSON") from None
    links = [link for link in doc if isinstance(link, dict) and link.get("ifname") == rail] \
        if isinstance(doc, list) else []
    if not links:
        raise BadOutput(f"no interface {rail}")
    found: Dict[str, str] = {}
    infos = links[0].get("addr_info")
    for info in infos if isinstance(infos, list) else []:
        if not isinstance(info, dict) or info.get("scope") != "global" or not isinstance(info.get("local"), str):
            continue
        try:
            address = ipaddress.ip_address(info["local"])
        except ValueError:
            continue
        if not _scope_id_is_plain(getattr(address, "scope_id", None)):
            continue
        found.setdefault(f"v{address.version}", str(address))
    if not found:
        raise BadOutput(f"{rail} has no global IP address")
    return found.get("v4") or found["v6"]


def _scope_id_is_plain(scope: Optional[str]) -> bool:
    """An IPv6 scope id ("fe80::1%eth2") as the kernel gives one: an
    interface name (nictune's rule for them) or an interface index.
    Python's ipaddress takes any text after "%", so "%$(reboot) x" would
    otherwise ride along into the iperf3 and ping arguments."""
    if scope is None:
        return True
    if scope.isascii() and scope.isdigit():
        return len(scope) <= 10 and int(scope) <= 0xFFFFFFFF
    return matches(IFNAME, scope)


# Reads the sources health.counters() reads, for the rail in $1: ethtool
# statistics, the hw_counters of an RDMA port whose GID table names it
# (rdma.netdev_ports: the first port wins), the netdev statistics.
COUNTERS_SCRIPT = r"""
d=/sys/class/net/$1
[ -d "$d" ] || { echo "no interface $1" >&2; exit 3; }
echo "== ethtool"
ethtool -S "$1" 2>/dev/null
echo "== rdma"
for p in /sys/class/infiniband/*/ports/*; do
    if grep -qsxF -e "$1" "$p"/gid_attrs/ndevs/*; then
        grep -sH . "$p"/hw_counters/*
        break
    fi
done
echo "== netdev"
grep -sH . "$d"/statistics/*
"""
MAX_COUNTERS = 20000
_COUNTER_VALUE = re.compile(r"^[0-9]{1,20}$")


def parse_counters(text: str) -> Dict[str, int]:
    """{counter: value} from COUNTERS_SCRIPT's output; ethtool's win over the
    RDMA port's, which win over the netdev statistics (health.counters())."""
    sections: Dict[str, Dict[str, int]] = {"ethtool": {}, "rdma": {}, "netdev": {}}
    current: Optional[Dict[str, int]] = None
    for line in text.splitlines()[:MAX_COUNTERS + 10]:
        if line.startswith("== ") and line[3:] in sections:
            current = sections[line[3:]]
            continue
        if current is None:
            continue
        if current is sections["ethtool"]:
            name, sep, value = line.rpartition(":")
            name = name.strip()
        else:  # grep -H: /path/to/name:value
            path, sep, value = line.rpartition(":")
            name = path.rsplit("/", 1)[-1]
        value = value.strip()
        if sep and name and len(name) <= 128 and _COUNTER_VALUE.match(value) and int(value) < 2**64:
            current[name] = int(value)
    return {**sections["netdev"], **sections["rdma"], **sections["ethtool"]}


# The GID table entries built from the rail in $1 (host/rdma.py gids():
# gids/N, gid_attrs/types/N, gid_attrs/ndevs/N), of every RDMA port.
GIDS_SCRIPT = r"""
for p in /sys/class/infiniband/*/ports/*; do
    for n in $(grep -lsxF -e "$1" "$p"/gid_attrs/ndevs/*); do
        i=${n##*/}
        printf 'gid %s %s %s %s\n' "${p#/sys/class/infiniband/}" "$i" \
            "$(cat "$p/gids/$i" 2>/dev/null)" "$(cat "$p/gid_attrs/types/$i" 2>/dev/null)"
    done
done
"""
_GID_LINE = re.compile(r"^gid (\S{1,64})/ports/([0-9]{1,3}) ([0-9]{1,5}) ([0-9a-f:]{2,39}) (.{0,32})$")


def rdma_endpoint(text: str, rail: str):
    """(perftest.Endpoint, the GID's address) of the RoCE port of `rail`,
    from GIDS_SCRIPT's output, with the GID NCCL would select by default
    (ibauto.Wanted().pick: the lowest index of a RoCE v2 IPv4 GID); the
    first port in device and port order, as ibauto.select.  BadOutput
    when the rail has none."""
    from nictune.control import perftest
    from nictune.host import ibauto, rdma
    from nictune.host.validate import IBDEV, matches

    tables: Dict[Tuple[str, int], list] = {}
    for line in text.splitlines()[:4096]:
        m = _GID_LINE.match(line)
        if m and matches(IBDEV, m.group(1)) and not m.group(1).startswith("-"):
            gid = rdma.Gid(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5) or None, rail)
            tables.setdefault((gid.device, gid.port), []).append(gid)
    wanted = ibauto.Wanted()
    for key in sorted(tables):
        gid = wanted.pick(tables[key])
        if gid is not None:
            return perftest.Endpoint(key[0], key[1], gid.index), gid.ipv4 or gid.gid
    raise BadOutput(f"{rail} has no RDMA port with a {wanted}" if tables else f"{rail} has no RDMA port")


# -- baselines --------------------------------------------------------------------------

BASELINE_FORMAT = 1
# Figures compared with their baseline, all "higher is better".
REGRESSION_FIGURES = ("gbps", "avg_busbw_gbytes")


def _key(row: dict) -> Tuple[str, str, str, str]:
    return (row["client"], row["server"] or "", row["rail"], row["tool"])


def read_baseline(path: str) -> Dict[Tuple[str, str, str, str], Dict[str, float]]:
    """{(client, server, rail, tool): figures} of a baseline file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise NictuneError(f"baseline {path}: {e.strerror or e}") from None
    except (ValueError, RecursionError):
        raise NictuneError(f"baseline {path}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("nictune_gate_baseline") != BASELINE_FORMAT \
            or not isinstance(doc.get("entries"), list):
        raise NictuneError(f"baseline {path}: not a baseline written by `nictune gate record`")
    out = {}
    for entry in doc["entries"]:
        try:
            key = tuple(str(entry[k] or "") for k in ("client", "server", "rail", "tool"))
            figures = {k: _number(v, k, 0, _MAX_BPS) for k, v in entry["figures"].items()}
        except (KeyError, TypeError, AttributeError, BadOutput):
            raise NictuneError(f"baseline {path}: an entry is not {{client, server, rail, tool, "
                               "figures}}") from None
        out[key] = figures
    return out


def write_baseline(path: str, rows: List[dict]) -> int:
    """Merge the figures of rows (those with figures) into the baseline
    file, an entry per (client, server, rail, tool), replacing the same
    keys and keeping the others; atomically.  The count written."""
    try:
        kept = read_baseline(path) if os.path.exists(path) else {}
    except NictuneError:
        kept = {}  # unreadable: replaced whole
    for row in rows:
        if row.get("figures") and row["tool"] != "counters":
            kept[_key(row)] = dict(row["figures"])
    doc = {"nictune_gate_baseline": BASELINE_FORMAT,
           "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "entries": [{"client": k[0], "server": k[1], "rail": k[2], "tool": k[3], "figures": v}
                       for k, v in sorted(kept.items())]}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".baseline-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(doc["entries"])


def compare(rows: List[dict], baseline: Dict, max_regression: float, path: str) -> None:
    """Fail the rows whose throughput fell more than max_regression below
    the baseline, or that have no baseline entry; add "baseline" to each."""
    for row in rows:
        if row["tool"] == "counters" or not row.get("figures"):
            continue
        base = baseline.get(_key(row))
        if base is None:
            _fail(row, f"no baseline for this pair, rail and tool in {path} "
                       "(record one with `nictune gate record`)")
            continue
        row["baseline"] = {k: base[k] for k in REGRESSION_FIGURES if k in base}
        for name in REGRESSION_FIGURES:
            if name not in base or name not in row["figures"] or base[name] <= 0:
                continue
            now, then = row["figures"][name], base[name]
            fell = 100.0 * (then - now) / then
            if fell > max_regression:
                _fail(row, f"{name} regressed {fell:.1f}% from the baseline (baseline {then:g}, now "
                           f"{now:g}; max_regression {max_regression:g}%)")


def _fail(row: dict, why: str) -> None:
    row["passed"] = False
    row["why"] = f"{row['why']}; {why}" if row.get("why") else why


# -- running ------------------------------------------------------------------------------

def row(client: str, server: Optional[str], rail: str, tool: str) -> dict:
    return {"client": client, "server": server, "rail": rail, "tool": tool,
            "figures": {}, "passed": True, "why": ""}


def describe(r: dict) -> str:
    who = f"{r['client']} > {r['server']}" if r["server"] else r["client"]
    return f"{who} on {r['rail']} ({r['tool']}): {r['why']}"


class Gate:
    """gate(number, hosts) -> {"passed", "message", "results": [rows]}: the
    gate of one play, called after each batch passed its verify.

    hosts: the batch, inventory hosts (as the play sees them) or names;
    peers: the hosts of `peers:`; connect(host) -> a traffic.Session.  It
    remembers the hosts of batches that passed, to pair a later batch of
    one with.  `compare=False` (gate record) measures without judging
    against the baseline."""

    def __init__(self, spec: GateSpec, connect, peers: Sequence = (), compare: bool = True,
                 tclass: Optional[int] = None):
        self.spec, self.connect, self.compare = spec, connect, compare
        # ib_write_bw's traffic class: the gate's own, else the profile's (for_play).
        self.tclass = spec.ib_write_bw.tclass if spec.ib_write_bw and spec.ib_write_bw.tclass is not None \
            else tclass
        self.peers = list(peers)
        self.kept: List[str] = []
        self._hosts: Dict[str, Any] = {_name(h): h for h in self.peers}

    def __call__(self, number: int, hosts: Sequence) -> dict:
        try:
            result = self._run(number, hosts)
        except NictuneError as e:
            result = {"passed": False, "message": f"batch {number}: the gate failed: {e}", "results": []}
        except Exception as e:  # noqa: BLE001 - a gate that breaks must fail its batch, never pass it
            result = {"passed": False, "results": [], "message": (
                f"batch {number}: the gate failed: internal error {type(e).__name__}: {_clean(str(e))}")}
        if result["passed"]:
            self.kept += [_name(h) for h in hosts]
        return result

    def _run(self, number: int, hosts: Sequence) -> dict:
        for h in hosts:
            self._hosts.setdefault(_name(h), h)
        batch = [_name(h) for h in hosts]
        paired = self.spec.iperf3 is not None or self.spec.ib_write_bw is not None
        pairs = pair_up(batch, [_name(p) for p in self.peers], self.kept) if paired else []
        if paired and not pairs:
            return {"passed": False, "results": [], "message": (
                f"batch {number}: the gate has nothing to measure {batch[0] if batch else 'it'} against: "
                "name peers: in the play's gate (a batch of one with no host kept before it)")}
        # nccl-tests runs on the batch's own hosts, never on peers.
        involved = list(dict.fromkeys([h for pair in pairs for h in pair]
                                      + (batch if self.spec.nccl_tests else [])))
        sessions: Dict[str, Any] = {}
        rows: List[dict] = []
        try:
            self._open(involved, sessions, rows)
            addresses = self._addresses(sessions, rows) if paired else {}
            if self.spec.ib_write_bw:
                addresses.update(self._rdma(sessions))
            before = self._counters(sessions, rows) if self.spec.counters else {}
            for rail in self.spec.rails if paired else []:
                for group in rounds(pairs):
                    for measured in _parallel(lambda p, rail=rail: self._measure(p, rail, sessions, addresses),
                                              group):
                        rows += measured
            if self.spec.nccl_tests:
                rows += self._nccl_tests(batch, sessions)
            if self.spec.counters:
                rows += self._counter_rows(before, self._counters(sessions, rows))
        finally:
            _parallel(lambda s: s.close(), list(sessions.values()))
        if self.compare and self.spec.baseline:
            self._compare(rows)
        failed = [r for r in rows if not r["passed"]]
        if failed:
            more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
            message = (f"batch {number}: the traffic gate failed: "
                       + "; ".join(describe(r) for r in failed[:5]) + more)
        else:
            message = f"batch {number}: the traffic gate passed ({len(rows)} checks)"
        return {"passed": not failed, "message": message, "results": rows}

    def _compare(self, rows: List[dict]) -> None:
        try:
            baseline = read_baseline(self.spec.baseline)
        except NictuneError as e:
            for r in rows:
                if r["tool"] != "counters" and r.get("figures"):
                    _fail(r, str(e))
            return
        compare(rows, baseline, self.spec.max_regression or 0.0, self.spec.baseline)

    def _open(self, names: List[str], sessions: Dict[str, Any], rows: List[dict]) -> None:
        def one(name: str):
            try:
                return name, self.connect(self._hosts[name]), None
            except NictuneError as e:
                return name, None, str(e)
            except Exception as e:  # noqa: BLE001 - the other hosts' sessions must still be closed
                return name, None, f"cannot connect: {type(e).__name__}: {_clean(str(e))}"

        for name, session, error in _parallel(one, names):
            if session is not None:
                sessions[name] = session
            else:
                r = row(name, None, "*", "ssh")
                _fail(r, error)
                rows.append(r)

    def _addresses(self, sessions: Dict[str, Any], rows: List[dict]) -> Dict[Tuple[str, str], str]:
        def one(item):
            name, rail = item
            try:
                result = sessions[name].run(["ip", "-j", "addr", "show", "dev", rail], 10)
                if not result.ok:
                    raise BadOutput(f"no interface {rail} ({result.why()})")
                return item, parse_rail_address(result.stdout, rail), None
            except (BadOutput, NictuneError) as e:
                return item, None, str(e)

        out = {}
        items = [(n, rail) for n in sessions for rail in self.spec.rails]
        for (name, rail), address, error in _parallel(one, items):
            if address:
                out[(name, rail)] = address
            else:
                r = row(name, None, rail, "address")
                _fail(r, error)
                rows.append(r)
        return out

    def _measure(self, pair: Tuple[str, str], rail: str, sessions, addresses) -> List[dict]:
        client, server = pair
        spec = self.spec.iperf3
        kinds = [] if spec is None else [("iperf3-tcp", False)] + ([("iperf3-udp", True)] if spec.udp_gbps else [])
        out = []
        for tool, udp in kinds:
            r = row(client, server, rail, tool)
            out.append(r)
            missing = [h for h in pair if h not in sessions or (h, rail) not in addresses]
            if missing:
                _fail(r, f"not measured: {', '.join(missing)} not reachable or no address on {rail}")
                continue
            try:
                r["figures"] = self._iperf3(sessions, client, server, addresses, rail, udp)
            except (BadOutput, NictuneError) as e:
                _fail(r, str(e))
                continue
            self._judge(r, udp)
        if self.spec.ib_write_bw:
            out.append(self._ib_write_bw(pair, rail, sessions, addresses))
        return out

    def _rdma(self, sessions) -> Dict[Tuple[str, str, str], Any]:
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

        return dict(_parallel(one, [(n, rail) for n in sessions for rail in self.spec.rails]))

    def _ib_write_bw(self, pair: Tuple[str, str], rail: str, sessions, found) -> dict:
        from nictune.control import perftest

        client, server = pair
        r = row(client, server, rail, "ib_write_bw")
        ends = [found.get((h, rail, "rdma")) for h in pair]
        why = [f"{h}: {e}" for h, e in zip(pair, ends) if not isinstance(e, tuple)]
        if why or (server, rail) not in found:
            _fail(r, "not measured: " + ("; ".join(why) or f"{server} has no address on {rail}"))
            return r
        ib = self.spec.ib_write_bw
        test = perftest.Perftest("ib_write_bw", size=ib.size, duration=ib.seconds, tclass=self.tclass,
                                 tcp_port=ib.port)
        limit = self.spec.timeout if self.spec.timeout is not None else perftest.time_limit(test)
        (client_end, _), (server_end, _) = ends
        r["tclass"], r["gid_index"] = self.tclass, client_end.gid_index
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
            _fail(r, str(e))
            return r
        r["figures"] = {"gbps": report.average_gbps, "peak_gbps": report.peak_gbps}
        if report.gid_index is not None and report.gid_index != client_end.gid_index:
            _fail(r, f"ib_write_bw used GID index {report.gid_index}, not {client_end.gid_index} as asked")
        if ib.min_gbps is not None and report.average_gbps < ib.min_gbps:
            _fail(r, f"{report.average_gbps:.3g} Gbit/s, less than min_gbps {ib.min_gbps:g}")
        return r

    def _nccl_tests(self, batch: List[str], sessions) -> List[dict]:
        """all_reduce_perf over the batch: once, launched on its first host,
        with a launcher; else on each host by itself, at once."""
        runs = [batch] if self.spec.nccl_tests.launcher else [[h] for h in batch]
        return _parallel(lambda names: self._all_reduce(names, sessions), runs)

    def _all_reduce(self, names: List[str], sessions) -> dict:
        from nictune.control import nccltests

        spec, first = self.spec.nccl_tests, names[0]
        r = row(",".join(names), None, "*", "nccl-tests")
        missing = [h for h in names if h not in sessions]
        if missing:
            _fail(r, f"not run: {', '.join(missing)} not reachable")
            return r
        try:
            addresses = [getattr(self._hosts.get(h), "address", None) or h for h in names]
            argv = spec.argv(names, addresses)
            result = sessions[first].run(argv, spec.timeout)
        except NictuneError as e:
            _fail(r, str(e))
            return r
        if result.timed_out:
            _fail(r, f"{argv[0]} on {first} did not finish within {spec.timeout:g} s and was killed"
                     f"{_tail(result)}")
            return r
        if not result.ok:
            _fail(r, f"{argv[0]} on {first} exited {result.exit_code}{_tail(result)}")
            return r
        try:
            report = nccltests.parse_all_reduce(result.stdout)
        except NictuneError as e:
            _fail(r, f"{e}{_tail(result)}")
            return r
        largest = max(report.rows, key=lambda x: x.size)
        r["figures"] = {"avg_busbw_gbytes": report.avg_busbw,
                        "largest_busbw_gbytes": largest.out_of_place.busbw,
                        "largest_bytes": largest.size}
        for why in nccltests.problems(report):
            _fail(r, why)
        if spec.min_busbw is not None and report.avg_busbw < spec.min_busbw:
            _fail(r, f"avg bus bandwidth {report.avg_busbw:g} GB/s, less than min_busbw {spec.min_busbw:g}")
        return r

    def _iperf3(self, sessions, client: str, server: str, addresses, rail: str, udp: bool) -> Dict[str, float]:
        spec, limit = self.spec.iperf3, self.spec.run_timeout()
        saddr, caddr, port = addresses[(server, rail)], addresses[(client, rail)], str(self.spec.port)
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

    def _judge(self, r: dict, udp: bool) -> None:
        spec, f = self.spec.iperf3, r["figures"]
        if udp:
            if f["lost_percent"] > spec.max_loss:
                _fail(r, f"lost {f['lost_percent']:g}% of datagrams, more than max_loss {spec.max_loss:g}%")
            return
        if spec.min_gbps is not None and f["gbps"] < spec.min_gbps:
            _fail(r, f"{f['gbps']:.3g} Gbit/s, less than min_gbps {spec.min_gbps:g}")
        if spec.max_retransmits is not None:
            if "retransmits" not in f:
                _fail(r, "iperf3 reported no retransmits to check max_retransmits against")
            elif f["retransmits"] > spec.max_retransmits:
                _fail(r, f"{f['retransmits']} retransmits, more than max_retransmits {spec.max_retransmits}")

    def _counters(self, sessions, rows: List[dict]) -> Dict[Tuple[str, str], Any]:
        def one(item):
            name, rail = item
            try:
                result = sessions[name].run(["sh", "-c", COUNTERS_SCRIPT, "sh", rail], 20)
            except NictuneError as e:
                return item, str(e)
            if not result.ok:
                return item, result.why()
            return item, parse_counters(result.stdout)

        items = [(n, rail) for n in sessions for rail in self.spec.rails]
        return dict(_parallel(one, items))

    def _counter_rows(self, before, after) -> List[dict]:
        out = []
        for (name, rail), then in before.items():
            r = row(name, None, rail, "counters")
            now = after.get((name, rail))
            out.append(r)
            for source in (then, now):
                if not isinstance(source, dict):
                    _fail(r, f"cannot read its counters: {source}")
            if not r["passed"]:
                continue
            for counter, limit in self.spec.counters.items():
                if counter not in then or counter not in now:
                    _fail(r, f"{name} has no counter {counter} on {rail}")
                    continue
                rise = now[counter] - then[counter]
                if rise < 0:
                    _fail(r, f"{counter} went down ({then[counter]} to {now[counter]}): reset during the traffic")
                    continue
                r["figures"][counter] = rise
                if rise > limit:
                    _fail(r, f"{counter} rose by {rise} during the traffic, more than its limit {limit}")
        return out


def _tail(result, lines: int = 3) -> str:
    """The last lines a failed command printed (stderr, else stdout),
    control characters escaped, for a row's why."""
    text = result.stderr.strip() or result.stdout.strip()
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return (": " + " | ".join(printable(line)[:300] for line in tail)) if tail else ": no output"


def _name(host: Any) -> str:
    return host if isinstance(host, str) else host.name


def _parallel(work, items: list, workers: int = 32) -> list:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(work, items))


def for_play(play, spec: GateSpec, inventory, ssh_options, compare: bool = True) -> Gate:
    """The Gate of a play: its peers as the play sees them, SSH sessions
    with the fleet commands' own connection settings (fleet.ssh_host)."""
    from nictune.control import fleet, traffic

    peers = [play.host(h) for h in inventory.select(spec.peers)] if spec.peers else []
    if spec.peers and not peers:
        file, _, line = spec.source.rpartition(":")
        raise ProfileError(file, int(line) if line.isdigit() else None, "gate.peers",
                           f"{spec.peers!r} matches no host of the inventory")

    def connect(host):
        return traffic.Session(fleet.ssh_host(host), ssh_options)

    tclass = None
    if spec.ib_write_bw is not None and spec.ib_write_bw.tclass is None:
        from nictune.control import perftest
        from nictune.control.playbook import play_profile

        file, _, line = spec.source.rpartition(":")
        try:
            # The play's profile without inventory layers: one class for the gate.
            tclass, _ = perftest.traffic_class(play_profile(play).doc)
        except NictuneError as e:
            raise ProfileError(file, int(line) if line.isdigit() else None, "gate.ib_write_bw",
                               f"cannot tell the traffic class to measure with: {e}; give tclass:") from None
    return Gate(spec, connect, peers, compare, tclass)
