"""Snapshots on the sshd fleet lab: last night's `audit --save` (and
`show --save`) over SSH, then in CI, with no host reachable, `plan
--from-snapshots` gives the live plan key for key, for every family the
lab exercises (link, sysctl host and per interface, ethtool features, an
owned NCCL file whose text the snapshot holds, an IPsec SA and policy
whose key file the snapshot holds the fingerprint of, never the key), and
`--base HEAD~1` the
live change effect, the drift injected on one host included (a git
repository made by the test, two commits).
"""

from __future__ import annotations

import json
import os

import pytest
from fleet_helpers import by_host, git, nictune
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.host.transports import keyfile
from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

FIRST = """\
nictune: 1
host:
  sysctl:
    net.ipv4.tcp_ecn: 1
    net.ipv4.tcp_mtu_probing: 1
  nccl:
    env:
      NCCL_IB_TC: 106
      NCCL_SOCKET_IFNAME: "=rail0"
interfaces:
  rails:
    match: {name: "rail*"}
    mtu: 9000
    txqueuelen: 4000
    features: {gro: false}
    sysctl:
      ipv4.arp_ignore: 1
"""
# The pull request also adds an IPsec SA and its policy on rail0 (this
# kernel has no rfc4106(gcm(aes)) AEAD, so it is planned, never applied).
CRYPTO = """\
  crypto:
    match: {name: rail0}
    ipsec:
      lab: true
      sas:
        - {src: 198.18.7.1, dst: 198.18.7.2, spi: 0x1001, reqid: 1, key_file: KEYFILE}
      policies:
        - {src: 198.18.7.1, dst: 198.18.7.2/32, dir: out,
           tmpl: {src: 198.18.7.1, dst: 198.18.7.2, reqid: 1}}
"""
KEY = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"
SECOND = FIRST.replace("mtu: 9000", "mtu: 8000").replace("106", "104") + CRYPTO


def test_offline_plans_from_the_fleets_snapshots_are_the_live_plans(make_fleet, tmp_path):
    fleet = make_fleet(3)
    hosts = fleet.of_kind("sshd")
    repo = tmp_path / "profiles-repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.invalid")
    git(repo, "config", "user.name", "ci")
    key_file = tmp_path / "sa1.key"  # the hosts are namespaces of this machine: its files
    key_file.write_text(KEY + "\n")
    os.chmod(key_file, 0o600)
    first, second = (p.replace("KEYFILE", str(key_file)) for p in (FIRST, SECOND))
    profile = repo / "rails.yaml"
    profile.write_text(first)
    git(repo, "add", "rails.yaml")
    git(repo, "commit", "-qm", "rails at 9000")
    code, report = nictune("apply", str(profile), "-i", fleet.inventory)
    assert code == 0, report
    profile.write_text(second)
    git(repo, "commit", "-qam", "rails at 8000")
    drifted = hosts[1]
    run_in(drifted, ["ip", "link", "set", "rail1", "mtu", "1500"])

    # Last night: the audit, saving each host's snapshot.
    snaps = tmp_path / "snaps"
    code, audit = nictune("audit", str(profile), "-i", fleet.inventory, "--save", str(snaps))
    assert code == 2, audit
    assert sorted(os.listdir(snaps)) == sorted(f"{h.name}.json" for h in hosts)
    for h in audit["hosts"]:
        assert "snapshot" not in h and h["snapshot_file"] == str(snaps / f"{h['host']}.json")
    with open(snaps / f"{hosts[0].name}.json") as f:
        doc = json.load(f)
    assert doc["host"] == hosts[0].name and doc["reads"]["root_is_system"] is True
    # The owned file's text (nictune's own, from the apply) is the host's state, kept;
    # of the IPsec SA's key file only the fingerprint, never the key.
    assert "NCCL_IB_TC=106" in json.dumps(doc["reads"]["files"])
    for name in os.listdir(snaps):
        text = (snaps / name).read_text()
        assert KEY not in text and KEY[:16] not in text and KEY.upper()[:16] not in text
        assert keyfile.fingerprint((KEY + "\n").encode()) in text

    # Now: live and offline, key for key.
    code, live = nictune("plan", str(profile), "-i", fleet.inventory)
    assert code == 2, live
    code, off = nictune("plan", str(profile), "-i", fleet.inventory, "--from-snapshots", str(snaps))
    assert code == 2, off
    live_hosts, off_hosts = by_host(live), by_host(off)
    assert sorted(off_hosts) == sorted(h.name for h in hosts)
    assert sorted(live_hosts) == sorted(off_hosts)
    for name, a in live_hosts.items():
        b = off_hosts[name]
        assert a["error"] is None and b["error"] is None, (a["error"], b["error"])
        assert b["changes"] == a["changes"], name
        assert b["warnings"] == a["warnings"]
        assert b["snapshot"]["stale"] is False
    families = {c["key"]["family"] for h in live["hosts"] for c in h["changes"]}
    assert families == {"sysctl", "link", "features", "nccl", "ipsec"}
    ipsec = [c for h in off["hosts"] for c in h["changes"] if c["key"]["family"] == "ipsec"]
    # Pending: the recorded XFRM dump has no such SA or policy; the key's fingerprint in the note.
    assert ipsec and {c["status"] for c in ipsec} == {"pending"}
    assert any(keyfile.fingerprint((KEY + "\n").encode()) in c["note"] for c in ipsec)

    # The change's effect, offline as live; the drift apart from it.
    code, live_change = nictune("plan", str(profile), "--base", "HEAD~1", "-i", fleet.inventory)
    assert code == 2, live_change
    code, off_change = nictune("plan", str(profile), "--base", "HEAD~1", "-i", fleet.inventory,
                               "--from-snapshots", str(snaps), "--max-age", "24h")
    assert code == 2, off_change
    assert off_change["change"] == live_change["change"]
    (group,) = off_change["change"]["effect"]
    assert sorted(group["hosts"]) == sorted(h.name for h in hosts)
    (drift,) = off_change["change"]["drift"]
    assert drift["hosts"] == [drifted.name]
    assert [(r["key"]["target"], r["current"]) for r in drift["rows"]] == [("rail1", 1500)]

    # A show saves the same kind of snapshot, but reads no profile's key
    # files: planning the SA from it fails on each host, saying so.  The
    # first profile (no key file) plans from it as live.
    shown = tmp_path / "shown"
    result = CliRunner().invoke(app, ["show", "-i", fleet.inventory, "--save", str(shown)])
    assert result.exit_code == 0, result.output
    code, from_show = nictune("plan", str(profile), "-i", fleet.inventory,
                              "--from-snapshots", str(shown))
    assert code == 1, from_show
    for h in from_show["hosts"]:
        assert h["error"]["kind"] == "unsupported", h["error"]
        assert h["error"]["message"].startswith("not in the snapshot of ")
        assert f"key file {key_file} (its fingerprint; snapshots hold no key material)" in \
            h["error"]["message"]
    old = tmp_path / "first.yaml"
    old.write_text(first)
    code, live_first = nictune("plan", str(old), "-i", fleet.inventory)
    assert code == 2, live_first
    code, first_from_show = nictune("plan", str(old), "-i", fleet.inventory,
                                    "--from-snapshots", str(shown))
    assert code == 2, first_from_show
    first_live = by_host(live_first)
    for name, h in by_host(first_from_show).items():
        assert h["error"] is None and h["changes"] == first_live[name]["changes"], name

    # The pull-request comment, from last night's audit snapshots.
    result = CliRunner().invoke(app, ["plan", str(profile), "-i", fleet.inventory, "--base",
                                      "HEAD~1", "--from-snapshots", str(snaps), "--format",
                                      "markdown"])
    assert result.exit_code == 2, result.output
    assert "This change alters" in result.stdout and "Drift on 1 host(s)" in result.stdout
