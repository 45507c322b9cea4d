"""Playbooks: loading and its errors, serial batches (against Ansible's
documented examples and, when it is installed, ansible-playbook itself),
max_fail_percentage, and the staged rollout driven by a fake `run`.

The fake `run` stands in for the SSH transport: it answers host reports of
the shape of docs/reference/report-format.md from a per-host script of exit codes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import namedtuple

import pytest

from nictune.control.rollout.playbook import (Play, ProfileError, load_playbook, make_batches, play_profile,
                                      rollout, too_many_failed)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES = os.path.join(ROOT, "profiles")
PLAYBOOKS = os.path.join(ROOT, "playbooks")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def profile_dir(tmp_path):
    """Two small profiles in tmp_path/profiles: base.yaml and rails.yaml."""
    write(tmp_path, "profiles/base.yaml", """
        nictune: 1
        host:
          sysctl:
            net.ipv4.tcp_ecn: 1
            net.ipv4.tcp_mtu_probing: 1
        """)
    write(tmp_path, "profiles/rails.yaml", """
        nictune: 1
        extends: base.yaml
        interfaces:
          rails:
            match: {name: "ens*"}
            mtu: 9000
            channels: {combined: 8}
        """)


def load_error(tmp_path, text, name="pb.yaml"):
    path = write(tmp_path, name, text)
    with pytest.raises(ProfileError) as info:
        load_playbook(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(path)
    return info.value


# -- loading -------------------------------------------------------------------

def test_shipped_playbooks_load_and_resolve():
    for name, profile in [("connectx7-fleet.yaml", "connectx7-training.yaml"), ("maia-fleet.yaml", "maia-mana.yaml")]:
        (play,) = load_playbook(os.path.join(PLAYBOOKS, name))
        assert play.serial == [1, "10%", "100%"] and play.max_fail_percentage == 0
        assert play.profiles == [os.path.join(PROFILES, profile)]
        merged = play_profile(play)
        assert merged.doc["nictune"] == 1 and merged.files[-1] == os.path.join(PROFILES, profile)
    (lab,) = load_playbook(os.path.join(PLAYBOOKS, "lab-fleet.yaml"))
    assert lab.hosts == "fleet" and lab.profiles == [os.path.join(PROFILES, "lab-fleet.yaml")]


def test_play_fields_and_defaults(tmp_path):
    profile_dir(tmp_path)
    path = write(tmp_path, "playbooks/pb.yaml", """
        - hosts: [rack1, "rack2:!maint"]
          profile: [../profiles/base.yaml, ../profiles/rails.yaml]
          serial: 5
          max_fail_percentage: "12.5%"
          vars:
            nictune_state_dir: /var/lib/nictune-b
        - name: second
          hosts: all
          profile: ../profiles/base.yaml
        """)
    first, second = load_playbook(path)
    assert first.name == "rack1,rack2:!maint"
    assert first.hosts == "rack1,rack2,!maint"  # each item split on its own, as Ansible does
    assert first.profiles == [str(tmp_path / "profiles/base.yaml"), str(tmp_path / "profiles/rails.yaml")]
    assert first.serial == [5] and first.max_fail_percentage == 12.5
    assert first.source == f"{path}:1" and second.source == f"{path}:7"
    # Defaults: one batch, no failure tolerated.
    assert second.name == "second" and second.serial == ["100%"] and second.max_fail_percentage == 0
    assert second.overrides is None and second.vars == {}


@pytest.mark.parametrize("text, line, keypath, words", [
    ("- hosts: a\n  profile: p.yaml\n  gather_facts: false\n", 3, "[0]", "unknown key 'gather_facts'"),
    ("- hosts: a\n  serial: 2\n", 1, "[0]", "the required key 'profile' is missing"),
    ("- hosts: a\n  profile: p.yaml\n  serial: 0\n", 3, "[0].serial", "below the minimum 1"),
    ("- hosts: a\n  profile: p.yaml\n  serial: [1, \"10\"]\n", 3, "[0].serial[1]", "percentage"),
    ("- hosts: a\n  profile: p.yaml\n  serial: \"0%\"\n", 3, "[0].serial", "'0%' is not allowed"),
    ("- hosts: a\n  profile: p.yaml\n  serial: [1, \"150%\"]\n", 3, "[0].serial[1]", "'150%' is not allowed"),
    ("- hosts: a\n  profile: p.yaml\n  max_fail_percentage: 101\n", 3, "[0].max_fail_percentage", "above the maximum 100"),
    ("- hosts: a\n  profile: p.yaml\n  vars: {bad-name: 1}\n", 3, "[0].vars", "'bad-name' is not allowed as a key"),
    ("- hosts: a\n  profile: p.yaml\n  vars: {nictune: 3}\n", 3, "[0].vars.nictune", "expected a mapping"),
    ("- hosts: a\n  profile: p.yaml\n  vars:\n    nictune:\n      extends: x.yaml\n", 5,
     "[0].vars.nictune.extends", "extends cannot be overridden"),
    ("- hosts: \"a\\nb\"\n  profile: p.yaml\n", 1, "[0].hosts", "line break"),
    ("hosts: a\nprofile: p.yaml\n", 1, "", "must be a list of plays"),
    ("[]\n", 1, "", "a list of 0 items is not allowed"),
    ("- hosts: a\n  profile: p.yaml\n  serial: [1\n", 4, "", "invalid YAML"),
])
def test_errors_name_file_line_and_key(tmp_path, text, line, keypath, words):
    err = load_error(tmp_path, text)
    assert (err.line, err.keypath) == (line, keypath)
    assert words in err.message


def test_empty_and_missing_files(tmp_path):
    assert "is empty" in load_error(tmp_path, "# nothing\n").message
    with pytest.raises(ProfileError, match="no such file"):
        load_playbook(str(tmp_path / "absent.yaml"))


def test_missing_profile_is_named_at_the_play(tmp_path):
    path = write(tmp_path, "pb.yaml", "- hosts: a\n  profile:\n    - base.yaml\n    - nope.yaml\n")
    write(tmp_path, "base.yaml", "nictune: 1\n")
    (play,) = load_playbook(path)
    with pytest.raises(ProfileError) as info:
        play_profile(play)
    err = info.value
    assert (err.file, err.line, err.keypath) == (path, 4, "[0].profile[1]")
    assert "nope.yaml" in err.message and "no such file" in err.message


# -- the profile a host gets ----------------------------------------------------

def test_layers_profiles_then_inventory_then_play_vars(tmp_path):
    profile_dir(tmp_path)
    path = write(tmp_path, "pb.yaml", """
        - hosts: all
          profile: profiles/rails.yaml
          vars:
            nictune:
              interfaces:
                rails:
                  mtu: 4200
              host:
                sysctl:
                  drop: [net.ipv4.tcp_mtu_probing]
        """)
    (play,) = load_playbook(path)
    group = ({"interfaces": {"rails": {"mtu": 1500, "channels": {"combined": 16}}}}, "inv/group_vars/all.yml:3")
    host = ({"interfaces": {"rails": {"channels": {"combined": 32}}}}, "inv/host_vars/h1.yml:2")
    merged = play_profile(play, [group, host])
    rails = merged.doc["interfaces"]["rails"]
    assert rails["mtu"] == 4200                      # play vars win over the inventory
    assert rails["channels"] == {"combined": 32}     # host over group over profile
    assert rails["match"] == {"name": "ens*"}        # the rest stays the profile's
    assert merged.doc["host"]["sysctl"] == {"net.ipv4.tcp_ecn": 1}   # drop in an override
    assert merged.sources["interfaces/rails/mtu"] == f"{path}:7"
    assert merged.sources["interfaces/rails/channels/combined"] == "inv/host_vars/h1.yml:2"
    assert merged.sources["interfaces/rails/match"] == f"{tmp_path}/profiles/rails.yaml:5"
    # Without the inventory, the play vars alone.
    assert play_profile(play).doc["interfaces"]["rails"]["channels"] == {"combined": 8}


def test_bad_override_names_where_it_was_set(tmp_path):
    profile_dir(tmp_path)
    path = write(tmp_path, "pb.yaml", """
        - hosts: all
          profile: profiles/rails.yaml
          vars:
            nictune:
              interfaces:
                rails:
                  mtu: big
        """)
    (play,) = load_playbook(path)
    with pytest.raises(ProfileError) as info:
        play_profile(play)
    assert (info.value.file, info.value.line, info.value.keypath) == (path, 7, "interfaces.rails.mtu")
    (clean,) = load_playbook(write(tmp_path, "pb2.yaml", "- hosts: all\n  profile: profiles/rails.yaml\n"))
    with pytest.raises(ProfileError) as info:
        play_profile(clean, [({"host": {"sysctl": {"net.ipv4.tcp_ecn": "x y;z"}}}, "inv/hosts.ini:12")])
    assert (info.value.file, info.value.line) == ("inv/hosts.ini", 12)
    with pytest.raises(ProfileError, match="must be a mapping"):
        play_profile(clean, [([1, 2], "inv/hosts.ini:3")])
    with pytest.raises(ProfileError, match="cannot be set from an inventory"):
        play_profile(clean, [({"extends": "x.yaml"}, "inv/hosts.ini:3")])


# -- serial -> batches ------------------------------------------------------------

# (serial, number of hosts) -> batch sizes.  The first six are the examples
# of Ansible's "Setting the batch size with serial"; the rest are edges of
# its arithmetic (utils/helpers.pct_to_int: int(pct / 100.0 * n) or 1).
BATCHES = [
    ([3], 6, [3, 3]),
    ([3], 7, [3, 3, 1]),
    (["30%"], 10, [3, 3, 3, 1]),
    ([1, 5, 10], 20, [1, 5, 10, 4]),
    (["10%", "20%", "100%"], 20, [2, 4, 14]),
    ([1, "10%", "100%"], 25, [1, 2, 22]),
    (["29%"], 100, [28, 28, 28, 16]),      # float rounding, as Ansible does it
    (["1%"], 5, [1, 1, 1, 1, 1]),          # less than one host: one host
    (["50%", 1], 4, [2, 1, 1]),            # the last value repeats
    ([10], 3, [3]),
    (["100%"], 1, [1]),
    ([1, "10%", "100%"], 1, [1]),
    ([2], 0, []),
]


@pytest.mark.parametrize("serial, count, sizes", BATCHES)
def test_batches(serial, count, sizes):
    hosts = [f"h{i:03d}" for i in range(count)]
    batches = make_batches(serial, hosts)
    assert [len(b) for b in batches] == sizes
    assert [h for b in batches for h in b] == hosts  # every host once, in order


def test_batches_match_ansible_playbook(tmp_path):
    """ansible-playbook itself, on an inventory of fake hosts that are never
    contacted (connection: local, a run_once debug task per batch printing
    ansible_play_batch)."""
    # The venv's own first: that is where the test extra installs it.
    ansible = shutil.which("ansible-playbook", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if not ansible:
        pytest.skip("ansible-playbook is not installed")
    inventory, plays = [], []
    for index, (serial, count, _) in enumerate(BATCHES):
        if count == 0:
            continue  # Ansible skips a play that matches no host
        inventory.append(f"[g{index}]")
        inventory.extend(f"g{index}h{i:03d}" for i in range(count))
        plays.append({"hosts": f"g{index}", "gather_facts": False, "connection": "local", "serial": serial,
                      "tasks": [{"debug": {"msg": f"BATCH {index} {{{{ ansible_play_batch | join(',') }}}}"},
                                 "run_once": True}]})
    (tmp_path / "hosts.ini").write_text("\n".join(inventory) + "\n")
    (tmp_path / "pb.yaml").write_text(json.dumps(plays))  # JSON is YAML
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / "ansible"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_LOCALHOST_WARNING="0")
    out = subprocess.run([ansible, "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "pb.yaml")],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    seen: dict = {}
    for index, hosts in re.findall(r'"msg": "BATCH (\d+) ([^"]*)"', out.stdout):
        seen.setdefault(int(index), []).append(hosts.split(","))
    for index, (serial, count, _) in enumerate(BATCHES):
        if count:
            hosts = [f"g{index}h{i:03d}" for i in range(count)]
            assert make_batches(serial, hosts) == seen[index], (serial, count)


# -- max_fail_percentage ---------------------------------------------------------

@pytest.mark.parametrize("failed, size, pct, stops", [
    (0, 4, 0, False),
    (1, 4, 0, True),      # nictune's default: any failure stops
    (1, 4, 25, False),    # 25% is not greater than 25%
    (2, 4, 49, True),     # Ansible's doc: to stop at 2 of 4, set 49, not 50
    (2, 4, 50, False),
    (4, 4, 100, True),    # a batch that failed whole always stops
    (3, 4, 100, False),
    (1, 3, 33, True),     # 33.3% > 33%
    (1, 3, 33.4, False),
    (0, 0, 0, False),
])
def test_max_fail_percentage(failed, size, pct, stops):
    assert too_many_failed(failed, size, pct) is stops


# -- the rollout ---------------------------------------------------------------------

class FakeFleet:
    """Answers run(command, hosts) from a script: exit code per (command,
    host), 0 by default; records every call.  apply reports changed=True
    unless the host is in `unchanged`."""

    def __init__(self, apply=None, verify=None, rollback=None, unchanged=(), silent=()):
        self.codes = {"apply": apply or {}, "verify": verify or {}, "rollback": rollback or {}}
        self.unchanged, self.silent = set(unchanged), set(silent)
        self.calls = []

    def __call__(self, command, hosts):
        names = [h if isinstance(h, str) else h.name for h in hosts]
        self.calls.append((command, names))
        reports = []
        for n in names:
            if n in self.silent:
                continue
            code = self.codes[command].get(n, 0)
            error = None if code in (0, 2) else {"kind": {3: "rolled-back", 4: "rollback-failed"}.get(code, "transport"),
                                                 "message": f"{command} failed on {n}"}
            reports.append({"host": n, "command": command, "ok": code == 0, "exit_code": code,
                            "changed": command != "verify" and code in (0, 4) and n not in self.unchanged,
                            "changes": [], "warnings": [], "error": error})
        return reports


def play(serial, mfp=0.0):
    return Play(name="test", hosts="all", profiles=[], vars={}, serial=serial, max_fail_percentage=mfp,
                source="pb.yaml:1")


HOSTS = [f"h{i}" for i in range(10)]


def test_all_good():
    fleet, seen = FakeFleet(), []
    report = rollout(play([1, "30%"]), HOSTS, fleet, on_batch=seen.append)
    assert report["batch_sizes"] == [1, 3, 3, 3] and len(seen) == 4
    assert fleet.calls[:4] == [("apply", ["h0"]), ("verify", ["h0"]), ("apply", ["h1", "h2", "h3"]),
                               ("verify", ["h1", "h2", "h3"])]
    assert [c for c, _ in fleet.calls].count("rollback") == 0
    assert report["kept"] == HOSTS and report["stopped"] is None
    assert report["rolled_back"] == report["not_started"] == report["failed"] == []
    assert report["exit_code"] == 0 and report["result"] == "done: 10 of 10 hosts kept"
    assert [b["result"] for b in seen] == ["passed the health gate"] * 4
    assert seen[0]["verify"][0]["command"] == "verify" and seen[0]["rollback"] == []


@pytest.mark.parametrize("code, listed, exit_code", [(3, "rolled_back", 3), (1, "failed", 1), (4, "rollback_failed", 4)])
def test_canary_fails_apply_and_nothing_else_is_touched(code, listed, exit_code):
    fleet = FakeFleet(apply={"h0": code})
    report = rollout(play([1, "30%"]), HOSTS, fleet)
    assert fleet.calls == [("apply", ["h0"])]
    assert report[listed] == ["h0"] and report["not_started"] == HOSTS[1:]
    assert report["kept"] == [] and report["stopped"]["batch"] == 1
    assert report["exit_code"] == exit_code


def test_second_batch_fails_the_health_gate():
    fleet = FakeFleet(verify={"h2": 2})
    report = rollout(play([1, "30%"]), HOSTS, fleet)
    assert fleet.calls == [("apply", ["h0"]), ("verify", ["h0"]), ("apply", ["h1", "h2", "h3"]),
                           ("verify", ["h1", "h2", "h3"]), ("rollback", ["h1", "h2", "h3"])]
    assert report["kept"] == ["h0"]
    assert report["rolled_back"] == ["h1", "h2", "h3"]
    assert report["not_started"] == HOSTS[4:]
    assert report["stopped"]["kind"] == "health-gate" and "h2 (drift)" in report["stopped"]["message"]
    assert report["exit_code"] == 3
    second = report["batches"][1]
    assert second["number"] == 2 and second["hosts"] == ["h1", "h2", "h3"]
    assert second["outcomes"] == {"h1": "rolled-back", "h2": "rolled-back", "h3": "rolled-back"}
    assert [r["command"] for r in second["reports"]] == ["apply"] * 3
    assert [r["exit_code"] for r in second["verify"]] == [0, 2, 0]
    assert [r["host"] for r in second["rollback"]] == ["h1", "h2", "h3"]
    assert second["result"] == report["stopped"]["message"] and report["result"].startswith("stopped: batch 2")


def test_a_rollback_that_fails_is_exit_4():
    fleet = FakeFleet(verify={"h1": 1}, rollback={"h3": 4})
    report = rollout(play([1, "30%"]), HOSTS, fleet)
    assert report["rolled_back"] == ["h1", "h2"] and report["rollback_failed"] == ["h3"]
    assert report["kept"] == ["h0"] and report["exit_code"] == 4
    assert "h1 (transport)" in report["stopped"]["message"]


def test_unchanged_hosts_are_not_rolled_back():
    # Their journal belongs to the apply before: rolling back would undo that.
    fleet = FakeFleet(verify={"h3": 2}, unchanged={"h2"})
    report = rollout(play([1, "30%"]), HOSTS, fleet)
    assert fleet.calls[-1] == ("rollback", ["h1", "h3"])
    assert report["unchanged"] == ["h2"] and report["rolled_back"] == ["h1", "h3"]


def test_tolerated_failures_go_on_and_skip_the_gate_for_failed_hosts():
    fleet = FakeFleet(apply={"h1": 3})
    report = rollout(play([1, 4], mfp=25), HOSTS[:9], fleet)   # batches 1, 4, 4
    assert ("verify", ["h2", "h3", "h4"]) in fleet.calls       # h1 failed: not gated
    assert report["stopped"] is None and report["not_started"] == []
    assert report["rolled_back"] == ["h1"] and len(report["kept"]) == 8
    assert report["exit_code"] == 3   # the most serious outcome: a host was rolled back


def test_more_failures_than_tolerated_stop_and_roll_back_the_rest_of_the_batch():
    fleet = FakeFleet(apply={"h1": 3, "h2": 1})
    report = rollout(play([1, 4], mfp=25), HOSTS[:9], fleet)
    assert fleet.calls[-1] == ("rollback", ["h3", "h4"])
    assert "verify" not in [c for c, names in fleet.calls if "h3" in names]
    assert report["stopped"]["kind"] == "max-fail"
    assert "2 of 4 hosts failed to apply (50%, more than max_fail_percentage 25)" in report["stopped"]["message"]
    assert report["failed"] == ["h2"] and report["rolled_back"] == ["h1", "h3", "h4"]
    assert report["not_started"] == HOSTS[5:9]


def test_a_stranded_host_stops_whatever_the_tolerance():
    fleet = FakeFleet(apply={"h2": 4})
    report = rollout(play([1, 4], mfp=100), HOSTS[:9], fleet)
    assert report["stopped"]["kind"] == "rollback-failed"
    assert report["rollback_failed"] == ["h2"] and report["exit_code"] == 4
    assert fleet.calls[-1] == ("rollback", ["h1", "h3", "h4"])


def test_a_whole_failed_batch_stops_even_at_100_percent():
    fleet = FakeFleet(apply={"h1": 1, "h2": 1})
    report = rollout(play([1, 2], mfp=100), HOSTS[:5], fleet)
    assert report["stopped"]["message"] == "batch 2: every host failed to apply (h1, h2)"
    assert report["not_started"] == ["h3", "h4"] and report["exit_code"] == 1


def test_a_host_without_a_report_counts_as_failed():
    fleet = FakeFleet(silent={"h0"})
    report = rollout(play([1, "100%"]), HOSTS[:3], fleet)
    assert report["failed"] == ["h0"] and report["not_started"] == ["h1", "h2"]
    (apply,) = report["batches"][0]["reports"]
    assert apply["error"]["kind"] == "transport" and "no apply report" in apply["error"]["message"]


def test_inventory_host_objects_are_passed_through():
    Host = namedtuple("Host", "name address")
    hosts = [Host(f"n{i}", f"198.18.0.{i + 1}") for i in range(3)]
    received = []

    def run(command, batch):
        received.append(batch)
        return FakeFleet()(command, batch)

    report = rollout(play([1, "100%"]), hosts, run)
    assert received[0] == [hosts[0]] and report["kept"] == ["n0", "n1", "n2"]
