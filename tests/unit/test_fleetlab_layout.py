"""The fleet lab's layout at 1,000 hosts without building one: addresses
(one subnet of the test range, distinct, none the bridge's or the
broadcast), the hosts shared among bridges each under the kernel's port
limit, names that fit IFNAMSIZ, and the limits checked before anything is
made (lab/fleet.py)."""

from __future__ import annotations

import ipaddress
import os

import pytest

from nictune.lab import fleet as fleetlab

TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")


def test_a_fleet_of_1000_gets_1000_distinct_addresses_in_one_subnet_of_the_test_range():
    assert fleetlab.MAX_HOSTS >= 1000
    prefixlen = fleetlab.subnet_prefix(1000)
    assert prefixlen == 22
    subnets = list(fleetlab.POOL.subnets(new_prefix=prefixlen))
    assert len(subnets) >= 2 and fleetlab.POOL.subnet_of(TEST_RANGE)
    subnet = subnets[-1]
    addresses = [ipaddress.ip_address(a) for a in fleetlab.host_addresses(subnet, 1000)]
    assert len(addresses) == 1000 and len(set(addresses)) == 1000
    reserved = {subnet.network_address, subnet.network_address + 1, subnet.broadcast_address}
    for a in addresses:
        assert a in subnet and a in TEST_RANGE and a not in reserved
    with pytest.raises(fleetlab.FleetError, match="cannot hold"):
        fleetlab.host_addresses(ipaddress.ip_network("198.19.0.0/23"), 510)


def test_the_bridges_of_1000_hosts_each_stay_under_the_port_limit_and_join_the_first():
    names = [f"ntbf1234h{i:03d}" for i in range(1, 1001)]
    segments = fleetlab.bridge_layout("ntbf1234br", names)
    assert len(segments) >= 2
    assert [p for s in segments for p in s.ports] == names  # each host once, in order
    first = segments[0]
    assert first.bridge == "ntbf1234br" and first.join is None
    for s in segments:
        joins_here = 1 if s.join else len(segments) - 1
        assert len(s.ports) <= fleetlab.HOSTS_PER_BRIDGE
        assert len(s.ports) + joins_here <= fleetlab.BRIDGE_MAX_PORTS < 1024
    others = segments[1:]
    assert others and all(s.join and s.join[0].startswith(s.bridge) for s in others)
    links = fleetlab._bridge_links(segments)
    assert len(links) == len(set(links)) == 3 * len(segments) - 2
    assert all(len(name) <= fleetlab.IFNAMSIZ for name in links + names)
    # Who enslaves what: every host port on its own bridge, each join's ends
    # on its bridge and on the first.
    lines = fleetlab._bridge_lines(segments) + fleetlab._port_lines(segments)
    for s in segments:
        for port in s.ports:
            assert f"link set {port} master {s.bridge} up" in lines
    for s in others:
        assert f"link set {s.join[0]} master {s.bridge} up" in lines
        assert f"link set {s.join[1]} master {first.bridge} up" in lines
    # Up to HOSTS_PER_BRIDGE, one bridge, as before the split.
    assert [s.bridge for s in fleetlab.bridge_layout("ntxbr", names[:fleetlab.HOSTS_PER_BRIDGE])] == ["ntxbr"]


def test_a_prefix_too_long_for_1000_hosts_is_refused_before_anything_is_made(tmp_path):
    directory = tmp_path / "fleet"
    with pytest.raises(fleetlab.FleetError, match=r"'nt123456789h1000' has 16 characters"):
        fleetlab.up(1000, str(directory), prefix="nt123456789")
    assert not directory.exists()


def test_limits_too_low_for_the_fleet_are_refused_with_what_to_raise(monkeypatch):
    set_to = []
    monkeypatch.setattr(fleetlab, "_free_pids", lambda: (100_000, "kernel.pid_max"))
    monkeypatch.setattr(fleetlab, "_mem_available_kb", lambda: 64 * 1024 * 1024)
    monkeypatch.setattr(fleetlab.resource, "setrlimit", lambda what, limits: set_to.append(limits))

    monkeypatch.setattr(fleetlab.resource, "getrlimit", lambda what: (1024, 1024))
    with pytest.raises(fleetlab.FleetError, match=r"needs 1256 open files .* its limit is 1024: raise it"):
        fleetlab.check_limits(1000)
    assert set_to == []
    fleetlab.check_limits(500)  # 756 open files are within 1024

    # A hard limit high enough: the soft one is raised, no error.
    monkeypatch.setattr(fleetlab.resource, "getrlimit", lambda what: (1024, 1 << 20))
    fleetlab.check_limits(1000)
    assert set_to == [(1256, 1 << 20)]

    monkeypatch.setattr(fleetlab, "_free_pids", lambda: (2000, "kernel.pid_max (4096, 2096 tasks running)"))
    with pytest.raises(fleetlab.FleetError, match=r"needs about 2512 free process IDs.*kernel.pid_max"):
        fleetlab.check_limits(1000)
    monkeypatch.setattr(fleetlab, "_free_pids", lambda: (100_000, "kernel.pid_max"))
    monkeypatch.setattr(fleetlab, "_mem_available_kb", lambda: 1024 * 1024)
    with pytest.raises(fleetlab.FleetError, match=r"needs about 3000 MB of memory .*MemAvailable is 1024 MB"):
        fleetlab.check_limits(1000)


def test_free_pids_reads_this_machine():
    free, where = fleetlab._free_pids()
    assert free > 0 and where
    assert os.path.exists("/proc/sys/kernel/pid_max")
