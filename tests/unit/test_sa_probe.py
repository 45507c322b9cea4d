"""health.py asks the kernel how many IPsec SAs the namespace holds (one
XFRM_MSG_GETSADINFO, netlink/sadinfo.py) before it dumps them for the
ipsec_sa_* facts: without an SA no SA concerns an interface, and the dump
costs every verify its message classes."""

from __future__ import annotations

import pytest

from nictune.host.facts import health
from nictune.host.facts.ipsec import Finding, Usage
from nictune.host.machine import Host, Interface
from nictune.host.transports.netlink import sadinfo


def _health(monkeypatch, count):
    h = health.Health(Host())
    monkeypatch.setattr(h, "counters", lambda *a, **k: {})
    monkeypatch.setattr(h, "dev_info", lambda name: None)
    monkeypatch.setattr(h, "tls_stat", lambda fresh=False: None)
    asked = []

    def ipsec(iface):
        asked.append(iface.name)
        return Usage(sas=[Finding("SA 1", "crypto", "")])

    monkeypatch.setattr(h, "ipsec", ipsec)

    def sa_count(opener=None):
        asked.append("count")
        if isinstance(count, Exception):
            raise count
        return count

    monkeypatch.setattr(sadinfo, "sa_count", sa_count)
    return h, asked


IFACE = Interface("ntnone0", 999999, None, None, None, None, None)


def test_no_sa_in_the_namespace_no_dump(monkeypatch):
    h, asked = _health(monkeypatch, 0)
    facts = h.of(IFACE)
    assert asked == ["count"] and "ipsec_sa_offloaded" not in facts


@pytest.mark.parametrize("count", [1, OSError(13, "no CAP_NET_ADMIN")])
def test_an_sa_or_no_answer_reads_them_as_before(monkeypatch, count):
    h, asked = _health(monkeypatch, count)
    assert h.of(IFACE)["ipsec_sa_offloaded"] == 1
    h.of(IFACE)
    assert asked == ["count", "ntnone0", "ntnone0"]  # the count is asked once per command
