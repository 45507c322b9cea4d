"""`nictune history` and `nictune rollback --to` over SSH (real sshd per
namespace host, the zipapp agent): two applies on two hosts, listed, then
both undone on one host with --to and one on the other with --steps.
Every value is read back with `ip` and `sysctl` inside the host's
namespace, never through nictune.
"""

from __future__ import annotations

import pytest
from fleet_helpers import by_host, mtu, nictune, profile_file, tcp_ecn

pytestmark = pytest.mark.netns

FIRST = """\
nictune: 1
host:
  sysctl:
    net.ipv4.tcp_ecn: 1
interfaces:
  rails:
    match: {name: "rail*"}
    mtu: 9000
"""

SECOND = """\
nictune: 1
interfaces:
  rails:
    match: {name: "rail*"}
    mtu: 4000
"""


def test_history_and_rollback_to_over_ssh(make_fleet, tmp_path):
    fleet = make_fleet(2)
    a, b = fleet.of_kind("sshd")
    start = {h.name: (mtu(h), mtu(h, "rail1"), tcp_ecn(h)) for h in (a, b)}
    assert all(m != (9000, 9000, "1") for m in start.values())
    for name, body in (("first.yaml", FIRST), ("second.yaml", SECOND)):
        code, report = nictune("apply", profile_file(tmp_path, body, name), "-i", fleet.inventory,
                               "--limit", "fleet")
        assert code == 0, report
    assert all(mtu(h) == 4000 for h in (a, b))

    code, report = nictune("history", "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report
    histories = {n: h["history"] for n, h in by_host(report).items()}
    assert set(histories) == {a.name, b.name}
    for entries in histories.values():
        assert [e["profile"].rsplit("/", 1)[-1] for e in entries] == ["second.yaml", "first.yaml"]
        assert [e["status"] for e in entries] == ["committed", "committed"]
    first_on_a = histories[a.name][1]["id"]

    code, report = nictune("rollback", "--to", first_on_a, "-i", fleet.inventory, "--limit", a.name)
    assert code == 0, report
    assert by_host(report)[a.name]["rolled_back"] == [histories[a.name][0]["id"], first_on_a]
    assert (mtu(a), mtu(a, "rail1"), tcp_ecn(a)) == start[a.name]

    code, report = nictune("rollback", "--steps", "1", "-i", fleet.inventory, "--limit", b.name)
    assert code == 0, report
    assert (mtu(b), tcp_ecn(b)) == (9000, "1")
    # A plain rollback now restores nothing: b's first apply is still in
    # place, and the error names it.
    code, report = nictune("rollback", "-i", fleet.inventory, "--limit", b.name)
    error = by_host(report)[b.name]["error"]
    assert code == 1 and error["kind"] == "no-journal" and histories[b.name][1]["id"] in error["message"]
    assert (mtu(b), tcp_ecn(b)) == (9000, "1")
