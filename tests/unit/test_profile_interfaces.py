"""The engine matches interface entries before host: sections expand, and
tells host families which interfaces the profile's entries took
(Family.profile_interfaces), so that NCCL_IB_HCA: auto can keep to the
rails.  The host is the fake mlx5 kernel (tests/fakes.py)."""

from __future__ import annotations

from fakes import FakeHost
from shipped import P0, P1
from nictune.host.transaction.engine import Families, expand
from nictune.host.knobs.base import Family

PROFILE = {"nictune": 1,
           "host": {"sysctl": {"net.core.rmem_max": 1}},
           "interfaces": {"front": {"match": {"name": P1}, "mtu": 1500},
                          "rails": {"match": {"name": P0}, "roce": {"tos": 106}}}}


def test_host_families_see_the_rails_and_every_matched_interface(tmp_path):
    fams = Families(FakeHost("cx7-host", tmp_path / "root"))
    desire = expand(fams.ordered[0].host, fams, PROFILE, {})
    assert fams.ordered
    for fam in fams.ordered:
        assert fam.profile_interfaces == {"roce": [P0], "all": [P1, P0]}
    # Host keys still come first, as the profile reads.
    assert next(iter(desire.items)).target == "host"


def test_without_interface_entries_there_is_nothing_to_keep_to(tmp_path):
    fams = Families(FakeHost("cx7-host", tmp_path / "root"))
    expand(fams.ordered[0].host, fams, {"nictune": 1, "host": PROFILE["host"]}, {})
    assert fams.ordered
    assert all(fam.profile_interfaces is None for fam in fams.ordered)
    assert Family(None).profile_interfaces is None
