"""`nictune plan PROFILE --base REF` on the sshd fleet lab: a git repository
made by the test holds two commits of a profile; the fleet runs the first;
one host drifts (an MTU set with `ip` inside its namespace).  The plan shows
the change's effect on every host in one group, the injected drift apart
from it, writes nothing, and leaves the repository as it was.
"""

from __future__ import annotations


import pytest
from fleet_helpers import git, mtu, nictune
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

FIRST = """\
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
# The pull request: a smaller MTU and another traffic class; a comment line
# moves every line below it, which alone is no effect.
SECOND = FIRST.replace("interfaces:\n", "# rails: 8000 leaves room for the overlay\ninterfaces:\n") \
    .replace("9000", "8000").replace("106", "104")


def rows_of(group) -> set:
    return {(r["key"]["target"], r["key"]["family"], r["key"]["name"], r["change"],
             str((r["old"] or {}).get("value"))[:40], str((r["new"] or {}).get("value"))[:40])
            for r in group["rows"]}


def test_the_change_effect_on_the_lab_fleet_apart_from_drift(make_fleet, tmp_path):
    fleet = make_fleet(3, unreachable=1)
    good = fleet.of_kind("sshd")
    repo = tmp_path / "profiles-repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.invalid")
    git(repo, "config", "user.name", "ci")
    profile = repo / "rails.yaml"
    profile.write_text(FIRST)
    git(repo, "add", "rails.yaml")
    git(repo, "commit", "-qm", "rails at 9000")
    code, report = nictune("apply", str(profile), "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report
    profile.write_text(SECOND)
    git(repo, "commit", "-qam", "rails at 8000")
    head, status = git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")

    drifted = good[1]
    run_in(drifted, ["ip", "link", "set", "rail1", "mtu", "1500"])

    code, report = nictune("plan", str(profile), "--base", "HEAD~1", "-i", fleet.inventory,
                           "--connect-timeout", "2")
    assert code == 1, report  # the unreachable host; the others plan
    doc = report["change"]
    assert doc["base"]["commit"] == git(repo, "rev-parse", "HEAD~1").strip()
    (group,) = doc["effect"]
    assert sorted(group["hosts"]) == sorted(h.name for h in good)
    nccl = {r for r in rows_of(group) if r[1] == "nccl"}
    assert rows_of(group) - nccl == {
        ("rail0", "link", "mtu", "changed", "9000", "8000"),
        ("rail1", "link", "mtu", "changed", "9000", "8000")}
    (row,) = [r for r in group["rows"] if r["key"]["family"] == "nccl"]
    assert "NCCL_IB_TC=106" in row["old"]["value"] and "NCCL_IB_TC=104" in row["new"]["value"]
    mtu_row = next(r for r in group["rows"] if r["key"]["target"] == "rail0")
    assert mtu_row["old"]["source"] == "HEAD~1:rails.yaml:12"
    assert mtu_row["new"]["source"] == f"{profile}:13"
    # The drift is the host's, not the change's: against the old wanted 9000.
    (drift,) = doc["drift"]
    assert drift["hosts"] == [drifted.name]
    assert [(r["key"]["target"], r["current"], r["wanted"]["value"]) for r in drift["rows"]] == [
        ("rail1", 1500, 9000)]
    (unreachable,) = fleet.of_kind("unreachable")
    assert [(e["host"], e["side"], e["kind"]) for e in doc["errors"]] == [
        (unreachable.name, "new", "transport")]
    # A plan writes nothing, and git was only read.
    assert [mtu(h) for h in good] == [9000] * 3 and mtu(drifted, "rail1") == 1500
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == status
    assert profile.read_text() == SECOND

    # The same base given as a file: the same effect.
    old = tmp_path / "old.yaml"
    old.write_text(git(repo, "show", "HEAD~1:rails.yaml"))
    code, by_file = nictune("plan", str(profile), "--base-file", str(old), "-i", fleet.inventory,
                            "--limit", "fleet")
    assert code == 2, by_file
    assert [rows_of(g) for g in by_file["change"]["effect"]] == [rows_of(group)]
    (file_drift,) = by_file["change"]["drift"]
    assert file_drift["hosts"] == drift["hosts"]
    assert file_drift["rows"][0]["wanted"]["source"] == f"{old}:12"

    # The pull-request comment.
    result = CliRunner().invoke(app, ["plan", str(profile), "--base", "HEAD~1", "-i",
                                      fleet.inventory, "--limit", "fleet", "--format", "markdown"])
    assert result.exit_code == 2, result.output
    text = result.stdout
    assert len(text) < 65536
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    fences = [t for t in tokens if t.type == "fence"]
    assert [t.info for t in fences] == ["diff"]
    assert "-NCCL_IB_TC=106" in fences[0].content and "+NCCL_IB_TC=104" in fences[0].content
    assert "This change alters 9 wanted setting(s) on 3 of 3 host(s)" in text
    assert "Drift on 1 host(s), 1 setting(s)" in text

    # The audit as a comment: today's drift against the new profile, one table per group.
    result = CliRunner().invoke(app, ["audit", str(profile), "-i", fleet.inventory, "--limit",
                                      "fleet", "--format", "markdown"])
    assert result.exit_code == 2, result.output
    parser = MarkdownIt("commonmark").enable("table")
    tokens = parser.parse(result.stdout)
    assert result.stdout.startswith("### nictune audit")
    assert "<strong>3 host(s): 3 drift.</strong>" in parser.render(result.stdout)
    assert sum(t.type == "table_open" for t in tokens) >= 2  # the groups, the per-host table
