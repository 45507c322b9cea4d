"""Usage errors exit 1, not click's 2 (issue 9, item 12): 2 means "changes
pending" or "drift", so a typo in a cron job must not read as drift.

Through the real entry point: app.run() as main() calls it, and once the
installed `nictune` script in a subprocess.  A command's own 2 still comes
through.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nictune.cli import app as app_module

USAGE_ERRORS = [
    (["plan", "--bogus"], "No such option: --bogus"),
    (["plan", "--forks", "many"], "Invalid value for '--forks'"),
    (["bogus"], "No such command 'bogus'"),
    (["validate"], "Missing argument"),
    (["audit", "p.yaml", "-i"], "requires an argument"),
    ([], " [OPTIONS] COMMAND [ARGS]..."),  # no command at all: the help, as a usage error
    (["lab"], " lab [OPTIONS] COMMAND [ARGS]..."),
]


@pytest.mark.parametrize("argv, said", USAGE_ERRORS)
def test_usage_errors_exit_1(monkeypatch, capsys, argv, said):
    monkeypatch.setattr(sys, "argv", ["nictune", *argv])
    assert app_module.run() == 1
    printed = "".join(capsys.readouterr())  # the help of a bare `nictune` goes to stdout
    assert said in printed and "Traceback" not in printed


def test_the_installed_command_exits_1_on_a_usage_error():
    script = os.path.join(os.path.dirname(sys.executable), "nictune")
    if not os.access(script, os.X_OK):
        pytest.skip("nictune is not installed next to this python")
    proc = subprocess.run([script, "verify", "--no-such-option"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "No such option: --no-such-option" in proc.stderr and "Try 'nictune verify --help'" in proc.stderr


def test_help_version_and_a_commands_own_codes_come_through(monkeypatch, capsys, tmp_path):
    for argv in (["--help"], ["plan", "--help"], ["--version"]):
        monkeypatch.setattr(sys, "argv", ["nictune", *argv])
        assert app_module.run() == 0, argv
    bad = tmp_path / "bad.yaml"
    bad.write_text("nictune: 1\nhots: {}\n")
    monkeypatch.setattr(sys, "argv", ["nictune", "validate", str(bad)])
    assert app_module.run() == 1
    capsys.readouterr()


def test_a_pending_plan_still_exits_2(monkeypatch, capsys, cx7, tmp_path):
    from nictune.cli import host_cmds
    from nictune.host import agent

    class FakeTarget:  # the recorded ConnectX-7 host, as tests/unit/test_cli.py uses it
        label = "fake:cx7-host"

        def __init__(self, state_dir):
            self.state_dir = state_dir

        def run(self, request):
            return agent.run(dict(request, host=self.label, state_dir=self.state_dir), host=cx7)

    monkeypatch.setattr(host_cmds, "target_for", lambda netns, state_dir: FakeTarget(state_dir))
    profile = tmp_path / "p.yaml"
    profile.write_text("nictune: 1\ninterfaces:\n  rails:\n    match: {name: enp23s0f1np1}\n    mtu: 9000\n")
    monkeypatch.setattr(sys, "argv", ["nictune", "plan", str(profile), "--state-dir", str(tmp_path / "s")])
    assert app_module.run() == 2
    assert "1 change(s) pending" in capsys.readouterr().out
