"""`--format markdown` (control/review/markdown.py): golden files, what a CommonMark
parser (markdown-it-py, with GFM tables) makes of the output, hostile host
text, and the 65,536-character comment limit on a big synthetic fleet.

Reports come from the real engine on the recorded ConnectX-7 host (fake
kernel, tests/fakes.py).  Regenerate the golden files with
NICTUNE_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import copy
import os

import pytest
from markdown_it import MarkdownIt

from fakes import FakeHost
from nictune.cli.output import envelope
from nictune.control.review import change, markdown
from nictune.control.remote.request import build_request
from nictune.host import agent
from nictune.profile.loader import load_profile_text

GOLDEN = os.path.join(os.path.dirname(__file__), "markdown_golden")

OLD = """\
nictune: 1
host:
  nccl:
    env:
      NCCL_IB_TC: 106
      NCCL_SOCKET_IFNAME: "=enp23s0f0np0"
interfaces:
  rails:
    match: {driver: mlx5_core}
    mtu: 9000
"""
NEW = OLD.replace("106", "104").replace("9000", "8000")


def parse(text: str) -> list:
    return MarkdownIt("commonmark").enable("table").parse(text)


def tables(tokens) -> list:
    """Each table as a list of rows of cell texts (header row first)."""
    out, row, cell = [], None, None
    for t in tokens:
        if t.type == "table_open":
            out.append([])
        elif t.type == "tr_open":
            row = []
        elif t.type in ("th_open", "td_open"):
            cell = []
        elif t.type == "inline" and cell is not None:
            cell.append("".join(c.content for c in t.children or []))
        elif t.type in ("th_close", "td_close"):
            row.append("".join(cell))
            cell = None
        elif t.type == "tr_close":
            out[-1].append(row)
    return out


def fleet_report(tmp_path, n=3) -> dict:
    host = FakeHost("cx7-host", tmp_path / "root")
    new = load_profile_text(NEW, "profiles/rails.yaml")
    old = load_profile_text(OLD, "HEAD~1:profiles/rails.yaml")
    req = dict(change.with_base(build_request("plan", new), old), host="x",
               state_dir=str(tmp_path / "state"))
    one = agent.run(req, host=host)
    one["seconds"] = 0.0
    hosts = [dict(copy.deepcopy(one), host=f"gpu{i:02}") for i in range(n)]
    return hosts


def change_envelope(hosts) -> dict:
    doc = change.effect(hosts, {"ref": "origin/main", "commit": "a" * 40},
                        {"introduced": [{"code": "mtu-low", "severity": "warning",
                                         "message": "an example", "locations": ["p.yaml:3"]}],
                         "fixed": []})
    return envelope("plan", hosts, change=doc)


def golden(name: str, text: str) -> None:
    path = os.path.join(GOLDEN, name)
    if os.environ.get("NICTUNE_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"{name} differs; NICTUNE_UPDATE_GOLDEN=1 rewrites it"


def test_change_golden_and_what_it_parses_into(tmp_path):
    text = markdown.report(change_envelope(fleet_report(tmp_path)), "profiles/rails.yaml")
    golden("change.md", text)
    tokens = parse(text)
    assert tokens[0].type == "heading_open"
    # summary first: the first list says how many hosts the change touches
    first_list = next(i for i, t in enumerate(tokens) if t.type == "bullet_list_open")
    assert first_list < next(i for i, t in enumerate(tokens) if t.type == "table_open")
    lint, effect, drift = tables(tokens)
    assert effect[0] == ["target", "setting", "change", "old wanted", "new wanted",
                         "old source", "new source"]
    rows = {(r[0], r[1]): r for r in effect[1:]}
    mtu = rows[("enp23s0f0np0", "link mtu")]
    assert mtu[2:] == ["changed", "9000", "8000", "HEAD~1:profiles/rails.yaml:10",
                       "profiles/rails.yaml:10"]
    assert rows[("host", "nccl /etc/nccl.conf")][3:5] == ["(3 lines)", "(3 lines)"]
    assert lint[1][:3] == ["introduced", "warning", "mtu-low"]
    assert drift[0][:4] == ["target", "setting", "current", "old wanted"]
    diffs = [t for t in tokens if t.type == "fence"]
    assert [t.info for t in diffs] == ["diff"]
    assert "-NCCL_IB_TC=106" in diffs[0].content and "+NCCL_IB_TC=104" in diffs[0].content
    # drift is collapsed: it is not what the change does
    html = [t.content for t in tokens if t.type == "html_block"]
    assert any("Drift on 3 host(s)" in h for h in html)


def test_plan_and_audit_golden(tmp_path):
    hosts = fleet_report(tmp_path, 2)
    for h in hosts:
        h.pop("base")
    plan = markdown.report(envelope("plan", hosts), "profiles/rails.yaml")
    golden("plan.md", plan)
    header = tables(parse(plan))[0][0]
    assert header == ["target", "setting", "before", "after", "status", "source", "note"]
    audit_hosts = copy.deepcopy(hosts)
    for h in audit_hosts:
        h["command"] = "verify"
        for c in h["changes"]:
            c["status"] = "drift" if c["status"] == "pending" else c["status"]
        h.update(agent.verdict("verify", [c["status"] for c in h["changes"]], h["error"]))
    audit = markdown.report(envelope("audit", audit_hosts), "profiles/rails.yaml")
    golden("audit.md", audit)
    assert tables(parse(audit))[0][0][2:4] == ["actual", "expected"]


HOSTILE = "evil|`x``\x1b[31m<img src=x onerror=alert(1)> @admin [l](http://e.invalid) \u202e"


def test_host_supplied_text_stays_text(tmp_path):
    hosts = fleet_report(tmp_path, 1)
    h = hosts[0]
    h["host"] = HOSTILE
    h["base"]["changes"][0]["after"] = HOSTILE
    h["changes"][0]["source"] = HOSTILE
    h["error"] = {"kind": "system", "message": HOSTILE}
    text = markdown.report(change_envelope(hosts), HOSTILE)
    tokens = parse(text)
    inline_html = [c for t in tokens if t.type == "inline" for c in t.children
                   if c.type in ("html_inline", "link_open")]
    assert inline_html == []
    blocks = [t.content for t in tokens if t.type == "html_block"]
    assert all(b.startswith(("<details>", "</details>")) for b in blocks)
    assert "\x1b" not in text and "\u202e" not in text
    seen = "evil|`x``\\x1b[31m<img src=x onerror=alert(1)> @admin [l](http://e.invalid) \\u202e"
    for table in tables(tokens):
        assert len({len(r) for r in table}) == 1  # no cell broke out of its row
    cells = [c for table in tables(tokens) for r in table for c in r]
    assert seen in cells  # the host's name, its value, shown exactly


def synthetic(n_hosts: int, n_groups: int, rows: int) -> dict:
    hosts = []
    for i in range(n_hosts):
        g = i % n_groups
        changes = [{"key": {"family": "link", "target": f"rail{r}", "name": "mtu"}, "before": 1500,
                    "after": 9001 + g, "status": "pending", "source": f"p.yaml:{r}"}
                   for r in range(rows)]
        base = [dict(c, after=9000) for c in changes]
        hosts.append({"host": f"gpu{i:05}", "command": "plan", "ok": True, "exit_code": 2,
                      "summary": {"pending": rows}, "changes": changes, "warnings": [],
                      "error": None, "seconds": 0.0,
                      "base": {"changes": base, "warnings": [], "error": None}})
    return change_envelope(hosts)


@pytest.mark.parametrize("n_hosts, n_groups, rows", [(2000, 400, 16), (100, 1, 3000)])
def test_a_big_fleet_fits_one_comment_by_summarising(n_hosts, n_groups, rows):
    report = synthetic(n_hosts, n_groups, rows)
    text = markdown.report(report, "p.yaml")
    assert len(text) <= markdown.LIMIT
    tokens = parse(text)
    assert tables(tokens)
    for table in tables(tokens):
        assert len({len(r) for r in table}) == 1
    if n_groups > 1:
        shown = text.count("#### Effect on ")
        left = n_groups - shown
        assert 0 < shown < n_groups
        assert f"{left:,} more effect group(s)" in text
    else:
        effect = next(t for t in tables(tokens) if t[0][2] == "change")
        kept = len(effect) - 1
        assert 0 < kept < rows
        assert f"and {rows - kept} more row(s)" in text
    # the summary still counts every host and group
    assert f"on {n_hosts:,} of {n_hosts:,} host(s)**, in {n_groups:,} group(s)" in text


def test_plain_plan_of_a_big_fleet_fits_too():
    report = synthetic(2000, 400, 16)
    del report["change"]
    text = markdown.report(report, "p.yaml")
    assert len(text) <= markdown.LIMIT
    assert "more host group(s)" in text
