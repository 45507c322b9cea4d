"""`nictune agent install|status|uninstall -i INV` over real sshd (lab/fleet.py).

Each namespace host gets its own unit directory (the inventory variable
nictune_unit_dir: the hosts share this machine's file system) and --no-start
(no systemd in a namespace).  Then the installed unit's command line is run
as systemd would run it, inside a host's namespace, with the unit's
environment alone: the resident agent must start from the zipapp and write
its status.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest
from fleet_helpers import nictune

from nictune.control.install import agent_install

from nictune.control.remote import agentzip

pytestmark = pytest.mark.netns


def with_unit_dirs(fleet) -> str:
    """The fleet's inventory, each host given nictune_unit_dir=<its dir>/units."""
    lines = []
    with open(fleet.inventory) as f:
        for line in f.read().splitlines():
            name = line.split(" ", 1)[0]
            host = next((h for h in fleet.hosts if h.name == name), None)
            if host is not None:
                units = os.path.join(fleet.dir, host.name, "units")
                os.makedirs(units, exist_ok=True)
                line += f" nictune_unit_dir={units}"
            lines.append(line)
    path = os.path.join(fleet.dir, "inventory-units.ini")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def placed(fleet, host) -> tuple:
    state = os.path.join(fleet.dir, host.name, "state")
    return (os.path.join(fleet.dir, host.name, "units", agent_install.UNIT_NAME),
            os.path.join(state, "resident", "nictune-agent.pyz"), state)


def unit_command(unit_path: str) -> tuple:
    """(environment, argv) of the unit, as systemd would parse them."""
    env, argv = {}, None
    with open(unit_path) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            if key == "Environment":
                name, _, val = value.partition("=")
                env[name] = val
            elif key == "ExecStart":
                argv = shlex.split(value)
    return env, argv


def test_install_over_ssh_runs_idempotent_and_uninstalls(make_fleet, tmp_path):
    fleet = make_fleet(2)
    inventory = with_unit_dirs(fleet)
    hosts = fleet.of_kind("sshd")
    base = ["-i", inventory, "--no-start", "--interval", "0.5", "--metrics-address", ""]

    code, report = nictune("agent", "install", *base)
    assert code == 0, report
    by_host = {h["host"]: h for h in report["hosts"]}
    assert sorted(by_host) == sorted(h.name for h in hosts)
    for host in hosts:
        unit, zipapp, state = placed(fleet, host)
        assert sorted(by_host[host.name]["changed"]) == sorted([unit, zipapp])
        with open(zipapp, "rb") as f:
            assert f.read() == agentzip.build().data
        env, argv = unit_command(unit)
        assert env == {"PYTHONPATH": zipapp}
        # The interpreter the host found for itself (the inventory's nictune_python).
        assert os.path.isabs(argv[0]) and os.access(argv[0], os.X_OK)
        assert argv[1:5] == ["-s", "-S", "-m", "nictune.host.resident"]
        assert argv[argv.index("--state-dir") + 1] == state

    code, again = nictune("agent", "install", *base)
    assert code == 0 and all(h["changed"] == [] for h in again["hosts"]), again

    code, status = nictune("agent", "status", "-i", inventory, "--limit", hosts[0].name)
    assert code == 0 and [h["host"] for h in status["hosts"]] == [hosts[0].name], status
    assert status["hosts"][0]["unit_installed"] and status["hosts"][0]["zipapp_installed"]

    # The unit's command line, run as systemd would (its environment only),
    # inside the host's namespace: the resident agent starts and reports.
    unit, zipapp, state = placed(fleet, hosts[0])
    env, argv = unit_command(unit)
    proc = subprocess.Popen(["ip", "netns", "exec", hosts[0].netns, "env", "-i",
                             *(f"{k}={v}" for k, v in env.items()), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        status_file = os.path.join(state, "agent-status.json")
        deadline = time.monotonic() + 20
        found = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with open(status_file) as f:
                    found = json.load(f)
                if found.get("pid"):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        assert found and found["interval"] == 0.5, found
        code, status = nictune("agent", "status", "-i", inventory, "--limit", hosts[0].name)
        assert status["hosts"][0]["agent"]["pid"] == found["pid"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)

    code, gone = nictune("agent", "uninstall", "-i", inventory, "--no-start")
    assert code == 0, gone
    for host in hosts:
        unit, zipapp, state = placed(fleet, host)
        assert not os.path.exists(unit) and not os.path.exists(zipapp)
        assert os.path.isdir(state)  # the state directory stays
    assert os.path.exists(os.path.join(placed(fleet, hosts[0])[2], "agent-status.json"))
