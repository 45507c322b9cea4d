"""The traffic gate's nccl-tests entry (control/rollout/gate/ nccl_tests:): the
spec and its errors (file:line:key, one paragraph), the exact argv with
the launcher's placeholders filled, and the runner's decisions on the
output, with the SSH session faked.  The output is real: recorded
all_reduce_perf runs of tests/fixtures/nccl-tests/ (see its SOURCE.md).
The run on real sshd hosts is tests/fleet/test_gate_nccl_fleet.py.
"""

from __future__ import annotations

import os
import textwrap
from types import SimpleNamespace

import pytest

from nictune.control.rollout import gate as g
from nictune.control.rollout.traffic import Result
from nictune.profile.errors import ProfileError

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "nccl-tests")
H100 = open(os.path.join(FIXTURES, "wrong-column-h100-2nodes.txt")).read()  # Avg bus bandwidth 70.742
A100 = open(os.path.join(FIXTURES, "error-column-a100-mpijob.txt")).read()  # 13.0489


def playbook(tmp_path, gate_yaml: str) -> str:
    (tmp_path / "p.yaml").write_text("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n")
    path = tmp_path / "pb.yaml"
    body = textwrap.indent(textwrap.dedent(gate_yaml).strip(), "    ")
    path.write_text(f"- name: gpus\n  hosts: all\n  profile: p.yaml\n  gate:\n{body}\n")
    return str(path)


# -- the spec ---------------------------------------------------------------------------

def test_a_full_nccl_tests_gate_loads(tmp_path):
    path = playbook(tmp_path, """
        rails: [eth2]
        timeout: 90
        nccl_tests:
          launcher: [mpirun, --allow-run-as-root, -np, "{np}", -H, "{hosts}", -x, NCCL_DEBUG=WARN]
          binary: /opt/nccl-tests/build/all_reduce_perf
          gpus: 8
          min_bytes: 8
          max_bytes: 8589934592
          min_busbw: 150
    """)
    [spec] = g.load_play_gates(path)
    n = spec.nccl_tests
    assert n.launcher == ["mpirun", "--allow-run-as-root", "-np", "{np}", "-H", "{hosts}", "-x", "NCCL_DEBUG=WARN"]
    assert (n.binary, n.gpus, n.min_bytes, n.max_bytes, n.min_busbw) == (
        "/opt/nccl-tests/build/all_reduce_perf", 8, 8, 8589934592, 150)
    assert (n.step_factor, n.iterations, n.warmup) == (2, 20, 5)
    assert n.timeout == 90  # the gate's, when nccl_tests names none
    assert spec.iperf3 is None and spec.ib_write_bw is None


def test_nccl_tests_defaults(tmp_path):
    [spec] = g.load_play_gates(playbook(tmp_path, "rails: [eth2]\nnccl_tests: {}"))
    n = spec.nccl_tests
    assert (n.launcher, n.binary, n.gpus, n.min_busbw, n.timeout) == ([], "all_reduce_perf", 8, None, 300.0)
    assert (n.min_bytes, n.max_bytes) == (1 << 30, 1 << 30)


@pytest.mark.parametrize("gate_yaml, line, key, words", [
    ("rails: [eth2]\nnccl_tests: {launcher: [mpirun, -np, '{ranks}']}", 6, "[0].gate.nccl_tests.launcher[2]",
     "unknown placeholder {ranks}; the placeholders are {hosts}, {addresses}, {np}, {gpus}, {batch} and {rollout}"),
    ("rails: [eth2]\nnccl_tests: {launcher: [mpirun, '-H={hosts']}", 6, "[0].gate.nccl_tests.launcher[1]",
     "lone '{'"),
    ("rails: [eth2]\nnccl_tests: {launcher: [-np, '16']}", 6, "[0].gate.nccl_tests.launcher[0]",
     "is an option, not a program"),
    ("rails: [eth2]\nnccl_tests: {launcher: 'mpirun -np 16'}", 6, "[0].gate.nccl_tests.launcher", "expected a list"),
    ("rails: [eth2]\nnccl_tests: {launcher: [\"mpirun\\n\"]}", 6, "[0].gate.nccl_tests.launcher[0]", ""),
    ("rails: [eth2]\nnccl_tests: {binary: build/all_reduce_perf}", 6, "[0].gate.nccl_tests.binary",
     "not an absolute path"),
    ("rails: [eth2]\nnccl_tests: {binary: /usr/bin/all_gather_perf}", 6, "[0].gate.nccl_tests.binary",
     "does not name all_reduce_perf"),
    ("rails: [eth2]\nnccl_tests: {min_bytes: 1024, max_bytes: 8}", 6, "[0].gate.nccl_tests.min_bytes",
     "1024 is above max_bytes 8"),
    ("rails: [eth2]\nnccl_tests: {gpus: 0}", 6, "[0].gate.nccl_tests.gpus", "from 1 to 64"),
    ("rails: [eth2]\nnccl_tests: {min_busbw: -1}", 6, "[0].gate.nccl_tests.min_busbw", "from 0 to 100000"),
    ("rails: [eth2]\nnccl_tests: {step_factor: 1}", 6, "[0].gate.nccl_tests.step_factor", "from 2 to 1024"),
    ("rails: [eth2]\nnccl_tests: {min_bw: 5}", 6, "[0].gate.nccl_tests", "unknown key 'min_bw'"),
    ("rails: [eth2]\nnccl_tests: {timeout: 0}", 6, "[0].gate.nccl_tests.timeout", "from 1 to 3600"),
    ("rails: [eth2]\niperf3: {}\nib_send_lat: {}", 7, "[0].gate.ib_send_lat", "not supported"),
])
def test_nccl_tests_spec_errors_name_file_line_and_key(tmp_path, gate_yaml, line, key, words):
    path = playbook(tmp_path, gate_yaml)
    with pytest.raises(ProfileError) as info:
        g.load_play_gates(path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'pb.yaml'}:{line}: {key}: "), message
    assert words in message and "\n" not in message


# -- the argv -------------------------------------------------------------------------------

def nccl(**kw) -> g.NcclTestsSpec:
    return g.NcclTestsSpec(**{"gpus": 8, "min_bytes": 8, "max_bytes": 8 << 30, "timeout": 60, **kw})


def test_the_argv_is_the_launcher_with_its_placeholders_filled_then_all_reduce_perf():
    spec = nccl(launcher=["mpirun", "--allow-run-as-root", "-np", "{np}", "-H", "{hosts}", "--host-list={addresses}",
                          "-x", "NCCL_DEBUG=WARN", "-npernode", "{gpus}", "{{literal}}"],
                binary="/opt/nccl-tests/build/all_reduce_perf")
    assert spec.argv(["gpu1", "gpu2", "gpu3"], ["10.0.0.1", "10.0.0.2", "10.0.0.3"]) == [
        "mpirun", "--allow-run-as-root", "-np", "24", "-H", "gpu1,gpu2,gpu3", "--host-list=10.0.0.1,10.0.0.2,10.0.0.3",
        "-x", "NCCL_DEBUG=WARN", "-npernode", "8", "{literal}",
        # One rank per GPU under the launcher: -g 1.
        "/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "8589934592", "-f", "2", "-g", "1",
        "-n", "20", "-w", "5", "-c", "1"]


def test_the_launcher_names_the_reservation_of_the_batch_and_rollout():
    # The play's hooks make "nictune-{rollout}-{batch}"; the gate's srun must name the same one.
    launcher = ["srun", "--reservation=nictune-{rollout}-{batch}", "--nodelist={hosts}"]
    spec = nccl(launcher=launcher)
    assert spec.argv(["gpu1", "gpu2"], ["10.0.0.1", "10.0.0.2"], 3, "20261204T191500Z-a1b2c3")[:3] == [
        "srun", "--reservation=nictune-20261204T191500Z-a1b2c3-3", "--nodelist=gpu1,gpu2"]
    log: list = []
    gate_spec = g.GateSpec(rails=["eth2"], source="pb.yaml:4", nccl_tests=spec)
    gate = g.Gate(gate_spec, lambda h: Session(g._name(h), log, ok(H100)), rollout_name="R1")
    assert gate(2, ["h1", "h2"])["passed"]
    assert [argv[1] for _, argv, _ in log if argv != "close"] == ["--reservation=nictune-R1-2"]


def test_without_a_launcher_one_process_drives_every_gpu_of_its_host():
    assert nccl(gpus=4).argv(["gpu1"], ["10.0.0.1"]) == [
        "all_reduce_perf", "-b", "8", "-e", "8589934592", "-f", "2", "-g", "4", "-n", "20", "-w", "5", "-c", "1"]


# -- the runner, with a fake session ------------------------------------------------------

class Session:
    """Stands in for traffic.Session: all_reduce_perf (or its launcher)
    answers with `answer`; the rest as a host with no such commands."""

    def __init__(self, name, log, answer):
        self.name, self.log, self.answer = name, log, answer

    def run(self, argv, seconds):
        self.log.append((self.name, argv, seconds))
        return self.answer(argv)

    def close(self):
        self.log.append((self.name, "close", None))


def run_gate(spec: g.NcclTestsSpec, answer, hosts=("h1", "h2"), **kw):
    log: list = []
    gate_spec = g.GateSpec(rails=["eth2"], source="pb.yaml:4", nccl_tests=spec, **kw)
    result = g.Gate(gate_spec, lambda h: Session(g._name(h), log, answer))(1, list(hosts))
    return result, log


def ok(text):
    return lambda argv: Result(argv, 0, text, "")


MPIRUN = ["mpirun", "-np", "{np}", "-H", "{hosts}", "--addr={addresses}"]


def test_a_batch_runs_once_on_its_first_host_and_passes_above_the_floor():
    hosts = [SimpleNamespace(name="h1", address="192.0.2.1"), SimpleNamespace(name="h2", address="192.0.2.2")]
    result, log = run_gate(nccl(launcher=MPIRUN, min_busbw=70), ok(H100), hosts=hosts)
    assert result["passed"], result["message"]
    runs = [(name, argv, seconds) for name, argv, seconds in log if argv != "close"]
    assert runs == [("h1", ["mpirun", "-np", "16", "-H", "h1,h2", "--addr=192.0.2.1,192.0.2.2", "all_reduce_perf",
                            "-b", "8", "-e", "8589934592", "-f", "2", "-g", "1", "-n", "20", "-w", "5", "-c", "1"], 60)]
    assert {name for name, argv, _ in log if argv == "close"} == {"h1", "h2"}
    [r] = result["results"]
    assert (r["client"], r["server"], r["rail"], r["tool"]) == ("h1,h2", None, "*", "nccl-tests")
    assert r["figures"] == {"avg_busbw_gbytes": 70.742, "largest_busbw_gbytes": 338.82, "largest_bytes": 8589934592}


def test_an_average_below_the_floor_fails_naming_figure_and_floor():
    result, _ = run_gate(nccl(launcher=MPIRUN, min_busbw=100), ok(H100))
    assert not result["passed"]
    [r] = result["results"]
    assert r["why"] == "avg bus bandwidth 70.742 GB/s, less than min_busbw 100"
    assert result["message"] == ("batch 1: the traffic gate failed: h1,h2 on * (nccl-tests): "
                                 "avg bus bandwidth 70.742 GB/s, less than min_busbw 100")


def test_the_older_error_column_layout_is_judged_too():
    result, _ = run_gate(nccl(launcher=MPIRUN, min_busbw=13), ok(A100))
    assert result["passed"] and result["results"][0]["figures"]["avg_busbw_gbytes"] == 13.0489
    result, _ = run_gate(nccl(launcher=MPIRUN, min_busbw=13.05), ok(A100))
    assert not result["passed"]


def test_wrong_elements_and_out_of_bounds_values_fail_whatever_the_bandwidth():
    row = "  8589934592    2147483648     float     sum      -1    47535  180.71  338.82      0"
    assert row in H100
    bad = H100.replace(row, row[:-1] + "7").replace("# Out of bounds values : 0 OK",
                                                     "# Out of bounds values : 3 FAILED")
    result, _ = run_gate(nccl(launcher=MPIRUN, min_busbw=1), ok(bad))
    [r] = result["results"]
    assert not r["passed"]
    assert "7 wrong elements (#wrong)" in r["why"] and "3 out-of-bounds values" in r["why"]


def test_a_failed_launch_fails_with_the_output_tail_escaped():
    def fails(argv):
        return Result(argv, 1, "", "mpirun was unable to launch\n\x1b[31mORTE: host h2 unreachable\x07\n")
    result, _ = run_gate(nccl(launcher=MPIRUN), fails)
    [r] = result["results"]
    assert not r["passed"] and "\x1b" not in r["why"] and "\x07" not in r["why"]
    assert r["why"] == ("mpirun on h1 exited 1: mpirun was unable to launch | "
                        "\\x1b[31mORTE: host h2 unreachable\\x07")


def test_output_that_is_not_a_result_table_fails():
    cut = H100[:H100.index("# Avg bus bandwidth")]  # a run that stopped before its footer
    for text, words in ((cut, "no '# Avg bus bandwidth' line"), ("Segmentation fault\n", "no nccl-tests result table"),
                        (H100 + H100, "2 nccl-tests result tables")):
        result, _ = run_gate(nccl(launcher=MPIRUN), ok(text))
        [r] = result["results"]
        assert not r["passed"] and words in r["why"], r["why"]
        assert not r["figures"]


def test_a_run_past_its_timeout_fails_saying_so():
    result, _ = run_gate(nccl(launcher=MPIRUN, timeout=7), lambda argv: Result(argv, 124, "# nThread 1\n", "", True))
    [r] = result["results"]
    assert not r["passed"] and r["why"].startswith("mpirun on h1 did not finish within 7 s and was killed")


def test_without_a_launcher_each_host_runs_alone_and_a_batch_of_one_needs_no_peer():
    result, log = run_gate(nccl(gpus=2), ok(H100), hosts=["h1", "h2"])
    assert result["passed"]
    assert sorted((name, argv[argv.index("-g") + 1]) for name, argv, _ in log if argv != "close") == [
        ("h1", "2"), ("h2", "2")]
    assert sorted(r["client"] for r in result["results"]) == ["h1", "h2"]
    alone, _ = run_gate(nccl(gpus=2), ok(H100), hosts=["h1"])
    assert alone["passed"] and [r["client"] for r in alone["results"]] == ["h1"]


def test_an_unreachable_host_fails_the_run_without_starting_it():
    log: list = []

    def connect(h):
        if h == "h2":
            raise g.NictuneError("h2: connection refused")
        return Session(h, log, ok(H100))

    spec = g.GateSpec(rails=["eth2"], source="pb.yaml:4", nccl_tests=nccl(launcher=MPIRUN))
    result = g.Gate(spec, connect)(1, ["h1", "h2"])
    assert not result["passed"]
    nccl_row = [r for r in result["results"] if r["tool"] == "nccl-tests"][0]
    assert nccl_row["why"] == "not run: h2 not reachable"
    assert [argv for _, argv, _ in log if argv != "close"] == []


def test_the_average_is_recorded_and_compared_with_its_baseline(tmp_path):
    base = str(tmp_path / "base.json")
    recorded, _ = run_gate(nccl(launcher=MPIRUN), ok(H100))
    assert g.write_baseline(base, recorded["results"]) == 1
    assert g.read_baseline(base)[("h1,h2", "", "*", "nccl-tests")]["avg_busbw_gbytes"] == 70.742
    slower = H100.replace("# Avg bus bandwidth    : 70.742", "# Avg bus bandwidth    : 60.1")
    result, _ = run_gate(nccl(launcher=MPIRUN), ok(slower), baseline=base, max_regression=10.0)
    [r] = result["results"]
    assert not r["passed"] and r["baseline"] == {"avg_busbw_gbytes": 70.742}
    assert "avg_busbw_gbytes regressed 15.0% from the baseline (baseline 70.742, now 60.1" in r["why"]
    same, _ = run_gate(nccl(launcher=MPIRUN), ok(H100), baseline=base, max_regression=10.0)
    assert same["passed"], same["message"]
