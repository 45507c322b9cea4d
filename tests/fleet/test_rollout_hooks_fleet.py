"""Drain hooks and require_drain on the sshd fleet: real hosts over SSH,
real plans (the `disruptive` mark comes from the host's own link family),
real hook processes on the controller.  What was written is read back
with `ip` inside each namespace, never through nictune.
"""

from __future__ import annotations

import json
import sys

import pytest
from fleet_helpers import mtu, nictune, profile_file

from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

# rail1 up -> down: the link family marks it "the link goes down" (knobs/link.py disruptive).
DISRUPTIVE = """\
nictune: 1
interfaces:
  rail0:
    match: {name: rail0}
    mtu: 9000
  rail1:
    match: {name: rail1}
    state: down
"""

HOOK = """\
import sys
log, host = sys.argv[1], sys.argv[2]
open(log, "a").write(sys.argv[3] + " " + host + "\\n")
sys.exit(1 if host == sys.argv[4] else 0)
"""


def state(host, ifname="rail1") -> str:
    return json.loads(run_in(host, ["ip", "-j", "link", "show", ifname]).stdout)[0]["operstate"]


def _playbook(tmp_path, profile, hooks=""):
    path = tmp_path / "drained.yaml"
    path.write_text(f"- name: drained\n  hosts: fleet\n  profile: {profile}\n  serial: 1\n"
                    f"  require_drain: true\n{hooks}")
    return str(path)


def _hosts(fleet):
    hosts = fleet.of_kind("sshd")
    for h in hosts:
        run_in(h, ["ip", "link", "set", "rail0", "mtu", "1500"])
    return hosts


def test_require_drain_refuses_a_disruptive_plan_without_a_hook(make_fleet, tmp_path):
    fleet = make_fleet(2)
    hosts = _hosts(fleet)
    profile = profile_file(tmp_path, DISRUPTIVE, "down.yaml")
    code, report = nictune("apply", _playbook(tmp_path, profile), "-i", fleet.inventory)
    assert code == 1, json.dumps(report, indent=1)
    (rollout,) = report["rollouts"]
    assert rollout["stopped"]["kind"] == "drain-required"
    assert "link rail1 state" in rollout["stopped"]["message"] and "drained.yaml:5" in rollout["stopped"]["message"]
    assert rollout["not_started"] == [h.name for h in hosts] and rollout["batches"] == []
    assert [mtu(h) for h in hosts] == [1500, 1500] and {state(h) for h in hosts} != {"DOWN"}


def test_a_failing_drain_hook_stops_with_nothing_written_there(make_fleet, tmp_path):
    fleet = make_fleet(3)
    hosts = _hosts(fleet)
    script = tmp_path / "drain.py"
    script.write_text(HOOK)
    log = tmp_path / "hooks.log"
    drain = json.dumps([sys.executable, str(script), str(log), "{host}", "drain", hosts[1].name])
    resume = json.dumps([sys.executable, str(script), str(log), "{host}", "resume", "none"])
    playbook = _playbook(tmp_path, profile_file(tmp_path, DISRUPTIVE, "down.yaml"),
                         f"  hooks:\n    before_batch: {drain}\n    after_batch: {resume}\n")
    code, report = nictune("apply", playbook, "-i", fleet.inventory)
    (rollout,) = report["rollouts"]
    assert code == 1 and rollout["stopped"]["kind"] == "hook-failed", json.dumps(rollout, indent=1)
    assert rollout["drain_check"]["drained"] and rollout["drain_check"]["disruptive"]
    assert rollout["kept"] == [hosts[0].name]
    assert rollout["not_started"] == [hosts[1].name, hosts[2].name]
    assert log.read_text().splitlines() == [f"drain {hosts[0].name}", f"resume {hosts[0].name}",
                                            f"drain {hosts[1].name}"]
    assert mtu(hosts[0]) == 9000 and state(hosts[0]) == "DOWN"      # the first batch was applied
    assert mtu(hosts[1]) == 1500 and mtu(hosts[2]) == 1500          # nothing written after the failed hook
    assert state(hosts[1]) != "DOWN" and state(hosts[2]) != "DOWN"
