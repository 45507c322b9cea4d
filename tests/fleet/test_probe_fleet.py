"""The probe over real sshd (lab/fleet.py, control/remote/probe.py): every
audit, the first from an empty question cache too, starts no agent, and
its reports equal the agent's (--no-probe), clean and after drift injected
by hand (ip, ethtool, sysctl, the NCCL file rewritten).  A read the
questions kept lack (an interface made since) is asked of the live probe
on demand; a hostile answer to it, or a verify no probe can answer (a
counter's rise), sends the host to its agent.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
import sys
import textwrap

import pytest
from fleet_helpers import audit, by_host, comparable, drift_of, nictune, profile_file
from test_hostile_hosts import inventory_with
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.remote import agentzip, probe
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


def agent_starts(monkeypatch) -> list:
    """Every start of an agent (the zipapp's bootstrap) this test makes, by host."""
    started = []
    real = agentzip.remote_command
    monkeypatch.setattr(agentzip, "remote_command", lambda *a, **kw: started.append(a) or real(*a, **kw))
    return started


def kept_questions() -> list:
    return [json.load(open(p)) for p in glob.glob(os.path.join(os.environ["XDG_CACHE_HOME"], "nictune",
                                                                "probe", "*.json"))]


def test_a_cold_audit_is_the_probes_and_finds_the_agents_drift(make_fleet, tmp_path, monkeypatch):
    # An empty question cache of this test's own: a controller that never
    # audited these hosts (a CI runner, a new laptop).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(3)
    a, b, c = fleet.of_kind("sshd")
    profile = profile_file(tmp_path, PROFILE, "probe.yaml")
    code, report = nictune("apply", profile, "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report
    # Drift by hand on a and b before the first audit: ip, ethtool, sysctl,
    # the NCCL file rewritten.
    run_in(a, ["ip", "link", "set", "rail1", "mtu", "1500"])
    run_in(a, ["ethtool", "-K", "rail0", "gro", "off"])
    run_in(b, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2", "net.ipv4.conf.rail1.arp_ignore=0"])
    run_in(b, ["sh", "-c", "printf 'NCCL_DEBUG=INFO\\nNCCL_IB_TIMEOUT=22\\n' > /etc/nccl.conf"])

    started = agent_starts(monkeypatch)
    cold = audit(fleet, profile)
    assert {h["via"] for h in cold.values()} == {"probe"} and started == []
    kept = kept_questions()
    assert len(kept) >= 4  # each host's questions, and the request's template
    for q in kept:  # questions only: nothing a host answered is kept
        assert set(q) == {"format", "files", "kernel", "nofollow"}, q
        assert q["files"] and q["kernel"] and "NCCL_DEBUG" not in json.dumps(q)

    warm = audit(fleet, profile)
    assert {h["via"] for h in warm.values()} == {"probe"} and started == []
    agents = audit(fleet, profile, "--no-probe")
    assert {h["via"] for h in agents.values()} == {"zipapp"}
    for name in cold:
        assert comparable(cold[name]) == comparable(agents[name]), name
        assert comparable(warm[name]) == comparable(agents[name]), name
    # The warm audit asks its cached questions in one batch, and needs no other.
    assert {h["transport"]["probe_batches"] for h in warm.values()} == {1}
    assert drift_of(cold[a.name]) == {("rail1", "mtu"), ("rail0", "rx-gro")}
    # A file nictune did not write that differs is drift to an audit (an
    # apply would still refuse to replace it without adopt: true): both
    # paths say so.
    assert drift_of(cold[b.name]) == {("host", "net.ipv4.tcp_ecn"), ("rail1", "net.ipv4.conf.rail1.arp_ignore"),
                                      ("host", "/etc/nccl.conf")}
    [nccl] = [ch for ch in cold[b.name]["changes"] if ch["key"]["family"] == "nccl"]
    assert nccl["status"] == "drift" and "adopt: true" in nccl["note"], nccl
    assert drift_of(cold[c.name]) == set() and cold[c.name]["summary"] == {"ok": 11}

    # A replay that goes wrong on the controller is never the answer given:
    # the host's agent answers instead.
    monkeypatch.setattr(probe, "verify_live", lambda *args: ({"error": {"kind": "system", "message": "x"}}, {}))
    broken = audit(fleet, profile)
    assert {h["via"] for h in broken.values()} == {"zipapp"}
    assert comparable(broken[c.name]) == comparable(agents[c.name])


def test_an_interface_made_after_the_questions_were_kept_is_asked_on_demand(make_fleet, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(1)
    [host] = fleet.of_kind("sshd")
    profile = profile_file(tmp_path, PROFILE, "probe.yaml")
    first = audit(fleet, profile)[host.name]
    assert first["via"] == "probe"
    # A new matching interface: its reads are in no question kept; the
    # probe is asked them on demand, in the same session, not the agent.
    run_in(host, ["ip", "link", "add", "rail7", "type", "veth", "peer", "name", "rail8"])
    started = agent_starts(monkeypatch)
    grown = audit(fleet, profile)[host.name]
    assert grown["via"] == "probe" and started == [], grown
    assert grown["transport"]["probe_batches"] > 1
    assert {ch["key"]["target"] for ch in grown["changes"]} >= {"rail7", "rail8"}
    assert comparable(grown) == comparable(audit(fleet, profile, "--no-probe")[host.name])
    again = audit(fleet, profile)[host.name]  # the new reads are kept with the host's questions
    assert again["via"] == "probe" and again["transport"]["probe_batches"] == 1
    assert comparable(again) == comparable(grown)


def hostile_python(tmp_path, fleet, name: str, batch: bytes) -> str:
    """A python3 for the host whose probe answers its first batch and then
    `batch` for every later one (where the frame and answers would be);
    any other command (the agent) runs as the lab's python3 runs it."""
    python = re.search(r"nictune_python=(\S+)", open(fleet.inventory).read()).group(1)
    [write] = [line.strip() for line in probe.PROBE.splitlines() if line.strip().startswith("out.write(")]
    spec = tmp_path / f"{name}.json"
    spec.write_text(json.dumps({"python": python, "find": write,
                                "hostile": f"{write} if head else (out.write({batch!r}), out.flush(), posix._exit(0))"}))
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        spec = json.load(open({str(spec)!r}))
        args = sys.argv[1:]
        if "-c" in args and "nictune-probe 2" in args[args.index("-c") + 1]:
            at = args.index("-c") + 1
            assert spec["find"] in args[at]
            args[at] = args[at].replace(spec["find"], spec["hostile"])
        os.execv(spec["python"], [spec["python"]] + args)
        """))
    path.chmod(stat.S_IRWXU)
    return str(path)


@pytest.mark.parametrize("batch", [
    b"a 1 5\nhello",                      # not an answer
    b"a 7 0\n",                           # another count than asked
    b"a 1 99999999999\n",                 # past the answers' bound
    b"nothing like a frame",
    b"",                                  # the probe stops answering
])
def test_a_hostile_answer_asked_on_demand_sends_the_host_to_its_agent(make_fleet, tmp_path, monkeypatch,
                                                                      batch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(1)
    [host] = fleet.of_kind("sshd")
    inventory = inventory_with(fleet, tmp_path, {host.name: hostile_python(tmp_path, fleet, "hostile", batch)})
    profile = profile_file(tmp_path, PROFILE, "probe.yaml")
    code, report = nictune("audit", profile, "-i", inventory, "--limit", "fleet")
    [got] = report["hosts"]
    assert code in (0, 2) and got["via"] == "zipapp" and got["error"] is None, got
    assert "Traceback" not in json.dumps(report)
    assert comparable(got) == comparable(audit(fleet, profile, "--no-probe")[host.name])
    assert kept_questions() == []  # nothing concluded from a probe that failed


COUNTERS = """\
nictune: 1
interfaces:
  rails:
    match: {name: rail0}
    expect:
      counters_interval: 1
      counters: {rx_packets: {max: 1000000000}}
"""


def test_a_verify_no_probe_can_answer_goes_to_its_agent_and_the_next_at_once(make_fleet, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(1)
    profile = profile_file(tmp_path, COUNTERS, "counters.yaml")
    first = audit(fleet, profile)
    assert {h["via"] for h in first.values()} == {"zipapp"}
    assert kept_questions() == [{"format": 1, "why_not": ["a counter's rise"]}]

    # The next audit goes to the agent at once, without a probe.
    monkeypatch.setattr(probe, "remote_command", lambda *a, **kw: pytest.fail("a probe was sent"))
    second = audit(fleet, profile)
    assert {h["via"] for h in second.values()} == {"zipapp"}
    assert comparable(second[fleet.hosts[0].name])["summary"] == comparable(first[fleet.hosts[0].name])["summary"]


def test_a_question_cache_that_is_not_the_users_own_is_not_used(make_fleet, profile, tmp_path, monkeypatch):
    # What a cache holds decides what root opens on every host: one another
    # user can write is left alone, and the audit says so.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(1)
    name = fleet.hosts[0].name
    assert audit(fleet, profile)[name]["via"] == "probe"
    directory = tmp_path / "xdg" / "nictune" / "probe"
    kept = {p: p.read_bytes() for p in directory.iterdir()}
    assert kept
    os.chmod(directory, 0o755)
    third = audit(fleet, profile)[name]
    assert third["via"] == "zipapp", third
    assert [w for w in third["warnings"] if f"question cache {directory} is not used: its mode is 0755" in w]
    assert {p: p.read_bytes() for p in directory.iterdir()} == kept  # nothing written into it


# -- plan ---------------------------------------------------------------------------

def plan_text(fleet, profile: str, *extra: str) -> tuple:
    """`nictune plan` of the fleet as a user reads it: (exit code, the rendered diff),
    each line's run of blanks as one and the timings (this profile has no other
    decimals) as "S"."""
    result = CliRunner().invoke(app, ["plan", profile, "-i", fleet.inventory, "--limit", "fleet", *extra])
    shown = [re.sub(r" +", " ", re.sub(r"\b\d+\.\d+\b", "S", line)) for line in result.stdout.splitlines()]
    return result.exit_code, shown


def test_a_plan_is_the_probes_and_equals_the_agents(make_fleet, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(2)
    drifted, clean = fleet.of_kind("sshd")
    profile = profile_file(tmp_path, PROFILE, "probe.yaml")
    code, report = nictune("apply", profile, "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report
    run_in(drifted, ["ip", "link", "set", "rail1", "mtu", "1500"])
    run_in(drifted, ["ethtool", "-K", "rail0", "gro", "off"])
    run_in(drifted, ["sysctl", "-qw", "net.ipv4.tcp_ecn=2"])

    started = agent_starts(monkeypatch)
    code, probed = nictune("plan", profile, "-i", fleet.inventory, "--limit", "fleet")
    shown = plan_text(fleet, profile)
    assert started == [] and code == 2, probed
    assert {h["via"] for h in probed["hosts"]} == {"probe"}
    code_agent, agents = nictune("plan", profile, "-i", fleet.inventory, "--limit", "fleet", "--no-probe")
    assert code_agent == code and {h["via"] for h in agents["hosts"]} == {"zipapp"}
    assert len(started) == 2  # --no-probe: each host's agent
    probed, agents = by_host(probed), by_host(agents)
    for name in agents:
        assert comparable(probed[name]) == comparable(agents[name]), name
    pending = {(c["key"]["target"], c["key"]["name"], c["before"], c["after"])
               for c in probed[drifted.name]["changes"] if c["status"] == "pending"}
    assert pending == {("rail1", "mtu", 1500, 9000), ("rail0", "rx-gro", False, True),
                       ("host", "net.ipv4.tcp_ecn", 2, 1)}
    assert probed[clean.name]["exit_code"] == 0 and probed[clean.name]["summary"] == {"ok": 11}
    # The diff a user reads is the agent's, line for line.
    assert shown == plan_text(fleet, profile, "--no-probe")
    assert shown[0] == 2 and " rail1 link mtu 1500 9000 pending " + profile + ":12" in shown[1], shown


KEYED = PROFILE + """\
  crypto:
    match: {name: rail0}
    ipsec:
      lab: true
      sas:
        - {src: 198.18.7.1, dst: 198.18.7.2, spi: 0x1001, reqid: 1, key_file: KEYFILE}
"""


def test_a_plan_that_reads_a_key_file_goes_to_its_agent(make_fleet, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fleet = make_fleet(1)
    [host] = fleet.of_kind("sshd")
    key_file = tmp_path / "sa1.key"  # the hosts are namespaces of this machine: its files
    key_file.write_text("0a1b2c3d4e5f60718293a4b5c6d7e8f901234567\n")
    os.chmod(key_file, 0o600)
    profile = profile_file(tmp_path, KEYED.replace("KEYFILE", str(key_file)), "keyed.yaml")
    started = agent_starts(monkeypatch)
    code, report = nictune("plan", profile, "-i", fleet.inventory, "--limit", "fleet")
    [got] = report["hosts"]
    assert code == 2 and got["via"] == "zipapp" and got["error"] is None and len(started) == 1, got
    assert any(c["key"]["family"] == "ipsec" for c in got["changes"])
    [why] = [q["why_not"] for q in kept_questions()]  # the next plan goes to the agent at once
    assert why == [f"key file {key_file} (its fingerprint; snapshots hold no key material)"], why
    assert comparable(got) == comparable(by_host(nictune("plan", profile, "-i", fleet.inventory,
                                                         "--limit", "fleet", "--no-probe")[1])[host.name])
