"""The Ansible collection (ansible_collections/nictune/network) run by the REAL
ansible-playbook (ansible-core, in the venv) against the sshd fleet lab: the
collection's example playbook and role, mapping the inventory's groups
(canary, rest) to profiles, through Ansible's own SSH connection."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
from fleet_helpers import ECN_PROFILE, nictune, running_fleet, tcp_ecn

from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
# The second group's profile also asks a macvlan for an MTU its lower device
# (rail0, 1500) cannot carry: the kernel refuses it mid-apply.
REFUSED = ECN_PROFILE + "interfaces:\n  stacked:\n    match: {name: railmv}\n    mtu: 9500\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with running_fleet(tmp_path_factory, 2) as f:
        yield f


@pytest.fixture(autouse=True)
def kernel_default(fleet):
    for h in fleet.of_kind("sshd"):
        run_in(h, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2"])
    yield
    for h in fleet.of_kind("sshd"):
        run_in(h, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2"])
        run_in(h, ["ip", "link", "del", "railmv"])  # never raises


def site(tmp_path, rest_profile: str = ECN_PROFILE) -> str:
    """A playbook of the collection's role: canary and rest to their profiles."""
    (tmp_path / "canary.yaml").write_text(ECN_PROFILE)
    (tmp_path / "rest.yaml").write_text(rest_profile)
    (tmp_path / "site.yml").write_text(
        "- hosts: fleet\n  gather_facts: false\n  roles:\n    - role: nictune.network.profiles\n"
        "      vars:\n        nictune_profiles:\n"
        f"          - {{group: canary, profile: {tmp_path}/canary.yaml}}\n"
        f"          - {{group: rest, profile: {tmp_path}/rest.yaml}}\n")
    return str(tmp_path / "site.yml")


RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def ansible(fleet, playbook: str, *args: str) -> tuple:
    """(exit code, {host: the module's result}, {host: recap counts}) of a
    real ansible-playbook run.  The module's result per host is what
    ansible-core's own tree callback writes (the role's last task)."""
    tree = tempfile.mkdtemp(dir=fleet.dir)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": ROOT,
           "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree", "ANSIBLE_CALLBACK_TREE_DIR": tree,
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
           "ANSIBLE_LOCAL_TEMP": os.path.join(fleet.dir, "ansible-tmp")}
    result = subprocess.run([PLAYBOOK, "-i", fleet.inventory, playbook, *args], capture_output=True, text=True,
                            env=env, timeout=300)
    stats = {m[0]: {"changed": int(m[2]), "failures": int(m[4])} for m in RECAP.findall(result.stdout)}
    if len(stats) != 2:
        raise AssertionError(f"exit {result.returncode}: {result.stdout[-3000:]}{result.stderr[-3000:]}")
    hosts = {name: json.load(open(os.path.join(tree, name))) for name in os.listdir(tree)}
    return result.returncode, hosts, stats, result.stdout


def changes_of(host_result: dict) -> list:
    return sorted((c["key"]["family"], c["key"]["name"], c["before"], c["after"])
                  for c in host_result["report"]["changes"] if c["status"] not in ("ok", "unchanged"))


def test_check_diff_is_the_plan_a_run_applies_and_a_second_changes_nothing(fleet, tmp_path):
    a, b = fleet.of_kind("sshd")
    playbook = site(tmp_path)
    code, hosts, stats, out = ansible(fleet, playbook, "--check", "--diff")
    assert code == 0, hosts
    _, plan = nictune("plan", str(tmp_path / "canary.yaml"), "-i", fleet.inventory, "--ssh-config", fleet.ssh_config)
    planned = {h["host"]: sorted((c["key"]["family"], c["key"]["name"], c["before"], c["after"])
                                 for c in h["changes"] if c["status"] not in ("ok", "unchanged")) for h in plan["hosts"]}
    assert len(planned) == 2 and planned[a.name] == [("sysctl", "net.ipv4.tcp_ecn", 2, 1)], planned
    for h in (a, b):
        assert hosts[h.name]["changed"] and changes_of(hosts[h.name]) == planned[h.name]
        assert tcp_ecn(h) == "2"  # check mode wrote nothing
    # Ansible's diff, as the default callback prints it for each host
    diff = "--- before: host\n+++ after: profile\n@@ -1 +1 @@\n-sysctl net.ipv4.tcp_ecn = 2\n+sysctl net.ipv4.tcp_ecn = 1\n"
    assert out.count(diff) == 2, out
    code, hosts, stats, _ = ansible(fleet, playbook)
    assert code == 0 and {h: s["changed"] for h, s in stats.items()} == {a.name: 1, b.name: 1}, stats
    assert {tcp_ecn(h) for h in (a, b)} == {"1"}
    code, hosts, stats, _ = ansible(fleet, playbook)
    assert code == 0 and {h: s["changed"] for h, s in stats.items()} == {a.name: 0, b.name: 0}, stats


def test_a_refused_setting_fails_the_host_and_it_is_rolled_back(fleet, tmp_path):
    a, b = fleet.of_kind("sshd")
    run_in(b, ["ip", "link", "set", "rail0", "mtu", "1500"])
    run_in(b, ["ip", "link", "add", "link", "rail0", "name", "railmv", "type", "macvlan"])
    code, hosts, stats, _ = ansible(fleet, site(tmp_path, REFUSED))
    assert code != 0
    assert stats[a.name]["failures"] == 0 and tcp_ecn(a) == "1"
    failed = hosts[b.name]
    assert stats[b.name]["failures"] == 1 and failed["rolled_back"], {k: v for k, v in failed["report"].items() if k != "changes"}
    assert failed["report"]["error"]["kind"] == "rolled-back", failed["report"]["error"]
    assert tcp_ecn(b) == "2"  # written, then rolled back


def test_the_verify_form_reports_drift(fleet, tmp_path):
    a, b = fleet.of_kind("sshd")
    playbook = site(tmp_path)
    assert ansible(fleet, playbook)[0] == 0
    run_in(b, ["sysctl", "-qw", "net.ipv4.tcp_ecn=0"])  # drift behind nictune's back
    code, hosts, stats, _ = ansible(fleet, playbook, "-e", "nictune_state=verified", "--diff")
    assert code != 0 and stats[a.name]["failures"] == 0 and stats[b.name]["failures"] == 1, stats
    assert not hosts[b.name]["changed"]
    assert hosts[b.name]["changes"] == ["sysctl net.ipv4.tcp_ecn: 0 -> 1 (drift)"], hosts[b.name]
    assert tcp_ecn(b) == "0"  # verify wrote nothing


def test_the_rollback_form_restores_the_last_apply(fleet, tmp_path):
    a, b = fleet.of_kind("sshd")
    playbook = site(tmp_path)
    assert ansible(fleet, playbook)[0] == 0 and {tcp_ecn(h) for h in (a, b)} == {"1"}
    code, hosts, stats, _ = ansible(fleet, playbook, "-e", "nictune_state=rolled_back")
    assert code == 0 and {h: s["changed"] for h, s in stats.items()} == {a.name: 1, b.name: 1}, stats
    assert hosts[a.name]["report"]["command"] == "rollback" and hosts[a.name]["report"]["rolled_back"], hosts[a.name]
    assert {tcp_ecn(h) for h in (a, b)} == {"2"}


def test_the_logged_invocation_carries_neither_the_profile_document_nor_the_agent(fleet, tmp_path):
    _, _, _, out = ansible(fleet, site(tmp_path), "--check", "-vvv")  # -vvv: the default callback shows invocation
    assert out.count('"invocation": {') >= 2, out[-3000:]  # the module's raw answer and the shown result
    assert "nictune_request" not in out and "UEsDB" not in out  # the request; a zip's base64 start
