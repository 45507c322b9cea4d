"""Reports as Markdown for a pull-request comment (`--format markdown`).

Renders a plan or audit envelope (docs/reference/report-format.md) and the change
document of a plan with a base (control/review/change.py): the summary first,
then one table per group of hosts with identical rows, multi-line values
(the NCCL file) as fenced ```diff blocks, long parts inside <details>.

Size: GitHub refuses comments over 65,536 characters.  Every block (a
group's table, a diff, a section) is rendered whole and added only while
it fits; what does not fit is summarised in a sentence ("12 more groups,
1,830 hosts, are in the --json report"), and a group too large on its own
loses rows at row boundaries with a line saying how many.  A table is never
cut in the middle of a row.

Everything a host, an inventory or a profile wrote is untrusted: names and
values go into code spans (no links, mentions, HTML or emphasis inside
one), with a fence longer than any backtick run in them; other text has
every ASCII punctuation character backslash-escaped (CommonMark makes each
literal); control, bidirectional and zero-width characters are written as
\\xNN / \\uNNNN; `|` is escaped inside table cells; diff blocks get a fence
longer than any backtick or tilde run in their lines.
"""

from __future__ import annotations

import difflib
import html
import re
from typing import Callable, List, Optional

from nictune.control.render import counts, fleet_summary, groups as grouped, note, result
from nictune.host.text import printable

LIMIT = 65536
# Room kept for the closing lines that say what was left out.
RESERVE = 600
HOSTS_INLINE = 8          # host names listed before the rest go in <details>
HOST_LIST_CHARS = 4000    # a group's host list longer than this is shortened
DIFF_OPEN_LINES = 20      # diffs longer than this are collapsed

# Characters that change how text reads without being seen: bidi controls
# (CVE-2021-42574, "Trojan Source") and zero-width characters.
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_PUNCT = re.compile(r"([!-/:-@\[-`{-~])")


def visible(text) -> str:
    text = printable(text)
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def esc(text) -> str:
    """Untrusted text as literal Markdown (outside code spans)."""
    return _PUNCT.sub(r"\\\1", visible(text))


def code(text, cell: bool = False) -> str:
    """Untrusted text as a code span; cell: inside a table row."""
    text = visible(text)
    if text == "":
        return ""
    run = max((len(r) for r in re.findall("`+", text)), default=0)
    fence = "`" * (run + 1)
    if text.startswith(("`", " ")) or text.endswith(("`", " ")):
        text = f" {text} "
    if cell:
        text = text.replace("|", "\\|")
    return f"{fence}{text}{fence}"


def table(header: tuple, rows: List[tuple]) -> str:
    """rows: cells already rendered (code() with cell=True, or esc())."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c if c else " " for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def details(summary: str, body: str) -> str:
    """A collapsed section; summary is our own words (HTML-escaped anyway)."""
    return f"<details><summary>{html.escape(summary)}</summary>\n\n{body.rstrip()}\n\n</details>\n"


def diff_block(old, new, label: str, names: tuple = ("before", "after")) -> str:
    """A unified diff of two texts in a fenced diff block."""
    lines = list(difflib.unified_diff(_lines(old), _lines(new), f"{label} ({names[0]})",
                                      f"{label} ({names[1]})", lineterm=""))
    body = [visible(ln) for ln in lines]
    run = max([len(r) for ln in body for r in re.findall("`+|~+", ln)] + [2])
    fence = "`" * (run + 1)
    text = f"{fence}diff\n" + "\n".join(body) + f"\n{fence}\n"
    if len(body) > DIFF_OPEN_LINES:
        return details(f"{label}: diff of {len(body)} lines", text)
    return text


def _lines(text) -> List[str]:
    return [] if text is None else str(text).splitlines()


def multiline(v) -> bool:
    return isinstance(v, str) and "\n" in v


def host_list(names: List[str]) -> str:
    shown = ", ".join(code(n) for n in names[:HOSTS_INLINE])
    if len(names) <= HOSTS_INLINE:
        return shown + "\n"
    rest = names[HOSTS_INLINE:]
    listed, cut = [], 0
    for n in rest:
        if sum(len(x) + 4 for x in listed) > HOST_LIST_CHARS:
            cut = len(rest) - len(listed)
            break
        listed.append(code(n))
    more = ", ".join(listed) + (f" and {cut} more (see the JSON report)" if cut else "")
    return shown + f" and {len(rest)} more\n\n" + details(f"all {len(names)} hosts", more)


class Budget:
    """Blocks added whole while they fit under the limit."""

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self.parts: List[str] = []

    @property
    def used(self) -> int:
        return sum(len(p) + 1 for p in self.parts)

    def fits(self, text: str) -> bool:
        return self.used + len(text) + 1 <= self.limit - RESERVE

    def add(self, text: str) -> bool:
        if not self.fits(text):
            return False
        self.parts.append(text)
        return True

    def must(self, text: str) -> None:
        self.parts.append(text)

    def text(self) -> str:
        out = "\n".join(self.parts)
        if len(out) > self.limit:  # only the must() parts can get here: never in practice
            out = out[: self.limit - 80].rsplit("\n", 1)[0] + "\n\n(report shortened)\n"
        return out


def add_groups(budget: Budget, groups: List[dict], render: Callable[[dict, Optional[int]], str],
               what: str) -> None:
    """Each group whole if it fits; one too large alone loses rows; the
    rest is summarised in one sentence."""
    for i, group in enumerate(groups):
        if budget.add(render(group, None)):
            continue
        rows = len(group["rows"])
        keep = rows // 2
        while keep >= 1 and not budget.fits(render(group, keep)):
            keep //= 2
        if keep >= 1 and i == 0:
            budget.add(render(group, keep))
            rest = groups[1:]
        else:
            rest = groups[i:]
        if rest:
            hosts = sum(len(g["hosts"]) for g in rest)
            budget.must(f"_{len(rest):,} more {what} group(s), {hosts:,} host(s), do not fit in "
                        "this comment: the `--json` report has every one._\n")
        return


# -- plan / audit / verify ------------------------------------------------------

VALUE_COLUMNS = {"verify": ("actual", "expected"), "audit": ("actual", "expected"),
                 "rollback": ("restored", "undone")}


def _setting(key: dict) -> str:
    from nictune.control.review.change import setting

    return setting(key)


def _value(v) -> str:
    from nictune.control.review.change import show_value

    return show_value(v)


def _after(c: dict) -> str:
    bound = {"min": "at least ", "max": "at most "}.get(c.get("bound") or "", "")
    return bound + _value(c.get("after"))


def report(envelope: dict, target: str = "", show_ok: bool = False, limit: int = LIMIT) -> str:
    """A plan, audit or verify envelope (one host or many) as Markdown; with
    a change document (plan --base), the change's effect instead."""
    if envelope.get("change"):
        return change(envelope, target, limit)
    command = envelope["command"]
    budget = Budget(limit)
    budget.must(f"### nictune {esc(command)} {code(target) if target else ''}".rstrip() + "\n")
    hosts = envelope.get("hosts") or []
    budget.must(f"**{esc(fleet_summary(envelope))}**\n")
    if envelope.get("error"):
        budget.must(f"**Error:** {esc(envelope['error'].get('message', ''))}\n")
    groups = [{"hosts": names, "rows": rows} for names, rows in grouped(hosts, show_ok)]
    columns = VALUE_COLUMNS.get(command, ("before", "after"))

    def render(group: dict, keep: Optional[int]) -> str:
        rows = group["rows"] if keep is None else group["rows"][:keep]
        out = [f"#### {len(group['hosts'])} host(s)\n", host_list(group["hosts"]),
               table(("target", "setting", *columns, "status", "source", "note"),
                     [(code(c["key"]["target"], True), code(_setting(c["key"]), True),
                       code(_value(c.get("before")), True), code(_after(c), True),
                       esc(c.get("status", "")), esc(c.get("source") or ""),
                       esc(note(c))) for c in rows])]
        if keep is not None:
            out.append(f"_… and {len(group['rows']) - keep} more row(s) in the `--json` report._\n")
        for c in rows:
            if multiline(c.get("before")) or multiline(c.get("after")):
                out.append(diff_block(c.get("before"), c.get("after"), visible(c["key"]["name"]),
                                      columns))
        return "\n".join(out)

    add_groups(budget, groups, render, "host")
    if envelope.get("agreement"):
        budget.add(agreement_block(envelope["agreement"], "Fabric agreement"))
    lint = envelope.get("lint") or []
    if lint:
        budget.add(_lint_table("Lint", [("", f) for f in lint]))
    if envelope.get("cabling"):
        if not budget.add(_cabling_table(envelope["cabling"], show_ok)):
            budget.add("_The cabling table does not fit: see the `--json` report._\n")
    rows = [(code(h["host"], True), esc(result(h)), esc(counts(h)),
             esc((h.get("error") or {}).get("message", ""))) for h in hosts]
    per_host = details(f"Per-host results ({len(hosts)} hosts)",
                       table(("host", "result", "changes", "error"), rows))
    if hosts and not budget.add(per_host):
        bad = [r for r, h in zip(rows, hosts) if h.get("error") or result(h) != "ok"]
        if not budget.add(details(f"Hosts that are not ok ({len(bad)})",
                                  table(("host", "result", "changes", "error"), bad))):
            budget.must(f"_{len(hosts):,} per-host results do not fit: see the `--json` report._\n")
    return budget.text()


def _cabling_table(doc: dict, show_ok: bool) -> str:
    """The rails not as the cabling plan says (all with show_ok): expected
    and seen neighbour side by side."""
    s = doc.get("summary") or {}
    out = [f"#### Cabling\n\n{esc(s.get('ok', 0))} of {esc(s.get('rails', 0))} rail(s) as planned "
           f"in {code(doc.get('plan') or 'the plan')}\n"]
    rows = []
    for row in doc.get("rails") or []:
        if row.get("status") == "ok" and not show_ok:
            continue
        want, got = row.get("expected") or {}, row.get("seen") or {}
        seen = (f"{got.get('system_name') or got.get('chassis_id')} port {got.get('port')}"
                if got else "nothing")
        rows.append((code(row.get("host", ""), True), code(row.get("rail", ""), True),
                     esc(row.get("status", "")),
                     code(f"{want.get('switch')} port {want.get('port')}", True), code(seen, True),
                     esc(want.get("source", "")), esc(_cabling_note(row))))
    if rows:
        out.append(table(("host", "rail", "status", "expected", "seen", "plan line", "note"), rows))
    return "\n".join(out)


def _cabling_note(row: dict) -> str:
    if row.get("claimed_by"):
        return "also seen by " + ", ".join(row["claimed_by"])
    if row.get("swapped_with"):
        return f"swapped with {row['swapped_with']}"
    if row.get("planned_for"):
        return f"planned for {row['planned_for']}"
    return ""
def _fabric_line(effect: Optional[dict]) -> Optional[str]:
    from nictune.control.review.agreement import change_line

    line = change_line(effect)
    if line and effect["hosts"]:
        return f"**{esc(line)}**"
    return esc(line) if line else None


def agreement_block(doc: dict, title: str) -> str:
    """Each fabric's disagreements (control/review/agreement.py): a row per
    value and outlier value, with the failure it predicts."""
    rows = []
    for f in doc.get("fabrics") or []:
        for row in f["values"]:
            for o in row["outliers"]:
                rows.append((code(f["fabric"], True), code(row["name"], True),
                             code(f"{row['majority']['shown']}", True) + f" on {row['majority']['count']:,}",
                             code(o["shown"], True) + f" on {len(o['hosts']):,}: " +
                             ", ".join(code(h, True) for h in o["hosts"][:HOSTS_INLINE]) +
                             (f" and {len(o['hosts']) - HOSTS_INLINE:,} more" if len(o["hosts"]) > HOSTS_INLINE else ""),
                             esc(row["predicts"])))
    fabrics = len(doc.get("fabrics") or [])
    if not rows:
        return f"#### {esc(title)}\n\nEvery value agrees in each of {fabrics} fabric(s).\n"
    return (f"#### {esc(title)}\n\n" +
            table(("fabric", "value", "majority", "outliers", "predicted failure"), rows))


def _lint_table(title: str, findings: List[tuple]) -> str:
    rows = [(esc(word), esc(f.get("severity", "")), code(f.get("code", ""), True),
             esc(f.get("message", "")), esc(", ".join(f.get("locations") or [])))
            for word, f in findings]
    return f"#### {title}\n\n" + table(("", "severity", "code", "message", "locations"), rows)


# -- the change's effect -------------------------------------------------------------

def change(envelope: dict, target: str = "", limit: int = LIMIT) -> str:
    from nictune.control.review.change import base_label, show_value, show_want

    doc = envelope["change"]
    s = doc["summary"]
    budget = Budget(limit)
    budget.must(f"### nictune plan {code(target)} against {code(base_label(doc['base']))}\n")
    lint = doc.get("lint") or {"introduced": [], "fixed": []}
    settings = sum(len(g["rows"]) * len(g["hosts"]) for g in doc["effect"])
    summary = [f"**This change alters {settings:,} wanted setting(s) on {s['affected']:,} of "
               f"{s['hosts']:,} host(s)**, in {s['groups']:,} group(s) of hosts with the same effect."]
    summary.append(f"{s['drifted']:,} host(s) already drift from the base today: shown "
                   "separately, not part of this change." if s["drifted"] else
                   "No host drifts from the base today.")
    if s["errors"]:
        summary.append(f"**{s['errors']:,} host(s) could not be planned** (see Errors).")
    summary.append(f"Lint: {len(lint['introduced'])} finding(s) introduced, "
                   f"{len(lint['fixed'])} fixed.")
    fabric = _fabric_line(doc.get("agreement"))
    if fabric:
        summary.append(fabric)
    if envelope.get("error"):
        summary.append(f"**Error:** {esc(envelope['error'].get('message', ''))}")
    budget.must("\n".join(f"- {line}" for line in summary) + "\n")

    def render(group: dict, keep: Optional[int]) -> str:
        rows = group["rows"] if keep is None else group["rows"][:keep]
        out = [f"#### Effect on {len(group['hosts'])} host(s)\n", host_list(group["hosts"]),
               table(("target", "setting", "change", "old wanted", "new wanted", "old source",
                      "new source"),
                     [(code(r["key"]["target"], True), code(_setting(r["key"]), True),
                       esc(r["change"]), code(show_want(r["old"]), True),
                       code(show_want(r["new"]), True), esc((r["old"] or {}).get("source", "")),
                       esc((r["new"] or {}).get("source", ""))) for r in rows])]
        if keep is not None:
            out.append(f"_… and {len(group['rows']) - keep} more row(s) in the `--json` report._\n")
        for r in rows:
            old, new = (r["old"] or {}).get("value"), (r["new"] or {}).get("value")
            if multiline(old) or multiline(new):
                out.append(diff_block(old, new, visible(r["key"]["name"]),
                                      ("old wanted", "new wanted")))
        return "\n".join(out)

    # Lint before the groups: a few lines a reviewer must not lose to a big effect.
    if lint["introduced"] or lint["fixed"]:
        budget.add(_lint_table("Lint findings this change introduces or fixes",
                               [("introduced", f) for f in lint["introduced"]]
                               + [("fixed", f) for f in lint["fixed"]]))
    if (doc.get("agreement") or {}).get("hosts"):
        budget.add(agreement_block(doc["agreement"]["after"], "Fabric disagreements once this change is applied"))
    if doc["effect"]:
        budget.must("#### What this change does\n")
        add_groups(budget, doc["effect"], render, "effect")
    else:
        budget.must("_The change alters no wanted setting on any host._\n")

    if doc["errors"]:
        rows = [(code(e["host"], True), esc(e["side"]), esc(e["kind"]), esc(e["message"]))
                for e in doc["errors"]]
        if not budget.add(details(f"Errors ({len(rows)})", table(("host", "profile", "kind",
                                                                    "message"), rows))):
            budget.must(f"_{len(rows):,} errors do not fit: see the `--json` report._\n")

    def render_drift(group: dict, keep: Optional[int]) -> str:
        rows = group["rows"] if keep is None else group["rows"][:keep]
        body = host_list(group["hosts"]) + "\n" + table(
            ("target", "setting", "current", "old wanted", "source"),
            [(code(r["key"]["target"], True), code(_setting(r["key"]), True),
              code(show_value(r["current"]), True), code(show_want(r["wanted"]), True),
              esc(r["wanted"].get("source", ""))) for r in rows])
        if keep is not None:
            body += f"\n_… and {len(group['rows']) - keep} more row(s) in the `--json` report._\n"
        return details(f"Drift on {len(group['hosts'])} host(s), {len(group['rows'])} setting(s)",
                       body)

    if doc["drift"]:
        budget.must("#### Drift the fleet already has (not this change)\n")
        add_groups(budget, doc["drift"], render_drift, "drift")
    return budget.text()
