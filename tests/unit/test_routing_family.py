"""The routing family (knobs/routing.py) on the recorded ConnectX-7 host
(tests/fakes.py FakeInet: its addresses, rules and routes): rail numbers,
the kernel's tables refused, a taken priority refused, a rail with two
addresses, and a rollback that deletes only what the apply added.  The real
kernel, with traffic, is tests/netns/test_rail_routing.py."""

from __future__ import annotations

import os

import pytest

from fakes import FakeHost
from nictune.host.errors import InvalidInput
from nictune.host.knobs.routing import RTPROT_NICTUNE, claimed, parse, rail_number
from nictune.host.model import Key
from nictune.host.transaction.engine import Engine
from nictune.profile.loader import load_profile_text

from shipped import P0, P1, REPO

pytestmark = pytest.mark.recorded

PROFILES = os.path.join(REPO, "profiles")
RAILS = """\
nictune: 1
interfaces:
  rails:
    match: {driver: mlx5_core}
    routing: {table: %s, priority: %s%s}
"""


def engine(tmp_path, **overlay):
    h = FakeHost({"base": "cx7-host", **overlay}, tmp_path / "root")
    return h, Engine(h, str(tmp_path / "state"))


def profile(table="100+rail", priority="30100+rail"):
    return load_profile_text(RAILS % (table, priority, ""), "p.yaml", PROFILES)


def routing_changes(out) -> dict:
    return {(c.key.target, c.key.name): c for c in out.changes if c.key.family == "routing"}


def test_rail_numbers_and_what_lint_claims():
    assert [rail_number("100+rail", i) for i in range(3)] == [100, 101, 102]
    assert rail_number(7, 5) == 7
    assert claimed(7) == {7} and len(claimed("100+rail")) == 32 and claimed("x+rail") == set()


def test_each_rail_gets_its_own_table_and_priority_in_match_order(tmp_path):
    _, e = engine(tmp_path)
    p = profile()
    changes = routing_changes(e.plan(p.doc, p.sources))
    assert sorted(changes) == [
        (P0, "route 198.18.7.0/24 table 100 src 198.18.7.1"),
        (P0, "rule 30100 from 198.18.7.1 lookup 100"),
        (P1, "route 198.18.7.0/24 table 101 src 198.18.7.2"),
        (P1, "rule 30101 from 198.18.7.2 lookup 101"),
    ]
    assert all((c.before, c.status) == ("absent", "pending") for c in changes.values())
    assert all(c.source == "p.yaml:5" for c in changes.values())


def test_a_table_of_the_kernel_is_refused_naming_the_line(tmp_path):
    _, e = engine(tmp_path)
    p = profile(table=254)
    with pytest.raises(InvalidInput, match=r"p.yaml:5: routing.table 254 .* kernel's tables"):
        e.plan(p.doc, p.sources)


def test_a_priority_another_rule_holds_is_refused_but_a_second_address_is_not(tmp_path):
    operators = {"family": 4, "priority": 30101, "src": "198.18.9.9", "src_len": 32, "dst": None,
                 "dst_len": 0, "table": 9, "proto": 3}
    _, e = engine(tmp_path, rules=[operators])
    p = profile()
    changes = routing_changes(e.plan(p.doc, p.sources))
    refused = changes[(P1, "rule 30101 from 198.18.7.2 lookup 101")]
    assert refused.status == "unsupported" and "priority 30101 already holds another rule" in refused.note
    # A second address on rail 0 with its rule already there: one more rule
    # at the same priority into the same table, nictune's own.
    ours = parse(Key("routing", P0, "rule 30100 from 198.18.7.1 lookup 100"))
    _, e = engine(tmp_path / "two", rules=[ours], addresses=[
        {"dev": P0, "local": "198.18.7.1", "prefixlen": 24},
        {"dev": P0, "local": "198.18.7.11", "prefixlen": 24}])
    changes = routing_changes(e.plan(p.doc, p.sources))
    assert changes[(P0, "rule 30100 from 198.18.7.1 lookup 100")].status == "ok"
    assert changes[(P0, "rule 30100 from 198.18.7.11 lookup 100")].status == "pending"


def test_rollback_deletes_what_apply_added_and_nothing_else(tmp_path):
    lookalike = {**parse(Key("routing", P1, "rule 30101 from 198.18.7.2 lookup 101")), "proto": 3}
    h, e = engine(tmp_path, rules=[lookalike])
    before = (list(h.kernel.rules), list(h.kernel.routes))
    p = load_profile_text(RAILS % ("100+rail", "30100+rail", "") + "    on_unsupported: skip\n",
                          "p.yaml", PROFILES)
    out = e.apply(p.doc, p.sources, p.path)
    assert out.error is None, out
    # The operator's rule holds rail 1's priority: its rule is skipped, the rest written.
    assert h.kernel.rules[0] == lookalike and len(h.kernel.rules) == 2 and len(h.kernel.routes) == 2
    assert all(r["proto"] == RTPROT_NICTUNE for r in h.kernel.rules[1:] + h.kernel.routes)
    out = e.rollback()
    assert out.error is None, out
    assert (h.kernel.rules, h.kernel.routes) == before


def test_declared_addresses_are_added_and_only_those_removed(tmp_path):
    # Rail 0 already has its declared address (the operator's): it stays
    # after rollback; rail 1's is nictune's and goes.
    h, e = engine(tmp_path, addresses=[{"dev": P0, "local": "198.18.8.1", "prefixlen": 24}])
    before = list(h.kernel.addresses)
    p = load_profile_text(RAILS % ("100+rail", "30100+rail", ", address: 198.18.8.1/24+rail"),
                          "p.yaml", PROFILES)
    changes = routing_changes(e.plan(p.doc, p.sources))
    assert changes[(P0, "address 198.18.8.1/24")].status == "ok"
    assert changes[(P1, "address 198.18.8.2/24")].status == "pending"
    assert changes[(P1, "rule 30101 from 198.18.8.2 lookup 101")].source == "p.yaml:5"
    assert e.apply(p.doc, p.sources, p.path).error is None
    assert {(a["dev"], a["local"]) for a in h.kernel.addresses} == {(P0, "198.18.8.1"), (P1, "198.18.8.2")}
    assert e.rollback().error is None
    assert h.kernel.addresses == before and h.kernel.rules == [] and h.kernel.routes == []


def test_a_declared_address_outside_its_subnet_is_refused(tmp_path):
    _, e = engine(tmp_path)
    p = load_profile_text(RAILS % ("100+rail", "30100+rail", ", address: 198.18.8.254/24+rail"),
                          "p.yaml", PROFILES)
    with pytest.raises(InvalidInput, match=r"p.yaml:5: routing.address '198.18.8.254/24\+rail' for "):
        e.plan(p.doc, p.sources)


def sysctl_changes(out) -> dict:
    return {(c.key.target, c.key.name.rsplit(".", 1)[1]): c for c in out.changes
            if c.key.family == "sysctl"}


def test_rails_in_one_subnet_get_the_arp_and_rp_filter_sysctls_as_defaults(tmp_path):
    # The recorded rails share 198.18.7.0/24: one subnet.
    _, e = engine(tmp_path)
    p = profile()
    changes = sysctl_changes(e.plan(p.doc, p.sources))
    assert {k: c.after for k, c in changes.items()} == {
        (rail, leaf): value for rail in (P0, P1)
        for leaf, value in (("arp_ignore", 1), ("arp_announce", 2), ("rp_filter", 2))}
    assert all(c.source == "p.yaml:5 (routing default: rails in one subnet)" for c in changes.values())


def test_the_profiles_own_sysctl_overrides_the_default_without_a_conflict(tmp_path):
    _, e = engine(tmp_path)
    text = RAILS % ("100+rail", "30100+rail", "") + "    sysctl: {ipv4.rp_filter: 0}\n"
    # In another entry too: the profile's value wins whichever entry sets it.
    other = text + "  strict:\n    match: {name: %s}\n    sysctl: {ipv4.arp_ignore: 2}\n" % P1
    p = load_profile_text(other, "p.yaml", PROFILES)
    changes = sysctl_changes(e.plan(p.doc, p.sources))
    assert (changes[(P0, "rp_filter")].after, changes[(P0, "rp_filter")].source) == (0, "p.yaml:6")
    assert (changes[(P1, "arp_ignore")].after, changes[(P1, "arp_ignore")].source) == (2, "p.yaml:9")
    assert changes[(P0, "arp_ignore")].after == 1 and "routing default" in changes[(P0, "arp_ignore")].source


def test_rails_in_subnets_of_their_own_get_arp_announce_alone(tmp_path):
    _, e = engine(tmp_path, addresses=[{"dev": P0, "local": "198.18.7.1", "prefixlen": 24},
                                       {"dev": P1, "local": "198.18.8.1", "prefixlen": 24}])
    p = profile()
    changes = sysctl_changes(e.plan(p.doc, p.sources))
    assert {k: c.after for k, c in changes.items()} == {(P0, "arp_announce"): 2, (P1, "arp_announce"): 2}
    assert changes[(P1, "arp_announce")].source == "p.yaml:5 (routing default: a subnet per rail)"


def test_a_profile_with_routing_alone_loads_the_sysctl_family():
    from nictune.host import knobs
    assert "sysctl" in knobs.families_for({"interfaces": {"r": {"routing": {}}}})


def test_each_hosts_rail_addresses_come_from_its_inventory_variables(tmp_path):
    # The inventory's nictune: layer of a host overrides the profile's
    # address pattern with a list, one address per rail, each rail in a
    # subnet of its own: so only arp_announce comes as a default.
    from nictune.control.remote.fleet import Profiles
    from nictune.inventory import load_inventory

    (tmp_path / "p.yaml").write_text(RAILS % ("100+rail", "30100+rail", ", address: 198.18.8.1/24+rail"))
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    node0:\n      nictune:\n        interfaces:\n          rails:\n"
        "            routing: {address: [198.18.10.1/24, 198.18.11.1/24]}\n")
    inv = load_inventory(str(tmp_path / "hosts.yml"))
    p = Profiles(str(tmp_path / "p.yaml")).for_host(inv.hosts["node0"])
    _, e = engine(tmp_path / "host", addresses=[])
    out = e.plan(p.doc, p.sources)
    changes = routing_changes(out)
    added = {k: c for k, c in changes.items() if k[1].startswith("address")}
    assert sorted(added) == [(P0, "address 198.18.10.1/24"), (P1, "address 198.18.11.1/24")]
    assert all(c.source.endswith("hosts.yml:4") for c in added.values()), added  # its nictune: line
    assert changes[(P1, "rule 30101 from 198.18.11.1 lookup 101")].status == "pending"
    assert sorted(sysctl_changes(out)) == [(P0, "arp_announce"), (P1, "arp_announce")]


def test_a_list_shorter_than_the_rails_is_refused_naming_the_line(tmp_path):
    _, e = engine(tmp_path)
    p = load_profile_text(RAILS % ("100+rail", "30100+rail", ", address: [198.18.10.1/24]"),
                          "p.yaml", PROFILES)
    with pytest.raises(InvalidInput, match=r"p.yaml:5: routing.address lists 1 addresses, but the "
                                           r"entry matched .* too \(rail 1\): give one address per rail"):
        e.plan(p.doc, p.sources)
