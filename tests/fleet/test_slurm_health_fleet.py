"""`nictune slurm-health` against a REAL Slurm (tests/fleet/slurm_lab.py:
slurmctld, a slurmd per namespace host, munge) on the sshd fleet.

Each check runs as Slurm's HealthCheckProgram would on the node: the CLI
inside the node's network namespace (`ip netns exec`), its own state
directory, SLURM_CONF pointing at the lab's slurmctld.  The drift is a real
sysctl of the namespace (net.ipv4.tcp_ecn, which the profile wants 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fleet_helpers import ECN_PROFILE

from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

NICTUNE = os.path.join(os.path.dirname(sys.executable), "nictune")
REASON = "nictune: sysctl net.ipv4.tcp_ecn 2 != 1"


@pytest.fixture
def cluster(slurm_cluster):
    """tests/fleet/conftest.py's Slurm over two sshd hosts, this module's."""
    return slurm_cluster


@pytest.fixture
def nodes(cluster, tmp_path):
    """The two nodes, both clean (tcp_ecn 1) and idle; idle again after."""
    fleet, slurm = cluster
    a, b = fleet.of_kind("sshd")
    (tmp_path / "p.yaml").write_text(ECN_PROFILE)
    for h in (a, b):
        run_in(h, ["sysctl", "-qw", "net.ipv4.tcp_ecn=1"])
    try:
        yield a, b
    finally:
        slurm.run("scontrol", "update", f"nodename={a.name},{b.name}", "state=resume", check=False)
        for h in (a, b):
            run_in(h, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2"])


def health(cluster, tmp_path, host, *extra: str) -> tuple:
    """The check on `host` as Slurm runs it there; (exit code, outcome)."""
    _, slurm = cluster
    state_dir = tmp_path / f"state-{host.name}"
    argv = ["ip", "netns", "exec", host.netns, NICTUNE, "slurm-health", str(tmp_path / "p.yaml"),
            "--node", host.name, "--state-dir", str(state_dir), "--json", *extra]
    result = subprocess.run(argv, capture_output=True, text=True, env=slurm.env, timeout=60)
    try:
        return result.returncode, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.returncode}: {result.stdout}{result.stderr}")


def drift(host) -> None:
    run_in(host, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2"])


def idle(slurm, node: str) -> bool:
    """The node's state without the flags sinfo appends ("idle*": slurmctld
    has not heard from slurmd since the resume; its next ping clears it)."""
    return slurm.node_states()[node].rstrip("*~#") == "idle"


def reason(slurm, node: str) -> str:
    return slurm.run("sinfo", "-h", "-n", node, "-o", "%E").stdout.strip()


def test_a_drifted_node_is_drained_with_the_setting_and_a_clean_one_is_not(cluster, nodes, tmp_path):
    _, slurm = cluster
    a, b = nodes
    drift(a)
    code, outcome = health(cluster, tmp_path, a, "--max-drained", "50")
    assert (code, outcome["action"], outcome["via"]) == (1, "drained", "local"), outcome
    code, clean = health(cluster, tmp_path, b, "--max-drained", "50")
    assert (code, clean["action"]) == (0, "clean"), clean
    states = slurm.node_states()
    assert states[a.name] in ("drained", "draining") and idle(slurm, b.name), states
    assert reason(slurm, a.name) == REASON


def test_a_fixed_node_is_resumed(cluster, nodes, tmp_path):
    _, slurm = cluster
    a, _ = nodes
    drift(a)
    assert health(cluster, tmp_path, a)[0] == 1
    assert health(cluster, tmp_path, a)[1]["message"] == "already"  # drained once, not again
    run_in(a, ["sysctl", "-qw", "net.ipv4.tcp_ecn=1"])
    code, outcome = health(cluster, tmp_path, a)
    assert (code, outcome["action"], outcome["reason"]) == (0, "resumed", REASON), outcome
    assert idle(slurm, a.name)


def test_a_node_someone_else_drained_is_never_resumed_nor_its_reason_replaced(cluster, nodes, tmp_path):
    _, slurm = cluster
    a, b = nodes
    slurm.run("scontrol", "update", f"nodename={a.name}", "state=drain", "reason=disk replacement")
    # nictune's own words, but not drained by this node's nictune (no record of it)
    slurm.run("scontrol", "update", f"nodename={b.name}", "state=drain", f"reason={REASON}")
    code, outcome = health(cluster, tmp_path, a)
    assert (code, outcome["action"]) == (0, "left"), outcome
    assert health(cluster, tmp_path, b)[1]["action"] == "left"
    drift(a)
    assert health(cluster, tmp_path, a)[1]["action"] == "left"
    assert reason(slurm, a.name) == "disk replacement" and reason(slurm, b.name) == REASON
    states = slurm.node_states()
    assert states[a.name] in ("drained", "draining") and states[b.name] in ("drained", "draining"), states


def test_the_same_drift_everywhere_is_a_storm_and_drains_no_more_than_the_threshold(cluster, nodes, tmp_path):
    _, slurm = cluster
    a, b = nodes
    drift(a)
    drift(b)
    assert health(cluster, tmp_path, a, "--max-drained", "50")[1]["action"] == "drained"
    code, outcome = health(cluster, tmp_path, b, "--max-drained", "50")
    assert (code, outcome["action"], outcome["reason"]) == (0, "storm", REASON), outcome
    assert "reported before" not in outcome["message"]
    again = health(cluster, tmp_path, b, "--max-drained", "50")[1]
    assert again["action"] == "storm" and "reported before" in again["message"]
    assert idle(slurm, b.name)
    # the operator's threshold decides: at 100 % the second node drains too
    assert health(cluster, tmp_path, b, "--max-drained", "100")[1]["action"] == "drained"


def test_a_check_over_its_budget_drains_nothing(cluster, nodes, tmp_path):
    _, slurm = cluster
    a, _ = nodes
    drift(a)
    code, outcome = health(cluster, tmp_path, a, "--budget", "0.001")
    assert (code, outcome["action"]) == (2, "failed") and "budget of 0.001 s" in outcome["message"], outcome
    assert idle(slurm, a.name)


def start_resident(host, state_dir) -> subprocess.Popen:
    """The resident agent on `host` as agent install leaves it: run from its
    archive at <state dir>/resident/nictune-agent.pyz, its socket in the
    state directory (host/resident/daemon.py)."""
    from nictune.control.remote import agentzip

    os.makedirs(os.path.join(state_dir, "resident"), mode=0o700)
    archive = os.path.join(state_dir, "resident", "nictune-agent.pyz")
    with open(archive, "wb") as f:
        f.write(agentzip.build().data)
    proc = subprocess.Popen(["ip", "netns", "exec", host.netns, "env", "-i", f"PYTHONPATH={archive}", sys.executable,
                             "-s", "-S", "-m", "nictune.host.resident", "--state-dir", str(state_dir),
                             "--interval", "600", "--metrics-address", ""],
                            cwd=state_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(state_dir, "agent.sock")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the resident agent made no socket"
        time.sleep(0.05)
    return proc


def test_the_check_asks_the_resident_agent_when_it_runs(cluster, nodes, tmp_path):
    _, slurm = cluster
    a, _ = nodes
    state_dir = tmp_path / f"state-{a.name}"
    state_dir.mkdir(mode=0o700)
    proc = start_resident(a, str(state_dir))
    try:
        drift(a)  # after the agent started: the socket's answer is a fresh read
        code, outcome = health(cluster, tmp_path, a)
        assert (code, outcome["action"], outcome["via"], outcome["reason"]) == (1, "drained", "resident", REASON), outcome
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
