"""What a change takes with it (nictune/host/transaction/aside.py), against the real
kernel: an MTU below 1280, `state: down` and ip_forward take addresses,
routes and per-interface sysctls that restoring their keys does not bring
back; rollback (manual and automatic) must put them back, or fail with the
list of what it could not, never say "restored".

Everything is read back with `ip -j` and `sysctl`.  IPv6 addresses come
from the documentation range 2001:db8::/32, inside the test's namespaces
only: the cases are about IPv6, and nothing leaves the veth pair.
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest

import netns_helpers

pytestmark = pytest.mark.netns

V6 = "2001:db8:5::1/64"
V6_GW = "2001:db8:5::2"
V6_NET = "2001:db8:99::/64"
V4_NET = "198.18.99.0/24"


@pytest.fixture
def lab(veth_pair, tmp_path):
    veth_pair.state = tmp_path / "state"
    veth_pair.dir = tmp_path
    return veth_pair


def must(lab, *argv: str) -> str:
    r = lab.run(lab.ns_a, list(argv))
    assert r.returncode == 0, f"{' '.join(argv)}: {r.stderr}"
    return r.stdout


def nictune(lab, *args: str) -> tuple:
    code, report = netns_helpers.nictune(lab, *args)
    return code, report["hosts"][0] if report.get("hosts") else report


def profile(lab, body: str) -> str:
    path = lab.dir / "p.yaml"
    path.write_text("nictune: 1\n" + textwrap.dedent(body))
    return str(path)


def addresses(lab, dev: str = "ntv0") -> set:
    """Addresses that are not the kernel's link-local ones."""
    info = json.loads(must(lab, "ip", "-j", "addr", "show", "dev", dev))[0]["addr_info"]
    return {f"{a['local']}/{a['prefixlen']}" for a in info if a.get("scope") != "link"}


def routes(lab) -> set:
    """(dst, gateway, dev, table, metric) of every non-kernel route, both families."""
    out = set()
    for family in ("-4", "-6"):
        for r in json.loads(must(lab, "ip", "-j", family, "route", "show", "table", "all")):
            if r.get("protocol") not in ("kernel", "ra") and r.get("type", "unicast") == "unicast":
                out.add((r["dst"], r.get("gateway"), r.get("dev"), r.get("table", "main"),
                         r.get("metric")))
    return out


def link(lab, dev: str) -> dict:
    return json.loads(must(lab, "ip", "-j", "link", "show", "dev", dev))[0]


def sysctl(lab, key: str) -> str:
    return must(lab, "sysctl", "-n", key).strip()


def add_ipv6(lab, *extra: str) -> None:
    must(lab, "ip", "addr", "add", V6, "dev", "ntv0", "nodad", *extra)
    must(lab, "ip", "-6", "route", "add", V6_NET, "via", V6_GW, "dev", "ntv0", "metric", "77")


def test_mtu_below_1280_rollback_puts_ipv6_back(lab):
    add_ipv6(lab)
    must(lab, "ip", "route", "add", V4_NET, "via", "198.18.0.2", "table", "100", "proto", "static")
    # A macvlan on the rail takes its MTU, and keeps it when the rail's goes back up.
    must(lab, "ip", "link", "add", "link", "ntv0", "name", "ntmv0", "type", "macvlan")
    must(lab, "ip", "link", "set", "ntmv0", "up")
    must(lab, "ip", "addr", "add", "2001:db8:6::1/64", "dev", "ntmv0", "nodad")
    # The kernel recreates the IPv6 sysctls from conf.default.
    must(lab, "sysctl", "-qw", "net.ipv6.conf.ntv0.accept_ra=2", "net.ipv6.conf.ntv0.hop_limit=33")
    before = (addresses(lab), addresses(lab, "ntmv0"), routes(lab))
    assert V6 in before[0] and (V6_NET, V6_GW, "ntv0", "main", 77) in before[2]
    path = profile(lab, """\
        interfaces:
          rail: {match: {name: ntv0}, mtu: 1200}
    """)

    code, report = nictune(lab, "plan", path)
    assert code == 2
    assert any("below 1280" in w and "rollback restores the addresses, routes" in w
               for w in report["warnings"]), report["warnings"]

    code, report = nictune(lab, "apply", path)
    assert code == 0, report
    # The side effect is real: IPv6 is gone from both links.
    assert V6 not in addresses(lab) and not addresses(lab, "ntmv0")
    assert link(lab, "ntmv0")["mtu"] == 1200

    code, report = nictune(lab, "rollback")
    assert code == 0, report
    assert report["error"] is None
    assert (addresses(lab), addresses(lab, "ntmv0"), routes(lab)) == before
    assert link(lab, "ntv0")["mtu"] == link(lab, "ntmv0")["mtu"] == 1500
    assert (sysctl(lab, "net.ipv6.conf.ntv0.accept_ra"), sysctl(lab, "net.ipv6.conf.ntv0.hop_limit")) == ("2", "33")


def test_a_restore_that_cannot_happen_is_a_failed_rollback(lab):
    # The gateway's prefix comes from an address with a lifetime (a DHCP or
    # SLAAC one): it runs out while the MTU keeps IPv6 off the link, so the
    # route through that gateway cannot come back.
    add_ipv6(lab, "valid_lft", "2", "preferred_lft", "2")
    path = profile(lab, """\
        interfaces:
          rail: {match: {name: ntv0}, mtu: 1200}
    """)
    code, report = nictune(lab, "apply", path)
    assert code == 0, report
    time.sleep(2.5)

    code, report = nictune(lab, "rollback")
    assert code == 4, report
    assert report["error"]["kind"] == "rollback-failed"
    message = report["error"]["message"]
    assert f"route {V6_NET} via {V6_GW} dev ntv0 table main proto boot metric 77" in message, message
    # The expired address is not a failure: it would have gone anyway.
    assert "address" not in message
    # The key itself is back, and the journal says the rollback failed.
    assert link(lab, "ntv0")["mtu"] == 1500
    assert [c["status"] for c in report["changes"]] == ["reverted"]
    journal = json.loads((lab.state / "netns" / lab.ns_a / "journal.json").read_text())
    assert journal["status"] == "rollback-failed"


def test_state_down_rollback_puts_routes_and_addresses_back(lab):
    must(lab, "ip", "addr", "add", V6, "dev", "ntv0", "nodad")
    must(lab, "ip", "route", "add", V4_NET, "via", "198.18.0.2", "metric", "5", "proto", "static")
    must(lab, "ip", "route", "add", "198.18.98.0/24", "dev", "ntv0", "table", "100")
    before = (addresses(lab), routes(lab))
    path = profile(lab, """\
        interfaces:
          rail: {match: {name: ntv0}, state: down}
    """)
    code, report = nictune(lab, "apply", path)
    assert code == 0, report
    assert not routes(lab) and V6 not in addresses(lab)

    code, report = nictune(lab, "rollback")
    assert code == 0, report
    assert (addresses(lab), routes(lab)) == before
    assert (V4_NET, "198.18.0.2", "ntv0", "main", 5) in before[1]


def test_ip_forward_rollback_puts_each_interfaces_forwarding_back(lab):
    must(lab, "sysctl", "-qw", "net.ipv4.conf.ntv0.forwarding=1",
         "net.ipv4.conf.all.accept_redirects=0", "net.ipv6.conf.ntv0.forwarding=1")
    keys = ("net.ipv4.ip_forward", "net.ipv4.conf.ntv0.forwarding", "net.ipv4.conf.lo.forwarding",
            "net.ipv4.conf.default.forwarding", "net.ipv4.conf.all.accept_redirects",
            "net.ipv6.conf.all.forwarding", "net.ipv6.conf.ntv0.forwarding")
    before = {k: sysctl(lab, k) for k in keys}
    assert before["net.ipv4.ip_forward"] == "0" and before["net.ipv4.conf.ntv0.forwarding"] == "1"
    path = profile(lab, """\
        host:
          sysctl: {net.ipv4.ip_forward: 1, net.ipv6.conf.all.forwarding: 1}
    """)
    code, report = nictune(lab, "plan", path)
    assert sum("LRO" in w for w in report["warnings"]) == 2, report["warnings"]

    code, report = nictune(lab, "apply", path)
    assert code == 0, report
    assert sysctl(lab, "net.ipv4.conf.lo.forwarding") == "1"

    code, report = nictune(lab, "rollback")
    assert code == 0, report
    assert {k: sysctl(lab, k) for k in keys} == before


def test_a_failed_apply_puts_back_what_its_mtu_took(lab):
    # The rail's MTU goes below 1280, then the macvlan's 9000 is refused
    # (above its lower device's): the automatic rollback must bring IPv6
    # back on both, not just the MTUs.
    add_ipv6(lab)
    must(lab, "ip", "link", "add", "link", "ntv0", "name", "ntmv0", "type", "macvlan")
    must(lab, "ip", "link", "set", "ntmv0", "up")
    must(lab, "ip", "addr", "add", "2001:db8:6::1/64", "dev", "ntmv0", "nodad")
    before = (addresses(lab), addresses(lab, "ntmv0"), routes(lab))
    path = profile(lab, """\
        interfaces:
          rail: {match: {name: ntv0}, mtu: 1200}
          upper: {match: {name: ntmv0}, mtu: 9000}
    """)
    code, report = nictune(lab, "apply", path)
    assert code == 3, report
    assert report["error"]["kind"] == "rolled-back"
    assert (addresses(lab), addresses(lab, "ntmv0"), routes(lab)) == before
    assert link(lab, "ntv0")["mtu"] == link(lab, "ntmv0")["mtu"] == 1500


def test_a_lower_mtu_rollback_gives_stacked_devices_theirs_back(lab):
    # Above 1280 nothing is lost but the MTU of what is stacked on the link.
    must(lab, "ip", "link", "add", "link", "ntv0", "name", "ntmv0", "type", "macvlan")
    path = profile(lab, """\
        interfaces:
          rail: {match: {name: ntv0}, mtu: 1400}
    """)
    code, report = nictune(lab, "plan", path)
    assert code == 2 and report["warnings"] == []
    assert nictune(lab, "apply", path)[0] == 0
    assert link(lab, "ntmv0")["mtu"] == 1400
    code, report = nictune(lab, "rollback")
    assert code == 0, report
    assert link(lab, "ntv0")["mtu"] == link(lab, "ntmv0")["mtu"] == 1500
