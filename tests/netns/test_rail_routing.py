"""Two and four rails in one subnet, against the real kernel: before the
profile the main table sends rail 1's traffic out of rail 0 (its connected
route comes first); after `apply` of the routing family (a table and a rule
per rail, with the ARP sysctls a one-subnet layout needs) each rail's
traffic, ping and iperf3, leaves and returns on its own rail, counted by the
rails' own packet counters; rollback returns the addresses, rules and
routes exactly, and never touches a rule or route the operator added.

Namespace A holds the rails ntr0, ntr1... (198.18.26.1, .2.../24: made by
the lab with two rails, declared by the profile's routing.address with
four); their veth peers are on one bridge in namespace B, which holds the
peer address 198.18.26.10.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import textwrap
import time

import pytest

import netns_helpers

pytestmark = pytest.mark.netns

RAILS = ("ntr0", "ntr1")
ADDRESS = {f"ntr{i}": f"198.18.26.{i + 1}" for i in range(4)}
PEER = "198.18.26.10"


def _sh(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def _must(*argv: str) -> str:
    r = _sh(*argv)
    assert r.returncode == 0, f"{' '.join(argv)}: {r.stderr}"
    return r.stdout


class Lab:
    def __init__(self, tmp_path, rails: int, declared: bool):
        self.rails = tuple(f"ntr{i}" for i in range(rails))
        self.declared = declared  # the profile declares the addresses, the lab makes none
        tag = secrets.token_hex(3)
        self.ns_a, self.ns_b = f"nt{tag}a", f"nt{tag}b"
        self.dir, self.state = tmp_path, tmp_path / "state"

    def a(self, *argv: str) -> str:
        return _must("ip", "netns", "exec", self.ns_a, *argv)

    def b(self, *argv: str) -> str:
        return _must("ip", "netns", "exec", self.ns_b, *argv)


@pytest.fixture(params=[(2, False), (4, True)], ids=["2-rails", "4-rails-declared"])
def lab(tmp_path, request):
    if shutil.which("ip") is None or subprocess.run(["id", "-u"], capture_output=True,
                                                     text=True).stdout.strip() != "0":
        pytest.skip("needs root and iproute2 for network namespaces")
    lab = Lab(tmp_path, *request.param)
    made = []
    try:
        for ns in (lab.ns_a, lab.ns_b):
            _must("ip", "netns", "add", ns)
            made.append(ns)
            _must("ip", "-n", ns, "link", "set", "lo", "up")
        lab.b("ip", "link", "add", "ntbr", "type", "bridge", "forward_delay", "0")
        for i, rail in enumerate(lab.rails):
            # No IPv6 on the rails: router solicitations would add to the counters.
            _must("ip", "-n", lab.ns_a, "link", "add", rail, "type", "veth", "peer", "name",
                  f"ntp{i}", "netns", lab.ns_b)
            lab.a("sysctl", "-qw", f"net.ipv6.conf.{rail}.disable_ipv6=1")
            lab.b("sysctl", "-qw", f"net.ipv6.conf.ntp{i}.disable_ipv6=1")
            lab.b("ip", "link", "set", f"ntp{i}", "master", "ntbr", "up")
        lab.b("sysctl", "-qw", "net.ipv6.conf.ntbr.disable_ipv6=1")
        lab.b("ip", "addr", "add", f"{PEER}/24", "dev", "ntbr")
        lab.b("ip", "link", "set", "ntbr", "up")
        for rail in lab.rails:  # ntr0 first: its connected route is the main table's answer
            if not lab.declared:
                lab.a("ip", "addr", "add", f"{ADDRESS[rail]}/24", "dev", rail)
            lab.a("ip", "link", "set", rail, "up")
        assert netns_helpers.wait_for(lambda: all(
            json.loads(lab.a("ip", "-j", "link", "show", rail))[0]["operstate"] == "UP"
            for rail in lab.rails))
        yield lab
    finally:
        for ns in made:
            _sh("ip", "netns", "del", ns)


def egress(lab, source: str) -> str:
    """The interface `ip route get PEER from source` answers."""
    [route] = json.loads(lab.a("ip", "-j", "route", "get", PEER, "from", source))
    return route["dev"]


def counters(lab) -> dict:
    """{rail: (tx packets, rx packets, tx bytes)} from the rails' own counters."""
    out = {}
    for rail in lab.rails:
        [link] = json.loads(lab.a("ip", "-j", "-s", "link", "show", "dev", rail))
        s = link["stats64"]
        out[rail] = (s["tx"]["packets"], s["rx"]["packets"], s["tx"]["bytes"])
    return out


def rises(before: dict, after: dict) -> dict:
    return {rail: tuple(a - b for a, b in zip(after[rail], before[rail])) for rail in before}


def rules_and_routes(lab) -> tuple:
    """The namespace's IPv4 addresses, rules and routes, as `ip -j` lists them."""
    addresses = [(a["ifname"], i["local"], i["prefixlen"])
                 for a in json.loads(lab.a("ip", "-j", "-4", "addr", "show")) for i in a["addr_info"]]
    rules = json.loads(lab.a("ip", "-j", "rule", "show"))
    routes = json.loads(lab.a("ip", "-j", "-4", "route", "show", "table", "all"))
    return (sorted(addresses), sorted(json.dumps(r, sort_keys=True) for r in rules),
            sorted(json.dumps(r, sort_keys=True) for r in routes))


def nictune(lab, *args: str) -> tuple:
    code, report = netns_helpers.nictune(lab, *args)
    return code, report["hosts"][0] if report.get("hosts") else report


PROFILE = """\
nictune: 1
interfaces:
  rails:
    match: {name: "ntr*"}
    routing:
      table: 100+rail
      priority: 30100+rail
    sysctl:
      ipv4.arp_ignore: 1
      ipv4.arp_announce: 2
      ipv4.rp_filter: 2
"""


def profile_for(lab) -> str:
    if not lab.declared:
        return PROFILE
    return PROFILE.replace("      priority: 30100+rail\n",
                           "      priority: 30100+rail\n      address: 198.18.26.1/24+rail\n")


def ping_from(lab, rail: str) -> None:
    lab.a("ping", "-c", "5", "-i", "0.05", "-W", "2", "-I", ADDRESS[rail], PEER)


def test_each_rail_leaves_and_returns_by_itself_and_rollback_restores_routing(lab):
    rails = lab.rails
    # The operator's own rule and table, in nictune's band: never removed.
    lab.a("ip", "route", "add", "198.18.27.0/24", "dev", "ntr0", "table", "7")
    lab.a("ip", "rule", "add", "from", "198.18.26.99", "table", "7", "priority", "30050")
    before = rules_and_routes(lab)
    if not lab.declared:
        assert egress(lab, ADDRESS["ntr1"]) == "ntr0"  # the problem
    path = lab.dir / "p.yaml"
    path.write_text(profile_for(lab))

    code, plan = nictune(lab, "plan", str(path))
    assert code == 2, plan  # changes to make
    shown = {(c["key"]["target"], c["key"]["name"]): c for c in plan["changes"]
             if c["key"]["family"] == "routing"}
    assert len(shown) == len(rails) * (3 if lab.declared else 2), shown
    rule = shown[("ntr1", "rule 30101 from 198.18.26.2 lookup 101")]
    assert (rule["before"], rule["after"]) == ("absent", "present"), rule
    assert rule["source"].endswith("p.yaml:7"), rule
    route = shown[("ntr0", "route 198.18.26.0/24 table 100 src 198.18.26.1")]
    assert route["source"].endswith("p.yaml:6"), route
    if lab.declared:
        assert shown[("ntr3", "address 198.18.26.4/24")]["source"].endswith("p.yaml:8")

    code, report = nictune(lab, "apply", str(path))
    assert code == 0, report
    assert {rail: egress(lab, ADDRESS[rail]) for rail in rails} == {rail: rail for rail in rails}

    for rail in rails:
        start = counters(lab)
        ping_from(lab, rail)
        moved = rises(start, counters(lab))
        assert moved[rail][0] >= 5 and moved[rail][1] >= 5, moved  # out and back on its rail
        assert all(moved[other][0] < 2 for other in rails if other != rail), moved
    last = rails[-1]
    server = subprocess.Popen(["ip", "netns", "exec", lab.ns_b, "iperf3", "-s", "-1", "-B", PEER],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        start = counters(lab)
        lab.a("iperf3", "-c", PEER, "-B", ADDRESS[last], "-t", "1")
        moved = rises(start, counters(lab))
    finally:
        server.kill()
        server.wait(5)
    assert moved[last][2] > 10_000_000, moved
    assert all(moved[other][2] < 100_000 for other in rails if other != last), moved

    code, report = nictune(lab, "rollback")
    assert code == 0, report
    after = rules_and_routes(lab)
    assert after == before, [(set(a) ^ set(b)) for a, b in zip(after, before)]
    if not lab.declared:
        assert egress(lab, ADDRESS["ntr1"]) == "ntr0"


def test_a_priority_taken_by_another_rule_is_refused(lab):
    lab.a("ip", "rule", "add", "from", "198.18.26.77", "table", "9", "priority", "30101")
    before = rules_and_routes(lab)
    path = lab.dir / "p.yaml"
    path.write_text(profile_for(lab))
    code, report = nictune(lab, "apply", str(path))
    assert code != 0
    assert "priority 30101 already holds another rule" in json.dumps(report)
    after = rules_and_routes(lab)
    assert after == before, [(set(a) ^ set(b)) for a, b in zip(after, before)]


ARP_LEAVES = ("arp_ignore", "arp_announce", "rp_filter")


def rail_sysctls(lab) -> dict:
    """{(rail, leaf): value} as `sysctl -n` reads them in the rails' namespace."""
    return {(rail, leaf): int(lab.a("sysctl", "-n", f"net.ipv4.conf.{rail}.{leaf}"))
            for rail in lab.rails for leaf in ARP_LEAVES}


def test_the_layouts_arp_sysctls_come_as_defaults_an_explicit_value_overrides(lab):
    # The kernel's defaults on every rail, whatever a new namespace inherits:
    # the test cannot pass with values that were there already.
    for rail in lab.rails:
        for leaf in ARP_LEAVES:
            lab.a("sysctl", "-qw", f"net.ipv4.conf.{rail}.{leaf}=0")
    before = rail_sysctls(lab)
    text = PROFILE.split("    sysctl:\n")[0] + "    sysctl:\n      ipv4.arp_ignore: 2\n"
    if lab.declared:
        text = text.replace("      priority: 30100+rail\n",
                            "      priority: 30100+rail\n      address: 198.18.26.1/24+rail\n")
    path = lab.dir / "p.yaml"
    path.write_text(text)
    line = 10 if lab.declared else 9

    code, plan = nictune(lab, "plan", str(path))
    assert code == 2, plan
    shown = {(c["key"]["target"], c["key"]["name"].rsplit(".", 1)[1]): c for c in plan["changes"]
             if c["key"]["family"] == "sysctl"}
    assert sorted(shown) == sorted(before), shown
    default = "p.yaml:5 (routing default: rails in one subnet)"
    assert all(default in shown[(rail, leaf)]["source"] for rail in lab.rails
               for leaf in ("arp_announce", "rp_filter")), shown
    assert all(shown[(rail, "arp_ignore")]["source"].endswith(f"p.yaml:{line}") for rail in lab.rails)

    code, report = nictune(lab, "apply", str(path))
    assert code == 0, report
    assert rail_sysctls(lab) == {(rail, leaf): value for rail in lab.rails for leaf, value in
                                 (("arp_ignore", 2), ("arp_announce", 2), ("rp_filter", 2))}
    # Rail 1's ping, bound to its address, goes out and comes back on rail 1.
    start = counters(lab)
    ping_from(lab, "ntr1")
    moved = rises(start, counters(lab))
    assert moved["ntr1"][0] >= 5 and moved["ntr1"][1] >= 5, moved

    code, report = nictune(lab, "rollback")
    assert code == 0, report
    assert rail_sysctls(lab) == before
