"""The resident agent across a reboot (issue 14, Persistence), on netdevsim.

Two boots of the VM share the "keep" disk (tests/vm/run.py: a host
directory, mounted read-write at NICTUNE_VM_KEEP in every boot of one run),
which holds the state directory.

- Boot 1: `nictune apply` of PROFILE to a two-port netdevsim device commits
  the desired state; `nictune agent install --no-start` writes the zipapp and
  the systemd unit (systemd is not PID 1 here, hence --no-start); the test
  asks the runner for boot 2 (NEXT_BOOT) and powers off with the rest.
- Boot 2: the device is created again (the driver's netdevs exist before
  the unit starts: it is ordered after udev's coldplug) and holds none of
  PROFILE's values: the reboot lost them.  The agent is started with the
  installed unit's own ExecStart= and Environment= (read from the unit file
  install wrote, the way systemd would run it); the values ethtool reads
  back next, before anything else touched the device, are PROFILE's.  Then
  the device is deleted and created again, and the agent re-tunes its new
  netdevs.  The test then asks for boot 3 with systemd as PID 1 (NEXT_INIT).
- Boot 3, systemd as PID 1 (tests/vm/init.sh; the unit directory
  /etc/systemd/system is a tmpfs there): `nictune agent install` without
  --no-start runs the real systemctl (daemon-reload, enable, start); the
  service, hardened as the unit says, re-applies the desired state to a new
  device; `nictune agent status` reports it active and enabled with the
  agent's pid as the service's MainPID; `nictune agent uninstall` runs
  `systemctl disable --now`, which stops the agent cleanly.  (An expected
  failure until the unit makes /run/nictune writable: see the test.)

Each value is read with the ethtool tool (netdevsim.ethtool_state).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import time

import pytest

import netdevsim
from netdevsim import ethtool_state
from nictune.host.resident.daemon import load_status
from nictune_cli import nictune
from rxe import sh

BOOT = int(os.environ.get("NICTUNE_VM_BOOT", "1"))
KEEP = os.environ.get("NICTUNE_VM_KEEP", "")
NEXT_BOOT, NEXT_INIT = "next-boot", "next-init"  # tests/vm/run.py's
STATE = os.path.join(KEEP, "state")
UNITS = os.path.join(KEEP, "units")
UNIT = os.path.join(UNITS, "nictune-agent.service")
SECOND = "tests/vm/guest/test_resident_boot.py::test_second_boot_the_agent_reapplies_and_retunes"
THIRD = "tests/vm/guest/test_resident_boot.py::test_third_boot_systemctl_runs_the_installed_service"
# Guest userspace is 20-30x slower than the host's: the agent's start (a
# Python process importing from the zipapp, a plan and an apply) takes a while.
WAIT = 240.0
# systemd's PATH for services (systemd.exec(5), "Environment variables in
# spawned processes"); the rest of a unit's environment is its Environment=.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Each differs from what a new netdevsim port has (rings 0, 4 combined
# channels, coalescing 0, pause off, hw-tc-offload off).
WANT = {
    ("rings", "rx"): 1024,
    ("rings", "tx"): 512,
    ("channels", "combined"): 3,
    ("coalesce", "rx-usecs"): 50,
    ("pause", "rx"): True,
    ("pause", "tx"): True,
    ("features", "hw-tc-offload"): True,
}
PROFILE = """\
nictune: 1
interfaces:
  sim:
    match: {driver: netdevsim}
    rings: {rx: 1024, tx: 512}
    channels: {combined: 3}
    coalesce: {rx-usecs: 50}
    pause: {rx: true, tx: true}
    features: {hw-tc-offload: true}
"""

pytestmark = pytest.mark.skipif(not KEEP, reason="no keep disk (run through scripts/test-vm)")


@pytest.fixture
def device_available():
    reason = netdevsim.unavailable()
    if reason:
        pytest.skip(f"NETDEVSIM UNAVAILABLE: {reason}")


def wanted(state: dict) -> dict:
    return {key: state[key] for key in WANT}


def test_first_boot_commits_the_desired_state_and_installs_the_agent(device_available, tmp_path):
    if BOOT != 1:
        pytest.skip("the first boot's part")
    profile = tmp_path / "resident-boot.yaml"
    profile.write_text(PROFILE)
    with netdevsim.netdevsim_device(ports=2, queues=4) as dev:
        code, report, _ = nictune("apply", str(profile), "--state-dir", STATE)
        assert code == 0, report
        assert dev.ifnames, dev.ifnames
        assert all(wanted(ethtool_state(name)) == WANT for name in dev.ifnames)
    os.makedirs(UNITS, exist_ok=True)
    code, report, _ = nictune("agent", "install", "--no-start", "--state-dir", STATE,
                              "--unit-dir", UNITS)
    assert code == 0 and report["ok"], report
    assert os.path.isfile(UNIT) and os.path.isfile(os.path.join(STATE, "desired.json"))
    with open(os.path.join(KEEP, NEXT_BOOT), "w") as f:
        f.write(SECOND + "\n")


def test_second_boot_the_agent_reapplies_and_retunes(device_available):
    if BOOT != 2:
        pytest.skip("runs in the second boot, which the first boot's test asks for")
    assert os.path.isfile(UNIT), "the first boot installed no unit on the keep disk"
    sh("ip", "link", "set", "lo", "up")  # systemd (PID 1) does so at its start
    with netdevsim.netdevsim_device(ports=2, queues=4) as dev:
        fresh = {name: ethtool_state(name) for name in dev.ifnames}
        assert all(fresh[name][key] != value for name in dev.ifnames
                   for key, value in WANT.items()), fresh
        agent = start_unit(UNIT)
        try:
            assert wait(lambda: (load_status(STATE) or {}).get("last_verify"), agent), \
                stop(agent)
            # Read back before anything else touched the device.
            after = {name: ethtool_state(name) for name in dev.ifnames}
            assert after == {name: {**fresh[name], **WANT} for name in dev.ifnames}, stop(agent)
            status = load_status(STATE)
            assert status["reapplies"] == 1 and status["last_reapply"]["reason"] == "boot", status
            assert status["last_reapply"]["error"] is None and status["pid"] == agent.pid
        except BaseException:
            stop(agent)
            raise
    try:
        with netdevsim.netdevsim_device(ports=2, queues=4) as again:
            assert wait(lambda: all(wanted(ethtool_state(name)) == WANT
                                    for name in again.ifnames), agent), stop(agent)
            status = load_status(STATE)
            assert status["reapplies"] == 2, status
            assert status["last_reapply"]["reason"].startswith("appeared: "), status
            assert set(again.ifnames) <= set(
                status["last_reapply"]["reason"][len("appeared: "):].split(", ")), status
    finally:
        log = stop(agent)
    assert agent.returncode == 0, log
    with open(os.path.join(KEEP, NEXT_INIT), "w") as f:
        f.write("systemd\n")
    with open(os.path.join(KEEP, NEXT_BOOT), "w") as f:
        f.write(THIRD + "\n")


# Found by this test: ProtectSystem=strict left /run read-only to the
# service, and the agent's first apply failed with "cannot create the
# /run/nictune: Read-only file system" (journal.py TARGET_LOCK_DIR, the
# per-namespace apply locks); the unit now has RuntimeDirectory=nictune.


def test_third_boot_systemctl_runs_the_installed_service(device_available):
    if BOOT != 3:
        pytest.skip("runs in the third boot (systemd as PID 1), which the second boot's test "
                    "asks for")
    with open("/proc/1/comm") as f:
        assert f.read().strip() == "systemd"
    # As in a real boot, udev is up before the driver makes its netdevs, and
    # has named them (predictable names) before the agent's unit starts.
    sh("systemctl", "start", "systemd-udevd.service", "systemd-udev-trigger.service")
    sh("udevadm", "settle")
    with named_by_udev(ports=2, queues=4) as names:
        fresh = {name: ethtool_state(name) for name in names}
        assert len(names) == 2 and all(fresh[name][key] != value for name in names
                                       for key, value in WANT.items()), fresh
        code, report, _ = nictune("agent", "install", "--state-dir", STATE)
        try:
            assert code == 0 and report["hosts"][0]["started"], report

            def applied():
                return all(wanted(ethtool_state(name)) == WANT for name in names)

            # Out early when the agent has said why it does not apply.
            assert wait(lambda: applied() or (load_status(STATE) or {}).get("error"), None)
            assert applied() and not load_status(STATE)["error"], journal()
            code, report, _ = nictune("agent", "status", "--state-dir", STATE)
            service, found = report["service"], report["agent"]
            assert (code, service["systemd"], service["active"], service["enabled"]) == (
                0, True, "active", "enabled"), report
            main_pid = sh("systemctl", "show", "-p", "MainPID", "--value",
                          "nictune-agent.service").stdout.strip()
            assert found["pid"] == int(main_pid) and report["running"], (report, main_pid)
            assert found["last_reapply"]["error"] is None, found
        finally:
            code, report, _ = nictune("agent", "uninstall", "--state-dir", STATE)
        assert code == 0 and report["ok"], report
    inactive = sh("systemctl", "is-active", "nictune-agent.service", check=False).stdout.strip()
    assert inactive == "inactive", journal()
    assert load_status(STATE)["stopped"], journal()  # SIGTERM from systemd: a clean exit


@contextlib.contextmanager
def named_by_udev(ports: int, queues: int):
    """The port names of a new netdevsim device once udev has renamed them
    (netdevsim.netdevsim_device reads names while udev may rename them)."""
    netdevsim.load()
    ns_id = 100 + secrets.randbelow(900)
    device = os.path.join(netdevsim.BUS, "devices", f"netdevsim{ns_id}")
    try:
        with open(os.path.join(netdevsim.BUS, "new_device"), "w") as f:
            f.write(f"{ns_id} {ports} {queues}")
        deadline, last = time.monotonic() + 60, None
        while True:
            sh("udevadm", "settle")
            net = os.path.join(device, "net")
            names = sorted(os.listdir(net)) if os.path.isdir(net) else []
            if len(names) == ports and names == last:  # the same twice: named for good
                break
            assert time.monotonic() < deadline, f"netdevsim{ns_id}: ports {names}"
            last = names
            time.sleep(0.5)
        yield names
    finally:
        if os.path.exists(device):
            with open(os.path.join(netdevsim.BUS, "del_device"), "w") as f:
                f.write(str(ns_id))


def journal() -> str:
    return sh("journalctl", "-u", "nictune-agent.service", "--no-pager", check=False).stdout


def start_unit(path: str) -> subprocess.Popen:
    """The unit's ExecStart= run as systemd would: its argv (systemd's quoting,
    which shlex reads for these plain words and ""), its Environment=."""
    env, argv = {"PATH": SYSTEMD_PATH}, None
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            if key == "Environment":
                name, _, val = value.partition("=")
                env[name] = val
            elif key == "ExecStart":
                argv = shlex.split(value)
    assert argv, f"{path} has no ExecStart="
    log = open("/tmp/resident-boot-agent.log", "w+")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait(predicate, agent) -> bool:
    """predicate() within WAIT seconds; False as soon as `agent` (a Popen,
    or None) has exited."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if predicate():
            return True
        if agent is not None and agent.poll() is not None:
            return False
        time.sleep(0.5)
    return bool(predicate())


def stop(agent: subprocess.Popen) -> str:
    """Stop it as systemd does (SIGTERM, then SIGKILL); its log."""
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    with open("/tmp/resident-boot-agent.log") as f:
        return f.read()
