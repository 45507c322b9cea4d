"""The fleet path end to end: inventory -> SSH (real sshd per namespace) ->
the zipapp agent on each host -> reports, audits and staged rollouts.

Drift is injected and read back with `ip` and `sysctl` run inside each
host's namespace, never through nictune.
"""

from __future__ import annotations

import json
import time
from xml.etree import ElementTree

import pytest
from fleet_helpers import by_host, drift_of, mtu, nictune, profile_file, sysctl

from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
host:
  sysctl:
    net.ipv4.tcp_ecn: 1
  nccl:
    env:
      NCCL_IB_TC: 106
      NCCL_SOCKET_IFNAME: "=rail0"
interfaces:
  rails:
    match: {name: "rail*"}
    mtu: 9000
"""


@pytest.fixture
def profile(tmp_path):
    return profile_file(tmp_path, PROFILE, "fleet.yaml")


def test_audit_finds_exactly_the_injected_drift_and_apply_fixes_it(fleet, profile, tmp_path):
    code, report = nictune("apply", profile, "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report
    good = fleet.of_kind("sshd")
    assert all(mtu(h) == 9000 and mtu(h, "rail1") == 9000 for h in good)

    a, b = good[1], good[2]
    run_in(a, ["ip", "link", "set", "rail1", "mtu", "1500"])
    run_in(b, ["sysctl", "-w", "net.ipv4.tcp_ecn=2"])

    junit, prom = tmp_path / "audit.xml", tmp_path / "audit.prom"
    code, report = nictune("audit", profile, "-i", fleet.inventory, "--limit", "fleet",
                           "--junit", str(junit), "--prometheus", str(prom))
    assert code == 2
    seen = {name: drift_of(h) for name, h in by_host(report).items()}
    assert seen == {h.name: set() for h in good} | {
        a.name: {("rail1", "mtu")}, b.name: {("host", "net.ipv4.tcp_ecn")}}
    change = next(c for c in by_host(report)[a.name]["changes"] if c["status"] == "drift")
    assert (change["before"], change["after"]) == (1500, 9000)  # actual, expected

    suite = ElementTree.parse(junit).getroot()
    failed = {tc.get("name") for tc in suite.iter("testcase") if tc.find("failure") is not None}
    assert failed == {a.name, b.name}
    metrics = prom.read_text()
    assert f'nictune_audit_drift{{host="{a.name}",family="link",target="rail1",key="mtu"}} 1' in metrics

    code, report = nictune("apply", profile, "-i", fleet.inventory, "--limit", f"{a.name},{b.name}")
    assert code == 0, report
    assert mtu(a, "rail1") == 9000 and sysctl(b, "net.ipv4.tcp_ecn") == "1"
    code, report = nictune("audit", profile, "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0 and all(not drift_of(h) for h in report["hosts"])


def test_broken_hosts_are_reported_and_do_not_hold_the_run(fleet, profile):
    started = time.monotonic()
    code, report = nictune("audit", profile, "-i", fleet.inventory, "--connect-timeout", "2",
                           "--limit", "all")
    elapsed = time.monotonic() - started
    assert code == 1
    results = by_host(report)
    for h in fleet.of_kind("silent") + fleet.of_kind("unreachable"):
        assert results[h.name]["error"]["kind"] == "transport", results[h.name]
        assert results[h.name]["unreachable"]
    assert "never answered as SSH" in results[fleet.of_kind("silent")[0].name]["error"]["message"]
    assert all(results[h.name]["ok"] for h in fleet.of_kind("sshd"))
    # Hosts are worked on at once: the two timeouts overlap, whatever the order.
    assert elapsed < 20, elapsed


def test_the_agent_is_sent_once_then_reused(fleet, profile):
    host = fleet.of_kind("sshd")[0].name
    nictune("plan", profile, "-i", fleet.inventory, "--limit", host, "--no-probe")
    code, report = nictune("plan", profile, "-i", fleet.inventory, "--limit", host, "--no-probe")
    assert report["hosts"][0]["transport"] == {"agent_sent": False}


def test_unknown_host_keys_are_refused_unless_accepted(fleet, profile, tmp_path):
    host = fleet.of_kind("sshd")[0]
    known = tmp_path / "known_hosts"
    inventory = tmp_path / "inv.ini"
    inventory.write_text(open(fleet.inventory).read().replace(fleet.known_hosts, str(known)))
    code, report = nictune("plan", profile, "-i", str(inventory), "--limit", host.name)
    assert code == 1 and "unknown host key" in report["hosts"][0]["error"]["message"]

    code, report = nictune("plan", profile, "-i", str(inventory), "--limit", host.name,
                           "--accept-new-host-keys")
    assert report["hosts"][0]["ok"], report
    assert host.address in known.read_text()

    # Now claim another key for it: a changed key is refused, accept-new or not.
    other = [ln for ln in open(fleet.known_hosts) if not ln.startswith(host.address + " ")][0]
    known.write_text(host.address + " " + other.split(" ", 1)[1])
    code, report = nictune("plan", profile, "-i", str(inventory), "--limit", host.name,
                           "--accept-new-host-keys")
    message = report["hosts"][0]["error"]["message"]
    assert code == 1 and "CHANGED" in message and "ssh-keygen -R" in message


def test_an_unconfirmed_remote_apply_is_undone_by_the_host(fleet, profile, monkeypatch):
    from nictune.control.remote import fleet as fleetmod
    from nictune.control.remote.ssh import SshOptions, SshTarget
    from nictune.inventory import load_inventory

    host = fleet.of_kind("sshd")[3]
    run_in(host, ["ip", "link", "set", "rail0", "mtu", "1500"])
    run_in(host, ["ip", "link", "set", "rail1", "mtu", "1500"])
    inventory = load_inventory(fleet.inventory)
    # As if the session died before confirming: no "confirm" is ever sent.
    monkeypatch.setattr(SshTarget, "_confirm", lambda self, chan, lines: "")
    options = SshOptions(confirm_timeout=1)
    jobs = fleetmod.jobs_for("apply", inventory.select(host.name), fleetmod.Profiles(profile),
                             options)
    [report] = fleetmod.run_jobs("apply", jobs)
    assert report["error"]["kind"] == "rolled-back" and "not confirmed" in report["error"]["message"]
    deadline = time.monotonic() + 15
    while mtu(host) != 1500 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mtu(host) == 1500 and mtu(host, "rail1") == 1500


def test_a_failing_batch_stops_the_rollout_and_is_rolled_back(make_fleet, tmp_path, profile):
    fleet = make_fleet(4)
    good = fleet.of_kind("sshd")
    # The third host (second batch) gets an override its kernel refuses mid-apply:
    # a macvlan cannot exceed its lower device's MTU.
    for h in good:
        run_in(h, ["ip", "link", "set", "rail0", "mtu", "1500"])
        run_in(h, ["ip", "link", "set", "rail1", "mtu", "1500"])
    bad = good[2]
    run_in(bad, ["ip", "link", "add", "link", "rail0", "name", "railmv", "type", "macvlan"])
    inventory = tmp_path / "inv.ini"
    text = open(fleet.inventory).read()
    inventory.write_text(text)
    hv = tmp_path / "host_vars"
    hv.mkdir()
    (hv / f"{bad.name}.yml").write_text(
        "nictune:\n  interfaces:\n    stacked:\n      match: {name: railmv}\n      mtu: 9500\n")
    playbook = tmp_path / "rollout.yaml"
    playbook.write_text(f"- name: staged\n  hosts: fleet\n  profile: {profile}\n"
                        "  serial: [1, 2, \"100%\"]\n")
    code, report = nictune("apply", str(playbook), "-i", str(inventory))
    assert code == 3, json.dumps(report, indent=1)
    [rollout] = report["rollouts"]
    assert rollout["kept"] == [good[0].name]
    assert set(rollout["rolled_back"]) | set(rollout.get("failed", [])) >= {good[1].name, bad.name}
    assert rollout["not_started"] == [good[3].name]
    assert mtu(good[0]) == 9000                       # the canary batch stays
    assert mtu(good[1]) == 1500 and mtu(bad) == 1500  # the failed batch was undone
    assert mtu(good[3]) == 1500                       # never touched
