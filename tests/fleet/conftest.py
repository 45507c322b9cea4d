"""Fleets of namespace hosts, each with its own real sshd (lab/fleet.py).

`fleet`: one per test module: 4 sshd hosts, 1 silent, 1 unreachable.
`make_fleet(n, **kw)`: more fleets inside one test, removed when it ends.
A module that needs a fleet of another shape makes its fixture with
fleet_helpers.running_fleet (the same start, records and removal).
Every fleet gets a random prefix "nt" + 4 hex digits and a temporary
directory; it is removed when its fixture ends, pass or fail, and a
session-end safety net removes any fleet this run recorded and did not
remove (say, a finalizer that was interrupted).
"""

from __future__ import annotations

from typing import List

import pytest
from fleet_helpers import RECORDS, profile_file, require_fleet, running_fleet, start_fleet

from nictune.lab import fleet as fleetlab


@pytest.fixture(scope="session", autouse=True)
def _fleet_safety_net():
    yield
    for record in RECORDS:
        fleetlab.down(record)  # a no-op for a fleet already removed


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with running_fleet(tmp_path_factory, 4, silent=1, unreachable=1) as f:
        yield f


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two reachable sshd hosts of the module's own, for tests that change them."""
    with running_fleet(tmp_path_factory, 2) as f:
        yield f


@pytest.fixture
def make_fleet(tmp_path_factory):
    require_fleet()
    made: List[str] = []

    def make(n: int, **kw) -> fleetlab.Fleet:
        f = start_fleet(str(tmp_path_factory.mktemp("fleet")), n, **kw)
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


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A fleet of two sshd hosts with a real Slurm over them
    (tests/fleet/slurm_lab.py), for one test module: (fleet, slurm)."""
    from slurm_lab import running_slurm

    with running_fleet(tmp_path_factory, 2) as fleet:
        with running_slurm(fleet, str(tmp_path_factory.mktemp("slurm"))) as slurm:
            yield fleet, slurm
