"""Report text shared by the terminal printer (cli/output.py) and the
Markdown review (control/review/markdown.py, control/review/change.py):
a host's result and counts, a fleet's summary line, values and notes as
people read them, and hosts grouped by identical rows.

It sits below both, so that nothing under control/ imports the CLI.
"""

from __future__ import annotations

import json


def groups(hosts: list, show_ok: bool) -> list:
    """Hosts whose rows are identical share one table: a review of 200 hosts
    reads as a handful of distinct diffs."""
    by_rows: dict = {}
    for h in hosts:
        rows = [c for c in h.get("changes", []) if show_ok or c["status"] != "ok"]
        if not rows:
            continue
        key = json.dumps([(c["key"], c["before"], c["after"], c["status"]) for c in rows],
                         sort_keys=True, default=str)
        by_rows.setdefault(key, ([], rows))[0].append(h["host"])
    return list(by_rows.values())


def listing(names: list, limit: int = 6) -> str:
    """The first names, then how many more."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def result(h: dict) -> str:
    """A host report's result in a word or two: its rollout's end, its error, or its worst status."""
    if h.get("rollout"):  # rolled_back / rollback_failed by a playbook's rollout
        return h["rollout"].replace("_", " ")
    if h.get("error"):
        return "unreachable" if h.get("unreachable") else h["error"]["kind"]
    s = h.get("summary", {})
    for status in ("drift", "switch-mismatch", "pending", "pending-reset", "applied", "reverted"):
        if s.get(status):
            return status
    return "ok"


def counts(h: dict) -> str:
    """A host report's statuses other than ok, counted ("-": none)."""
    s = h.get("summary", {})
    return ", ".join(f"{n} {status}" for status, n in sorted(s.items()) if status != "ok") or "-"


def fleet_summary(report: dict) -> str:
    """A fleet report's line: hosts per result, and why a rollout stopped."""
    hosts = report["hosts"]
    tally: dict = {}
    for h in hosts:
        tally[result(h)] = tally.get(result(h), 0) + 1
    parts = ", ".join(f"{n} {what}" for what, n in sorted(tally.items()))
    rollouts = report.get("rollouts") or []
    not_started = sum(len(r.get("not_started") or []) for r in rollouts)
    stops = [r["stopped"].get("message", "") for r in rollouts if isinstance(r.get("stopped"), dict)]
    fabric = _fabric_words(report.get("agreement"))
    if not (not_started or stops):
        return f"{len(hosts)} host(s): {parts or 'none selected'}{fabric}."
    # A rollout that stopped before a batch ran has no host report: say why,
    # not "none selected".
    ran = f"{len(hosts)} host(s): {parts}" if hosts else "no host was written"
    why = f", the rollout stopped: {'; '.join(m.rstrip('.') for m in stops)}" if stops else ""
    return f"{ran}; {not_started} host(s) not started{why}."


def _fabric_words(doc) -> str:
    """"; 2 fabric value(s) disagree on 5 host(s)": why an audit whose
    hosts are all ok exits 2 (control/review/agreement.py)."""
    summary = (doc or {}).get("summary") or {}
    if not summary.get("disagreeing"):
        return ""
    return (f"; {summary['disagreeing']} fabric value(s) disagree on "
            f"{summary['outlier_hosts']} host(s)")


def value(v) -> str:
    """A setting's value as a reviewer reads it (on/off, "(none)", a file's line count)."""
    if v is True:
        return "on"
    if v is False:
        return "off"
    if v is None:
        return "(none)"
    if isinstance(v, dict):  # a feature group whose bits differ
        on = sorted(k for k, bit in v.items() if bit)
        off = sorted(k for k, bit in v.items() if not bit)
        return f"mixed (on: {', '.join(on)})" if len(on) <= len(off) else f"mixed (off: {', '.join(off)})"
    if isinstance(v, str) and "\n" in v:
        return f"({v.count(chr(10))} lines)"
    if isinstance(v, str) and v == "":
        return '""'
    return str(v)


def note(change: dict) -> str:
    """The note, led by what makes the change disruptive: a reviewer must
    not miss that writing it drops the link or resets queues."""
    why = change.get("disruptive")
    if not why or change["status"] not in ("pending", "drift", "applied"):
        return change.get("note") or ""
    return "; ".join(t for t in (f"DISRUPTIVE: {why}", change.get("note") or "") if t)
