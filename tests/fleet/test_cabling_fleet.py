"""The cabling plan on a lab: hosts with two cables each (cab0, cab1),
joined by veth to two "switch" namespaces whose real lldpd advertises its
system name (leaf1, leaf2) and its port names (swp1, swp2).

- On namespace hosts: each cable's LLDP frame is read off the wire with an
  AF_PACKET socket in the host's namespace and decoded by nictune's decoder
  (host/facts/lldp.py); the audit's cabling check runs on those neighbours
  put in verify reports where the agent puts them (facts[rail].neighbour).
- On a fleet of sshd hosts: `nictune audit --lldp-wait --cabling` end to
  end; the agent's switch family hears the frames, the verify reports carry
  the neighbours, the controller checks the plan.

Cabled as planned, every rail passes; with the two hosts' first cables
crossed (host 1 cab0 on leaf1 swp2, host 2 cab0 on leaf1 swp1), both are
found and each names the other.

Namespaces are nt<random>..., lldpd runs in the foreground, and everything
is stopped and removed in a finally, pass or fail.  lldpd is installed by
scripts/setup: under CI its absence fails (tests/skips.py)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from typing import Dict, Iterator, List

import pytest

from fleet_helpers import nictune, profile_file, running_fleet
from nictune.control.review import audit_formats, cabling
from nictune.host.facts import lldp

LLDPD = "/usr/sbin/lldpd"
LLDPCLI = "/usr/sbin/lldpcli"
HOSTS = ("gpu01", "gpu02")
# host index, cable -> switch, port
AS_PLANNED = {(0, "cab0"): ("leaf1", "swp1"), (0, "cab1"): ("leaf2", "swp1"),
              (1, "cab0"): ("leaf1", "swp2"), (1, "cab1"): ("leaf2", "swp2")}
# The two hosts' first cables crossed at leaf1.
CROSSED = {**AS_PLANNED, (0, "cab0"): ("leaf1", "swp2"), (1, "cab0"): ("leaf1", "swp1")}
SWITCH_PROFILE = """nictune: 1
interfaces:
  cables:
    match: {name: "cab*"}
    switch: {lldp: required}
"""

# One frame per rail, read in the host's namespace: {rail: frame hex}.
CAPTURE = r"""
import json, select, socket, sys, time
socks = {}
for rail in sys.argv[1:]:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88cc))
    s.bind((rail, 0))
    socks[s] = rail
got, deadline = {}, time.monotonic() + 20
while len(got) < len(socks) and time.monotonic() < deadline:
    ready, _, _ = select.select([s for s in socks if socks[s] not in got], [], [], 1.0)
    for s in ready:
        got[socks[s]] = s.recv(2048).hex()
print(json.dumps(got))
"""


def plan_text(names) -> str:
    return "host,rail,switch,port\n" + "".join(
        f"{names[i]},{cable},{switch},{port}\n" for (i, cable), (switch, port) in AS_PLANNED.items())


def _sh(argv: List[str], check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LANG": "C"})
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def _require() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    if not os.access(LLDPD, os.X_OK):
        pytest.skip("needs lldpd (scripts/setup installs it)")


@contextmanager
def namespaces(names) -> Iterator[List[str]]:
    """Plain host namespaces, removed on exit."""
    tag = "nt" + secrets.token_hex(2)
    made: List[str] = []
    try:
        for i, _ in enumerate(names, 1):
            _sh(["ip", "netns", "add", f"{tag}g{i}"])
            made.append(f"{tag}g{i}")
        yield made
    finally:
        for ns in made:
            _sh(["ip", "netns", "del", ns], check=False)


@contextmanager
def switches(cabled: Dict[tuple, tuple], hosts: List[str]) -> Iterator[Dict[str, str]]:
    """Two leaf namespaces running lldpd, cabled to the host namespaces
    `hosts` as `cabled` says; yields {switch name: namespace}.  Removing a
    leaf namespace removes its cables' host ends with it."""
    _require()
    tag = "nt" + secrets.token_hex(2)
    leaves = {"leaf1": f"{tag}l1", "leaf2": f"{tag}l2"}
    made: List[str] = []
    cables: List[tuple] = []
    daemons: List[subprocess.Popen] = []
    # lldpd's lldpcli drops to the _lldpd user: its socket and configuration
    # must be where that user can reach them (pytest's tmp_path is root's alone).
    run_dir = tempfile.mkdtemp(prefix=f"{tag}-lldpd-")
    os.chmod(run_dir, 0o755)
    try:
        for ns in leaves.values():
            _sh(["ip", "netns", "add", ns])
            made.append(ns)
        for (i, cable), (switch, port) in cabled.items():
            cables.append((hosts[i], cable))
            _sh(["ip", "link", "add", cable, "netns", hosts[i], "type", "veth",
                 "peer", "name", port, "netns", leaves[switch]])
            _sh(["ip", "-n", hosts[i], "link", "set", cable, "up"])
            _sh(["ip", "-n", leaves[switch], "link", "set", port, "up"])
        for switch, ns in leaves.items():
            daemons.append(_lldpd(ns, switch, run_dir))
        for switch, ns in leaves.items():
            _wait_configured(ns, switch, run_dir)
        yield leaves
    finally:
        for daemon in daemons:
            _stop(daemon)
        for ns, cable in cables:  # now: a namespace's links go some time after it does
            _sh(["ip", "-n", ns, "link", "del", cable], check=False)
        for ns in made:
            for pid in _sh(["ip", "netns", "pids", ns], check=False).stdout.split():
                _kill(int(pid))  # lldpd's privilege-separated child, had it outlived its monitor
            _sh(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(run_dir, ignore_errors=True)


def _lldpd(ns: str, name: str, run_dir: str) -> subprocess.Popen:
    """lldpd in the foreground in ns, as switch `name`: port ids are the
    interface names (as a Cumulus switch sends them), a frame a second."""
    conf = os.path.join(run_dir, f"{name}.conf")
    with open(conf, "w") as f:
        f.write(f"configure system hostname {name}\nconfigure lldp portidsubtype ifname\n"
                "configure lldp tx-interval 1\n")
    with open(os.path.join(run_dir, f"{name}.log"), "wb") as log:  # what a failing test shows
        return subprocess.Popen(["ip", "netns", "exec", ns, LLDPD, "-d", "-u", os.path.join(run_dir, f"{name}.sock"),
                                 "-O", conf, "-I", "swp*"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def _wait_configured(ns: str, name: str, run_dir: str) -> None:
    """Until lldpd runs as `name` with ifname port ids: a frame sent before
    its configuration carries the machine's hostname and MAC port ids."""
    sock = os.path.join(run_dir, f"{name}.sock")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        chassis = _sh(["ip", "netns", "exec", ns, LLDPCLI, "-u", sock, "-f", "json", "show", "chassis"],
                      check=False)
        config = _sh(["ip", "netns", "exec", ns, LLDPCLI, "-u", sock, "show", "configuration"], check=False)
        if f'"{name}"' in chassis.stdout and "ifname" in config.stdout:
            time.sleep(1.2)  # one tx-interval: the frames on the wire are the configured ones
            return
        time.sleep(0.2)
    with open(os.path.join(run_dir, f"{name}.log")) as f:
        raise AssertionError(f"lldpd in {ns} did not take its configuration:\n{f.read()}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- namespace hosts: the wire's frames, nictune's decoder, the controller's check -----

def _neighbours(ns: str) -> Dict[str, lldp.Neighbour]:
    """Each cable's neighbour, from one frame read off the wire."""
    r = _sh(["ip", "netns", "exec", ns, sys.executable, "-c", CAPTURE, "cab0", "cab1"])
    frames = json.loads(r.stdout)
    return {rail: lldp.decode(bytes.fromhex(frame), rail=rail) for rail, frame in frames.items()}


def _check_lab(cabled, tmp_path) -> dict:
    with namespaces(HOSTS) as hosts, switches(cabled, hosts):
        reports = []
        for name, ns in zip(HOSTS, hosts):
            seen = _neighbours(ns)
            assert sorted(seen) == ["cab0", "cab1"], f"{name} heard no LLDP on some cable: {seen}"
            reports.append({"host": name, "error": None, "changes": [],
                            "facts": {rail: {cabling.NEIGHBOUR_FACT: n.to_dict()} for rail, n in seen.items()}})
    plan_file = tmp_path / "cabling.csv"
    plan_file.write_text(plan_text(HOSTS))
    return cabling.for_audit(reports, cabling.load_plan(str(plan_file)), str(plan_file))


def test_a_lab_cabled_as_planned_passes(tmp_path):
    doc = _check_lab(AS_PLANNED, tmp_path)
    assert doc["summary"]["rails"] == 4
    assert [(r["host"], r["rail"], r["status"]) for r in doc["rails"]] == [
        (HOSTS[i], cable, "ok") for i, cable in AS_PLANNED]
    seen = {(HOSTS.index(r["host"]), r["rail"]): (r["seen"]["system_name"], r["seen"]["port_id"])
            for r in doc["rails"]}
    assert seen == AS_PLANNED  # lldpd's own name and port names, as advertised


def test_a_lab_with_two_hosts_cables_crossed_finds_and_names_them(tmp_path):
    doc = _check_lab(CROSSED, tmp_path)
    rows = {(r["host"], r["rail"]): r for r in doc["rails"]}
    assert len(rows) == 4 and doc["summary"]["failing"] == 2
    one, two = rows[("gpu01", "cab0")], rows[("gpu02", "cab0")]
    assert (one["status"], one["planned_for"]) == ("wrong-port", "gpu02 cab0")
    assert (two["status"], two["planned_for"]) == ("wrong-port", "gpu01 cab0")
    assert (one["expected"]["switch"], one["expected"]["port"]) == ("leaf1", "swp1")
    assert (one["seen"]["system_name"], one["seen"]["port_id"]) == ("leaf1", "swp2")
    assert one["message"] == ("gpu01 cab0 is on the wrong port: expected leaf1 port swp1 (" + str(tmp_path / "cabling.csv")
                              + ":2), seen leaf1 port swp2, which the plan gives gpu02 cab0")
    assert rows[("gpu01", "cab1")]["status"] == rows[("gpu02", "cab1")]["status"] == "ok"
    junit = ET.fromstring(audit_formats.junit({"command": "audit", "hosts": [], "cabling": doc}))
    failed = {c.get("name"): c.find("failure").get("type") for c in junit.iter("testcase")
              if c.find("failure") is not None}
    assert failed == {"gpu01 cab0": "wrong-port", "gpu02 cab0": "wrong-port"}


# -- sshd hosts: nictune audit end to end -------------------------------------------

@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    _require()
    with running_fleet(tmp_path_factory, 2) as f:
        yield f


def _audit(fleet, cabled, tmp_path, *extra: str) -> tuple:
    hosts = fleet.of_kind("sshd")
    assert len(hosts) == 2
    plan = tmp_path / "plan.csv"
    plan.write_text(plan_text([h.name for h in hosts]))
    profile = profile_file(tmp_path, SWITCH_PROFILE, "switch.yaml")
    with switches(cabled, [h.netns for h in hosts]):
        code, report = nictune("audit", profile, "-i", fleet.inventory, "--limit", "fleet",
                               "--lldp-wait", "4", "--cabling", str(plan), *extra)
    return hosts, code, report


def test_audit_of_a_fleet_cabled_as_planned_passes(two_hosts, tmp_path):
    hosts, code, report = _audit(two_hosts, AS_PLANNED, tmp_path, "--no-probe")
    assert [h["error"] for h in report["hosts"]] == [None, None]
    doc = report["cabling"]
    assert [(r["rail"], r["status"]) for r in doc["rails"]] == [
        ("cab0", "ok"), ("cab1", "ok"), ("cab0", "ok"), ("cab1", "ok")], doc
    assert code == 0, report


def test_audit_of_a_fleet_with_crossed_cables_names_both_hosts(two_hosts, tmp_path):
    hosts, code, report = _audit(two_hosts, CROSSED, tmp_path)
    assert code == 2
    one, two = hosts[0].name, hosts[1].name
    rows = {(r["host"], r["rail"]): r for r in report["cabling"]["rails"]}
    assert len(rows) == 4
    assert (rows[(one, "cab0")]["status"], rows[(one, "cab0")]["planned_for"]) == ("wrong-port", f"{two} cab0")
    assert (rows[(two, "cab0")]["status"], rows[(two, "cab0")]["planned_for"]) == ("wrong-port", f"{one} cab0")
    assert rows[(one, "cab0")]["seen"]["port_id"] == "swp2"
    assert rows[(one, "cab1")]["status"] == "ok" and rows[(two, "cab1")]["status"] == "ok"
    # The neighbour came in the host's own verify report, no second pass.
    facts = {h["host"]: h["facts"] for h in report["hosts"]}
    assert facts[one]["cab0"]["neighbour"]["system_name"] == "leaf1"


def test_a_probed_audit_still_hears_the_neighbours(two_hosts, tmp_path):
    """The probe replays recorded reads on the controller: the controller's
    own wire is not the host's, so a profile that reads neighbours is never
    answered by the probe (the agent runs, every time)."""
    for _ in range(2):
        hosts, code, report = _audit(two_hosts, CROSSED, tmp_path)
        assert [h.get("via") for h in report["hosts"]] == ["zipapp", "zipapp"]
        assert code == 2 and report["cabling"]["summary"]["wrong-port"] == 2, report["cabling"]
