"""perftest (ib_write_bw, ib_send_lat ...) for the traffic gate: argv lists
for the server and the client, and the parsing of their text reports.

The gate runner (control/rollout/gate/) runs these over its SSH connections; this
module never starts a process.  Each side gets its own RDMA device, port and
GID index (the GID index of one rail may differ between hosts) and the same
traffic class, so the data packets (client) and the ACKs (server) carry the
DSCP the profile gives RDMA traffic.

Options, as perftest 4.5 parses them (src/perftest_parameters.c
parser(), long_options[]): -d/--ib-dev, -i/--ib-port, -x/--gid-index
(MIN_GID_IX 0 .. MAX_GID_IX 64), --tclass (the GRH traffic class of the
QP, a uint16 CHECK_VALUE; a ToS byte here), -s/--size (MAX_SIZE 8388608),
-D/--duration (bandwidth tests: seconds; margin = duration / 4, so any
positive value works), -n/--iters (at least MIN_ITER 5; the
latency tests run by iterations, since only then they report t_typical
and the percentiles: RESULT_FMT_LAT against RESULT_FMT_LAT_DUR),
-p/--port (the TCP port of the out-of-band exchange, DEF_PORT 18515),
-F/--CPU-freq (do not fail on a cpufreq governor that changes the clock:
VMs and servers with frequency scaling), --report_gbits (Gb/s rather
than MiB/s).

Reports (src/perftest_parameters.h RESULT_FMT_G / REPORT_FMT, print_report_bw
in perftest_parameters.c; RESULT_FMT_LAT / REPORT_FMT_LAT, print_report_lat):

     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     65536      403              0.00               0.11               0.000201

     #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
     64      200          35.97          16293.64      40.72           619.89          1509.01         8906.17         16293.64

(recorded over soft-RoCE under emulation: tests/fixtures/perftest).  With
-D both sides print the report, and the peak column reads 0.00 there (as
recorded with Debian's perftest 4.5-0.17): a gate compares the average.

Without --report_gbits the bandwidth columns are MiB/s (perftest before
24.07 wrote "MB/sec" for the same unit, until commit 1d202bb "Display proper
unit for MiB/sec results": format_factor 0x100000 in print_report_bw either
way); they are converted, as a Gb/s report is (format_factor 125000000
bytes).  The header's " GID index : N" line says
which GID the tool used (ctx_print_test_info); parse() returns it so the
caller can check it against the one it asked for.

Output is untrusted: at most MAX_OUTPUT characters are looked at, every
message quotes it through host/text.printable, and anything that is not a
report raises PerftestError (a NictuneError), never another exception.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.text import printable
from nictune.host.validate import IBDEV, check

BW_TOOLS = ("ib_write_bw", "ib_send_bw", "ib_read_bw")
LAT_TOOLS = ("ib_send_lat", "ib_write_lat", "ib_read_lat")
MAX_GID_INDEX = 64          # perftest_parameters.h MAX_GID_IX
MAX_SIZE = 8388608          # perftest_parameters.h MAX_SIZE
MIN_ITERS = 5               # perftest_parameters.h MIN_ITER
MAX_DURATION = 600          # ours: a gate measures, it does not soak
MAX_LAT_ITERS = 1000000     # ours: bounds a latency run in time
DEFAULT_TCP_PORT = 18515    # perftest_parameters.h DEF_PORT
MAX_OUTPUT = 256 * 1024     # a report is a few KiB; more is not a report
# Seconds a run may take beyond its measuring: the out-of-band exchange,
# QP set-up and a slow first connection.
START_SLACK = 30.0
# Bytes per unit of the bandwidth columns (print_report_bw format_factor).
_GBITS = 125000000
_MIB = 0x100000
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


class PerftestError(NictuneError):
    """A perftest report that cannot be read, or a run that was not one."""


# -- what to run -------------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    """One side's RDMA port: device (-d), port (-i) and GID index (-x).
    gid_index None leaves -x out, and perftest picks a GID itself
    (perftest_communication.c get_best_gid_index: IPv4-mapped and the newer
    RoCE version preferred, not necessarily the rail's address nor the GID
    NCCL takes): fine on InfiniBand; on RoCE give it (roce_endpoint())."""

    device: str
    port: int = 1
    gid_index: Optional[int] = None


@dataclass(frozen=True)
class Perftest:
    """One measurement: the tool and what both sides share.
    duration: seconds of a bandwidth test (-D); iterations: exchanges of
    a latency test (-n); tclass: the traffic class byte (--tclass), None
    to leave the device's default."""

    tool: str = "ib_write_bw"
    size: int = 65536
    duration: int = 5
    iterations: int = 1000
    tclass: Optional[int] = None
    tcp_port: int = DEFAULT_TCP_PORT

    @property
    def is_bw(self) -> bool:
        return self.tool in BW_TOOLS


def _int(value, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} {printable(repr(value))} is not an integer from {low} to {high}")
    return value


def _checked(test: Perftest) -> Perftest:
    if test.tool not in BW_TOOLS + LAT_TOOLS:
        raise InvalidInput(f"perftest tool {printable(repr(test.tool))} is none of "
                           + ", ".join(BW_TOOLS + LAT_TOOLS))
    _int(test.size, 1, MAX_SIZE, "perftest message size")
    if test.is_bw:
        _int(test.duration, 1, MAX_DURATION, "perftest duration (seconds)")
    else:
        _int(test.iterations, MIN_ITERS, MAX_LAT_ITERS, "perftest iterations")
    if test.tclass is not None:
        _int(test.tclass, 0, 255, "traffic class")
    _int(test.tcp_port, 1, 65535, "perftest TCP port")
    return test


def _endpoint_args(end: Endpoint) -> List[str]:
    device = check(IBDEV, end.device, "RDMA device name")
    if device.startswith("-"):  # getopt would take it as the value, but a reader would not
        raise InvalidInput(f"RDMA device name {printable(repr(device))} starts with '-'")
    args = ["-d", device,
            "-i", str(_int(end.port, 1, 255, "RDMA port"))]
    if end.gid_index is not None:
        args += ["-x", str(_int(end.gid_index, 0, MAX_GID_INDEX, "GID index"))]
    return args


def _common(test: Perftest, end: Endpoint) -> List[str]:
    test = _checked(test)
    args = [test.tool, *_endpoint_args(end), "-s", str(test.size)]
    args += ["-D", str(test.duration), "--report_gbits"] if test.is_bw else ["-n", str(test.iterations)]
    if test.tclass is not None:
        args.append(f"--tclass={test.tclass}")
    return args + ["-F", "-p", str(test.tcp_port)]


def server_argv(test: Perftest, local: Endpoint) -> List[str]:
    """The argv of the side that waits (start it first)."""
    return _common(test, local)


def client_argv(test: Perftest, local: Endpoint, server: str) -> List[str]:
    """The argv of the side that connects to `server` (an IP address or a
    host name; never something perftest could take for an option)."""
    return _common(test, local) + [check_server(server)]


def check_server(server: object) -> str:
    if isinstance(server, str):
        try:
            return str(ipaddress.ip_address(server))
        except ValueError:
            if _HOSTNAME.match(server):
                return server
    raise InvalidInput(f"perftest server {printable(repr(server))} is neither an IP address "
                       "nor a host name")


def time_limit(test: Perftest) -> float:
    """Seconds after which a side that has not exited is stuck: a bandwidth
    test measures for its duration; a latency test's iterations are bounded
    by allowing each a millisecond (a round trip on a loaded rail is tens of
    microseconds), and both get START_SLACK for the set-up."""
    test = _checked(test)
    measuring = test.duration if test.is_bw else test.iterations / 1000.0
    return START_SLACK + measuring


# -- what the profile and the host say -----------------------------------------------

def _byte(value) -> Optional[int]:
    """A ToS byte from a profile value (NCCL env values may be text)."""
    if isinstance(value, bool):
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        return None
    return number if 0 <= number <= 255 else None


def traffic_class(doc: dict, entry: Optional[str] = None) -> Tuple[Optional[int], str]:
    """(the traffic class byte RDMA traffic of the profile's rail takes, and
    where it comes from), (None, why) when the profile sets none.

    In this order: the entry's roce.verbs_tos (MLNX_OFED mlx5_ib
    tc/<port>/traffic_class overrides the ToS of every RoCE QP of the port,
    perftest's too: knobs/roce.py), then host.nccl.env NCCL_IB_TC (the GRH
    traffic class of NCCL's QPs, src/transport/net_ib/connect.cc, the
    workload the gate stands in for), then the entry's roce.tos (the RDMA-CM
    default, configfs default_roce_tos).  Without `entry`, an entry-level
    value counts only when every entry that sets it agrees.  `nictune lint`
    (traffic-class-mismatch) reports profiles where these disagree."""
    entries = doc.get("interfaces") if isinstance(doc, dict) else None
    entries = entries if isinstance(entries, dict) else {}
    if entry is not None:
        if entry not in entries:
            raise InvalidInput(f"the profile has no interface entry {printable(repr(entry))}")
        chosen = {entry: entries[entry]}
    else:
        chosen = entries

    def entry_value(key: str) -> Tuple[Optional[int], str]:
        found = {}
        for name, body in chosen.items():
            roce = body.get("roce") if isinstance(body, dict) else None
            value = _byte(roce.get(key)) if isinstance(roce, dict) else None
            if value is not None:
                found[name] = value
        if len(set(found.values())) == 1:
            names = sorted(found)
            return found[names[0]], f"roce.{key} of {', '.join(names)}"
        if found:
            raise InvalidInput(f"the profile's entries give different roce.{key}: "
                               + ", ".join(f"{n} {v}" for n, v in sorted(found.items()))
                               + ": name the entry of the rail to measure")
        return None, ""

    value, where = entry_value("verbs_tos")
    if value is not None:
        return value, where
    host = doc.get("host") if isinstance(doc, dict) else None
    nccl = host.get("nccl") if isinstance(host, dict) else None
    env = nccl.get("env") if isinstance(nccl, dict) else None
    value = _byte(env.get("NCCL_IB_TC")) if isinstance(env, dict) else None
    if value is not None:
        return value, "host.nccl.env.NCCL_IB_TC"
    value, where = entry_value("tos")
    if value is not None:
        return value, where
    return None, "the profile sets no roce.verbs_tos, NCCL_IB_TC or roce.tos"


def roce_endpoint(host, ifname: str, env: Optional[dict] = None) -> Tuple[Endpoint, str]:
    """(Endpoint, the address of its GID) of the RoCE port that carries
    `ifname` on `host` (a nictune.host Host: the agent's side, or a fake),
    with the GID NCCL would select there (nictune.host.facts.ibauto: lowest index
    of the RoCE v2 IPv4 GID, or as env's NCCL_IB_ADDR_FAMILY /
    NCCL_IB_ADDR_RANGE / NCCL_IB_ROCE_VERSION_NUM say).  A number pinned in
    env's NCCL_IB_GID_INDEX is not taken: verify reports it when it no longer
    points there (ibauto.gid_index_problem), and the gate measures the GID
    the traffic would take.  AutoUnresolved when ifname has no such port."""
    from nictune.host.facts import ibauto  # host side: only for callers that have a Host

    wanted = ibauto.wanted_from(env or {})
    ports, _ = ibauto.roce_rails(host, wanted, [ifname], f"the RDMA port of {ifname}")
    port = ports[0]
    address = port.gid.ipv4 or str(ipaddress.IPv6Address(port.gid.gid))
    return Endpoint(port.device, port.port, port.gid.index), address


# -- the reports ---------------------------------------------------------------------

@dataclass(frozen=True)
class BwResult:
    size: int
    iterations: int
    peak_gbps: float
    average_gbps: float
    msg_rate_mpps: float
    gid_index: Optional[int]  # from the header, None when it has none


@dataclass(frozen=True)
class LatResult:
    """usec; t_min ... p999 are None in a duration (-D) report, which has
    only t_avg and transactions per second."""

    size: int
    iterations: int
    t_avg: float
    t_min: Optional[float] = None
    t_max: Optional[float] = None
    t_typical: Optional[float] = None
    t_stdev: Optional[float] = None
    p99: Optional[float] = None
    p999: Optional[float] = None
    tps: Optional[float] = None
    gid_index: Optional[int] = None


_BW_HEADER = re.compile(r"^\s*#bytes\s+#iterations\s+BW peak\[(Gb|MiB|MB)/sec\]\s+"
                        r"BW average\[(?:Gb|MiB|MB)/sec\]\s+MsgRate\[Mpps\]")
_LAT_HEADER = re.compile(r"^\s*#bytes\s+#iterations\s+t_min\[usec\]\s+t_max\[usec\]\s+"
                         r"t_typical\[usec\]\s+t_avg\[usec\]\s+t_stdev\[usec\]\s+"
                         r"99% percentile\[usec\]\s+99\.9% percentile\[usec\]")
_LAT_DUR_HEADER = re.compile(r"^\s*#bytes\s+#iterations\s+t_avg\[usec\]\s+tps average")
_GID_INDEX = re.compile(r"^\s*GID index\s*:\s*([0-9]{1,9})\s*$")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$")


def _lines(text: object, tool: str) -> List[str]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise PerftestError(f"{tool}: no output to read")
    if len(text) > MAX_OUTPUT:
        raise PerftestError(f"{tool}: {len(text)} characters of output, more than a report "
                            f"({MAX_OUTPUT}): not read")
    return text.splitlines()


def _quote(line: str) -> str:
    return printable(repr(line[:200]))


def _numbers(line: str, count: int, tool: str) -> List[str]:
    words = line.split()
    if len(words) < count or not all(_NUMBER.match(w) for w in words[:count]):
        raise PerftestError(f"{tool}: the result line {_quote(line)} does not have the "
                            f"{count} numbers its header announces")
    return words[:count]


def _float(word: str, line: str, tool: str) -> float:
    value = float(word)
    if not math.isfinite(value) or value < 0:
        raise PerftestError(f"{tool}: {_quote(line)}: {printable(word)} is out of range")
    return value


def _count(word: str, line: str, tool: str) -> int:
    if not re.fullmatch(r"[0-9]{1,12}", word):
        raise PerftestError(f"{tool}: {_quote(line)}: {printable(word)} is not a count")
    return int(word)


def _result_line(lines: List[str], header: re.Pattern, tool: str, what: str) -> Tuple[re.Match, str]:
    """The header match and the line after it (perftest prints one size
    per line; the gate runs one size, so a second result line is refused
    rather than guessed about)."""
    found = [(i, m) for i, m in ((i, header.match(line)) for i, line in enumerate(lines)) if m]
    if not found:
        raise PerftestError(f"{tool}: no {what} table in the output (did the run fail? its "
                            f"last line: {_quote(_last(lines))})")
    if len(found) > 1:
        raise PerftestError(f"{tool}: {len(found)} {what} tables in one output")
    index, match = found[0]
    rows = [line for line in lines[index + 1:] if line.strip() and not line.lstrip().startswith("-")]
    rows = [line for line in rows if line.split()[0].isdigit()]
    if not rows:
        raise PerftestError(f"{tool}: the {what} table has no result line")
    if len(rows) > 1:
        raise PerftestError(f"{tool}: the {what} table has {len(rows)} result lines; the gate "
                            "runs one message size")
    return match, rows[0]


def _last(lines: List[str]) -> str:
    return next((line for line in reversed(lines) if line.strip()), "")


def _gid_index(lines: List[str]) -> Optional[int]:
    found = {int(m.group(1)) for m in map(_GID_INDEX.match, lines) if m}
    if len(found) > 1:
        raise PerftestError(f"perftest: the header names GID indexes {sorted(found)}")
    return found.pop() if found else None


def parse_bw(text: object, tool: str = "ib_write_bw") -> BwResult:
    """The figures of a bandwidth test's report, in Gb/s."""
    lines = _lines(text, tool)
    match, line = _result_line(lines, _BW_HEADER, tool, "bandwidth")
    size, iters, peak, avg, rate = _numbers(line, 5, tool)
    factor = (_GBITS if match.group(1) == "Gb" else _MIB) / _GBITS
    return BwResult(size=_count(size, line, tool), iterations=_count(iters, line, tool),
                    peak_gbps=_float(peak, line, tool) * factor,
                    average_gbps=_float(avg, line, tool) * factor,
                    msg_rate_mpps=_float(rate, line, tool), gid_index=_gid_index(lines))


def parse_lat(text: object, tool: str = "ib_send_lat") -> LatResult:
    """The figures of a latency test's report, in microseconds."""
    lines = _lines(text, tool)
    if any(_LAT_DUR_HEADER.match(line) for line in lines):
        _, line = _result_line(lines, _LAT_DUR_HEADER, tool, "latency")
        size, iters, avg, tps = _numbers(line, 4, tool)
        return LatResult(size=_count(size, line, tool), iterations=_count(iters, line, tool), t_avg=_float(avg, line, tool),
                         tps=_float(tps, line, tool), gid_index=_gid_index(lines))
    _, line = _result_line(lines, _LAT_HEADER, tool, "latency")
    words = _numbers(line, 9, tool)
    t_min, t_max, typical, avg, stdev, p99, p999 = (_float(w, line, tool) for w in words[2:])
    return LatResult(size=_count(words[0], line, tool), iterations=_count(words[1], line, tool), t_avg=avg, t_min=t_min,
                     t_max=t_max, t_typical=typical, t_stdev=stdev, p99=p99, p999=p999,
                     gid_index=_gid_index(lines))


def parse(tool: str, text: object):
    """parse_bw or parse_lat, by the tool's name."""
    if tool in BW_TOOLS:
        return parse_bw(text, tool)
    if tool in LAT_TOOLS:
        return parse_lat(text, tool)
    raise PerftestError(f"no perftest report reader for {printable(repr(tool))}")
