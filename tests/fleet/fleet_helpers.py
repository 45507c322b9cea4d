"""What the fleet test files share: starting and removing a fleet (the
conftest's fixtures and the modules that need a fleet of their own shape),
the CLI in-process (exit code and JSON report), a host's state read back
with `ip`/`sysctl`, never through nictune, and the traffic gate's playbook
and runner."""

from __future__ import annotations

import json
import os
import stat
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from typing import Iterator, List

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.rollout import gate as gatemod
from nictune.control.rollout import playbook
from nictune.control.remote.ssh import SshOptions
from nictune.inventory import load_inventory
from nictune.lab import fleet as fleetlab
from nictune.lab.fleet import run_in

RECORDS: List[str] = []  # every fleet record this run may have written (conftest's safety net)

# A play's profile the sshd hosts take without rails: one sysctl.
ECN_PROFILE = "nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n"


def require_fleet() -> None:
    """Skip (fail under CI: tests/skips.py) where no fleet can start."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces and sshd")
    if shutil.which("ip") is None or not os.access(fleetlab.SSHD, os.X_OK) or shutil.which("ssh-keygen") is None:
        pytest.skip("needs iproute2, OpenSSH's sshd and ssh-keygen")


def start_fleet(directory: str, n: int, **kw) -> fleetlab.Fleet:
    """fleetlab.up in `directory` with a random "nt" prefix, recorded first
    so that even a half-built fleet is removed at the session's end."""
    RECORDS.append(os.path.join(directory, "record.json"))
    kw.setdefault("prefix", "nt" + secrets.token_hex(2))
    return fleetlab.up(n, directory, **kw)


@contextmanager
def running_fleet(tmp_path_factory, n: int, **kw) -> Iterator[fleetlab.Fleet]:
    """A fleet for a fixture: up on entry, down on exit, pass or fail."""
    require_fleet()
    f = start_fleet(str(tmp_path_factory.mktemp("fleet")), n, **kw)
    try:
        yield f
    finally:
        fleetlab.down(f.record)


def nictune(*args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--json"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}, no JSON report: {result.output}")


def profile_file(tmp_path, text: str, name: str) -> str:
    """A profile written into the test's directory; its path."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def mtu(host, ifname="rail0") -> int:
    return json.loads(run_in(host, ["ip", "-j", "link", "show", ifname]).stdout)[0]["mtu"]


def audit(fleet, profile: str, *extra: str) -> dict:
    """`nictune audit` of the whole fleet: host reports by name."""
    code, report = nictune("audit", profile, "-i", fleet.inventory, "--limit", "fleet", *extra)
    assert code in (0, 1, 2), [(h["host"], h.get("via"), h["error"]) for h in report["hosts"]]
    return {h["host"]: h for h in report["hosts"]}


def comparable(host_report: dict) -> dict:
    """A host report without what differs between the paths that answer it."""
    return {k: v for k, v in host_report.items() if k not in ("seconds", "via", "transport")}


def drift_of(host_report: dict) -> set:
    return {(c["key"]["target"], c["key"]["name"]) for c in host_report["changes"]
            if c["status"] == "drift"}


def sysctl(host, key) -> str:
    return run_in(host, ["sysctl", "-n", key]).stdout.strip()


def tcp_ecn(host) -> str:
    return sysctl(host, "net.ipv4.tcp_ecn")


def by_host(report: dict) -> dict:
    return {h["host"]: h for h in report["hosts"]}


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def gate_playbook(tmp_path, gate_yaml: str) -> str:
    """A playbook of one play over `fleet` applying ECN_PROFILE, with the
    gate `gate_yaml`; its path."""
    (tmp_path / "p.yaml").write_text(ECN_PROFILE)
    path = tmp_path / "pb.yaml"
    path.write_text("- hosts: fleet\n  profile: p.yaml\n  gate:\n" +
                    "".join(f"    {line}\n" for line in gate_yaml.strip().splitlines()))
    return str(path)


def run_gate(fleet, path: str, number: int = 1):
    """The gate of the playbook at `path`, run once (batch `number`) over
    the play's hosts in `fleet`: its result."""
    inventory = load_inventory(fleet.inventory)
    [play] = playbook.load_playbook(path)
    [spec] = gatemod.load_play_gates(path)
    runner = gatemod.for_play(play, spec, inventory, SshOptions(ssh_config=fleet.ssh_config))
    return runner(number, [play.host(h) for h in inventory.select(play.hosts)])


def script(path, body: str) -> str:
    """An executable /bin/sh script at `path` (a stand-in tool a fleet test
    puts on the hosts' PATH); its path as a string."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)
