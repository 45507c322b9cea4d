"""The host and fleet commands' shared options (cli/options.py), the
targets they run on (control/remote/targets.py), and fleet commands reading their
TARGET once (cli/fleet_cmds.py), on stand-in SSH hosts."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import typer
from typer.testing import CliRunner

from nictune.cli import host_cmds
from nictune.cli.app import app
from nictune.cli.options import COMMON, CONFIRM, FLEET, TARGET, Options, with_options
from nictune.control.remote.ssh import SshHost, SshOptions, SshTarget
from nictune.control.remote.targets import LocalTarget, NetnsTarget, Target
from .test_cli import count_reads

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CX7 = os.path.join(REPO, "profiles", "connectx7-training.yaml")

SSH = ["--accept-new-host-keys", "--connect-timeout", "--timeout", "--ssh-config"]
FLEET_OPTS = ["-i", "-l", "-f"]
COMMON_OPTS = ["-n", "--state-dir", "--json"]

# What each command takes, in --help order (first name of each option).
COMMAND_LINE = {
    "plan": ["target", *FLEET_OPTS, *COMMON_OPTS, "--format", "--base", "--base-file",
             "--from-snapshots", "--max-age", "-a", "--show-file-content", *SSH, "--probe", "--force"],
    "apply": ["target", *FLEET_OPTS, "--junit", *COMMON_OPTS, "-a", "--show-file-content", *SSH,
              "--confirm-timeout", "--force"],
    "verify": ["target", *FLEET_OPTS, *COMMON_OPTS, "--format", "-a", "--show-file-content", *SSH,
               "--probe", "--lldp-wait"],
    "audit": ["target", *FLEET_OPTS, "--junit", "--prometheus", "--cabling", *COMMON_OPTS, "--format",
              "--save", "-a", "--show-file-content", *SSH, "--probe", "--lldp-wait"],
    "rollback": ["--to", "--steps", *FLEET_OPTS, *COMMON_OPTS, "--show-file-content", *SSH],
    "history": [*FLEET_OPTS, *COMMON_OPTS, *SSH],
    "show": [*FLEET_OPTS, *COMMON_OPTS, "--save", *SSH],
}


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(app, list(args), **kwargs)


def click_command(name: str):
    return typer.main.get_command(app).commands[name]


# -- Options and with_options --------------------------------------------------------

@pytest.mark.parametrize("name", sorted(COMMAND_LINE))
def test_each_command_takes_its_option_groups(name):
    params = click_command(name).params
    assert [min(p.opts, key=lambda o: (o.startswith("--"), o)) for p in params] == COMMAND_LINE[name]
    fields = {f.name for f in dataclasses.fields(Options)}
    assert {p.name for p in params} <= fields | {"target"}


def test_options_keep_their_names_defaults_and_limits():
    params = {p.name: p for p in click_command("apply").params}
    assert params["inventory"].opts == ["--inventory", "-i"]
    assert params["state_dir"].envvar == "NICTUNE_STATE_DIR"
    assert params["state_dir"].default == "/var/lib/nictune"
    assert (params["forks"].default, params["forks"].type.min, params["forks"].type.max) == (50, 1, 1000)
    assert params["confirm_timeout"].default == 30.0
    assert params["confirm_timeout"].metavar == "SECONDS"


def dispatched(monkeypatch, *args: str, env=None) -> tuple:
    calls = []
    monkeypatch.setattr(host_cmds, "_dispatch", lambda *call: calls.append(call))
    result = invoke(*args, env=env)
    assert result.exit_code == 0, result.output
    (call,) = calls
    return call


def test_a_command_gets_one_options_object(monkeypatch):
    command, target, opts = dispatched(
        monkeypatch, "apply", "p.yaml", "-i", "hosts.ini", "-l", "web", "-f", "3", "--json",
        "--connect-timeout", "2", "--confirm-timeout", "0", "--force",
        env={"NICTUNE_STATE_DIR": "/srv/state"})
    assert (command, target) == ("apply", "p.yaml")
    assert opts == Options(inventory="hosts.ini", limit="web", forks=3, as_json=True, connect_timeout=2.0,
                           confirm_timeout=0.0, force=True, state_dir="/srv/state")


def test_defaults_of_options_a_command_does_not_take(monkeypatch):
    assert dispatched(monkeypatch, "apply", "p.yaml")[2].confirm_timeout == 30.0
    # Only apply asks hosts to wait for a confirmation.
    assert dispatched(monkeypatch, "verify", "p.yaml")[2].confirm_timeout == 0.0
    command, target, opts = dispatched(monkeypatch, "rollback", "-n", "ns1")
    assert (command, target, opts.netns, opts.show_all) == ("rollback", None, "ns1", True)


def test_with_options_makes_a_typer_command():
    seen = []

    @with_options(TARGET, FLEET, COMMON, CONFIRM)
    def command(target, opts):
        """Does nothing."""
        seen.append((target, opts))

    cli = typer.Typer(rich_markup_mode=None)
    cli.command()(command)
    result = CliRunner().invoke(cli, ["t.yaml", "--forks", "7", "--netns", "ns1", "--confirm-timeout", "5"])
    assert result.exit_code == 0, result.output
    assert seen == [("t.yaml", Options(forks=7, netns="ns1", confirm_timeout=5.0))]
    assert command.__name__ == "command" and command.__doc__ == "Does nothing."
    assert "-f, --forks" in CliRunner().invoke(cli, ["--help"]).output


# -- targets ---------------------------------------------------------------------------

def test_every_target_is_a_target(monkeypatch):
    assert isinstance(LocalTarget("/tmp/state"), Target)
    assert isinstance(SshTarget(SshHost("gpu01", "192.0.2.1"), SshOptions()), Target)
    with monkeypatch.context() as m:
        m.setattr(os.path, "exists", lambda path: True)  # as if /run/netns/ntx were there
        assert isinstance(NetnsTarget("ntx", "/tmp/state"), Target)
    assert not isinstance(object(), Target)


# -- fleet commands read their TARGET once ------------------------------------------------

@pytest.fixture
def ssh_hosts(monkeypatch):
    """SSH hosts that answer every request with an empty report, and the
    requests they got, by host."""
    requests: dict = {}

    def run(self, request: dict) -> dict:
        requests[self.label] = request
        return {"host": self.label, "command": request["command"], "ok": True, "exit_code": 0,
                "changed": False, "summary": {}, "changes": [], "warnings": [], "error": None,
                "seconds": 0.0}

    monkeypatch.setattr(SshTarget, "run", run)
    return requests


INVENTORY = """all:
  hosts:
    gpu01: {ansible_host: 192.0.2.1}
    gpu02: {ansible_host: 192.0.2.2, nictune: {interfaces: {rails: {mtu: 4200}}}}
"""


def fleet_json(*args: str) -> dict:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_fleet_profile_is_read_once(ssh_hosts, monkeypatch, tmp_path):
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(INVENTORY)
    reads = count_reads(monkeypatch)
    report = fleet_json("verify", CX7, "-i", str(inventory))
    assert [h["host"] for h in report["hosts"]] == ["gpu01", "gpu02"]
    # Two hosts with different overrides: two profiles, from one read.
    assert reads.count(CX7) == 1
    mtu = {name: r["profile"]["doc"]["interfaces"]["rails"]["mtu"] for name, r in ssh_hosts.items()}
    assert mtu == {"gpu01": 9000, "gpu02": 4200}


def test_a_playbook_is_read_once(ssh_hosts, monkeypatch, tmp_path):
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(INVENTORY)
    playbook = tmp_path / "pb.yaml"
    playbook.write_text(f"- hosts: gpu01\n  profile: {CX7}\n")
    reads = count_reads(monkeypatch)
    report = fleet_json("verify", str(playbook), "-i", str(inventory))
    assert [h["host"] for h in report["hosts"]] == ["gpu01"]
    assert reads.count(str(playbook)) == 1 and reads.count(CX7) == 1


def test_a_fleet_profile_that_does_not_read_is_each_hosts_error(ssh_hosts, tmp_path):
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(INVENTORY)
    missing = str(tmp_path / "absent.yaml")
    result = invoke("verify", missing, "-i", str(inventory), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert "error" not in report and ssh_hosts == {}
    errors = [h["error"] for h in report["hosts"]]
    assert [e["kind"] for e in errors] == ["profile", "profile"]
    assert all(missing in e["message"] and "no such file" in e["message"] for e in errors)
