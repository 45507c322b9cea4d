"""Fixtures for tests that run against the real kernel inside network namespaces.

Everything created here lives in two throw-away namespaces named nt<random>a /
nt<random>b, so deleting the namespaces removes it all (a veth end dies with
its namespace, taking the peer with it).  Addresses come only from the
benchmarking range 198.18.0.0/15.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import List

import pytest

_ENV = {**os.environ, "LANG": "C", "LC_ALL": "C"}


def _sh(argv: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=_ENV, capture_output=True, text=True, check=False)


def _require_netns() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 'ip' is not installed")
    if _sh(["ip", "netns", "list"]).returncode != 0:
        pytest.skip("'ip netns' is not available")


@dataclass
class VethPair:
    ns_a: str
    ns_b: str
    ifname: str  # the same name at both ends, one end per namespace

    def run(self, ns: str, argv: List[str]) -> subprocess.CompletedProcess:
        """argv inside namespace ns (text output, LANG=C, never raises on exit code)."""
        return _sh(["ip", "netns", "exec", ns, *argv])


def _wait_operstate_up(pair: VethPair, timeout: float = 3.0) -> None:
    # Carrier/operstate follow "link up" asynchronously (linkwatch); tests
    # that compare operstate between two readers need it settled first.
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for ns in (pair.ns_a, pair.ns_b):
            r = _sh(["ip", "-n", ns, "-j", "link", "show", pair.ifname])
            states.append(json.loads(r.stdout)[0]["operstate"] if r.returncode == 0 else None)
        if states == ["UP", "UP"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"veth ends did not come up: {states}")
        time.sleep(0.02)


@pytest.fixture
def veth_pair():
    _require_netns()
    tag = secrets.token_hex(3)
    pair = VethPair(ns_a=f"nt{tag}a", ns_b=f"nt{tag}b", ifname="ntv0")
    created: List[str] = []

    def must(argv: List[str]) -> None:
        r = _sh(argv)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {r.stderr.strip()}")

    try:
        for ns in (pair.ns_a, pair.ns_b):
            must(["ip", "netns", "add", ns])
            created.append(ns)
        must(
            ["ip", "link", "add", pair.ifname, "netns", pair.ns_a, "type", "veth",
             "peer", "name", pair.ifname, "netns", pair.ns_b]
        )
        for ns, addr in ((pair.ns_a, "198.18.0.1/30"), (pair.ns_b, "198.18.0.2/30")):
            must(["ip", "-n", ns, "addr", "add", addr, "dev", pair.ifname])
            must(["ip", "-n", ns, "link", "set", pair.ifname, "up"])
            must(["ip", "-n", ns, "link", "set", "lo", "up"])
        _wait_operstate_up(pair)
        yield pair
    finally:
        for ns in created:
            _sh(["ip", "netns", "del", ns])
