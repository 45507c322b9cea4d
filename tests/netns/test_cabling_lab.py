"""The cabling plan on a lab: two hosts with two rails each, cabled by veth
to two "switch" namespaces whose real lldpd advertises its system name
(leaf1, leaf2) and its port names (swp1, swp2).  Each host rail's LLDP
frame is read off the wire with an AF_PACKET socket in the host's
namespace and decoded by nictune's decoder (host/facts/lldp.py); the
audit's cabling check then runs on those neighbours, put in the hosts'
verify reports where the LLDP reader puts them (facts[rail]["neighbour"]).

Cabled as planned, every rail passes; with the two hosts' first rails
crossed (gpu01 rail0 on leaf1 swp2, gpu02 rail0 on leaf1 swp1), both are
found and each names the other.

Namespaces are nt<random>g1, g2 (hosts) and l1, l2 (switches); lldpd runs
in the foreground, and everything is stopped and removed in a finally,
pass or fail.  lldpd is installed by scripts/setup: under CI its absence
fails (tests/skips.py)."""

from __future__ import annotations

import json
import os
import pathlib
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

from nictune.control.review import audit_formats, cabling
from nictune.host.facts import lldp

LLDPD = "/usr/sbin/lldpd"
PLAN = """host,rail,switch,port
gpu01,rail0,leaf1,swp1
gpu01,rail1,leaf2,swp1
gpu02,rail0,leaf1,swp2
gpu02,rail1,leaf2,swp2
"""
AS_PLANNED = {("gpu01", "rail0"): ("leaf1", "swp1"), ("gpu01", "rail1"): ("leaf2", "swp1"),
              ("gpu02", "rail0"): ("leaf1", "swp2"), ("gpu02", "rail1"): ("leaf2", "swp2")}
# The two hosts' first rails crossed at leaf1.
CROSSED = {**AS_PLANNED, ("gpu01", "rail0"): ("leaf1", "swp2"), ("gpu02", "rail0"): ("leaf1", "swp1")}

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
def lab(cabled: Dict[tuple, tuple], tmp_path) -> Iterator[Dict[str, str]]:
    """The hosts' and switches' namespaces cabled as `cabled` says, lldpd
    running on both switches; yields {host or switch name: namespace}."""
    _require()
    tag = "nt" + secrets.token_hex(2)
    spaces = {"gpu01": f"{tag}g1", "gpu02": f"{tag}g2", "leaf1": f"{tag}l1", "leaf2": f"{tag}l2"}
    made: List[str] = []
    daemons: List[subprocess.Popen] = []
    # lldpd's lldpcli drops to the _lldpd user: its socket's directory must
    # be one that user can enter (pytest's tmp_path is root's alone).
    run_dir = tempfile.mkdtemp(prefix=f"{tag}-lldpd-")
    os.chmod(run_dir, 0o755)
    try:
        for ns in spaces.values():
            _sh(["ip", "netns", "add", ns])
            made.append(ns)
        for (host, rail), (switch, port) in cabled.items():
            _sh(["ip", "link", "add", rail, "netns", spaces[host], "type", "veth",
                 "peer", "name", port, "netns", spaces[switch]])
            _sh(["ip", "-n", spaces[host], "link", "set", rail, "up"])
            _sh(["ip", "-n", spaces[switch], "link", "set", port, "up"])
        for switch in ("leaf1", "leaf2"):
            daemons.append(_lldpd(spaces[switch], switch, tmp_path, run_dir))
        for switch in ("leaf1", "leaf2"):
            _wait_configured(spaces[switch], switch, run_dir, tmp_path)
        yield spaces
    finally:
        for daemon in daemons:
            _stop(daemon)
        for ns in made:
            for pid in _sh(["ip", "netns", "pids", ns], check=False).stdout.split():
                _kill(int(pid))  # lldpd's privilege-separated child, had it outlived its monitor
            _sh(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(run_dir, ignore_errors=True)


def _lldpd(ns: str, name: str, tmp_path, run_dir: str) -> subprocess.Popen:
    """lldpd in the foreground in ns, as switch `name`: port ids are the
    interface names (as a Cumulus switch sends them), a frame a second."""
    conf = pathlib.Path(run_dir, f"{name}.conf")
    conf.write_text(f"configure system hostname {name}\nconfigure lldp portidsubtype ifname\n"
                    "configure lldp tx-interval 1\n")
    with open(tmp_path / f"{name}.log", "wb") as log:  # what a failing test shows of lldpd
        return subprocess.Popen(["ip", "netns", "exec", ns, LLDPD, "-d", "-u", os.path.join(run_dir, f"{name}.sock"),
                                 "-O", str(conf), "-I", "swp*"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def _wait_configured(ns: str, name: str, run_dir: str, tmp_path) -> None:
    """Until lldpd runs as `name` (its configuration applied): a frame sent
    before that carries the machine's hostname and MAC port ids."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        r = _sh(["ip", "netns", "exec", ns, "lldpcli", "-u", os.path.join(run_dir, f"{name}.sock"),
                 "-f", "json", "show", "chassis"], check=False)
        if r.returncode == 0 and f'"{name}"' in r.stdout and "ifname" in _sh(
                ["ip", "netns", "exec", ns, "lldpcli", "-u", os.path.join(run_dir, f"{name}.sock"),
                 "show", "configuration"], check=False).stdout:
            return
        time.sleep(0.2)
    raise AssertionError(f"lldpd in {ns} did not take its configuration:\n"
                         + (tmp_path / f"{name}.log").read_text())


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


def _neighbours(ns: str) -> Dict[str, lldp.Neighbour]:
    """Each rail's neighbour, from one frame read off the wire."""
    r = _sh(["ip", "netns", "exec", ns, sys.executable, "-c", CAPTURE, "rail0", "rail1"])
    frames = json.loads(r.stdout)
    return {rail: lldp.decode(bytes.fromhex(frame), rail=rail) for rail, frame in frames.items()}


def _audit(spaces: Dict[str, str], tmp_path) -> dict:
    """The cabling document of the lab's verify reports."""
    plan_file = tmp_path / "cabling.csv"
    plan_file.write_text(PLAN)
    reports = []
    for host in ("gpu01", "gpu02"):
        seen = _neighbours(spaces[host])
        logs = "".join((tmp_path / f"{s}.log").read_text() for s in ("leaf1", "leaf2"))
        assert sorted(seen) == ["rail0", "rail1"], f"{host} heard no LLDP on some rail: {seen}\n{logs}"
        reports.append({"host": host, "error": None, "changes": [],
                        "facts": {rail: {cabling.NEIGHBOUR_FACT: n.to_dict()} for rail, n in seen.items()}})
    return cabling.for_audit(reports, cabling.load_plan(str(plan_file)), str(plan_file))


def test_a_lab_cabled_as_planned_passes(tmp_path):
    with lab(AS_PLANNED, tmp_path) as spaces:
        doc = _audit(spaces, tmp_path)
    assert doc["summary"]["rails"] == 4
    assert [(r["host"], r["rail"], r["status"]) for r in doc["rails"]] == [
        (host, rail, "ok") for host, rail in AS_PLANNED]
    seen = {(r["host"], r["rail"]): (r["seen"]["system_name"], r["seen"]["port_id"]) for r in doc["rails"]}
    assert seen == AS_PLANNED  # lldpd's own name and port names, as advertised


def test_a_lab_with_two_hosts_rails_crossed_finds_and_names_them(tmp_path):
    started = time.monotonic()
    with lab(CROSSED, tmp_path) as spaces:
        doc = _audit(spaces, tmp_path)
    rows = {(r["host"], r["rail"]): r for r in doc["rails"]}
    assert len(rows) == 4 and doc["summary"]["failing"] == 2
    one, two = rows[("gpu01", "rail0")], rows[("gpu02", "rail0")]
    assert (one["status"], one["planned_for"]) == ("wrong-port", "gpu02 rail0")
    assert (two["status"], two["planned_for"]) == ("wrong-port", "gpu01 rail0")
    assert (one["expected"]["switch"], one["expected"]["port"]) == ("leaf1", "swp1")
    assert (one["seen"]["system_name"], one["seen"]["port_id"]) == ("leaf1", "swp2")
    assert one["message"] == ("gpu01 rail0: wrong-port: expected leaf1 port swp1 (" + str(tmp_path / "cabling.csv")
                              + ":2), seen leaf1 port swp2, which the plan gives gpu02 rail0")
    assert rows[("gpu01", "rail1")]["status"] == rows[("gpu02", "rail1")]["status"] == "ok"
    junit = ET.fromstring(audit_formats.junit({"command": "audit", "hosts": [], "cabling": doc}))
    failed = {c.get("name"): c.find("failure").get("type") for c in junit.iter("testcase")
              if c.find("failure") is not None}
    assert failed == {"gpu01 rail0": "wrong-port", "gpu02 rail0": "wrong-port"}
    assert time.monotonic() - started < 60
