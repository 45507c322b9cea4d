"""`show --netns NS --save DIR`, then `plan --from-snapshots DIR` with no
access to the namespace: the same plan as live, key for key, on a real
kernel's veth and sysctls; and `--base` from the snapshot gives the same
change effect as live (a git repository made by the test, two commits).
Namespaces nt<tag>{a,b} (tests/netns/conftest.py veth_pair), addresses from
198.18.0.0/15, removed whatever happens.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
host:
  sysctl:
    net.ipv4.tcp_mtu_probing: 1
    net.ipv4.conf.all.rp_filter: 0
    net.ipv4.tcp_ecn: 1
interfaces:
  v:
    match: {name: "ntv*"}
    mtu: 9000
    txqueuelen: 5000
    features: {gro: false, tso: true}
    sysctl:
      ipv6.disable_ipv6: 1
      ipv4.arp_ignore: 1
"""


def cli(*args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--json"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}, no JSON: {result.output}")


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def test_an_offline_plan_from_a_namespace_snapshot_is_the_live_plan(veth_pair, tmp_path):
    ns = veth_pair.ns_a
    profile = tmp_path / "p.yaml"
    profile.write_text(PROFILE)
    snaps = tmp_path / "snaps"
    state = str(tmp_path / "state")

    code, shown = cli("show", "--netns", ns, "--state-dir", state, "--save", str(snaps))
    assert code == 0, shown
    (host,) = shown["hosts"]
    assert "snapshot" not in host and host["snapshot_file"] == str(snaps / f"netns%3A{ns}.json")
    code, live = cli("plan", str(profile), "--netns", ns, "--state-dir", state)
    assert code == 2, json.dumps(live)
    code, off = cli("plan", str(profile), "--netns", ns, "--from-snapshots", str(snaps))
    assert code == 2, off
    (a,), (b,) = live["hosts"], off["hosts"]
    assert a["error"] is None and b["error"] is None
    assert b["changes"] == a["changes"]  # key for key: before, after, status, note, source
    assert b["warnings"] == a["warnings"]
    assert {c["key"]["family"] for c in a["changes"]} == {"sysctl", "link", "features"}
    assert b["snapshot"]["stale"] is False and b["snapshot"]["age_seconds"] < 600
    with open(host["snapshot_file"]) as f:
        doc = json.load(f)
    assert doc["host"] == f"netns:{ns}" and doc["nictune_snapshot"] == 1

    # An old snapshot is flagged; the plan is the same.
    code, stale = cli("plan", str(profile), "--netns", ns, "--from-snapshots", str(snaps),
                      "--max-age", "0s")
    (c,) = stale["hosts"]
    assert c["snapshot"]["stale"] is True and c["changes"] == a["changes"]
    assert any(w.startswith("planned from a snapshot of ") for w in c["warnings"])

    # A file a show does not read (an NCCL file at a path of this profile's
    # own) is not in the snapshot: Unsupported, where live reads it.
    other = tmp_path / "nccl.yaml"
    other.write_text(f"nictune: 1\non_unsupported: warn\nhost:\n  nccl:\n"
                     f"    path: /etc/{ns}/nccl.conf\n    allowed_dirs: [/etc/{ns}]\n"
                     f"    env: {{NCCL_IB_TC: 106}}\n")
    code, off = cli("plan", str(other), "--netns", ns, "--from-snapshots", str(snaps))
    (row,) = off["hosts"][0]["changes"]
    assert row["status"] == "skipped" and row["note"].startswith(
        f"cannot read nccl: not in the snapshot of {doc['recorded']}: lstat of /etc/netns/{ns}/")


def test_the_change_effect_from_a_snapshot_is_the_live_one(veth_pair, tmp_path):
    ns = veth_pair.ns_a
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.invalid")
    git(repo, "config", "user.name", "ci")
    profile = repo / "p.yaml"
    profile.write_text(PROFILE)
    git(repo, "add", "p.yaml")
    git(repo, "commit", "-qm", "first")
    state = str(tmp_path / "state")
    code, applied = cli("apply", str(profile), "--netns", ns, "--state-dir", state)
    assert code == 0, applied
    profile.write_text(PROFILE.replace("9000", "8000").replace("tcp_ecn: 1", "tcp_ecn: 2"))
    git(repo, "commit", "-qam", "second")
    # Drift of the host's own: the change must not claim it.
    veth_pair.run(ns, ["ip", "link", "set", "ntv0", "txqueuelen", "1000"])

    snaps = tmp_path / "snaps"
    code, _ = cli("show", "--netns", ns, "--state-dir", state, "--save", str(snaps))
    assert code == 0
    code, live = cli("plan", str(profile), "--base", "HEAD~1", "--netns", ns, "--state-dir", state)
    assert code == 2, json.dumps(live)
    code, off = cli("plan", str(profile), "--base", "HEAD~1", "--netns", ns,
                    "--from-snapshots", str(snaps))
    assert code == 2, off
    assert off["change"] == live["change"]
    doc = off["change"]
    (group,) = doc["effect"]
    assert {(r["key"]["family"], r["key"]["name"]) for r in group["rows"]} == {
        ("link", "mtu"), ("sysctl", "net.ipv4.tcp_ecn")}
    (drift,) = doc["drift"]
    assert [(r["key"]["name"], r["current"]) for r in drift["rows"]] == [("txqueuelen", 1000)]
    assert off["hosts"][0]["changes"] == live["hosts"][0]["changes"]
