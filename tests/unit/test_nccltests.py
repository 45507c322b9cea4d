"""nccl-tests all_reduce_perf (nictune.control.rollout.nccltests): the argv, and the
parser on outputs recorded on real clusters (tests/fixtures/nccl-tests, see
its SOURCE.md): nccl-tests 2.13+ ("#wrong", root; 16 ranks on two hosts) and
2.11 or older ("error", no root), then on hostile and broken outputs."""

from __future__ import annotations

import os

import pytest

from nictune.control.rollout import nccltests
from nictune.control.rollout.nccltests import AllReducePerf, Half, NcclTestsError, parse_all_reduce
from nictune.host.errors import InvalidInput

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "nccl-tests")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


NEW = fixture("wrong-column-h100-2nodes.txt")
OLD = fixture("error-column-a100-mpijob.txt")


# -- argv ------------------------------------------------------------------------

def test_argv_is_a_list_with_every_bound_given():
    assert nccltests.argv(AllReducePerf()) == [
        "all_reduce_perf", "-b", "1073741824", "-e", "1073741824", "-f", "2", "-g", "1",
        "-n", "20", "-w", "5", "-c", "1"]
    test = AllReducePerf(min_bytes=8, max_bytes=8 << 30, step_factor=4, gpus=8, iterations=50,
                         warmup=0, check=False, binary="/opt/nccl-tests/build/all_reduce_perf")
    assert nccltests.argv(test) == [
        "/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "8589934592", "-f", "4",
        "-g", "8", "-n", "50", "-w", "0", "-c", "0"]


@pytest.mark.parametrize("change", [
    {"min_bytes": 0}, {"max_bytes": 1 << 41}, {"min_bytes": 2048, "max_bytes": 1024},
    {"step_factor": 1}, {"gpus": 0}, {"gpus": True}, {"iterations": "20"}, {"warmup": -1},
    {"check": 1}, {"binary": "all_reduce_perf; reboot"}, {"binary": "/bin/sh"},
    {"binary": "relative/all_reduce_perf"}, {"binary": "/opt/../all_reduce_perf"},
    {"binary": "-oall_reduce_perf"},
])
def test_argv_refuses_what_must_not_reach_a_host(change):
    with pytest.raises(InvalidInput):
        nccltests.argv(AllReducePerf(**change))


# -- recorded outputs ----------------------------------------------------------------

def test_the_2_13_format_with_root_and_wrong_columns_16_ranks_on_two_hosts():
    result = parse_all_reduce(NEW)
    assert result.avg_busbw == 70.742
    assert result.out_of_bounds == 0 and result.wrong == 0
    assert len(result.rows) == 31
    first, last = result.rows[0], result.rows[-1]
    assert (first.size, first.count, first.type, first.redop, first.root) == (8, 2, "float", "sum", -1)
    assert first.out_of_place == Half(135.8, 0.0, 0.0, wrong=0)
    assert first.in_place == Half(123.5, 0.0, 0.0, wrong=0)
    assert (last.size, last.count) == (8589934592, 2147483648)
    assert last.out_of_place == Half(47535.0, 180.71, 338.82, wrong=0)
    assert last.in_place == Half(47743.0, 179.92, 337.35, wrong=0)
    assert nccltests.rows_by_size(result)[134217728].in_place.busbw == 153.76
    # nccl-tests' average is the mean of busbw over all rows and halves.
    mean = sum(h.busbw for r in result.rows for h in (r.out_of_place, r.in_place)) / 62
    assert abs(mean - result.avg_busbw) < 0.01


def test_the_older_format_with_an_error_column_and_no_root():
    result = parse_all_reduce(OLD)
    assert result.avg_busbw == 13.0489 and result.out_of_bounds == 0
    assert len(result.rows) == 30
    first, last = result.rows[0], result.rows[-1]
    assert (first.size, first.count, first.type, first.redop, first.root) == (4, 1, "float", "sum", None)
    assert first.out_of_place == Half(58.2, 0.0, 0.0, error=5e-07)
    assert first.in_place == Half(58.0, 0.0, 0.0, error=7e-07)
    assert last.out_of_place == Half(95238.0, 22.55, 44.74, error=2e-06)
    assert last.in_place == Half(95289.0, 22.54, 44.72, error=2e-06)
    assert result.wrong == 0  # "error" is a deviation, not a count of wrong elements


def test_gate_problems_threshold_and_wrong_elements():
    assert nccltests.problems(parse_all_reduce(NEW), min_busbw=70.0) == []
    assert nccltests.problems(parse_all_reduce(NEW), min_busbw=100.0) == [
        "average bus bandwidth 70.742 GB/s is below 100 GB/s"]
    bad = NEW.replace("338.82      0", "338.82     17").replace(
        "Out of bounds values : 0 OK", "Out of bounds values : 3 FAILED")
    assert nccltests.problems(parse_all_reduce(bad)) == [
        "17 wrong elements (#wrong): the reduction returned bad data", "3 out-of-bounds values"]


def test_interleaved_nccl_info_lines_and_unchecked_runs():
    """NCCL INFO lines land between rows when NCCL_DEBUG=INFO; -c 0 prints N/A."""
    lines = NEW.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("8 "))
    lines.insert(at, "ztan-mig-235z:6899:6899 [0] NCCL INFO Launch mode Parallel")
    text = "\n".join(lines).replace("      0    123.5    0.00    0.00      0",
                                    "    N/A    123.5    0.00    0.00    N/A")
    result = parse_all_reduce(text)
    assert len(result.rows) == 31
    assert result.rows[0].out_of_place.wrong is None and result.rows[0].in_place.wrong is None


# -- broken and hostile outputs --------------------------------------------------------

def cut_after(text: str, marker: str) -> str:
    return text[:text.index(marker)]


@pytest.mark.parametrize("text, message", [
    ("", "no nccl-tests result table"),
    (None, "no output"),
    ("\x1b[2J# nThread 1 nGpus 1\nSegmentation fault\n", "last line: 'Segmentation fault'"),
    (cut_after(NEW, "# Out of bounds"), "no '# Avg bus bandwidth' line"),
    (NEW.replace("# Avg bus bandwidth    : 70.742", "# Avg bus bandwidth    : nan"), "not a number"),
    (NEW.replace("# Avg bus bandwidth    : 70.742", "# Avg bus bandwidth    : 1e999"), "out of range"),
    (NEW.replace("135.8    0.00    0.00", "135.8    0.00    fast"), "'fast' is not a number"),
    (NEW.replace("135.8    0.00    0.00      0    123.5", "135.8"), "has 9 columns, the header 13"),
    (NEW.replace("   0    123.5", "  -4    123.5"), "'-4' is not a number"),
    (NEW + NEW, "2 nccl-tests result tables"),
    (NEW.replace("busbw #wrong     time", "busbw #wrong  elapsed"), "one time column per half"),
    (NEW.replace("redop    root", "redop   owner"), "unknown key columns"),
    (cut_after(NEW, "           8  ") + "# Avg bus bandwidth    : 1\n", "has no rows"),
    ("#  size count\n" * 2, "2 nccl-tests result tables"),
])
def test_broken_outputs_are_clear_errors(text, message):
    with pytest.raises(NcclTestsError) as info:
        parse_all_reduce(text)
    assert message in info.value.message
    assert "\x1b" not in info.value.message


def test_control_characters_in_messages_are_escaped_and_sizes_bounded():
    hostile = NEW.replace("135.8    0.00    0.00", "135.8    0.00    \x1b[31m")
    with pytest.raises(NcclTestsError) as info:
        parse_all_reduce(hostile)
    assert "\\x1b[31m" in info.value.message and "\x1b" not in info.value.message
    with pytest.raises(NcclTestsError, match="characters of output"):
        parse_all_reduce("#" * (nccltests.MAX_OUTPUT + 1))
    many = NEW.replace("# Out of bounds", "           8             2     float     sum      -1"
                       "    135.8    0.00    0.00      0    123.5    0.00    0.00      0\n" * 5000
                       + "# Out of bounds")
    with pytest.raises(NcclTestsError, match="more than 4096 result rows"):
        parse_all_reduce(many)
    assert parse_all_reduce(NEW.encode()).avg_busbw == 70.742


def test_the_per_iteration_layout_and_g_formatted_wrong_counts():
    """Not a recording (no published run with -I 1 was found): the header and
    a row built with the printf formats of NVIDIA/nccl-tests src/util.cu
    (writeResultHeader with per_iter_timing, writeBenchmarkLinePreamble,
    writeBenchmarkLineBody and its per-iteration columns); #wrong is %g
    there, so a million wrong elements read 1e+06."""
    names = ("size", "count", "type", "redop", "root",
             "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%",
             "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%")
    header = ("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s"
              "  %6s  %7s  %7s  %7s  %7s %*s\n") % (*names, 0, "")
    row = "%12li  %12li  %8s  %6s  %6s" % (1048576, 262144, "float", "sum", "%6i" % -1)
    row += "  %7s  %6s  %6s  %6g" % ("  27.76", " 37.78", " 66.11", 1e6)
    row += "  %7s  %7s  %7s  %7s" % ("  26.10", "  30.02", "  29.97", "   3.10")
    row += "  %7s  %6s  %6s  %6g" % ("  27.49", " 38.15", " 66.76", 0)
    row += "  %7s  %7s  %7s  %7s\n" % ("  26.00", "  29.80", "  29.70", "   2.90")
    text = header + row + "# Avg bus bandwidth    : 66.435 \n"
    result = parse_all_reduce(text)
    (only,) = result.rows
    assert only.out_of_place == Half(27.76, 37.78, 66.11, wrong=1000000)
    assert only.in_place == Half(27.49, 38.15, 66.76, wrong=0)
    assert result.wrong == 1000000 and result.avg_busbw == 66.435
    with pytest.raises(NcclTestsError, match="#wrong 1.5 is not a count"):
        parse_all_reduce(text.replace("1e+06", "  1.5"))


def test_mpirun_of_a_build_without_mpi_prints_one_table_per_process():
    """nccl-tests issue #107: two processes, two headers, each its own job."""
    twice = NEW.replace("# Out of bounds", NEW[NEW.index("#     "):NEW.index("           8  ")]
                        + "# Out of bounds")
    with pytest.raises(NcclTestsError, match="built without MPI=1 under mpirun"):
        parse_all_reduce(twice)
