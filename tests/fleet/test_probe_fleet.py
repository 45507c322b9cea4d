"""The probe over real sshd (lab/fleet.py, control/remote/probe.py): the first
audit of a host runs its agent, which teaches the controller the verify's
questions; the next ones start no agent, and their reports equal the
agent's, clean and after drift injected by hand (ip, ethtool, sysctl, the
NCCL file rewritten).  A host that grew an interface the profile matches
goes back to its agent once, and learns again.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from fleet_helpers import audit, comparable, drift_of, nictune, profile_file

from nictune.control.remote import probe, probecache
from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
host:
  sysctl:
    net.ipv4.tcp_ecn: 1
    net.ipv4.tcp_mtu_probing: 1
  nccl:
    path: /etc/nccl.conf
    env: {NCCL_DEBUG: WARN, NCCL_IB_TIMEOUT: 22}
interfaces:
  rails:
    match: {name: "rail*"}
    mtu: 9000
    features: {gro: true, rx-udp-gro-forwarding: true}
    sysctl:
      ipv4.arp_ignore: 1
"""


def test_audits_through_the_probe_equal_the_agents(make_fleet, tmp_path, monkeypatch):
    # A question cache of this test's own: other tests' refusals (a switch
    # profile's, say) stay in theirs.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(3)
    a, b, c = fleet.of_kind("sshd")
    profile = profile_file(tmp_path, PROFILE, "probe.yaml")
    code, report = nictune("apply", profile, "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report

    first = audit(fleet, profile)
    assert {h["via"] for h in first.values()} == {"zipapp"}
    learned = glob.glob(os.path.join(os.environ["XDG_CACHE_HOME"], "nictune", "probe", "*.json"))
    assert len(learned) >= 3
    for path in learned:  # questions only: nothing a host answered is kept
        kept = json.load(open(path))
        assert set(kept) == {"format", "files", "kernel", "nofollow"}, kept
        assert "NCCL_DEBUG" not in json.dumps(kept)

    second = audit(fleet, profile)
    assert {h["via"] for h in second.values()} == {"probe"}
    for name in second:
        assert comparable(second[name]) == comparable(first[name]), name
        assert second[name]["summary"] == {"ok": 11}

    # Drift by hand on a and b: the probe reads it now, as the agent does.
    run_in(a, ["ip", "link", "set", "rail1", "mtu", "1500"])
    run_in(a, ["ethtool", "-K", "rail0", "gro", "off"])
    run_in(b, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2", "net.ipv4.conf.rail1.arp_ignore=0"])
    run_in(b, ["sh", "-c", "printf 'NCCL_DEBUG=INFO\\nNCCL_IB_TIMEOUT=22\\n' > /etc/nccl.conf"])
    probed = audit(fleet, profile)
    agents = audit(fleet, profile, "--no-probe")
    assert {h["via"] for h in probed.values()} == {"probe"}
    assert {h["via"] for h in agents.values()} == {"zipapp"}
    for name in probed:
        assert comparable(probed[name]) == comparable(agents[name]), name
    assert drift_of(probed[a.name]) == {("rail1", "mtu"), ("rail0", "rx-gro")}
    # A file nictune did not write that differs is drift to an audit (an
    # apply would still refuse to replace it without adopt: true): both
    # paths say so.
    assert drift_of(probed[b.name]) == {("host", "net.ipv4.tcp_ecn"), ("rail1", "net.ipv4.conf.rail1.arp_ignore"),
                                        ("host", "/etc/nccl.conf")}
    [nccl] = [ch for ch in probed[b.name]["changes"] if ch["key"]["family"] == "nccl"]
    assert nccl["status"] == "drift" and "adopt: true" in nccl["note"], nccl
    assert drift_of(probed[c.name]) == set()

    # A new matching interface on c: its reads were never asked, so c's agent
    # answers (and learns); the audit after that is the probe's again.
    run_in(c, ["ip", "link", "add", "rail7", "type", "veth", "peer", "name", "rail8"])
    grown = audit(fleet, profile)
    assert grown[c.name]["via"] == "zipapp" and grown[a.name]["via"] == "probe"
    assert {ch["key"]["target"] for ch in grown[c.name]["changes"]} >= {"rail7", "rail8"}
    again = audit(fleet, profile)
    assert again[c.name]["via"] == "probe"
    assert comparable(again[c.name]) == comparable(grown[c.name])

    # A replay that goes wrong on the controller is never the answer given:
    # the host's agent answers instead.
    monkeypatch.setattr(probe, "verify", lambda *args: {"error": {"kind": "system", "message": "broken"}})
    broken = audit(fleet, profile)
    assert {h["via"] for h in broken.values()} == {"zipapp"}
    assert comparable(broken[c.name]) == comparable(again[c.name])


COUNTERS = """\
nictune: 1
interfaces:
  rails:
    match: {name: rail0}
    expect:
      counters_interval: 1
      counters: {rx_packets: {max: 1000000000}}
"""


def test_a_verify_a_probe_cannot_ask_is_not_learned_again(make_fleet, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(1)
    profile = profile_file(tmp_path, COUNTERS, "counters.yaml")
    first = audit(fleet, profile)
    assert {h["via"] for h in first.values()} == {"zipapp"}
    kept = [json.load(open(p)) for p in glob.glob(os.path.join(os.environ["XDG_CACHE_HOME"], "nictune",
                                                               "probe", "*.json"))]
    assert {"format": 1, "why_not": ["a counter's rise (two readings apart in time)"]} in kept

    # The next audit goes to the agent at once, without asking it to learn
    # (which costs the host a recording every time) and without a probe.
    asked = []
    real = probecache.QuestionCache.learned
    monkeypatch.setattr(probecache.QuestionCache, "learned", lambda self, *a: asked.append(a) or real(self, *a))
    monkeypatch.setattr(probe, "encode_questions", lambda q: pytest.fail("a probe was sent"))
    second = audit(fleet, profile)
    assert {h["via"] for h in second.values()} == {"zipapp"} and asked == []
    assert comparable(second[fleet.hosts[0].name])["summary"] == comparable(first[fleet.hosts[0].name])["summary"]


def test_a_question_cache_that_is_not_the_users_own_is_not_used(make_fleet, profile, tmp_path, monkeypatch):
    # What a cache holds decides what root opens on every host: one another
    # user can write is left alone, and the audit says so.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(1)
    name = fleet.hosts[0].name
    assert audit(fleet, profile)[name]["via"] == "zipapp"
    assert audit(fleet, profile)[name]["via"] == "probe"
    directory = tmp_path / "xdg" / "nictune" / "probe"
    kept = {p: p.read_bytes() for p in directory.iterdir()}
    os.chmod(directory, 0o755)
    third = audit(fleet, profile)[name]
    assert third["via"] == "zipapp", third
    assert [w for w in third["warnings"] if f"question cache {directory} is not used: its mode is 0755" in w]
    assert {p: p.read_bytes() for p in directory.iterdir()} == kept  # nothing learned into it
