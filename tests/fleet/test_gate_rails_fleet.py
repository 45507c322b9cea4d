"""The iperf3 gate on two rails in one subnet, with Debian's real iperf3 on
two sshd namespace hosts: each host has data0 and data1 on one bridge,
four addresses of one /24 of 198.18.0.0/16.

Without a policy rule per rail, the kernel sends everything from data1's
address out of data0 (its connected route comes first): the gate refuses
the data1 measurement, naming host, rail and NIC, even though this
iperf3 (3.12) has --bind-dev -- it does not pass a rail whose traffic
would leave by another.  With nictune's own routing family applied (a
table and rule per rail, and arp_ignore/arp_announce, so that each address
is answered for by its own NIC), the gate measures (two streams: with this iperf3, 3.12, two
one-stream processes on two ports), and the rails' own packet counters
(ip -j -s link) show the bytes on data1, not on data0.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from fleet_helpers import gate_playbook, run_gate, running_fleet

from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.rollout import gate as gatemod
from nictune.lab import fleet as fleetlab

pytestmark = pytest.mark.netns

RAILS = ("data0", "data1")


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


@pytest.fixture(scope="module")
def twin_rails(tmp_path_factory):
    """A two-host fleet whose hosts each have data0 and data1 on one bridge
    (one subnet); yields (fleet, {(host name, rail): address})."""
    if shutil.which("iperf3") is None:
        pytest.skip("needs iperf3 (scripts/setup installs it)")
    with running_fleet(tmp_path_factory, 2) as f:
        bridge = f"{f.prefix}tw"
        outside = [f"{f.prefix}t{i}{j}" for i in range(2) for j in range(2)]
        try:
            _ip("link", "add", bridge, "type", "bridge", "forward_delay", "0")
            _ip("link", "set", bridge, "up")
            subnet = fleetlab._claim_subnet(bridge, 24, fleetlab.DATA_POOL)
            addresses = {}
            for i, host in enumerate(f.of_kind("sshd")):
                for j, rail in enumerate(RAILS):
                    end = f"{f.prefix}t{i}{j}"
                    _ip("link", "add", end, "type", "veth", "peer", "name", rail, "netns", host.netns)
                    _ip("link", "set", end, "master", bridge, "up")
                    addresses[(host.name, rail)] = str(subnet.network_address + 2 + 2 * i + j)
                    # data0 first: its connected route is the one the main table answers with.
                    _ip("-n", host.netns, "addr", "add", f"{addresses[(host.name, rail)]}/24", "dev", rail)
                    _ip("-n", host.netns, "link", "set", rail, "up")
            yield f, addresses
        finally:
            for name in outside + [bridge]:
                subprocess.run(["ip", "link", "del", name], capture_output=True)


RAIL_PROFILE = """\
nictune: 1
interfaces:
  rails:
    match: {name: "data*"}
    routing: {table: 100+rail, priority: 30100+rail}
    sysctl: {ipv4.arp_ignore: 1, ipv4.arp_announce: 2}
"""


def nictune_on(host, state, *args: str) -> dict:
    """`nictune ARGS --netns` of the fleet host's namespace, as its JSON report."""
    result = CliRunner().invoke(app, [*args, "--netns", host.netns, "--state-dir", str(state), "--json"])
    return {"exit_code": result.exit_code, "output": result.output}


def route_rails_by_themselves(host, tmp_path) -> None:
    """What a same-subnet multi-rail host needs, from nictune's own routing
    family (knobs/routing.py): each rail's addresses looked up in a table of
    their own, and each NIC answering ARP for its own address only (else the
    peer's frames to data1's address may arrive on data0)."""
    profile = tmp_path / "rails.yaml"
    profile.write_text(RAIL_PROFILE)
    done = nictune_on(host, tmp_path / host.name, "apply", str(profile))
    assert done["exit_code"] == 0, done["output"]


def unroute(host, tmp_path) -> None:
    done = nictune_on(host, tmp_path / host.name, "rollback")
    assert done["exit_code"] == 0, done["output"]


def byte_counters(hosts) -> dict:
    """{(host, rail): (tx bytes, rx bytes)} from the rails' own counters."""
    out = {}
    for host in hosts:
        for rail in RAILS:
            [link] = json.loads(fleetlab.run_in(host, ["ip", "-j", "-s", "link", "show", "dev", rail]).stdout)
            out[(host.name, rail)] = (link["stats64"]["tx"]["bytes"], link["stats64"]["rx"]["bytes"])
    return out


def rises(before: dict, after: dict) -> dict:
    return {key: (after[key][0] - before[key][0], after[key][1] - before[key][1]) for key in before}


GATE = "rails: [data1]\niperf3: {seconds: 1, streams: 2, min_gbps: 0.2}"
LITTLE = 2_000_000  # ARP, the route check's nothing: far below a second of iperf3


def test_same_subnet_rails_without_policy_routing_are_refused_not_measured(twin_rails, tmp_path):
    fleet, addresses = twin_rails
    a, b = fleet.of_kind("sshd")
    before = byte_counters((a, b))
    result = run_gate(fleet, gate_playbook(tmp_path, GATE))
    moved = rises(before, byte_counters((a, b)))
    assert not result["passed"], result["message"]
    rows = [r for r in result["results"] if r["tool"] == "iperf3-tcp"]
    assert len(rows) == 2 and not any(r["passed"] or r["figures"] for r in rows), rows
    a1, b1 = addresses[(a.name, "data1")], addresses[(b.name, "data1")]
    assert f"{a.name}: data1's traffic to {b1} would leave by data0 (ip route get {b1} from {a1})" in rows[0]["why"]
    assert f"{b.name}: data1's traffic to {a1} would leave by data0" in rows[0]["why"]
    assert f"batch 1: the traffic gate failed: {a.name} > {b.name} on data1 (iperf3-tcp): not measured: " \
           in result["message"]
    # Nothing was measured, on either NIC.
    assert len(moved) == 4, moved
    assert all(tx < LITTLE and rx < LITTLE for tx, rx in moved.values()), moved


def test_with_a_route_per_rail_the_gate_measures_data1_on_data1(twin_rails, tmp_path):
    fleet, addresses = twin_rails
    a, b = fleet.of_kind("sshd")
    routed = []
    try:
        for host in (a, b):
            route_rails_by_themselves(host, tmp_path)
            routed.append(host)
        before = byte_counters((a, b))
        result = run_gate(fleet, gate_playbook(tmp_path, GATE))
        moved = rises(before, byte_counters((a, b)))
    finally:
        for host in routed:
            unroute(host, tmp_path)
    assert result["passed"], result["message"]
    rows = [r for r in result["results"] if r["tool"] == "iperf3-tcp"]
    assert len(rows) == 2 and all(r["figures"]["gbps"] > 0.2 for r in rows), rows
    # This iperf3 (3.12) binds to the rail too; two streams each way, as
    # two one-stream processes where iperf3 runs its streams in one thread.
    facts = gatemod.parse_rail_facts("iperf3 " + subprocess.run(["iperf3", "--version"], capture_output=True,
                                                                 text=True).stdout.replace("\n", " "))
    assert facts.bind_dev, facts
    assert all(r["bind_dev"] and r["streams"] == 2 and r["processes"] == (1 if facts.threaded else 2)
               for r in rows), rows
    # What a 1 s run at > 0.2 Gbit/s sends (25 MB and more) went over data1
    # each way, and data0 carried next to nothing.
    for host in (a, b):
        tx1, rx1 = moved[(host.name, "data1")]
        tx0, rx0 = moved[(host.name, "data0")]
        assert tx1 > 25_000_000 and rx1 > 25_000_000, moved
        assert tx0 < LITTLE and rx0 < LITTLE, moved
