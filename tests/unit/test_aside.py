"""Which pending changes take state with them that restoring their keys does
not undo (nictune/host/transaction/aside.py), and how plans say so.  Recording and
restoring that state runs against the real kernel: tests/netns/test_aside.py."""

from __future__ import annotations

import pytest

from nictune.host.transaction import aside
from nictune.host.knobs.sysctl import SysctlFamily
from nictune.host.machine import Host
from nictune.host.model import HOST, Change, Key


def change(family: str, target: str, name: str, before, after) -> Change:
    return Change(Key(family, target, name), before, after, "pending")


@pytest.mark.parametrize("c, links, ipv6_conf, warned", [
    (change("link", "eth0", "mtu", 1500, 1200), ("eth0",), True, True),
    # Above 1280 only stacked devices keep the lower MTU: put back silently.
    (change("link", "eth0", "mtu", 9000, 1500), ("eth0",), False, False),
    (change("link", "eth0", "state", "up", "down"), ("eth0",), False, True),
    (change("sysctl", "eth0", "net.ipv6.conf.eth0.disable_ipv6", 0, 1), ("eth0",), False, True),
    (change("sysctl", HOST, "net.ipv6.conf.eth0.disable_ipv6", 0, 1), ("eth0",), False, True),
    (change("sysctl", HOST, "net.ipv6.conf.all.disable_ipv6", 0, 1), (aside.EVERY_LINK,), False, True),
    (change("sysctl", HOST, "net.ipv4.ip_forward", 0, 1), (), False, True),
])
def test_changes_with_side_effects(c, links, ipv6_conf, warned):
    (effect,) = aside.affected([c])
    assert (effect.key, effect.links, effect.ipv6_conf) == (c.key, links, ipv6_conf)
    assert bool(aside.warnings([c])) is warned


@pytest.mark.parametrize("c", [
    change("link", "eth0", "mtu", 1500, 9000),
    change("link", "eth0", "state", "down", "up"),
    change("link", "eth0", "txqueuelen", 1000, 10),
    change("sysctl", "eth0", "net.ipv6.conf.eth0.disable_ipv6", 1, 0),
    change("sysctl", HOST, "net.ipv6.conf.default.disable_ipv6", 0, 1),
    change("sysctl", "eth0", "net.ipv4.conf.eth0.forwarding", 0, 1),
    change("sysctl", HOST, "net.ipv4.tcp_ecn", 0, 1),
    change("rings", "eth0", "rx", 1024, 512),
])
def test_changes_without(c):
    effects = aside.affected([c])
    assert all(not e.what for e in effects) and not aside.warnings([c])


def test_an_mtu_decrease_from_below_1280_is_recorded_not_warned():
    # An MTU already below 1280 has no IPv6 to lose, but the devices
    # stacked on the link still take the lower value: recorded, not warned.
    (effect,) = aside.affected([change("link", "eth0", "mtu", 1200, 1000)])
    assert effect.links == ("eth0",) and not effect.what


def test_plan_warnings_say_what_rollback_restores_and_what_not():
    (mtu,) = aside.warnings([change("link", "eth0", "mtu", 1500, 1200)])
    assert mtu.startswith("eth0: MTU 1200 is below 1280")
    assert "rollback restores the addresses, routes and sysctls that nictune records" in mtu
    assert "other state, such as neighbour entries" in mtu and mtu.endswith("is not")
    (fwd,) = aside.warnings([change("sysctl", HOST, "net.ipv4.ip_forward", 0, 1)])
    assert "net.ipv4.conf.<every interface>.forwarding" in fwd
    assert "net.ipv4.conf.all.accept_redirects" in fwd and "LRO" in fwd


def test_a_spread_sysctl_says_so_in_its_plan_note():
    fam = SysctlFamily(Host())
    note = fam.note(Key("sysctl", HOST, "net.ipv6.conf.all.forwarding"))
    assert note == "writing it also sets net.ipv6.conf.<every interface>.forwarding"
    assert fam.note(Key("sysctl", HOST, "net.ipv4.tcp_ecn")) == ""


@pytest.mark.parametrize("record", [
    {"format": 1},                                   # no time, no lists
    {"format": 2, "taken": 0},                       # a format this nictune does not know
    {"format": 1, "taken": "soon", "links": {}, "sysctl": [], "addresses": [], "routes": []},
])
def test_a_damaged_record_is_reported_not_raised(record):
    (line,) = aside.restore(Host(), record)
    assert "damaged" in line and "not all restored" in line


def test_nothing_recorded_nothing_to_restore():
    assert aside.restore(Host(), None) == []
    assert aside.snapshot(Host(), []) is None
