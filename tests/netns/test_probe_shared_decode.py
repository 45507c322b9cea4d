"""The controller's replays share decoded netlink messages between hosts
(host/replay/decoded.py), on a real kernel: two hosts (namespaces) asked
the same verify, one as wanted and one drifted, each replayed in turn in
one process, get each their own report, the agent's own; what both
answered alike is decoded for neither once it is kept.  Namespaces nt<tag>{a,b} (conftest.py
veth_pair), addresses from 198.18.0.0/15, removed whatever happens."""

from __future__ import annotations

import pytest

import test_probe as probe_test
from nictune.control.remote import probe
from nictune.host.replay import decoded, probe_reads
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

    # A cache of this test's own: the process-wide one holds what earlier
    # tests' replays decoded, and the counts below start from nothing.
    monkeypatch.setattr(probe_reads._ReplaySocket, "decoded", decoded.DecodedCache())
    decodes = []
    real = _nlmsg.nlmsg.decode
    monkeypatch.setattr(_nlmsg.nlmsg, "decode", lambda self: (decodes.append(1), real(self))[1])

    def replay(ns: str) -> tuple:
        before = len(decodes)
        _, questions, data = hosts[ns]
        report = probe.verify(probe.parse_answers(data, questions), req, req["host"])
        return report, len(decodes) - before

    rounds = [[replay(veth_pair.ns_a), replay(veth_pair.ns_b)] for _ in range(3)]

    for (report_a, _), (report_b, _) in rounds:
        assert probe_test.drift(report_a) == set()
        assert probe_test.drift(report_b) == {("ntv0", "mtu")}
        assert probe_test.comparable(report_a) == probe_test.comparable(hosts[veth_pair.ns_a][0])
        assert probe_test.comparable(report_b) == probe_test.comparable(hosts[veth_pair.ns_b][0])
    (_, first_a), (_, first_b) = rounds[0]
    (_, second_a), (_, second_b) = rounds[1]
    (_, third_a), (_, third_b) = rounds[2]
    # Bytes met once are decoded as ever; met again (the second host's
    # feature names, family lookups...) they are kept, and from then on
    # decoded for no host.
    assert first_a > 0 and first_b == first_a, rounds
    assert 0 < second_a < first_a, rounds
    assert third_a == third_b == 0, rounds
