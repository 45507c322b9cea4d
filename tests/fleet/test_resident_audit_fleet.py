"""The fast audit over real sshd (lab/fleet.py): `nictune audit` asks a
running resident agent through the session's stream-local forwarding to its
socket (control/remote/ssh.py, host/resident/daemon.py), and takes the zipapp path where
none runs or where it runs another archive.

The resident agent is run as its unit would run it (the zipapp on
PYTHONPATH, the environment emptied), inside the host's namespace with the
host's state directory, and stopped in a finally.  Drift is injected with
`ip` and `sysctl` inside each namespace, never through nictune.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import zipfile

import pytest
from fleet_helpers import audit as fleet_audit
from fleet_helpers import comparable, drift_of, nictune, profile_file

from nictune.control.remote import agentzip
from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
host:
  sysctl:
    net.ipv4.tcp_ecn: 1
interfaces:
  rails:
    match: {name: "rail*"}
    mtu: 9000
"""


def state_of(fleet, host) -> str:
    return os.path.join(fleet.dir, host.name, "state")


def other_archive() -> bytes:
    """The same agent, one file more: another archive id."""
    buf = io.BytesIO(agentzip.build().data)
    with zipfile.ZipFile(buf, "a") as z:
        z.writestr("nictune/other-version.txt", "not the controller's archive\n")
    return buf.getvalue()


def start_agent(fleet, host, archive: bytes) -> subprocess.Popen:
    state = state_of(fleet, host)
    zipapp = os.path.join(fleet.dir, host.name, f"agent-{len(archive)}.pyz")
    with open(zipapp, "wb") as f:
        f.write(archive)
    sock = os.path.join(state, "agent.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    proc = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, "env", "-i", f"PYTHONPATH={zipapp}",
         sys.executable, "-s", "-S", "-m", "nictune.host.resident", "--state-dir", state,
         "--interval", "600", "--metrics-address", ""],
        cwd=state, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the resident agent made no socket"
        time.sleep(0.05)
    assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
    return proc


def stop(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def audit(fleet, profile) -> dict:
    # --no-probe: the paths compared here are the resident agent's and the
    # zipapp's (tests/fleet/test_probe_fleet.py compares the probe's).
    return fleet_audit(fleet, profile, "--no-probe")


def test_audit_through_the_resident_agent_equals_the_zipapp_path(make_fleet, tmp_path):
    fleet = make_fleet(3)
    a, b, c = fleet.of_kind("sshd")
    profile = profile_file(tmp_path, PROFILE, "fast.yaml")
    code, report = nictune("apply", profile, "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report

    procs = []
    try:
        procs = [start_agent(fleet, a, agentzip.build().data),
                 start_agent(fleet, b, agentzip.build().data)]
        # Drift after the agents started: the fast path must read it now.
        run_in(a, ["ip", "link", "set", "rail1", "mtu", "1500"])
        run_in(c, ["sysctl", "-w", "net.ipv4.tcp_ecn=2"])
        fast = audit(fleet, profile)
        assert {n: h["via"] for n, h in fast.items()} == {
            a.name: "resident", b.name: "resident", c.name: "zipapp"}
        assert {n: drift_of(h) for n, h in fast.items()} == {
            a.name: {("rail1", "mtu")}, b.name: set(), c.name: {("host", "net.ipv4.tcp_ecn")}}

        # A drift on b now, and a's put back: never the answer of before.
        run_in(b, ["ip", "link", "set", "rail0", "mtu", "1500"])
        run_in(a, ["ip", "link", "set", "rail1", "mtu", "9000"])
        again = audit(fleet, profile)
        assert again[b.name]["via"] == "resident"
        assert drift_of(again[b.name]) == {("rail0", "mtu")} and not drift_of(again[a.name])

        # The same hosts, the agents stopped: the zipapp path, the same reports.
        stop(procs)
        slow = audit(fleet, profile)
        assert all(h["via"] == "zipapp" for h in slow.values())
        for name in slow:
            s, f = comparable(slow[name]), comparable(again[name])
            assert s == f, (name, {k: (s.get(k), f.get(k)) for k in set(s) | set(f)
                                   if s.get(k) != f.get(k)})

        # An agent running another archive is not asked: the zipapp answers.
        procs = [start_agent(fleet, a, other_archive())]
        other = audit(fleet, profile)
        assert other[a.name]["via"] == "zipapp"
        assert comparable(other[a.name]) == comparable(slow[a.name])
        assert procs[0].poll() is None  # refused, still running
    finally:
        stop(procs)
