"""The controller's replays share decoded netlink messages between hosts
(host/replay/decoded.py), on a real kernel: two hosts (namespaces) asked
the same verify, one as wanted and one drifted, each replayed in turn in
one process, get each their own report, the agent's own; what both
answered alike is decoded once.  Namespaces nt<tag>{a,b} (conftest.py
veth_pair), addresses from 198.18.0.0/15, removed whatever happens."""

from __future__ import annotations

import pytest

import test_probe as probe_test
from nictune.control.remote import probe
from nictune.host.transports.netlink import _nlmsg

pytestmark = pytest.mark.netns


def test_two_hosts_answers_replayed_in_turn_keep_their_own_reports(veth_pair, tmp_path, monkeypatch):
    run = veth_pair.run
    for ns, mtu in ((veth_pair.ns_a, "9000"), (veth_pair.ns_b, "1500")):
        for argv in (["ip", "link", "set", "ntv0", "mtu", mtu], ["ethtool", "-K", "ntv0", "gro", "off"],
                     ["sysctl", "-qw", "net.ipv4.tcp_mtu_probing=1", "net.ipv4.tcp_ecn=1",
                      "net.ipv4.conf.ntv0.arp_ignore=1"]):
            assert run(ns, argv).returncode == 0
    req = probe_test.request(tmp_path)
    hosts = {}
    for ns in (veth_pair.ns_a, veth_pair.ns_b):
        agent_report, questions = probe_test.learned(ns, req)
        data = probe_test.probe_in(ns, questions)
        hosts[ns] = (agent_report, questions, data)

    decodes = []
    real = _nlmsg.nlmsg.decode
    monkeypatch.setattr(_nlmsg.nlmsg, "decode", lambda self: (decodes.append(1), real(self))[1])

    def replay(ns: str) -> tuple:
        before = len(decodes)
        _, questions, data = hosts[ns]
        report = probe.verify(probe.parse_answers(data, questions), req, req["host"])
        return report, len(decodes) - before

    first_a, decoded_a = replay(veth_pair.ns_a)
    first_b, decoded_b = replay(veth_pair.ns_b)
    again_a, decoded_again = replay(veth_pair.ns_a)
    again_b, _ = replay(veth_pair.ns_b)

    assert probe_test.drift(first_a) == set()
    assert probe_test.drift(first_b) == {("ntv0", "mtu")}
    for ns, reports in ((veth_pair.ns_a, (first_a, again_a)), (veth_pair.ns_b, (first_b, again_b))):
        for report in reports:
            assert probe_test.comparable(report) == probe_test.comparable(hosts[ns][0])
    # The same bytes again decode nothing; the second host's answers that
    # equal the first's (the feature names, the family lookups) are not
    # decoded again either.
    assert decoded_a > 0 and decoded_again == 0, (decoded_a, decoded_again)
    assert 0 < decoded_b < decoded_a, (decoded_a, decoded_b)
