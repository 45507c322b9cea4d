"""The traffic gate's place in a rollout (control/rollout/playbook.py), not its
measurements (control/rollout/gate/): when the gate runs, what a failed,
broken or missing gate does to the batch, and how its results reach the
rollout report, the human printer, JUnit and the CLI's gate seam
(cli/fleet_cmds.py _gate_for).

The fleet is the fake `run` of test_playbook.py; the gate is a recording
callable that answers as control/rollout/playbook.py's Gate says.
"""

from __future__ import annotations

import json
import sys
import textwrap
from xml.etree import ElementTree

import pytest

from nictune.cli import fleet_cmds
from nictune.cli.options import Options
from nictune.cli.output import Printer, envelope
from nictune.control.review import audit_formats
from nictune.control.rollout.playbook import ProfileError, load_playbook, rollout

from .test_playbook import FakeFleet

HOSTS = [f"h{i}" for i in range(6)]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def gate_playbook(tmp_path, gate="gate: {rails: [rail0], iperf3: {min_gbps: 10}}", hooks="", serial="[1, 2]"):
    write(tmp_path, "p.yaml", "nictune: 1\nhost: {sysctl: {net.ipv4.tcp_ecn: 1}}\n")
    return write(tmp_path, "pb.yaml", f"- name: gated\n  hosts: all\n  profile: p.yaml\n  serial: {serial}\n"
                                      f"  {gate}\n{hooks}")


def row(client, server, rail, passed, why=""):
    return {"client": client, "server": server, "rail": rail, "tool": "iperf3",
            "figures": {"gbps": 42.0 if passed else 3.1}, "passed": passed, "why": why}


class Gate:
    """Records its calls in a shared log; fails the batches in `fail`."""

    def __init__(self, log, fail=(), answer=None):
        self.log, self.fail, self.answer = log, set(fail), answer

    def __call__(self, number, hosts):
        names = [h if isinstance(h, str) else h.name for h in hosts]
        self.log.append(("gate", number, names))
        if self.answer is not None:
            return self.answer(number, names)
        if number in self.fail:
            return {"passed": False, "message": "1 of 2 pairs below the floor",
                    "results": [row(names[0], names[-1], "rail0", True),
                                row(names[-1], names[0], "rail1", False, "3.1 Gbit/s, below min_gbps 10")]}
        return {"passed": True, "message": f"{len(names)} host(s) passed", "results": [row(names[0], "peer", "rail0", True)]}


def logged(log, **kw):
    fleet = FakeFleet(**kw)

    def run(command, hosts):
        log.append((command, [h if isinstance(h, str) else h.name for h in hosts]))
        return fleet(command, hosts)
    return run


def test_the_gate_runs_after_verify_on_each_batch(tmp_path):
    (play,) = load_playbook(gate_playbook(tmp_path))
    assert play.gate == {"rails": ["rail0"], "iperf3": {"min_gbps": 10}} and play.gate_source.endswith("pb.yaml:5")
    log = []
    report = rollout(play, HOSTS[:3], logged(log), gate=Gate(log))
    assert log == [("apply", ["h0"]), ("verify", ["h0"]), ("gate", 1, ["h0"]),
                   ("apply", ["h1", "h2"]), ("verify", ["h1", "h2"]), ("gate", 2, ["h1", "h2"])]
    assert report["kept"] == HOSTS[:3] and report["exit_code"] == 0 and report["gate"] == play.gate_source
    first = report["batches"][0]
    assert first["result"] == "passed the health gate and the traffic gate"
    assert first["gate"]["passed"] and first["gate"]["results"][0]["figures"] == {"gbps": 42.0}
    assert first["gate"]["seconds"] >= 0


def test_a_failing_gate_rolls_the_batch_back_and_stops(tmp_path):
    (play,) = load_playbook(gate_playbook(tmp_path))
    log = []
    report = rollout(play, HOSTS, logged(log), gate=Gate(log, fail={2}))
    assert log[3:] == [("apply", ["h1", "h2"]), ("verify", ["h1", "h2"]), ("gate", 2, ["h1", "h2"]),
                       ("rollback", ["h1", "h2"])]
    assert report["kept"] == ["h0"] and report["rolled_back"] == ["h1", "h2"]
    assert report["not_started"] == HOSTS[3:] and report["exit_code"] == 3
    stop = report["stopped"]
    assert stop["kind"] == "traffic-gate" and stop["batch"] == 2
    assert stop["message"] == ("batch 2: the traffic gate did not pass: h2 -> h1 on rail1 "
                               "(iperf3: 3.1 Gbit/s, below min_gbps 10)")
    second = report["batches"][1]
    assert second["outcomes"] == {"h1": "rolled-back", "h2": "rolled-back"}
    assert [r["host"] for r in second["rollback"]] == ["h1", "h2"] and not second["gate"]["passed"]


@pytest.mark.parametrize("answer, words", [
    (lambda n, names: 1 / 0, "the gate failed: ZeroDivisionError: division by zero"),
    (lambda n, names: None, "the gate gave no passed: true/false (NoneType)"),
    (lambda n, names: {"passed": "yes"}, "the gate gave no passed: true/false (dict)"),
    (lambda n, names: {"passed": False, "message": "iperf3 \x1b[2J server did not start", "results": "x"},
     "iperf3 \\x1b[2J server did not start"),
])
def test_a_broken_gate_is_a_failed_gate(tmp_path, answer, words):
    (play,) = load_playbook(gate_playbook(tmp_path))
    log = []
    report = rollout(play, HOSTS[:3], logged(log), gate=Gate(log, answer=answer))
    assert log[-1] == ("rollback", ["h0"]) and report["rolled_back"] == ["h0"]
    assert report["stopped"]["kind"] == "traffic-gate" and words in report["stopped"]["message"]
    assert report["batches"][0]["gate"]["results"] == []


def test_no_gate_key_no_gate(tmp_path):
    (play,) = load_playbook(gate_playbook(tmp_path, gate="max_fail_percentage: 0"))
    log = []
    report = rollout(play, HOSTS[:3], logged(log), gate=Gate(log))
    assert [e for e in log if e[0] == "gate"] == [] and report["kept"] == HOSTS[:3]
    assert report["batches"][0]["gate"] is None and report["gate"] is None
    assert report["batches"][0]["result"] == "passed the health gate"


def test_a_gate_key_without_a_gate_runner_refuses_to_start(tmp_path):
    (play,) = load_playbook(gate_playbook(tmp_path))
    log = []
    report = rollout(play, HOSTS[:3], logged(log))
    assert log == [] and report["not_started"] == HOSTS[:3] and report["exit_code"] == 1
    assert report["stopped"]["kind"] == "traffic-gate"
    assert report["stopped"]["message"].startswith(f"{play.gate_source}: the play asks for a traffic gate")


def test_no_gate_after_a_failed_verify(tmp_path):
    (play,) = load_playbook(gate_playbook(tmp_path))
    log = []
    report = rollout(play, HOSTS[:3], logged(log, verify={"h0": 2}), gate=Gate(log))
    assert ("gate", 1, ["h0"]) not in log and report["stopped"]["kind"] == "health-gate"
    assert report["batches"][0]["gate"] is None


def test_after_batch_runs_after_a_gate_failure_and_rollback(tmp_path):
    hooklog = tmp_path / "hooks"
    argv = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')",
            str(hooklog)]
    hooks = (f"  hooks:\n    before_batch: {json.dumps(argv + ['drain {{hosts}}'])}\n"
             f"    after_batch: {json.dumps(argv + ['resume {{hosts}}'])}\n")
    hooks = hooks.replace("{{hosts}}", "{hosts}")
    (play,) = load_playbook(gate_playbook(tmp_path, hooks=hooks))
    log = []

    def run(command, hosts):
        with open(hooklog, "a") as f:
            f.write(command + "\n")
        return logged(log)(command, hosts)

    def gate(number, hosts):
        with open(hooklog, "a") as f:
            f.write("gate\n")
        return Gate(log, fail={2})(number, hosts)

    report = rollout(play, HOSTS[:3], run, gate=gate)
    assert hooklog.read_text().split("\n")[-7:] == ["drain h1,h2", "apply", "verify", "gate", "rollback",
                                                    "resume h1,h2", ""]
    assert report["stopped"]["kind"] == "traffic-gate" and report["rolled_back"] == ["h1", "h2"]
    assert [h["hook"] for h in report["batches"][1]["hooks"]] == ["before_batch", "after_batch"]


# -- the report, the table and JUnit -------------------------------------------------

def failed_rollout(tmp_path, **kw):
    (play,) = load_playbook(gate_playbook(tmp_path, **kw))
    log = []
    return rollout(play, HOSTS[:5], logged(log), gate=Gate(log, fail={2}))


def test_junit_has_a_suite_per_rollout_and_a_case_per_host_per_batch(tmp_path):
    report = failed_rollout(tmp_path)
    text = audit_formats.junit_rollouts(envelope("apply", [], rollouts=[report]))
    root = ElementTree.fromstring(text.encode())
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "rollout: gated"
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    assert list(cases) == [("nictune.rollout.batch1", "h0"), ("nictune.rollout.batch2", "h1"),
                           ("nictune.rollout.batch2", "h2"), ("nictune.rollout.not_started", "h3"),
                           ("nictune.rollout.not_started", "h4")]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("5", "2", "0", "2")
    assert (root.get("tests"), root.get("failures")) == ("5", "2")
    assert list(cases[("nictune.rollout.batch1", "h0")]) == []
    failure = cases[("nictune.rollout.batch2", "h2")].find("failure")
    assert failure.get("type") == "rolled-back"
    assert failure.get("message") == "traffic gate: h2 -> h1 on rail1 (iperf3): 3.1 Gbit/s, below min_gbps 10"
    assert "batch stopped: batch 2: the traffic gate did not pass" in failure.text
    assert cases[("nictune.rollout.not_started", "h3")].find("skipped") is not None


def test_junit_has_a_case_per_hook_and_escapes_output(tmp_path):
    argv = [sys.executable, "-c", "print('drain refused \\x1b[1m'); raise SystemExit(2)"]
    report = failed_rollout(tmp_path, hooks=f"  hooks: {{before_batch: {json.dumps(argv)}}}\n")
    text = audit_formats.junit_rollouts(envelope("apply", [], rollouts=[report]))
    assert "\x1b" not in text
    root = ElementTree.fromstring(text.encode())
    cases = root.find("testsuite").findall("testcase")
    assert [c.get("classname") for c in cases] == ["nictune.rollout.batch1.hooks", "nictune.rollout.batch1"] + \
        ["nictune.rollout.not_started"] * 4
    failure = cases[0].find("failure")
    assert failure.get("type") == "hook-failed" and failure.get("message").endswith(": exited with 2")
    assert "drain refused \\x1b[1m" in failure.text
    assert cases[1].find("skipped").get("message").startswith("not started: batch 1: before_batch hook")


def test_junit_of_a_refused_start(tmp_path):
    (play,) = load_playbook(gate_playbook(tmp_path))
    report = rollout(play, HOSTS[:2], logged([]))
    root = ElementTree.fromstring(audit_formats.junit_rollouts(envelope("apply", [], rollouts=[report])).encode())
    cases = root.find("testsuite").findall("testcase")
    assert cases[0].get("name") == "start" and "asks for a traffic gate" in cases[0].find("failure").get("message")
    assert [c.get("name") for c in cases[1:]] == ["h0", "h1"]


def test_the_table_shows_hooks_and_failing_pairs(tmp_path, capsys):
    argv = [sys.executable, "-c", "pass"]
    report = failed_rollout(tmp_path, hooks=f"  hooks: {{after_batch: {json.dumps(argv + ['{hosts}'])}}}\n")
    Printer(False).fleet(envelope("apply", [], rollouts=[report]))
    out = capsys.readouterr().out
    assert f"batch 2 after_batch: {sys.executable} -c pass h1,h2: ok" in out
    assert "batch 2 traffic gate: FAILED: 1 of 2 pairs below the floor" in out
    assert "h2 -> h1 on rail1 (iperf3): 3.1 Gbit/s, below min_gbps 10 [gbps 3.1]" in out
    assert "h0 -> peer" not in out   # passing pairs are in --json, not the table


# -- the CLI seam -----------------------------------------------------------------

def cli_apply(tmp_path, monkeypatch, capsys, gate_for=None, junit=None, second_play=""):
    """apply of the gated playbook through fleet_cmds.run, the SSH pool replaced by the fake fleet."""
    inventory = write(tmp_path, "inv.ini", "".join(f"{h} ansible_host=198.18.0.{i + 1}\n"
                                                   for i, h in enumerate(HOSTS[:3])))
    path = gate_playbook(tmp_path)
    with open(path, "a") as f:
        f.write(second_play)
    fleet = FakeFleet()
    monkeypatch.setattr(fleet_cmds, "_pool", lambda command, hosts, *rest, **kw: fleet(command, hosts))
    if gate_for is not None:
        monkeypatch.setattr(fleet_cmds, "_gate_for", gate_for)
    code = fleet_cmds.run("apply", path, Options(inventory=inventory, as_json=True, junit=junit))
    return code, fleet, json.loads(capsys.readouterr().out)


def test_the_cli_refuses_a_gate_it_cannot_run(tmp_path, monkeypatch, capsys):
    code, fleet, report = cli_apply(tmp_path, monkeypatch, capsys, lambda play, inventory, opts, name: None)
    assert code == 1 and fleet.calls == []
    (rollout_report,) = report["rollouts"]
    assert "the play asks for a traffic gate, and this nictune has no gate runner" in rollout_report["result"]


def test_the_cli_gate_seam_and_junit(tmp_path, monkeypatch, capsys):
    made, names = [], []

    def gate_for(play, inventory, opts, name):
        made.append((play.gate, [h.name for h in inventory.select("all")]))
        names.append(name)
        return Gate([], fail={2})

    junit = tmp_path / "apply.xml"
    code, fleet, report = cli_apply(tmp_path, monkeypatch, capsys, gate_for, str(junit))
    assert made == [({"rails": ["rail0"], "iperf3": {"min_gbps": 10}}, HOSTS[:3])]
    assert code == 3 and fleet.calls[-1] == ("rollback", ["h1", "h2"])
    (rollout_report,) = report["rollouts"]
    assert rollout_report["stopped"]["kind"] == "traffic-gate"
    assert names == [rollout_report["id"]]  # the gate's launcher and the hooks see one {rollout}
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("name") == "rollout: gated" and suite.get("failures") == "2"


def test_every_plays_gate_is_built_before_the_first_play_writes(tmp_path, monkeypatch, capsys):
    second = "- name: second\n  hosts: h2\n  profile: p.yaml\n  gate: {rails: [bad]}\n"

    def gate_for(play, inventory, opts, name):
        if play.name == "second":
            raise ProfileError(play.gate_source.rsplit(":", 1)[0], int(play.gate_source.rsplit(":", 1)[1]),
                               "[1].gate", "no such rail")
        return Gate([])

    code, fleet, report = cli_apply(tmp_path, monkeypatch, capsys, gate_for, second_play=second)
    assert code == 1 and fleet.calls == [] and "no such rail" in report["error"]["message"]


def test_ib_write_bw_without_tclass_measures_with_the_plays_traffic_class(tmp_path):
    """for_play asks the play for its profile (Play.profile, not an import of
    playbook.py from the gate) and takes the traffic class NCCL uses."""
    from nictune.control.remote.ssh import SshOptions
    from nictune.control.rollout.gate.runner import for_play
    from nictune.control.rollout.gate.spec import gate_of_play

    path = gate_playbook(tmp_path, gate="gate: {rails: [rail0], ib_write_bw: {min_gbps: 10}}")
    write(tmp_path, "p.yaml", "nictune: 1\nhost: {nccl: {env: {NCCL_IB_TC: 106}}}\n")
    play = load_playbook(path)[0]
    gate = for_play(play, gate_of_play(play), None, SshOptions())
    assert gate.tclass == 106
