"""Drain hooks (control/rollout/hooks.py) and require_drain, through rollout().

The hooks are real subprocesses (a small Python script that appends its
argv and environment to a log file in tmp_path); the fleet is the fake
`run` of test_playbook.py, which writes to the same log, so the log shows
the true order of hooks and host commands.  Playbooks are loaded from
files, so errors are checked with their file, line and key.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.rollout import hooks as hooklib
from nictune.control.rollout.playbook import ProfileError, load_playbook, rollout

from .test_playbook import FakeFleet

HOSTS = [f"h{i}" for i in range(5)]

SCRIPT = """\
import json, os, sys
log, code = sys.argv[1], int(sys.argv[2])
env = {k: v for k, v in os.environ.items() if k.startswith("NICTUNE_")}
with open(log, "a") as f:
    f.write(json.dumps({"argv": sys.argv[3:], "env": env}) + "\\n")
print("hook output \\x1b[31m red")
sys.exit(code)
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def playbook(tmp_path, hooks: str, extra: str = "", serial='[1, 2]') -> str:
    """A playbook whose hooks: block is `hooks` (YAML, indented under it)."""
    write(tmp_path, "p.yaml", "nictune: 1\nhost: {sysctl: {net.ipv4.tcp_ecn: 1}}\n")
    body = textwrap.indent(textwrap.dedent(hooks).strip("\n"), "    ")
    return write(tmp_path, "pb.yaml", f"- name: drained\n  hosts: all\n  profile: p.yaml\n"
                                      f"  serial: {serial}\n  hooks:\n{body}\n{extra}")


class LoggedFleet(FakeFleet):
    """FakeFleet that also writes each call to the hooks' log, and answers
    plan with the changes given per host."""

    def __init__(self, log, plans=None, **kw):
        super().__init__(**kw)
        self.log, self.plans = log, plans or {}

    def __call__(self, command, hosts):
        names = [h if isinstance(h, str) else h.name for h in hosts]
        with open(self.log, "a") as f:
            f.write(json.dumps({"run": command, "hosts": names}) + "\n")
        if command == "plan":
            self.calls.append((command, names))
            return [{"host": n, "command": "plan", "ok": True, "exit_code": 2 if self.plans.get(n) else 0,
                     "changed": False, "changes": self.plans.get(n, []), "warnings": [], "error": None}
                    for n in names]
        return super().__call__(command, hosts)


def events(log):
    with open(log) as f:
        return [json.loads(line) for line in f]


def hook(tmp_path, *args, code=0):
    """A YAML flow list: the logging script, exiting with code."""
    script = tmp_path / "hook.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, str(script), str(tmp_path / "log"), str(code), *args]
    return json.dumps(argv)


# -- running ---------------------------------------------------------------------

def test_hooks_get_the_batch_hosts_in_order(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        before_batch:
          - {hook(tmp_path, "drain", "nodename={host}", "b{batch}")}
          - {hook(tmp_path, "all", "{hosts}")}
        after_batch: {hook(tmp_path, "resume", "{{literal}}", "{batch}")}
        timeout: 30
        """)
    (play,) = load_playbook(path)
    fleet = LoggedFleet(log)
    report = rollout(play, HOSTS[:3], fleet)
    assert report["kept"] == HOSTS[:3] and report["exit_code"] == 0
    seen = [e.get("run") or e["argv"] for e in events(log)]
    assert seen == [
        ["drain", "nodename=h0", "b1"], ["all", "h0"], "apply", "verify", ["resume", "{literal}", "1"],
        ["drain", "nodename=h1", "b2"], ["drain", "nodename=h2", "b2"], ["all", "h1,h2"], "apply", "verify",
        ["resume", "{literal}", "2"],
    ]
    env = [e["env"] for e in events(log) if "env" in e]
    assert env[0] == {"NICTUNE_HOOK": "before_batch", "NICTUNE_BATCH": "1", "NICTUNE_HOSTS": "h0",
                      "NICTUNE_HOST": "h0", "NICTUNE_ROLLOUT": report["id"]}
    assert env[-1] == {"NICTUNE_HOOK": "after_batch", "NICTUNE_BATCH": "2", "NICTUNE_HOSTS": "h1,h2",
                       "NICTUNE_STOP": "", "NICTUNE_ROLLOUT": report["id"]}
    second = report["batches"][1]["hooks"]
    assert [(h["hook"], h["host"] if "host" in h else None, h["exit_code"]) for h in second] == [
        ("before_batch", "h1", 0), ("before_batch", "h2", 0), ("before_batch", None, 0), ("after_batch", None, 0)]
    assert second[0]["argv"][-2:] == ["nodename=h1", "b2"] and second[0]["source"] == f"{path}:7"
    # The output's tail is kept, its escape character made visible.
    assert second[0]["output"] == "hook output \\x1b[31m red\n" and second[0]["seconds"] >= 0
    assert report["hooks"]["before_batch"][0][-2:] == ["nodename={host}", "b{batch}"]


def test_a_failing_before_batch_hook_stops_with_nothing_written(tmp_path):
    log = str(tmp_path / "log")
    fails_in_batch_2 = json.dumps([sys.executable, "-c", "import sys; sys.exit(int(sys.argv[1]) == 2 and 7)",
                                   "{batch}"])
    path = playbook(tmp_path, f"""
        before_batch:
          - {hook(tmp_path, "drain", "{host}")}
          - {fails_in_batch_2}
        after_batch: {hook(tmp_path, "resume", "{hosts}")}
        """)
    (play,) = load_playbook(path)
    fleet = LoggedFleet(log)
    report = rollout(play, HOSTS, fleet)
    assert fleet.calls == [("apply", ["h0"]), ("verify", ["h0"])]   # no apply after the failure
    assert report["kept"] == ["h0"] and report["not_started"] == HOSTS[1:]
    assert report["exit_code"] == 1 and report["stopped"]["kind"] == "hook-failed"
    message = report["stopped"]["message"]
    assert message.startswith(f"batch 2: before_batch hook ({path}:8)") and "exited with 7" in message
    assert "nothing was written in this batch" in message and "2 hook command(s)" in message
    second = report["batches"][1]
    assert second["outcomes"] == {"h1": "not-started", "h2": "not-started"}
    assert second["reports"] == [] and [h["exit_code"] for h in second["hooks"]] == [0, 0, 7]
    # The batch whose drain failed is not resumed; batch 1 was.
    assert [e["argv"] for e in events(log) if "argv" in e] == [["drain", "h0"], ["resume", "h0"],
                                                               ["drain", "h1"], ["drain", "h2"]]
    assert len(report["batches"]) == 2


def test_a_relative_program_is_relative_to_the_playbook(tmp_path, monkeypatch):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "drain").write_text(f"#!{sys.executable}\n" + SCRIPT)
    (scripts / "drain").chmod(0o755)
    path = playbook(tmp_path, f"""
        before_batch: [scripts/drain, {json.dumps(str(tmp_path / "log"))}, "0", "{{host}}"]
        """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (play,) = load_playbook(path)
    assert play.hooks.before_batch[0].argv[0] == str(scripts / "drain")
    report = rollout(play, HOSTS[:2], FakeFleet())
    assert report["kept"] == HOSTS[:2]
    assert [e["argv"] for e in events(str(tmp_path / "log"))] == [["h0"], ["h1"]]


def test_a_hook_that_cannot_start_stops_the_rollout(tmp_path):
    path = playbook(tmp_path, """
        before_batch: [/nonexistent/drain, "{hosts}"]
        """)
    (play,) = load_playbook(path)
    fleet = FakeFleet()
    report = rollout(play, HOSTS[:2], fleet)
    assert fleet.calls == [] and report["not_started"] == HOSTS[:2]
    assert "cannot start /nonexistent/drain: No such file or directory" in report["stopped"]["message"]
    assert report["batches"][0]["hooks"][0]["exit_code"] is None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("trap", ["", "trap '' TERM; "])
def test_a_timeout_kills_the_hooks_whole_process_group(tmp_path, monkeypatch, trap):
    # A child that ignores SIGTERM is killed too, after the grace.
    monkeypatch.setattr(hooklib, "KILL_GRACE", 0.5)
    pidfile = tmp_path / "pid"
    script = f"{trap}sleep 300 & echo $! > {pidfile}; echo started; wait"
    path = playbook(tmp_path, f"""
        before_batch: [sh, -c, {json.dumps(script)}]
        timeout: 1
        """)
    (play,) = load_playbook(path)
    fleet = FakeFleet()
    start = time.monotonic()
    report = rollout(play, HOSTS[:1], fleet)
    assert time.monotonic() - start < 10
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    (result,) = report["batches"][0]["hooks"]
    # The same message, in the {kind, message} shape every error has.
    assert result["error"] == {"kind": "hook-failed",
                               "message": "timed out after 1 s; its process group was killed"}
    assert result["output"] == "started\n" and fleet.calls == []
    assert report["stopped"]["kind"] == "hook-failed"


def test_ctrl_c_during_a_hook_kills_its_process_group(tmp_path, monkeypatch):
    # The hook runs in a session of its own: the terminal's SIGINT never reaches it.
    pidfile = tmp_path / "pid"
    real_wait = hooklib.subprocess.Popen.wait

    def interrupted(self, timeout=None):
        if timeout == 77:
            while not pidfile.exists() or not pidfile.read_text().strip():
                time.sleep(0.02)
            raise KeyboardInterrupt
        return real_wait(self, timeout)

    monkeypatch.setattr(hooklib.subprocess.Popen, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hooklib.run_command(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], {}, 77)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_a_failing_after_batch_hook_keeps_the_batch_and_stops(tmp_path):
    path = playbook(tmp_path, f"""
        after_batch: {hook(tmp_path, "resume", code=1)}
        """)
    (play,) = load_playbook(path)
    fleet = FakeFleet()
    report = rollout(play, HOSTS[:3], fleet)
    assert [c for c, _ in fleet.calls] == ["apply", "verify"]   # no rollback
    assert report["kept"] == ["h0"] and report["not_started"] == ["h1", "h2"]
    assert report["stopped"]["kind"] == "hook-failed" and report["exit_code"] == 1
    assert "after_batch hook" in report["stopped"]["message"]
    assert "the batch passed its gates and is kept" in report["stopped"]["message"]


def test_after_batch_runs_after_a_rollback(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        before_batch: {hook(tmp_path, "drain", "{hosts}")}
        after_batch:
          - {hook(tmp_path, "resume", "{hosts}")}
          - {hook(tmp_path, "check", "{host}")}
        """)
    (play,) = load_playbook(path)
    report = rollout(play, HOSTS[:3], LoggedFleet(log, verify={"h2": 2}, rollback={"h2": 4}))
    assert report["rolled_back"] == ["h1"] and report["rollback_failed"] == ["h2"]
    seen = [e.get("run") or e["argv"] for e in events(log)]
    assert seen[-7:] == [["drain", "h1,h2"], "apply", "verify", "rollback", ["resume", "h1,h2"],
                         ["check", "h1"], ["check", "h2"]]
    # How the batch ended, so a resume can leave a host a human must look at alone.
    env = [e["env"] for e in events(log) if "env" in e][-3:]
    assert [e["NICTUNE_STOP"] for e in env] == ["health-gate"] * 3
    assert "NICTUNE_OUTCOME" not in env[0]
    assert [e["NICTUNE_OUTCOME"] for e in env[1:]] == ["rolled-back", "rollback-failed"]


def test_the_last_batch_failing_its_after_hook_is_not_exit_0(tmp_path):
    path = playbook(tmp_path, f"""
        after_batch: {hook(tmp_path, code=3)}
        """, serial='"100%"')
    (play,) = load_playbook(path)
    report = rollout(play, HOSTS[:2], FakeFleet())
    assert report["kept"] == HOSTS[:2] and report["not_started"] == []
    assert report["exit_code"] == 1 and report["result"].startswith("stopped: batch 1: after_batch hook")


def test_cleanup_runs_when_before_batch_fails_half_way(tmp_path):
    # A reservation created, then the wait for jobs gives up: after_batch
    # does not run (the batch never started), cleanup must, or the
    # reservation stays behind.
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        before_batch:
          - {hook(tmp_path, "reserve", "r-{rollout}-{batch}", "{hosts}")}
          - {hook(tmp_path, "wait", code=1)}
        after_batch: {hook(tmp_path, "resume", "{hosts}")}
        cleanup: {hook(tmp_path, "unreserve", "r-{rollout}-{batch}")}
        """, serial='"100%"')
    (play,) = load_playbook(path)
    fleet = LoggedFleet(log)
    report = rollout(play, HOSTS[:2], fleet)
    assert fleet.calls == [] and report["not_started"] == HOSTS[:2]
    seen = [e.get("run") or e["argv"] for e in events(log)]
    name = f"r-{report['id']}-1"
    assert seen == [["reserve", name, "h0,h1"], ["wait"], ["unreserve", name]]
    env = events(log)[-1]["env"]
    assert env["NICTUNE_HOOK"] == "cleanup" and env["NICTUNE_STOP"] == "hook-failed"
    assert [h["hook"] for h in report["batches"][0]["hooks"]] == ["before_batch", "before_batch", "cleanup"]
    assert "after_batch does not run when before_batch fails, cleanup does" in report["stopped"]["message"]


def test_cleanup_runs_every_command_after_a_pass_a_rollback_and_a_failed_after_batch(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        after_batch: {hook(tmp_path, "resume", code=1)}
        cleanup:
          - {hook(tmp_path, "first", "{batch}", code=5)}
          - {hook(tmp_path, "second", "{host}")}
        """)
    (play,) = load_playbook(path)
    report = rollout(play, HOSTS[:3], LoggedFleet(log, verify={"h0": 2}))
    assert report["rolled_back"] == ["h0"] and report["not_started"] == ["h1", "h2"]
    seen = [e.get("run") or e["argv"] for e in events(log)]
    assert seen == ["apply", "verify", "rollback", ["resume"], ["first", "1"], ["second", "h0"]]
    message = report["stopped"]["message"]
    assert message.startswith("batch 1: the health gate") and "; and batch 1: after_batch hook" in message
    assert "; and batch 1: cleanup hook" in message and "exited with 5" in message
    assert events(log)[-1]["env"]["NICTUNE_OUTCOME"] == "rolled-back"


def test_a_failing_cleanup_after_a_passing_batch_stops_the_rollout(tmp_path):
    path = playbook(tmp_path, f"cleanup: {hook(tmp_path, code=2)}")
    (play,) = load_playbook(path)
    report = rollout(play, HOSTS[:3], FakeFleet())
    assert report["kept"] == ["h0"] and report["not_started"] == ["h1", "h2"] and report["exit_code"] == 1
    assert report["stopped"]["kind"] == "hook-failed"
    assert "cleanup hook" in report["result"] and "the batch passed its gates and is kept" in report["result"]


def test_cleanup_runs_when_the_batch_breaks_off_with_an_exception(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        before_batch: {hook(tmp_path, "reserve", "{batch}")}
        cleanup: {hook(tmp_path, "unreserve", "{batch}")}
        """)
    (play,) = load_playbook(path)

    def run(command, hosts):
        raise KeyboardInterrupt  # Ctrl-C while the batch is applied

    with pytest.raises(KeyboardInterrupt):
        rollout(play, HOSTS[:3], run)
    assert [e["argv"] for e in events(log)] == [["reserve", "1"], ["unreserve", "1"]]
    assert events(log)[-1]["env"]["NICTUNE_STOP"] == "interrupted"


def test_the_rollout_name_is_the_same_in_every_batch_and_new_per_rollout(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f'before_batch: {hook(tmp_path, "{rollout}")}')
    (play,) = load_playbook(path)
    first = rollout(play, HOSTS[:3], FakeFleet())
    second = rollout(play, HOSTS[:1], FakeFleet())
    names = [e["argv"][0] for e in events(log)]
    assert names == [first["id"]] * 2 + [second["id"]] and first["id"] != second["id"]
    assert all(re.fullmatch(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}", n) for n in names)


# -- require_drain ----------------------------------------------------------------

DISRUPTIVE = {"key": {"family": "dcb", "target": "rail0", "name": "pfc"}, "before": [], "after": [3],
              "status": "pending", "disruptive": "mlx5 toggles the port link when PFC changes"}
QUIET = {"key": {"family": "sysctl", "target": "host", "name": "net.ipv4.tcp_ecn"}, "before": 0, "after": 1,
         "status": "pending"}


def drain_play(tmp_path, hooks="timeout: 10"):
    return load_playbook(playbook(tmp_path, hooks, extra="  require_drain: true\n"))[0]


def test_require_drain_refuses_disruptive_changes_without_a_hook(tmp_path):
    fleet = LoggedFleet(str(tmp_path / "log"), plans={"h1": [QUIET, DISRUPTIVE]})
    play = drain_play(tmp_path)
    report = rollout(play, HOSTS[:3], fleet)
    assert fleet.calls == [("plan", HOSTS[:3])]      # nothing else: nothing written
    assert report["stopped"]["kind"] == "drain-required" and report["not_started"] == HOSTS[:3]
    message = report["stopped"]["message"]
    assert message.startswith(f"{play.drain_source}: require_drain:") and play.drain_source.endswith("pb.yaml:7")
    assert "on h1 (h1 dcb rail0 pfc)" in message and "no hooks.before_batch" in message
    assert report["exit_code"] == 1 and report["batches"] == []
    assert report["drain_check"]["disruptive"] == [{"host": "h1", "family": "dcb", "target": "rail0",
                                                    "name": "pfc", "why": DISRUPTIVE["disruptive"]}]


def test_a_refused_drain_in_the_table_and_junit(tmp_path, capsys):
    from xml.etree import ElementTree

    from nictune.cli.output import Printer, envelope
    from nictune.control.review.audit_formats import junit_rollouts

    fleet = LoggedFleet(str(tmp_path / "log"), plans={"h1": [DISRUPTIVE]})
    report = rollout(drain_play(tmp_path), HOSTS[:2], fleet)
    Printer(False).fleet(envelope("apply", [], rollouts=[report]))
    assert ("require_drain: 1 disruptive change(s) (h1 dcb rail0 pfc), and NO before_batch hook to drain"
            in capsys.readouterr().out)
    suite = ElementTree.fromstring(junit_rollouts(envelope("apply", [], rollouts=[report])).encode()).find("testsuite")
    first = suite.find("testcase")
    assert first.get("name") == "require_drain" and first.find("failure").get("type") == "drain-required"
    assert "h1: dcb rail0 pfc: mlx5 toggles the port link" in first.find("failure").text
    assert suite.get("failures") == "1" and suite.get("skipped") == "2"


def test_require_drain_proceeds_without_disruptive_changes(tmp_path):
    fleet = LoggedFleet(str(tmp_path / "log"), plans={"h1": [QUIET]})
    report = rollout(drain_play(tmp_path), HOSTS[:3], fleet)
    assert fleet.calls[0] == ("plan", HOSTS[:3]) and report["kept"] == HOSTS[:3]
    assert report["drain_check"]["passed"] and report["exit_code"] == 0


def test_require_drain_proceeds_with_a_drain_hook(tmp_path):
    fleet = LoggedFleet(str(tmp_path / "log"), plans={"h0": [DISRUPTIVE]})
    play = drain_play(tmp_path, f"before_batch: {hook(tmp_path, 'drain', '{host}')}")
    report = rollout(play, HOSTS[:2], fleet)
    assert report["kept"] == HOSTS[:2] and report["drain_check"]["drained"]


def test_require_drain_stops_when_a_plan_fails(tmp_path):
    fleet = FakeFleet()

    def run(command, hosts):
        if command == "plan":
            return [{"host": "h0", "command": "plan", "ok": True, "exit_code": 0, "changes": []}]  # h1: silent
        return fleet(command, hosts)

    report = rollout(drain_play(tmp_path), HOSTS[:2], run)
    assert fleet.calls == [] and report["stopped"]["kind"] == "drain-required"
    assert "plan failed on h1" in report["stopped"]["message"]


def test_without_require_drain_nothing_is_planned(tmp_path):
    fleet = LoggedFleet(str(tmp_path / "log"), plans={"h0": [DISRUPTIVE]})
    (play,) = load_playbook(playbook(tmp_path, "timeout: 10"))
    rollout(play, HOSTS[:1], fleet)
    assert [c for c, _ in fleet.calls] == ["apply", "verify"]


# -- loading ---------------------------------------------------------------------

@pytest.mark.parametrize("hooks, line, keypath, words", [
    ('before_batch: "scontrol update nodename={host} state=drain"', 6, "[0].hooks.before_batch",
     "is a shell string; a hook is an argv list"),
    ('after_batch:\n  - [a, "{host}"]\n  - "kubectl uncordon {host}"', 8, "[0].hooks.after_batch[1]",
     "is a shell string"),
    ('before_batch: [drain, "{host}", "--all={hosts}"]', 6, "[0].hooks.before_batch",
     "uses both {host} and {hosts}"),
    ('before_batch: [drain, "{node}"]', 6, "[0].hooks.before_batch[1]",
     "the unknown placeholder {node}; the placeholders are {host}, {hosts}, {batch} and {rollout}"),
    ('before_batch: [jq, "{.x}"]', 6, "[0].hooks.before_batch[1]", "write {{ and }} for literal braces"),
    ('before_batch: [awk, "}"]', 6, "[0].hooks.before_batch[1]", "has a lone '}'; write }} for a literal brace"),
    ('before_batch: ["", x]', 6, "[0].hooks.before_batch[0]", "the program to run must not be empty"),
    ('before_batch: ["kubectl cordon {host}"]', 6, "[0].hooks.before_batch[0]",
     "is not a program name (it has a space): a hook is an argv list, one item per word"),
    ("timeout: 86401", 7, "[0].hooks.timeout", "above the maximum 86400"),
    ("before_batch: []", 6, "[0].hooks.before_batch", "a list of 0 items"),
    ("sleep: 3", 6, "[0].hooks", "unknown key 'sleep'"),
])
def test_bad_hooks_are_named_by_file_line_and_key(tmp_path, hooks, line, keypath, words):
    path = playbook(tmp_path, ("before_batch: [x]\n" if line == 7 else "") + hooks)
    with pytest.raises(ProfileError) as info:
        load_playbook(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}:{line}: {keypath}: "), message
    assert words in message, message


def test_bad_hooks_through_the_cli_are_one_paragraph(tmp_path):
    inventory = write(tmp_path, "inv.ini", "h0 ansible_host=198.18.0.1\n")
    cases = {
        "string": ('before_batch: "kubectl cordon {host}"', "[0].hooks.before_batch", "is a shell string"),
        "both": ('before_batch: [x, "{host}{hosts}"]', "[0].hooks.before_batch", "uses both {host} and {hosts}"),
        "unknown": ('after_batch: [x, "{hostname}"]', "[0].hooks.after_batch[1]", "unknown placeholder {hostname}"),
    }
    for name, (hooks, keypath, words) in cases.items():
        path = playbook(tmp_path, hooks)
        result = CliRunner().invoke(app, ["apply", path, "-i", inventory])
        assert result.exit_code == 1, (name, result.output)
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}:6: {keypath}: "), (name, result.stderr)
        assert words in lines[0]
        result = CliRunner().invoke(app, ["apply", path, "-i", inventory, "--json"])
        report = json.loads(result.stdout)
        assert report["error"]["kind"] == "profile" and words in report["error"]["message"]


def test_placeholders_fill_and_braces_escape():
    per_host = hooklib.Hook("before_batch", ("x", "n={host}", "{{a}}-{batch}"), "pb:1", True)
    assert hooklib.commands(per_host, 4, ["a", "b"]) == [(["x", "n=a", "{a}-4"], "a"), (["x", "n=b", "{a}-4"], "b")]
    once = hooklib.Hook("before_batch", ("x", "{hosts}"), "pb:1", False)
    assert hooklib.commands(once, 1, ["a", "b"]) == [(["x", "a,b"], None)]


def test_the_output_tail_is_bounded(tmp_path):
    result = hooklib.run_command([sys.executable, "-c", "import sys; sys.stdout.write('x' * 100000 + 'END')"],
                                 {}, 30)
    assert result["ok"] and result["output"].endswith("END") and len(result["output"]) == hooklib.TAIL_BYTES


class _ResetFleet(LoggedFleet):
    """verify answers with changes: h0's firmware keys stored for a reboot
    and a driver reload, h1's stored for a driver reload, h2's drifted."""

    WAITING = {"h0": [("pending-reset", "pending reset: stored 16; takes effect at a reboot (the "
                                         "PCI function is enumerated again)"),
                      ("pending-reset", "takes effect at `devlink dev reload pci/x`")],
               "h1": [("pending-reset", "takes effect at `devlink dev reload pci/x` "
                                        "(action driver_reinit)"), ("ok", "")],
               "h2": [("pending-reset", "takes effect at a reboot"), ("drift", "")]}

    def __call__(self, command, hosts):
        reports = super().__call__(command, hosts)
        if command == "verify":
            for r in reports:
                changes = self.WAITING.get(r["host"], [])
                r["changes"] = [{"key": {}, "status": s, "note": n} for s, n in changes]
                r["exit_code"] = 2 if any(s != "ok" for s, _ in changes) else 0
        return reports


def test_after_batch_learns_the_reset_each_kept_host_waits_for(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        after_batch: {hook(tmp_path, "reboot-if-asked", "{host}")}
        """, serial='"100%"')
    (play,) = load_playbook(path)
    report = rollout(play, HOSTS[:2], _ResetFleet(log))
    # Stored-but-not-running firmware keys pass the health gate: the reset is the hook's.
    assert report["kept"] == ["h0", "h1"] and report["stopped"] is None
    env = {e["env"]["NICTUNE_HOST"]: e["env"] for e in events(log) if "env" in e}
    assert (env["h0"]["NICTUNE_RESET"], env["h1"]["NICTUNE_RESET"]) == ("reboot", "driver_reinit")


def test_a_drifted_key_beside_a_pending_reset_still_fails_the_gate(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        after_batch: {hook(tmp_path, "reboot-if-asked", "{host}")}
        """, serial='"100%"')
    (play,) = load_playbook(path)
    report = rollout(play, ["h2"], _ResetFleet(log))
    assert report["stopped"]["kind"] == "health-gate" and report["rolled_back"] == ["h2"]
    (env,) = [e["env"] for e in events(log) if "env" in e]
    assert env["NICTUNE_RESET"] == ""  # a batch that stopped asks for no reset
