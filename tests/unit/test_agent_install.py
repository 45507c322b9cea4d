"""`nictune agent install|uninstall|status` on this host (control/install/agent_install.py).

The unit is checked by the real `systemd-analyze verify` (it reads the unit
file alone: no running systemd needed, and none is PID 1 here); install and
uninstall run the real installer script as a child python, into temporary
unit and state directories with --no-start.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.install import agent_install
from nictune.control.remote import agentzip

ANALYZE = shutil.which("systemd-analyze")
PYTHON3 = shutil.which("python3") or "/usr/bin/python3"


def cli(*args: str):
    return CliRunner().invoke(app, ["agent", *args])


def verify(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([ANALYZE, "verify", "--man=no", path], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)


def directives(text: str) -> dict:
    out: dict = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.skipif(ANALYZE is None, reason="needs systemd-analyze")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    unit = tmp_path / agent_install.UNIT_NAME
    unit.write_text(agent_install.unit_text(os.path.realpath(PYTHON3), str(state), 2.5, ""))
    r = verify(str(unit))
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr
    # The same check does see a unit that is wrong: a misspelt key only warns.
    bad = tmp_path / "bad.service"
    bad.write_text(unit.read_text().replace("ProtectSystem=", "ProtectSytem="))
    assert "Unknown key" in verify(str(bad)).stderr
    missing = tmp_path / "missing.service"
    missing.write_text(unit.read_text().replace(os.path.realpath(PYTHON3), str(tmp_path / "nopython")))
    assert verify(str(missing)).returncode != 0


def test_the_unit_lets_the_agent_write_every_owned_file_the_profile_may_name_by_default():
    from nictune.host import knobs
    from nictune.host.validate import within

    d = directives(agent_install.unit_text("/usr/bin/python3", "/var/lib/nictune"))
    writable = [w.lstrip("-") for w in d["ReadWritePaths"][0].split()]
    # Every family's default path: an owned file is replaced by rename (and
    # its directory made when missing), so the directory above it must be writable.
    paths = [knobs.load(s).default_path for s in agent_install.OWNED_SECTIONS]
    assert sorted(paths) == ["/etc/enroot/environ.d/90-nictune.env",
                             "/etc/enroot/mounts.d/90-nictune.fstab", "/etc/environment",
                             "/etc/nccl.conf", "/etc/openmpi/openmpi-mca-params.conf",
                             "/etc/profile.d/nvshmem.sh", "/etc/slurm/nictune-task-prolog.sh",
                             "/etc/ucx/ucx.conf"]
    for path in paths:
        parent = os.path.dirname(os.path.dirname(path)) if path.count("/") > 2 else os.path.dirname(path)
        assert any(within(parent, w) for w in writable), path
    # Nothing else: exactly the state directory and those directories.
    assert sorted(writable) == sorted(["/var/lib/nictune", *agent_install.owned_file_dirs()])


def test_the_unit_is_hardened_but_can_still_tune():
    d = directives(agent_install.unit_text("/usr/bin/python3", "/var/lib/nictune"))
    assert d["ProtectSystem"] == ["strict"] and d["PrivateTmp"] == ["yes"]
    assert d["NoNewPrivileges"] == ["yes"] and d["Restart"] == ["on-failure"]
    assert d["ReadWritePaths"] == ["/var/lib/nictune -/etc"]
    # /run is read-only under ProtectSystem=strict: the target locks' directory.
    assert (d["RuntimeDirectory"], d["RuntimeDirectoryMode"], d["RuntimeDirectoryPreserve"]) == (
        ["nictune"], ["0700"], ["yes"])
    # It would make /proc/sys and /sys read-only: no sysctl or sysfs write.
    for forbidding in ("ProtectKernelTunables", "PrivateDevices", "PrivateNetwork",
                       "ProtectControlGroups"):
        assert forbidding not in d
    assert d["CapabilityBoundingSet"] == ["CAP_NET_ADMIN CAP_CHOWN"]
    assert d["RestrictAddressFamilies"] == ["AF_NETLINK AF_UNIX AF_INET AF_INET6"]
    assert "network-online.target" in d["Before"][0] and "network-pre.target" in d["Before"][0]
    assert d["Environment"] == ["PYTHONPATH=/var/lib/nictune/resident/nictune-agent.pyz"]
    assert shlex.split(d["ExecStart"][0]) == [
        "/usr/bin/python3", "-s", "-S", "-m", "nictune.host.resident", "--state-dir",
        "/var/lib/nictune", "--interval", "30.0", "--metrics-address", "127.0.0.1:9463"]


def test_install_metrics_detail_reaches_the_units_command_line(tmp_path):
    # The agent's --metrics-detail (host/resident/metrics.py DETAIL_LABELS):
    # off unless asked, and then on the unit's ExecStart.
    assert "--metrics-detail" not in agent_install.unit_text("/usr/bin/python3", "/var/lib/nictune")
    state, units = tmp_path / "state", tmp_path / "units"
    units.mkdir()
    state.mkdir(mode=0o700)
    r = cli("install", "--state-dir", str(state), "--unit-dir", str(units), "--no-start", "--json",
            "--metrics-detail")
    assert r.exit_code == 0, r.output
    exec_start = [line for line in (units / agent_install.UNIT_NAME).read_text().splitlines()
                  if line.startswith("ExecStart=")]
    assert len(exec_start) == 1 and shlex.split(exec_start[0])[-3:] == [
        "--metrics-address", "127.0.0.1:9463", "--metrics-detail"]


def test_install_status_uninstall_here(tmp_path):
    state, units = tmp_path / "state", tmp_path / "units"
    units.mkdir()
    (state / "journal").mkdir(parents=True, mode=0o700)
    (state / "journal" / "keep").write_text("x")
    desired = {"path": "rails.yaml", "doc": {"nictune": 1}, "sources": {}, "apply": "a1", "stored": 1}
    (state / "desired.json").write_text(json.dumps(desired))
    os.chmod(state, 0o700)
    args = ("--state-dir", str(state), "--unit-dir", str(units), "--no-start", "--json")

    r = cli("install", *args, "--interval", "2")
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)["hosts"][0]
    unit, zipapp = units / agent_install.UNIT_NAME, state / "resident" / "nictune-agent.pyz"
    assert sorted(first["changed"]) == sorted([str(unit), str(zipapp)])
    assert zipapp.read_bytes() == agentzip.build().data  # the very archive the SSH path ships
    assert oct(zipapp.stat().st_mode & 0o777) == "0o600"
    assert "--interval 2.0" in unit.read_text()

    again = json.loads(cli("install", *args, "--interval", "2").stdout)["hosts"][0]
    assert again["ok"] and again["changed"] == []

    r = cli("status", "--state-dir", str(state), "--unit-dir", str(units), "--json")
    assert "Traceback" not in r.output, r.output
    service = json.loads(r.stdout)["service"]
    assert service["unit_installed"] and service["zipapp_installed"]

    r = cli("uninstall", *args)
    assert r.exit_code == 0, r.output
    assert not unit.exists() and not (state / "resident").exists()
    # The desired state and the journal stay.
    assert (state / "desired.json").exists() and (state / "journal" / "keep").exists()
    text = cli("status", "--state-dir", str(state), "--unit-dir", str(units)).stdout
    assert "service: unit absent" in text and "zipapp absent" in text
    assert "desired profile: rails.yaml (apply a1" in text


def test_the_unit_names_the_interpreter_by_its_real_path_and_never_one_under_tmp(tmp_path):
    """A virtualenv's python (a link) in a checkout under /tmp: PrivateTmp=yes
    would hide it from the service, which then never starts."""
    state, units = tmp_path / "state", tmp_path / "units"
    units.mkdir()
    venv = tempfile.mkdtemp(dir="/tmp")
    try:
        link = os.path.join(venv, "python3")
        os.symlink(os.path.realpath(sys.executable), link)
        report = agent_install.run_local("install", str(state), str(units), start=False, python=link)
        assert report["ok"], report
        unit = (units / agent_install.UNIT_NAME).read_text()
        assert f"ExecStart={os.path.realpath(sys.executable)} -s -S" in unit and venv not in unit
        copy = os.path.join(venv, "python3-copy")
        shutil.copy(os.path.realpath(sys.executable), copy)
        refused = agent_install.run_local("install", str(state), str(units), start=False, python=copy)
        # The same words, in the {kind, message} shape every error has.
        assert not refused["ok"] and "PrivateTmp=yes hides" in refused["error"]["message"], refused
    finally:
        shutil.rmtree(venv)


@pytest.mark.parametrize("extra, words", [
    (("--unit-dir", "/nonexistent-nictune-units"), "unit directory /nonexistent-nictune-units does not exist"),
    (("--unit-dir", "/tmp/a%n"), "is not a plain absolute path"),
    (("--unit-dir", "relative/dir"), "is not a plain absolute path"),
    (("--interval", "0"), "--interval 0.0 is not a number of seconds"),
    (("--interval", "nan"), "is not a number of seconds"),
    (("--metrics-address", "nowhere"), "--metrics-address 'nowhere' is not HOST:PORT"),
    (("--limit", "web"), "--limit needs an inventory"),
])
def test_bad_input_is_refused_in_one_paragraph(tmp_path, extra, words):
    args = ["install", "--state-dir", str(tmp_path / "s"), "--no-start"]
    if "--unit-dir" not in extra:
        args += ["--unit-dir", str(tmp_path)]
    r = cli(*args, *extra)
    assert r.exit_code != 0 and words in r.output, r.output
    assert "Traceback" not in r.output and r.output.strip().count("\n") <= 8
    assert not (tmp_path / "s" / "resident").exists()


def test_a_state_dir_others_can_write_is_refused(tmp_path):
    state = tmp_path / "s"
    state.mkdir()
    os.chmod(state, 0o777)
    r = cli("install", "--state-dir", str(state), "--unit-dir", str(tmp_path), "--no-start")
    assert r.exit_code == 1 and "writable by nobody else" in r.output
    assert not (tmp_path / agent_install.UNIT_NAME).exists()


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd runs here")
def test_without_systemd_running_a_start_is_refused(tmp_path):
    r = cli("install", "--state-dir", str(tmp_path / "s"), "--unit-dir", str(tmp_path))
    assert r.exit_code == 1 and "use --no-start" in r.output
    assert not (tmp_path / agent_install.UNIT_NAME).exists()
