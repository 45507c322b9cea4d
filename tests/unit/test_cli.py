"""The command line through Typer's CliRunner: exit codes, streams, JSON.

Commands that need a host run against the fake kernel (recorded
ConnectX-7 state, tests/fakes.py) through a stand-in target; nothing here
touches the machine's own network settings.  The same commands against
real namespaces are tested in tests/netns.
"""

from __future__ import annotations

import errno
import json
import os
import sys

import pytest
from typer.testing import CliRunner

from fakes import FakeHost
from nictune import REPORT_FORMAT, __version__
from nictune.host import agent
from nictune.cli import app as app_module
from nictune.cli import host_cmds
from nictune.cli.app import app
from nictune.profile import SCHEMA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES = os.path.join(REPO, "profiles")
CX7 = os.path.join(REPO, "tests", "fixtures", "profiles", "connectx7-training-no-pcie.yaml")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_paragraph(text: str) -> str:
    """stderr of a failed command: one line per error, no traceback."""
    assert "Traceback" not in text
    lines = text.strip().splitlines()
    assert lines and all(line.startswith(("error: ", "warning: ")) for line in lines), text
    return text


def write(tmp_path, body: str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


class FakeTarget:
    """Runs the agent in-process on a FakeHost, as LocalTarget does on the real one."""

    def __init__(self, host: FakeHost, state_dir: str):
        self.host, self.state_dir, self.label = host, state_dir, "fake:cx7-host"

    def run(self, request: dict) -> dict:
        return agent.run(dict(request, host=self.label, state_dir=self.state_dir), host=self.host)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """The CLI's target is a recorded ConnectX-7 host."""
    host = FakeHost("cx7-host", tmp_path / "root")
    targets = []

    def target_for(netns, state_dir):
        assert netns is None
        targets.append(FakeTarget(host, state_dir))
        return targets[-1]

    monkeypatch.setattr(host_cmds, "target_for", target_for)
    host.state_dir = str(tmp_path / "state")
    return host


def run_fake(host, *args: str):
    result = invoke(*args, "--state-dir", host.state_dir)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


# -- version, validate, schema ----------------------------------------------------

def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout == f"nictune {__version__}\n"


def test_no_arguments_prints_help():
    result = invoke()
    assert "validate" in result.output and "apply" in result.output


def test_validate_exit_codes(tmp_path):
    good = [os.path.join(PROFILES, n) for n in sorted(os.listdir(PROFILES)) if n.endswith(".yaml")]
    result = invoke("validate", *good)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"ok: {p}" for p in good]

    bad = write(tmp_path, "nictune: 1\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n    mtu: 100000\n")
    result = invoke("validate", good[0], bad)
    assert result.exit_code == 1
    assert result.stdout == f"ok: {good[0]}\n"
    err = one_paragraph(result.stderr)
    assert f"{bad}:5" in err and "mtu" in err


def test_validate_json(tmp_path):
    bad = write(tmp_path, "nictune: 2\n")
    result = invoke("validate", CX7, bad, "--json")
    assert result.exit_code == 1 and result.stderr == ""
    report = json.loads(result.stdout)
    assert report["nictune_report"] == REPORT_FORMAT and report["nictune"] == __version__
    assert report["command"] == "validate" and report["exit_code"] == 1
    ok, failed = report["profiles"]
    assert ok["ok"] and ok["files"][-1] == CX7 and ok["files"][0].endswith("base-ai-host.yaml")
    assert not failed["ok"] and failed["error"]["kind"] == "profile"


def test_schema_prints_the_json_schema():
    result = invoke("schema")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == json.loads(json.dumps(SCHEMA))


def test_schema_json_is_the_report_envelope():
    result = invoke("schema", "--json")
    assert result.exit_code == 0 and result.stderr == ""
    report = json.loads(result.stdout)
    assert list(report)[:5] == ["nictune_report", "nictune", "command", "exit_code", "hosts"]
    assert (report["nictune_report"], report["nictune"]) == (REPORT_FORMAT, __version__)
    assert (report["command"], report["exit_code"], report["hosts"]) == ("schema", 0, [])
    assert "error" not in report
    assert report["schema"] == json.loads(json.dumps(SCHEMA))


# -- errors before any host is reached ----------------------------------------------

@pytest.mark.parametrize("body, words", [
    ("nictune: 1\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n    chanels: {combined: 8}\n",
     ["p.yaml:5", "chanels", "channels"]),
    ("nictune: 1\ninterfaces: [\n", ["p.yaml"]),
    ("nictune: 1\nhost:\n  nccl: {path: ../../etc/passwd}\n", ["p.yaml:3"]),
])
def test_plan_on_a_bad_profile(tmp_path, body, words):
    path = write(tmp_path, body)
    result = invoke("plan", path, "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 1 and result.stdout == ""
    err = one_paragraph(result.stderr)
    assert len(err.strip().splitlines()) == 1
    assert words
    for word in words:
        assert word in err

    result = invoke("plan", path, "--json", "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 1 and result.stderr == ""
    report = json.loads(result.stdout)
    assert report["nictune_report"] == REPORT_FORMAT and report["nictune"] == __version__
    assert (report["command"], report["exit_code"], report["hosts"]) == ("plan", 1, [])
    assert report["error"]["kind"] == "profile" and "\n" not in report["error"]["message"]


def test_a_missing_profile(tmp_path):
    result = invoke("apply", str(tmp_path / "nope.yaml"), "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 1
    assert "nope.yaml" in one_paragraph(result.stderr)


def test_unknown_netns(tmp_path):
    result = invoke("plan", CX7, "--netns", "nictune-test-absent", "--state-dir", str(tmp_path))
    assert result.exit_code == 1 and result.stdout == ""
    err = one_paragraph(result.stderr)
    assert "no network namespace named 'nictune-test-absent'" in err and "ip netns list" in err

    result = invoke("rollback", "-n", "nictune-test-absent", "--json", "--state-dir", str(tmp_path))
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["error"]["kind"] == "transport" and report["nictune"] == __version__


def test_invalid_netns_name(tmp_path):
    result = invoke("show", "--netns", "../etc", "--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert "invalid network namespace name" in one_paragraph(result.stderr)


def test_fleet_options_and_playbooks_need_an_inventory(tmp_path):
    playbook = os.path.join(REPO, "playbooks", "connectx7-fleet.yaml")
    result = invoke("plan", playbook, "--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert "is a playbook" in one_paragraph(result.stderr) and "-i INVENTORY" in result.stderr
    result = invoke("audit", CX7, "--limit", "gpu01", "--state-dir", str(tmp_path))
    assert result.exit_code == 1 and "need an inventory (-i)" in one_paragraph(result.stderr)
    result = invoke("plan", CX7, "-i", str(tmp_path / "inv.ini"), "--netns", "ntx")
    assert result.exit_code == 1 and "do not go together" in one_paragraph(result.stderr)


def test_audit_needs_an_inventory(monkeypatch, tmp_path):
    def no_target(netns, state_dir):
        raise AssertionError("audit without -i reached a target")

    monkeypatch.setattr(host_cmds, "target_for", no_target)
    result = invoke("audit", CX7, "--state-dir", str(tmp_path))
    assert result.exit_code == 1 and result.stdout == ""
    err = one_paragraph(result.stderr)
    assert len(err.strip().splitlines()) == 1
    assert "audit needs an inventory (-i)" in err and "use verify" in err

    result = invoke("audit", CX7, "--netns", "ntx", "--json", "--state-dir", str(tmp_path))
    assert result.exit_code == 1 and result.stderr == ""
    report = json.loads(result.stdout)
    assert (report["command"], report["exit_code"], report["hosts"]) == ("audit", 1, [])
    assert report["error"]["kind"] == "invalid-input"
    assert report["error"]["message"].startswith("audit needs an inventory (-i)")


def test_a_bad_inventory_is_one_paragraph(tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[rails]\ngpu[05:01]\n")
    result = invoke("plan", CX7, "-i", str(inventory))
    assert result.exit_code == 1
    err = one_paragraph(result.stderr)
    assert f"{inventory}:2" in err


def test_rollback_with_no_journal(tmp_path):
    # Reaches the local agent, which stops at the empty state directory
    # before opening any kernel handle.
    result = invoke("rollback", "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 1
    assert "nothing to roll back" in one_paragraph(result.stderr)


def test_internal_errors_are_one_line_unless_debugging(monkeypatch, capsys):
    def boom(netns, state_dir):
        raise RuntimeError("boom")

    monkeypatch.setattr(host_cmds, "target_for", boom)
    monkeypatch.setattr(sys, "argv", ["nictune", "plan", CX7])
    assert app_module.run() == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err and "--debug" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1

    monkeypatch.setattr(sys, "argv", ["nictune", "--debug", "plan", CX7])
    with pytest.raises(RuntimeError):
        app_module.run()


# -- exit codes of host commands, on the recorded ConnectX-7 host ---------------------

def test_plan_apply_verify_rollback_exit_codes(fake):
    result = run_fake(fake, "plan", CX7)
    assert result.exit_code == 2, result.output
    assert "enp23s0f0np0" in result.stdout and "pending" in result.stdout
    assert fake.kernel.writes == []

    result = run_fake(fake, "apply", CX7)
    assert result.exit_code == 0, result.output
    assert fake.kernel.links["enp23s0f1np1"].mtu == 9000

    assert run_fake(fake, "verify", CX7).exit_code == 0
    assert run_fake(fake, "plan", CX7).exit_code == 0
    fake.kernel.links["enp23s0f1np1"].mtu = 1500
    assert run_fake(fake, "verify", CX7).exit_code == 2

    result = run_fake(fake, "rollback")
    assert result.exit_code == 0, result.output
    assert fake.kernel.links["enp23s0f1np1"].txqlen == 1000


def test_the_profile_is_read_once(fake, monkeypatch, tmp_path):
    """Telling a profile from a playbook and loading it is one read and one parse."""
    reads = count_reads(monkeypatch)
    assert run_fake(fake, "plan", CX7).exit_code == 2
    assert reads.count(CX7) == 1
    assert reads.count(os.path.join(PROFILES, "base-ai-host.yaml")) == 1  # its extends

    playbook = write(tmp_path, "- hosts: all\n  profile: p.yaml\n", "pb.yaml")
    result = run_fake(fake, "plan", playbook)
    assert result.exit_code == 1 and "is a playbook" in one_paragraph(result.stderr)
    assert reads.count(playbook) == 1


def count_reads(monkeypatch) -> list:
    """Every file yamlpos reads (the profile loader and playbooks read through it)."""
    from nictune.profile import yamlpos

    reads: list = []
    real = yamlpos.read_file

    # varsdirs binds read_file at import: when this test imports it first,
    # it gets this wrapper, with its encoding argument.
    def read_file(path: str, *args) -> str:
        reads.append(path)
        return real(path, *args)

    monkeypatch.setattr(yamlpos, "read_file", read_file)
    return reads


def test_json_report_of_a_host_command(fake):
    result = run_fake(fake, "plan", CX7, "--json")
    assert result.exit_code == 2 and result.stderr == ""
    report = json.loads(result.stdout)
    assert report["nictune_report"] == REPORT_FORMAT and report["nictune"] == __version__
    assert report["command"] == "plan" and report["exit_code"] == 2 and "error" not in report
    (host,) = report["hosts"]
    assert host["host"] == "fake:cx7-host" and host["exit_code"] == 2 and host["ok"]
    # as in tests/golden/connectx7-training; skipped: enroot's mounts.d on a host without enroot
    assert host["summary"] == {"pending": 33, "ok": 13, "skipped": 1}
    assert host["changed"] is False


def test_apply_failure_exit_codes(fake, tmp_path):
    fake.kernel.fail("set_rings", "enp23s0f1np1", errno.ENOMEM)
    result = run_fake(fake, "apply", CX7)
    assert result.exit_code == 3, result.output
    assert "every change was restored" in result.stderr

    fake.kernel.faults.clear()
    fake.kernel.fail("set_rings", "enp23s0f1np1", errno.ENOMEM)
    fake.kernel.fail("set_channels", "enp23s0f0np0", errno.EBUSY, when=lambda v: v == {"combined": 16})
    result = run_fake(fake, "apply", CX7, "--json")
    assert result.exit_code == 4
    report = json.loads(result.stdout)
    assert report["exit_code"] == 4 and report["hosts"][0]["error"]["kind"] == "rollback-failed"


def test_unsupported_settings_exit_1(fake, tmp_path):
    # Matched by name, so that lint cannot know the NIC class: the host's
    # own limits refuse it (with match: {driver: mlx5_core} lint does).
    path = write(tmp_path, "nictune: 1\ninterfaces:\n  rails:\n    match: {name: \"enp*\"}\n"
                           "    rings: {rx: 16384}\n")
    result = run_fake(fake, "apply", path)
    assert result.exit_code == 1
    assert "above the device maximum 8192" in result.stderr
    assert fake.kernel.writes == []
