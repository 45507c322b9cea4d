"""Fleets of namespace hosts, each with its own real sshd (lab/fleet.py).

`fleet`: one per test module: 4 sshd hosts, 1 silent, 1 unreachable.
`make_fleet(n, **kw)`: more fleets inside one test, removed when it ends.
Every fleet gets a random prefix "nt" + 4 hex digits and a temporary
directory; it is removed when its fixture ends, pass or fail, and a
session-end safety net removes any fleet this run recorded and did not
remove (say, a finalizer that was interrupted).
"""

from __future__ import annotations

import os
import secrets
import shutil
from typing import List

import pytest
from fleet_helpers import profile_file

from nictune.lab import fleet as fleetlab

_RECORDS: List[str] = []  # every fleet record this run may have written


def _require_fleet() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces and sshd")
    if shutil.which("ip") is None or not os.access(fleetlab.SSHD, os.X_OK) or shutil.which("ssh-keygen") is None:
        pytest.skip("needs iproute2, OpenSSH's sshd and ssh-keygen")


def _up(tmp_path_factory, n: int, **kw) -> fleetlab.Fleet:
    directory = str(tmp_path_factory.mktemp("fleet"))
    # Registered before up() so that even a half-built fleet is found later.
    _RECORDS.append(os.path.join(directory, "record.json"))
    kw.setdefault("prefix", "nt" + secrets.token_hex(2))
    return fleetlab.up(n, directory, **kw)


@pytest.fixture(scope="session", autouse=True)
def _fleet_safety_net():
    yield
    for record in _RECORDS:
        fleetlab.down(record)  # a no-op for a fleet already removed


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    _require_fleet()
    f = _up(tmp_path_factory, 4, silent=1, unreachable=1)
    try:
        yield f
    finally:
        fleetlab.down(f.record)


@pytest.fixture
def make_fleet(tmp_path_factory):
    _require_fleet()
    made: List[str] = []

    def make(n: int, **kw) -> fleetlab.Fleet:
        f = _up(tmp_path_factory, n, **kw)
        made.append(f.record)
        return f

    try:
        yield make
    finally:
        for record in made:
            fleetlab.down(record)


# A profile the sshd hosts' rails match (modules may define their own).
RAILS_PROFILE = """\
nictune: 1
interfaces:
  rails:
    match: {name: "rail*"}
    mtu: 9000
"""


@pytest.fixture
def profile(tmp_path):
    return profile_file(tmp_path, RAILS_PROFILE, "rails.yaml")
