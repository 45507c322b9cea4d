"""The traffic gate's nccl_tests: entry on the sshd fleet: real SSH
sessions, real `timeout`, a real rollout through `nictune apply`.

There are no GPUs here, so all_reduce_perf is a FAKE: a small shell
script this module writes under the test's tmp dir (the namespace hosts
share the filesystem) and names as the gate's `binary:`.  It checks the
argv it was given and prints, byte for byte, a recorded real run
(tests/fixtures/nccl-tests/wrong-column-h100-2nodes.txt, Avg bus
bandwidth 70.742 GB/s).  The launcher is a FAKE mpirun too: it writes
its argv and the network namespace it runs in to a file, then runs the
rest of its argv, as mpirun would on each rank.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fleet_helpers import gate_playbook, nictune, run_gate, running_fleet, script, tcp_ecn


pytestmark = pytest.mark.netns

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "nccl-tests", "wrong-column-h100-2nodes.txt")
ARGS = "-b 8 -e 8589934592 -f 2 -g 1 -n 20 -w 5 -c 1"


@pytest.fixture(scope="module")
def gpu_fleet(tmp_path_factory):
    if shutil.which("timeout") is None:
        pytest.skip("needs coreutils timeout")
    with running_fleet(tmp_path_factory, 2) as f:
        yield f


def fake_all_reduce_perf(tmp_path, hang: bool = False) -> str:
    """A FAKE all_reduce_perf (no GPU here): refuses an argv other than
    ARGS, then prints the recorded real output (or hangs, with a child)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    tail = f"cat '{os.path.abspath(FIXTURE)}'\n"
    if hang:  # a child named by its path, so that pgrep finds it if it outlives the run
        child = script(tmp_path / "bin" / "hanging-child", "while :; do sleep 1; done\n")
        tail = f'echo "# nThread 1 nGpus 1"\n"{child}" &\nwait\n'
    return script(tmp_path / "bin" / "all_reduce_perf",
                  "# FAKE all_reduce_perf for tests/fleet/test_gate_nccl_fleet.py: no GPUs here.\n"
                  f'[ "$*" = "{ARGS}" ] || {{ echo "fake all_reduce_perf: unexpected argv: $*" >&2; exit 2; }}\n'
                  + tail)


def fake_mpirun(tmp_path) -> str:
    """A FAKE launcher: records its argv (one per line) and its netns,
    then runs what follows `--`."""
    record = tmp_path / "mpirun.argv"
    return script(tmp_path / "bin" / "mpirun",
                  f'for a in "$@"; do printf "%s\\n" "$a"; done > "{record}"\n'
                  f'echo "netns=$(ip netns identify $$)" >> "{record}"\n'
                  'while [ "$1" != "--" ]; do shift; done; shift\nexec "$@"\n')


def nccl_gate(tmp_path, min_busbw: float, launcher: bool = True, hang: bool = False, timeout: int = 30) -> str:
    binary = fake_all_reduce_perf(tmp_path, hang)
    lines = ["rails: [data0]", "nccl_tests:", f"  binary: {binary}", "  gpus: 8", "  min_bytes: 8",
             "  max_bytes: 8589934592", f"  min_busbw: {min_busbw}", f"  timeout: {timeout}"]
    if launcher:
        lines.append(f'  launcher: ["{fake_mpirun(tmp_path)}", -np, "{{np}}", -H, "{{hosts}}", '
                     f'--addr, "{{addresses}}", --]')
    return gate_playbook(tmp_path, "\n".join(lines))


def left_running(tmp_path) -> str:
    return subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True).stdout


def test_the_gate_passes_above_its_floor_with_the_launcher_given_np_and_hosts(gpu_fleet, tmp_path):
    a, b = gpu_fleet.of_kind("sshd")
    result = run_gate(gpu_fleet, nccl_gate(tmp_path, min_busbw=70))
    assert result["passed"], result["message"]
    [r] = result["results"]
    assert (r["client"], r["tool"]) == (f"{a.name},{b.name}", "nccl-tests")
    assert r["figures"] == {"avg_busbw_gbytes": 70.742, "largest_busbw_gbytes": 338.82, "largest_bytes": 8589934592}
    recorded = (tmp_path / "mpirun.argv").read_text().splitlines()
    assert recorded == ["-np", "16", "-H", f"{a.name},{b.name}", "--addr", f"{a.address},{b.address}", "--",
                        str(tmp_path / "bin" / "all_reduce_perf"), *ARGS.split(), f"netns={a.netns}"]


def test_the_gate_fails_below_its_floor_naming_the_figure_and_floor(gpu_fleet, tmp_path):
    result = run_gate(gpu_fleet, nccl_gate(tmp_path, min_busbw=71))
    assert not result["passed"]
    assert "(nccl-tests): avg bus bandwidth 70.742 GB/s, less than min_busbw 71" in result["message"]


def test_without_a_launcher_each_host_runs_its_own(gpu_fleet, tmp_path):
    a, b = gpu_fleet.of_kind("sshd")
    path = nccl_gate(tmp_path, min_busbw=70, launcher=False)
    # Alone, one process drives every GPU of its host: -g 8; the fake wants -g 1.
    result = run_gate(gpu_fleet, path)
    assert not result["passed"]
    assert sorted(r["client"] for r in result["results"]) == sorted([a.name, b.name])
    assert all("exited 2: fake all_reduce_perf: unexpected argv: " in r["why"] and "-g 8" in r["why"]
               for r in result["results"]), result["results"]


def test_a_hanging_run_is_killed_at_the_timeout_and_nothing_is_left(gpu_fleet, tmp_path):
    path = nccl_gate(tmp_path, min_busbw=1, hang=True, timeout=3)
    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_gate, gpu_fleet, path)
        time.sleep(1.5)
        during = left_running(tmp_path)
        result = running.result()
    took = time.monotonic() - started
    assert "hanging-child" in during  # what the check below looks for is there while it runs
    assert not result["passed"]
    [r] = result["results"]
    assert "did not finish within 3 s and was killed" in r["why"] and "# nThread 1 nGpus 1" in r["why"]
    assert took < 3 + 2 + 5, took
    assert left_running(tmp_path) == ""


def test_a_rollout_whose_nccl_gate_fails_rolls_the_batch_back(gpu_fleet, tmp_path):
    a, b = gpu_fleet.of_kind("sshd")
    before = {h.name: tcp_ecn(h) for h in (a, b)}
    assert set(before.values()) != {"1"}
    path = nccl_gate(tmp_path, min_busbw=100)
    code, report = nictune("apply", path, "-i", gpu_fleet.inventory, "--ssh-config", gpu_fleet.ssh_config)
    assert code != 0
    [rollout] = report["rollouts"]
    assert sorted(rollout["rolled_back"]) == sorted([a.name, b.name]) and rollout["kept"] == []
    [batch] = rollout["batches"]
    [r] = batch["gate"]["results"]
    assert (r["tool"], r["passed"], r["figures"]["avg_busbw_gbytes"]) == ("nccl-tests", False, 70.742)
    assert "less than min_busbw 100" in rollout["stopped"]["message"]
    assert {h.name: tcp_ecn(h) for h in (a, b)} == before  # rolled back on both


def test_gate_record_stores_the_average_that_a_later_gate_compares_with(gpu_fleet, tmp_path):
    a, b = gpu_fleet.of_kind("sshd")
    path = nccl_gate(tmp_path, min_busbw=1)
    with open(path, "a") as f:
        f.write('    baseline: base.json\n    max_regression: "5%"\n')
    code, report = nictune("gate", "record", path, "-i", gpu_fleet.inventory, "--ssh-config", gpu_fleet.ssh_config)
    assert code == 0, report
    [entry] = json.loads((tmp_path / "base.json").read_text())["entries"]
    assert (entry["client"], entry["tool"], entry["figures"]["avg_busbw_gbytes"]) == (
        f"{a.name},{b.name}", "nccl-tests", 70.742)
    assert run_gate(gpu_fleet, path)["passed"]
    entry["figures"]["avg_busbw_gbytes"] = 80.0  # as if the fabric had done better before the change
    (tmp_path / "base.json").write_text(json.dumps({"nictune_gate_baseline": 1, "entries": [entry]}))
    result = run_gate(gpu_fleet, path)
    assert not result["passed"] and "avg_busbw_gbytes regressed 11.6% from the baseline (baseline 80, now 70.742" \
        in result["message"]
