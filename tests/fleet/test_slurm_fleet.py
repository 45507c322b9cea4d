"""The shipped ConnectX-7 playbook's Slurm hooks and nccl-tests launcher,
run by `nictune apply` against a REAL Slurm (tests/fleet/slurm_lab.py:
Debian's slurmctld, a slurmd per namespace host, munge) on the sshd fleet.

What is taken from playbooks/connectx7-fleet.yaml as shipped: the hooks
(before_batch, after_batch, cleanup) and the nccl-tests launcher (srun
--reservation=... --nodelist --ntasks-per-node --gpus-per-node
--mpi=pmix).  What the test changes, and why: the wait's limit and poll
interval (its $1 and $2: seconds here, not an hour), the hooks' timeout,
`env SLURM_CONF=...` before srun (an SSH session does not carry the
controller's environment; a real node reads /etc/slurm/slurm.conf), the
profile (one sysctl the sshd hosts take) and, there being no GPUs, the
binary: a FAKE all_reduce_perf that checks its argv, records on rank 0
what Slurm gave the step (its job's reservation, task count, GPUs, the
time it started) and prints, on rank 0 only as nccl-tests does, a
recorded real run (tests/fixtures/nccl-tests/wrong-column-h100-2nodes.txt,
Avg bus bandwidth 70.742 GB/s).  The scheduler is not faked.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml
from fleet_helpers import ECN_PROFILE, nictune, running_fleet, script, tcp_ecn
from slurm_lab import running_slurm

from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SHIPPED = os.path.join(ROOT, "playbooks", "connectx7-fleet.yaml")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "nccl-tests", "wrong-column-h100-2nodes.txt")
ARGS = "-b 8589934592 -e 8589934592 -f 2 -g 1 -n 20 -w 5 -c 1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_fleet(tmp_path_factory, 2) as fleet:
        with running_slurm(fleet, str(tmp_path_factory.mktemp("slurm"))) as slurm:
            yield fleet, slurm


@pytest.fixture(autouse=True)
def controller_env(cluster, monkeypatch):
    """The hooks run on the controller with this cluster's slurm.conf; no
    test may leave a job, reservation or drained node to the next."""
    fleet, slurm = cluster
    monkeypatch.setenv("SLURM_CONF", slurm.conf)
    for h in fleet.of_kind("sshd"):  # the kernel's default, which the play's profile changes
        run_in(h, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2"])
    yield
    slurm.run("scancel", "--user=root", check=False)
    leftover = slurm.reservations()
    for name in [w.split("=", 1)[1] for w in leftover.split() if w.startswith("ReservationName=")]:
        slurm.run("scontrol", "delete", f"reservationname={name}", check=False)
    slurm.run("scontrol", "update", f"nodename={','.join(slurm.nodes)}", "state=resume", check=False)


def fake_all_reduce_perf(tmp_path) -> str:
    record = tmp_path / "step"
    return script(tmp_path / "all_reduce_perf",
                  "# FAKE all_reduce_perf for tests/fleet/test_slurm_fleet.py: no GPUs here; Slurm is real.\n"
                  f'[ "$*" = "{ARGS}" ] || {{ echo "fake all_reduce_perf: unexpected argv: $*" >&2; exit 2; }}\n'
                  '[ "$SLURM_PROCID" = 0 ] || exit 0\n'
                  f'{{ date +%s.%N; scontrol -o show job "$SLURM_JOB_ID"; echo "tasks=$SLURM_STEP_NUM_TASKS"; '
                  f'echo "gpus=$CUDA_VISIBLE_DEVICES"; }} > "{record}"\n'
                  f"cat '{os.path.abspath(FIXTURE)}'\n")


def shipped_play() -> dict:
    [play] = yaml.safe_load(open(SHIPPED))
    return play


def play_file(tmp_path, slurm, min_busbw: float, wait_seconds: int = 30) -> str:
    """The shipped play's hooks and launcher over this fleet (see the
    module's docstring for what changes)."""
    shipped = shipped_play()
    hooks = shipped["hooks"]
    [wait] = [argv for argv in hooks["before_batch"] if argv[0] == "sh"]
    assert wait[-3:] == ["wait-for-jobs", "3600", "30"], wait  # the shipped limit and interval
    wait[-2:] = [str(wait_seconds), "1"]
    hooks["timeout"] = 60
    nccl = dict(shipped["gate"]["nccl_tests"], binary=fake_all_reduce_perf(tmp_path), min_busbw=min_busbw,
                timeout=60, launcher=["env", f"SLURM_CONF={slurm.conf}", *shipped["gate"]["nccl_tests"]["launcher"]])
    (tmp_path / "p.yaml").write_text(ECN_PROFILE)
    play = {"name": "slurm", "hosts": "fleet", "profile": "p.yaml", "serial": ["100%"], "hooks": hooks,
            "gate": {"rails": ["data0"], "nccl_tests": nccl}}
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    return str(path)


def blocker(tmp_path, slurm, node: str, seconds: int) -> str:
    """A batch job of someone else's on `node`, running when this returns;
    it writes the time it ends to a file, whose path is returned."""
    end = tmp_path / "blocker.end"
    job = slurm.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "-J", "blocker",
                    "--wrap", f"sleep {seconds}; date +%s.%N > {end}").stdout.strip()
    deadline = time.monotonic() + 20
    while slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, f"the blocker job {job} did not start:\n{slurm.logs()}"
        time.sleep(0.2)
    return str(end)


def apply(fleet, path):
    return nictune("apply", path, "-i", fleet.inventory, "--ssh-config", fleet.ssh_config)


def assert_released(slurm):
    """No reservation left, no node drained: the cluster as it was."""
    assert slurm.reservations() == ""
    assert set(slurm.node_states().values()) == {"idle"}, slurm.node_states()


def test_the_gate_waits_for_running_jobs_then_runs_in_the_reservation(cluster, tmp_path):
    fleet, slurm = cluster
    a, b = fleet.of_kind("sshd")
    ended = blocker(tmp_path, slurm, b.name, 8)  # longer than apply and verify take here
    code, report = apply(fleet, play_file(tmp_path, slurm, min_busbw=70))
    assert code == 0, (report.get("rollouts"), slurm.logs())
    [rollout] = report["rollouts"]
    assert sorted(rollout["kept"]) == sorted([a.name, b.name])
    reservation = f"nictune-{rollout['id']}-1"
    # ignore_jobs: the reservation started over the running job, which was
    # let finish (not killed), and the step began only after it ended.
    started, job, tasks, gpus = (tmp_path / "step").read_text().splitlines()
    assert os.path.exists(ended), "the blocker job did not run to its end"
    assert float(started) >= float(open(ended).read()), (started, open(ended).read())
    assert f"Reservation={reservation} " in job, job
    assert (tasks, gpus) == ("tasks=16", "gpus=0,1,2,3,4,5,6,7")   # the launcher as shipped: 8 per node
    [r] = [r for r in rollout["batches"][0]["gate"]["results"] if r["tool"] == "nccl-tests"]
    assert r["passed"] and r["figures"]["avg_busbw_gbytes"] == 70.742
    hooks = [(h["hook"], h["argv"][:3], h["exit_code"]) for h in rollout["batches"][0]["hooks"]]
    assert hooks[0] == ("before_batch", ["scontrol", "create", "reservation"], 0)
    assert hooks[-1] == ("cleanup", ["scontrol", "delete", f"reservationname={reservation}"], 0)
    assert_released(slurm)
    assert {tcp_ecn(h) for h in (a, b)} == {"1"}


def test_a_failing_gate_rolls_back_and_deletes_the_reservation(cluster, tmp_path):
    fleet, slurm = cluster
    a, b = fleet.of_kind("sshd")
    before = {h.name: tcp_ecn(h) for h in (a, b)}
    code, report = apply(fleet, play_file(tmp_path, slurm, min_busbw=100))
    assert code != 0
    [rollout] = report["rollouts"]
    assert sorted(rollout["rolled_back"]) == sorted([a.name, b.name]), rollout["stopped"]
    assert "less than min_busbw 100" in rollout["stopped"]["message"]
    assert f"Reservation=nictune-{rollout['id']}-1 " in (tmp_path / "step").read_text()  # it did run, reserved
    assert [h["hook"] for h in rollout["batches"][0]["hooks"]][-1] == "cleanup"
    assert_released(slurm)
    assert {h.name: tcp_ecn(h) for h in (a, b)} == before


def test_a_job_that_outlasts_the_wait_stops_the_rollout_and_the_reservation_goes(cluster, tmp_path):
    fleet, slurm = cluster
    a, b = fleet.of_kind("sshd")
    before = {h.name: tcp_ecn(h) for h in (a, b)}
    blocker(tmp_path, slurm, a.name, 60)
    started = time.monotonic()
    code, report = apply(fleet, play_file(tmp_path, slurm, min_busbw=70, wait_seconds=2))
    assert time.monotonic() - started < 30
    assert code != 0
    [rollout] = report["rollouts"]
    assert sorted(rollout["not_started"]) == sorted([a.name, b.name])
    message = rollout["stopped"]["message"]
    assert rollout["stopped"]["kind"] == "hook-failed" and "nothing was written" in message
    [wait] = [h for h in rollout["batches"][0]["hooks"] if h["argv"][0] == "sh"]
    assert f"jobs still running on {a.name},{b.name} after 2 s:" in wait["output"]
    assert f"root RUNNING {a.name}" in wait["output"], wait["output"]
    assert not (tmp_path / "step").exists()
    assert [h["hook"] for h in rollout["batches"][0]["hooks"]][-1] == "cleanup"
    assert slurm.reservations() == ""
    assert slurm.run("squeue", "-h", "-n", "blocker", "-o", "%T").stdout.strip() == "RUNNING"  # left alone
    assert {h.name: tcp_ecn(h) for h in (a, b)} == before


def test_slurm_runs_nothing_on_a_drained_node(cluster):
    """Why the shipped playbook reserves rather than drains: the step the
    old playbook's gate asked for after its drain is never scheduled."""
    fleet, slurm = cluster
    a, b = fleet.of_kind("sshd")
    slurm.run("scontrol", "update", f"nodename={a.name},{b.name}", "state=drain", "reason=nictune-test")
    result = slurm.run("srun", "--immediate=3", f"--nodelist={a.name},{b.name}", "true", check=False)
    assert result.returncode != 0 and "Unable to allocate resources" in result.stderr, result.stderr


def test_a_node_whose_rollback_failed_is_drained_and_the_others_are_not(cluster, tmp_path):
    """The shipped after_batch and cleanup, as a rollout runs them after a
    batch whose rollback failed on one host (no lab host can be made to
    fail its rollback, so the outcomes are given)."""
    from nictune.control.rollout import hooks as hooklib
    from nictune.control.rollout.playbook import load_playbook

    fleet, slurm = cluster
    a, b = fleet.of_kind("sshd")
    [play] = load_playbook(play_file(tmp_path, slurm, min_busbw=70))
    names = [a.name, b.name]
    _, failed = hooklib.run_hooks(play.hooks, "before_batch", 1, names, rollout="R")
    assert failed is None and "ReservationName=nictune-R-1 " in slurm.reservations()
    outcomes = {a.name: "rollback-failed", b.name: "rolled-back"}
    _, failed = hooklib.run_hooks(play.hooks, "after_batch", 1, names, "health-gate", outcomes, "R")
    assert failed is None
    _, failed = hooklib.run_hooks(play.hooks, "cleanup", 1, names, "health-gate", outcomes, "R")
    assert failed is None and slurm.reservations() == ""
    states = slurm.node_states()
    assert states[a.name] in ("drained", "draining") and states[b.name] == "idle", states
    reason = slurm.run("sinfo", "-h", "-n", a.name, "-o", "%E").stdout.strip()
    assert reason == "nictune: rollback failed"
