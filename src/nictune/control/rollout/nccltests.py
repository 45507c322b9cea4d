"""nccl-tests all_reduce_perf for the traffic gate: its argv, and the parsing
of the table it prints, for a bus bandwidth threshold.

No machine here has GPUs: the argv is tested as a list and the parser on
outputs recorded on real clusters (tests/fixtures/nccl-tests/, each named
in its SOURCE.md).  The gate runner (control/rollout/gate/) starts it, usually
behind an MPI launcher of the site's (mpirun ... + argv()), and bounds it
in time; only rank 0 prints the table.

Options (NVIDIA/nccl-tests src/common.cu parseArgs, README "Arguments"):
-b/--minbytes, -e/--maxbytes, -f/--stepfactor, -g/--ngpus (GPUs per
thread), -n/--iters, -w/--warmup_iters, -c/--check (validate results: the
#wrong column; 0 prints N/A there).

The table (src/util.cu writeResultHeader / writeResultFooter from v2.17.3;
src/common.cu from v2.13; each collective's print_header() up to v2.11),
one row per message size, an out-of-place and an in-place half:

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
       134217728      33554432     float     sum      -1   1652.2   81.24  152.32      0   1636.7   82.01  153.76      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 70.742

Versions differ, so columns are taken by the header's names, never by
position: up to v2.11 there is no root column and the check column is
"error" (the largest deviation, %5.0le, e.g. 2e-06) rather than "#wrong"
(a count of wrong elements); with -C the time column is "cputime"; with -I
(per-iteration timing, v2.19.2 and later) each half has i_min/i_max/i_p99/
i_cv% columns too, and with timestamps a last column.  The average is of busbw
over every row and both halves (common.cu: bw[0] / bw_count[0]), in GB/s
(10^9 bytes per second, doc/PERFORMANCE.md), which is what the gate's
threshold is in.

Output is untrusted: at most MAX_OUTPUT characters, control characters
escaped in every message, and anything that is not such a table raises
NcclTestsError (a NictuneError), never another exception.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.text import printable
from nictune.host.validate import check_path

BINARY = "all_reduce_perf"
MAX_BYTES = 1 << 40          # 1 TiB: more than any GPU holds
MAX_ITERS = 100000
MAX_GPUS = 64
MAX_OUTPUT = 4 * 1024 * 1024  # NCCL INFO lines come interleaved; a run is far less
MAX_ROWS = 4096
# The average line's "FAILED"/"OK" is nccl-tests' own check against the
# environment's NCCL_TESTS_MIN_BW (common.cu check_avg_bw), not ours.
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*([0-9]{1,12})\b")
_TIME_NAMES = ("time", "cputime")
_CHECK_NAMES = ("#wrong", "error")
_KEYS = ("size", "count", "type", "redop", "root")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$")


class NcclTestsError(NictuneError):
    """An nccl-tests output that cannot be read as a result table."""


@dataclass(frozen=True)
class AllReducePerf:
    """One all_reduce_perf run.  binary: the name on PATH or an absolute path."""

    min_bytes: int = 1 << 30
    max_bytes: int = 1 << 30
    step_factor: int = 2
    gpus: int = 1
    iterations: int = 20
    warmup: int = 5
    check: bool = True
    binary: str = BINARY


def _int(value, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"all_reduce_perf {what} {printable(repr(value))} is not an integer "
                           f"from {low} to {high}")
    return value


def argv(test: AllReducePerf) -> List[str]:
    """The all_reduce_perf command line, a list (no shell)."""
    binary = test.binary
    if binary != BINARY:
        binary = check_path(binary, "all_reduce_perf path")
        if not binary.endswith("/" + BINARY):
            raise InvalidInput(f"all_reduce_perf path {printable(repr(binary))} does not name "
                               f"{BINARY}")
    low = _int(test.min_bytes, 1, MAX_BYTES, "minimum size (bytes)")
    high = _int(test.max_bytes, 1, MAX_BYTES, "maximum size (bytes)")
    if low > high:
        raise InvalidInput(f"all_reduce_perf minimum size {low} is above the maximum {high}")
    if not isinstance(test.check, bool):
        raise InvalidInput(f"all_reduce_perf check {printable(repr(test.check))} is not true or false")
    return [binary, "-b", str(low), "-e", str(high),
            "-f", str(_int(test.step_factor, 2, 1024, "step factor")),
            "-g", str(_int(test.gpus, 1, MAX_GPUS, "GPUs per process")),
            "-n", str(_int(test.iterations, 1, MAX_ITERS, "iterations")),
            "-w", str(_int(test.warmup, 0, MAX_ITERS, "warm-up iterations")),
            "-c", "1" if test.check else "0"]


@dataclass(frozen=True)
class Half:
    """The out-of-place or the in-place half of a row.  wrong: #wrong (a
    count), error: the older versions' largest deviation; the one the
    version prints is set, None for N/A (run with -c 0)."""

    time_us: float
    algbw: float
    busbw: float
    wrong: Optional[int] = None
    error: Optional[float] = None


@dataclass(frozen=True)
class Row:
    size: int
    count: int
    type: str
    redop: Optional[str]  # None for collectives without one (the header has no redop)
    root: Optional[int]   # None before nccl-tests 2.13 (no root column)
    out_of_place: Half
    in_place: Half


@dataclass(frozen=True)
class AllReduceResult:
    avg_busbw: float            # GB/s, nccl-tests' own average line
    rows: List[Row] = field(default_factory=list)
    out_of_bounds: Optional[int] = None  # None: the version prints no such line

    @property
    def wrong(self) -> int:
        """Elements found wrong, over every row and both halves."""
        return sum(h.wrong or 0 for r in self.rows for h in (r.out_of_place, r.in_place))


def _quote(line: str) -> str:
    return printable(repr(line[:200]))


def _header(lines: List[str]) -> tuple:
    """(index of the header line, its column names)."""
    found = []
    for index, line in enumerate(lines):
        words = line.lstrip("#").split()
        if line.startswith("#") and words[:2] == ["size", "count"]:
            found.append((index, words))
    if not found:
        raise NcclTestsError("no nccl-tests result table (no '#  size  count ...' header line) "
                             f"in the output; its last line: {_quote(_last(lines))}")
    if len(found) > 1:
        # As when mpirun starts an nccl-tests built without MPI=1: every
        # process is a job of its own and prints its own table.
        raise NcclTestsError(f"{len(found)} nccl-tests result tables in one output (one run "
                             "prints one; nccl-tests built without MPI=1 under mpirun prints "
                             "one per process, each process alone)")
    return found[0]


def _last(lines: List[str]) -> str:
    return next((line for line in reversed(lines) if line.strip()), "")


def _layout(names: List[str]) -> tuple:
    """(key columns, out-of-place columns, in-place columns) of a header."""
    starts = [i for i, name in enumerate(names) if name in _TIME_NAMES]
    if len(starts) != 2:
        raise NcclTestsError(f"the header {_quote(' '.join(names))} does not have one time "
                             "column per half (out-of-place, in-place)")
    keys, first, second = names[:starts[0]], names[starts[0]:starts[1]], names[starts[1]:]
    second = second[:len(first)]  # a timestamp column may follow
    for half in (first, second):
        if half[1:3] != ["algbw", "busbw"] or not any(c in half for c in _CHECK_NAMES):
            raise NcclTestsError(f"the header {_quote(' '.join(names))} lacks time, algbw, "
                                 "busbw and #wrong/error in each half")
    if keys[:3] != ["size", "count", "type"] or not set(keys) <= set(_KEYS):
        raise NcclTestsError(f"the header {_quote(' '.join(names))} has unknown key columns")
    return keys, first, second


def _number(word: str, line: str) -> float:
    if not _NUMBER.match(word):
        raise NcclTestsError(f"{_quote(line)}: {printable(repr(word))} is not a number")
    value = float(word)
    if not math.isfinite(value):
        raise NcclTestsError(f"{_quote(line)}: {printable(word)} is out of range")
    return value


def _count(word: str, line: str, signed: bool = False) -> int:
    if not re.fullmatch(r"-?[0-9]{1,15}" if signed else r"[0-9]{1,15}", word):
        raise NcclTestsError(f"{_quote(line)}: {printable(repr(word))} is not a count")
    return int(word)


def _half(columns: List[str], words: List[str], line: str) -> Half:
    values = dict(zip(columns, words))
    wrong = error = None
    if "#wrong" in values and values["#wrong"] != "N/A":
        # Printed with %g (util.cu writeBenchmarkLineBody): 1.23457e+06 past a million.
        wrong = _number(values["#wrong"], line)
        if not wrong.is_integer():
            raise NcclTestsError(f"{_quote(line)}: #wrong {printable(values['#wrong'])} is not a count")
        wrong = int(wrong)
    if "error" in values and values["error"] != "N/A":
        error = _number(values["error"].rstrip("*"), line)  # '*': beyond nccl-tests' threshold
    return Half(_number(values[columns[0]], line), _number(values["algbw"], line),
                _number(values["busbw"], line), wrong, error)


def _row(layout: tuple, line: str) -> Row:
    keys, first, second = layout
    words = line.split()
    width = len(keys) + len(first) + len(second)
    if len(words) < width:
        raise NcclTestsError(f"the result row {_quote(line)} has {len(words)} columns, the "
                             f"header {width}")
    named = dict(zip(keys, words))
    at = len(keys)
    return Row(size=_count(named["size"], line), count=_count(named["count"], line),
               type=printable(named["type"])[:16],
               redop=printable(named["redop"])[:16] if "redop" in named else None,
               root=_count(named["root"], line, signed=True) if "root" in named else None,
               out_of_place=_half(first, words[at:at + len(first)], line),
               in_place=_half(second, words[at + len(first):width], line))


def parse_all_reduce(text: object) -> AllReduceResult:
    """The rows and the average bus bandwidth of an all_reduce_perf output
    (also reads the other *_perf tools' tables, whose layout is the same)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise NcclTestsError("all_reduce_perf: no output to read")
    if len(text) > MAX_OUTPUT:
        raise NcclTestsError(f"all_reduce_perf: {len(text)} characters of output, more than "
                             f"{MAX_OUTPUT}: not read")
    lines = text.splitlines()
    index, names = _header(lines)
    layout = _layout(names)
    rows: List[Row] = []
    avg = oob = None
    for line in lines[index + 1:]:
        match = _AVG.match(line)
        if match:
            avg = _number(match.group(1), line)
            continue
        match = _OOB.match(line)
        if match:
            oob = int(match.group(1))
            continue
        words = line.split()
        # Rows start with the size; NCCL INFO/WARN lines ("host:pid:tid [0] NCCL
        # INFO ...") and comments come interleaved and are not rows.
        if words and re.fullmatch(r"[0-9]{1,15}", words[0]):
            if len(rows) >= MAX_ROWS:
                raise NcclTestsError(f"all_reduce_perf: more than {MAX_ROWS} result rows")
            rows.append(_row(layout, line))
    if avg is None:
        raise NcclTestsError("all_reduce_perf: no '# Avg bus bandwidth' line: the run did not "
                             f"finish (its last line: {_quote(_last(lines))})")
    if not rows:
        raise NcclTestsError("all_reduce_perf: the result table has no rows")
    return AllReduceResult(avg_busbw=avg, rows=rows, out_of_bounds=oob)


def problems(result: AllReduceResult, min_busbw: Optional[float] = None) -> List[str]:
    """Why `result` fails a gate: wrong elements, out-of-bounds values, an
    average bus bandwidth below min_busbw (GB/s).  Empty when it passes."""
    found = []
    if result.wrong:
        found.append(f"{result.wrong} wrong elements (#wrong): the reduction returned bad data")
    if result.out_of_bounds:
        found.append(f"{result.out_of_bounds} out-of-bounds values")
    if min_busbw is not None and result.avg_busbw < min_busbw:
        found.append(f"average bus bandwidth {result.avg_busbw:g} GB/s is below {min_busbw:g} GB/s")
    return found


def rows_by_size(result: AllReduceResult) -> Dict[int, Row]:
    return {row.size: row for row in result.rows}
