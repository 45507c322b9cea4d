"""expect: counters on a real veth in a namespace: a counter that rises while
verify watches is drift, one whose total is old is not (issue 11 item 6).

The counter is the netdev's rx_packets (/sys/class/net/ntv0/statistics,
which health reads after ethtool -S and the RDMA hw_counters).  Namespace
B sends UDP to a 198.18.1.0/24 address routed to A, which does not forward
(a new namespace's default) and so drops it without answering; IPv6 is off
on both ends and the neighbours are static, so no other packet reaches A.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from netns_helpers import wait_for
from nictune.control.remote.targets import NetnsTarget

pytestmark = pytest.mark.netns

# Sends to a routed, non-local address every 5 ms until killed.
SENDER = ("import socket, time\n"
          "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
          "for _ in range({count}):\n"
          "    s.sendto(b'x' * 64, ('198.18.1.1', 9))\n"
          "    time.sleep({gap})\n")


@pytest.fixture
def quiet_pair(veth_pair):
    """veth_pair on which only what the test sends reaches A's ntv0."""
    mac = {}
    for ns in (veth_pair.ns_a, veth_pair.ns_b):
        for argv in (["sysctl", "-qw", "net.ipv6.conf.ntv0.disable_ipv6=1"],
                     ["sysctl", "-qw", "net.ipv4.ip_forward=0"]):
            r = veth_pair.run(ns, argv)
            assert r.returncode == 0, r.stderr
        link = json.loads(veth_pair.run(ns, ["ip", "-j", "link", "show", "ntv0"]).stdout)[0]
        mac[ns] = link["address"]
    for ns, peer, addr in ((veth_pair.ns_b, veth_pair.ns_a, "198.18.0.1"),
                           (veth_pair.ns_a, veth_pair.ns_b, "198.18.0.2")):
        r = veth_pair.run(ns, ["ip", "neigh", "replace", addr, "lladdr", mac[peer], "dev", "ntv0",
                               "nud", "permanent"])
        assert r.returncode == 0, r.stderr
    r = veth_pair.run(veth_pair.ns_b, ["ip", "route", "add", "198.18.1.0/24", "via", "198.18.0.1"])
    assert r.returncode == 0, r.stderr
    return veth_pair


def rx_packets(pair) -> int:
    return int(pair.run(pair.ns_a, ["cat", "/sys/class/net/ntv0/statistics/rx_packets"]).stdout)


def send(pair, count: int, gap: float) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", pair.ns_b, sys.executable, "-c",
                             SENDER.format(count=count, gap=gap)])


def verify(pair, tmp_path, expect: dict) -> dict:
    doc = {"nictune": 1, "interfaces": {"rail": {"match": {"name": "ntv0"}, "expect": expect}}}
    req = {"nictune_request": 1, "command": "verify",
           "profile": {"path": "p.yaml", "doc": doc, "sources": {}}}
    out = NetnsTarget(pair.ns_a, str(tmp_path)).run(req)
    return {c["key"]["name"]: c for c in out["changes"]}


EXPECT = {"counters_interval": 1, "counters": {"rx_packets": {"max": 0}},
          "counter_totals": {"rx_packets": {"max": 0}}}


def test_an_old_total_is_not_drift(quiet_pair, tmp_path):
    start = rx_packets(quiet_pair)
    sender = send(quiet_pair, 200, 0)
    assert sender.wait(timeout=30) == 0
    assert wait_for(lambda: rx_packets(quiet_pair) >= start + 200)
    got = verify(quiet_pair, tmp_path, EXPECT)
    rise, total = got["counters.rx_packets"], got["counter_totals.rx_packets"]
    assert (rise["status"], rise["before"]) == ("ok", 0), rise
    assert re.match(r"rx_packets did not rise in 1(\.[0-9])? s \(at [0-9]+\)$", rise["note"]), rise
    # Asked for as a total, the same counter is drift: 200 packets since up.
    assert total["status"] == "drift" and total["before"] >= 200, total


def test_a_rise_while_verify_watches_is_drift(quiet_pair, tmp_path):
    start = rx_packets(quiet_pair)
    sender = send(quiet_pair, 1000, 0.005)  # about 5 s of packets
    try:
        assert wait_for(lambda: rx_packets(quiet_pair) > start)
        rise = verify(quiet_pair, tmp_path, EXPECT)["counters.rx_packets"]
    finally:
        sender.kill()
        sender.wait()
    assert rise["status"] == "drift" and rise["before"] > 0, rise
    # The time between the reads, measured: 1 s, or a little more on a busy host.
    assert re.match(rf"rx_packets rose by {rise['before']} in 1(\.[0-9])? s \([0-9]+ -> [0-9]+\)$",
                    rise["note"]), rise
