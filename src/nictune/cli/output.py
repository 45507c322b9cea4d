"""Everything the CLI prints: human tables and diffs, or the JSON report.

On a terminal, rich tables with coloured before/after; otherwise the same
rows as plain text, so logs and change reviews stay readable.  Every field
printed, whoever wrote it (a host, an inventory, a profile), has its control
characters made visible first (host/text.py): nothing reaches the terminal
that could move its cursor or fake a line of nictune's own.  JSON is JSON,
which escapes them itself.
"""

from __future__ import annotations

import difflib
import json
import sys
from contextlib import contextmanager
from typing import Optional

from nictune import REPORT_FORMAT, __version__
from nictune.host.errors import EXIT_ERROR, combined_exit
from nictune.host.text import printable
from nictune.control.render import counts as _counts, fleet_summary as _fleet_summary, groups as _groups
from nictune.control.render import listing as _listing, note as _note, result as _result, value as _value

STYLE = {"pending": "yellow", "drift": "yellow", "switch-mismatch": "magenta", "applied": "green", "ok": "dim",
         "reverted": "cyan", "failed": "bold red", "unsupported": "red", "revert-failed": "bold red",
         "skipped": "dim", "not-applied": "dim", "kept": "cyan", "pending-reset": "yellow"}


# What the two value columns mean, per command.
COLUMNS = {"verify": ("actual", "expected"), "rollback": ("restored", "undone")}


def envelope(command: str, hosts: list, error: Optional[dict] = None, **extra) -> dict:
    codes = [h["exit_code"] for h in hosts]
    report = {"nictune_report": REPORT_FORMAT, "nictune": __version__, "command": command,
              "exit_code": EXIT_ERROR if error else combined_exit(codes), "hosts": hosts}
    if error:
        report["error"] = error
    report.update(extra)
    return report


class Printer:
    def __init__(self, as_json: bool):
        self.as_json = as_json
        self._console = None

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False, soft_wrap=True, emoji=False)
        return self._console

    @property
    def rich(self) -> bool:
        return sys.stdout.isatty()

    # -- generic ---------------------------------------------------------
    def json(self, data, sort_keys: bool = False) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=sort_keys, default=str) + "\n")

    def line(self, text: str = "", style: Optional[str] = None) -> None:
        text = printable(text)
        if self.rich and style:
            self.console.print(text, style=style, markup=False)
        else:
            sys.stdout.write(text + "\n")

    def warn(self, text: str) -> None:
        sys.stderr.write(f"warning: {printable(text)}\n")

    def error(self, text: str, prefix: str = "error") -> None:
        """On stderr; prefix names who failed ("nictune agent status")."""
        sys.stderr.write(f"{prefix}: {printable(text)}\n")

    def note(self, text: str) -> None:
        """Progress and side facts, on stderr: stdout stays the report."""
        sys.stderr.write(printable(text) + "\n")

    # -- reports ----------------------------------------------------------
    def _printed_whole(self, report: dict) -> bool:
        """JSON, or an error before any host: nothing more to print."""
        if self.as_json:
            self.json(report)
        elif report.get("error") and not report["hosts"]:
            self.error(report["error"]["message"])
        else:
            return False
        return True

    def report(self, report: dict, show_ok: bool = False, profile: str = "") -> None:
        if self._printed_whole(report):
            return
        for host in report["hosts"]:
            self.host(host, show_ok, profile)

    def host(self, host: dict, show_ok: bool, profile: str) -> None:
        command = host["command"]
        self.line(f"{host['host']}: {command}" + (f" {profile}" if profile else ""), "bold")
        if command == "history":
            self.history(host)
        rows = [c for c in host["changes"] if show_ok or c["status"] != "ok"]
        if rows:
            self._table(rows, COLUMNS.get(command, ("before", "after")))
            for c in rows:
                self._text_diff(c, command)
        for w in host.get("warnings", []):
            self.warn(w)
        if host["changes"] or not host.get("error"):
            self.line(_summary(host), STYLE.get("failed") if host.get("error") else None)
        if host.get("error"):
            self.error(host["error"]["message"])

    def history(self, host: dict) -> None:
        """The applies a host keeps, newest first (`nictune history`)."""
        entries = host.get("history") or []
        if not entries:
            return
        header = ("id", "started", "status", "profile", "changed")
        cells = [tuple(printable(v) for v in (
            e.get("id", "?"), e.get("started") or "?", e.get("status", "?"),
            e.get("profile") or "", e.get("summary", ""))) for e in entries]
        widths = [max(len(r[i]) for r in cells + [header]) for i in range(4)]
        for r in [header] + cells:
            self.line("  " + "  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])

    def _table(self, rows: list, values: tuple) -> None:
        header = ("target", "setting", *values, "status", "source", "note")
        cells = [tuple(printable(v) for v in (
            c["key"]["target"], f"{c['key']['family']} {_name(c)}", _value(c["before"]), _after(c),
            c["status"], c.get("source") or "", _note(c))) for c in rows]
        if not any(c[6] for c in cells):
            header, cells = header[:6], [c[:6] for c in cells]
        if self.rich:
            from rich.table import Table

            table = Table(box=None, pad_edge=False, show_edge=False)
            for i, h in enumerate(header):
                # Keys and values stay whole; source and note wrap if needed.
                table.add_column(h, no_wrap=i < 5, overflow="fold")
            for row in cells:
                status = row[4]
                style = STYLE.get(status, "")
                table.add_row(_esc(row[0]), _esc(row[1]),
                              f"[red]{_esc(row[2])}[/]" if status != "ok" else _esc(row[2]),
                              f"[green]{_esc(row[3])}[/]", f"[{style}]{status}[/]" if style else _esc(status),
                              *(_esc(v) for v in row[5:]))
            self.console.print(table)
            return
        widths = [max(len(r[i]) for r in cells + [header]) for i in range(len(header))]
        for r in [header] + cells:
            self.line("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())

    def _text_diff(self, c: dict, command: str = "") -> None:
        before, after = c["before"], c["after"]
        if not (isinstance(after, str) and "\n" in after) and not (isinstance(before, str) and "\n" in before):
            return
        if before == after:
            return
        name = _name(c)
        old, new, labels = before, after, COLUMNS.get(command, ("before", "after"))
        if command == "rollback":  # what the rollback did: from the applied text back
            old, new, labels = after, before, labels[::-1]
        lines = difflib.unified_diff((old or "").splitlines(True), (new or "").splitlines(True),
                                     f"{name} ({labels[0]})", f"{name} ({labels[1]})")
        for ln in lines:
            ln = ln.rstrip("\n")
            style = "green" if ln.startswith("+") else "red" if ln.startswith("-") else "cyan" if ln.startswith("@") else None
            self.line("    " + ln, style)


    # -- fleets -------------------------------------------------------------
    @contextmanager
    def progress(self, what: str, total: int):
        """A progress bar on a terminal (stderr); yields the per-host callback."""
        if self.as_json or total < 2 or not sys.stderr.isatty():
            yield lambda report: None
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(_esc(what), total=total)
            yield lambda report: bar.advance(task)

    def batch_done(self, batch: dict) -> None:
        """Called by a rollout after each batch, as it happens."""
        if self.as_json:
            return
        names = batch.get("hosts", [])
        self.note(f"batch {batch.get('number', '?')}: {len(names)} host(s) "
                  f"{_listing(names)}: {batch.get('result', '')}")

    def fleet(self, report: dict, show_ok: bool = False, target: str = "") -> None:
        if self._printed_whole(report):
            return
        command = report["command"]
        columns = COLUMNS.get("verify" if command == "audit" else command, ("before", "after"))
        for hosts, rows in _groups(report["hosts"], show_ok):
            self.line(f"{len(hosts)} host(s): {_listing(hosts)}", "bold")
            self._table(rows, columns)
            for c in rows:
                self._text_diff(c, command)
        for rollout in report.get("rollouts", []):
            self._rollout(rollout)
        if command == "history":
            for host in report["hosts"]:
                if host.get("history"):
                    self.line(f"{host['host']}:", "bold")
                    self.history(host)
        self._fleet_warnings(report["hosts"])
        self._host_table(report["hosts"])
        self._cabling(report.get("cabling"))
        self._agreement(report.get("agreement"))
        self.line(_fleet_summary(report), "bold")

    def _cabling(self, doc) -> None:
        """The cabling plan's verdict, and a line per rail not as planned."""
        from nictune.control.review.cabling import text_lines

        for line in text_lines(doc):
            self.line(line, "bold red" if line.startswith("  ") else "bold")

    def _agreement(self, doc) -> None:
        """Each fabric's verdict, and a line per value its hosts disagree on."""
        from nictune.control.review.agreement import text_lines

        for line in text_lines(doc):
            self.line(line, "bold red" if line.startswith("  ") else "bold")

    def _rollout(self, rollout: dict) -> None:
        self.line(f"rollout of {rollout.get('play', '')}: {rollout.get('result', '')}", "bold")
        for name in ("kept", "unchanged", "failed", "rolled_back", "rollback_failed", "not_started"):
            hosts = rollout.get(name) or []
            if hosts:
                self.line(f"  {name.replace('_', ' ')}: {_listing(hosts, 20)}")
        check = rollout.get("drain_check")
        if check:
            self.line("  " + _drain_line(check), None if check.get("passed") else "bold red")
        for batch in rollout.get("batches", []):
            for hook in batch.get("hooks") or []:
                self.line("  " + _hook_line(batch, hook), None if hook.get("ok") else "bold red")
            gate = batch.get("gate")
            if gate:
                self.line(f"  batch {batch.get('number', '?')} traffic gate: "
                          f"{'passed' if gate.get('passed') else 'FAILED'}: {printable(gate.get('message', ''))}",
                          None if gate.get("passed") else "bold red")
                for row in gate.get("results") or []:
                    if not row.get("passed"):
                        self.line("    " + _gate_row(row), "red")

    def _fleet_warnings(self, hosts: list) -> None:
        """Each distinct warning once, with the hosts that gave it."""
        hosts_of: dict = {}
        for h in hosts:
            for w in h.get("warnings") or []:
                hosts_of.setdefault(w, []).append(h["host"])
        for text, names in hosts_of.items():
            self.warn(f"{text} ({len(names)} host(s): {_listing(names)})")

    def _host_table(self, hosts: list) -> None:
        header = ("host", "result", "changes", "seconds", "error")
        cells = [tuple(printable(v) for v in (
            h["host"], _result(h), _counts(h), f"{h.get('seconds', 0):.2f}",
            (h.get("error") or {}).get("message", ""))) for h in hosts]
        if self.rich:
            from rich.table import Table

            table = Table(box=None, pad_edge=False, show_edge=False)
            for i, name in enumerate(header):
                table.add_column(name, no_wrap=i < 4, overflow="fold")
            for row in cells:
                style = "bold red" if row[4] else "yellow" if row[1] in ("drift", "pending") else ""
                table.add_row(*(_esc(v) for v in row), style=style)
            self.console.print(table)
            return
        widths = [max(len(r[i]) for r in cells + [header]) for i in range(4)]
        for r in [header] + cells:
            self.line("  " + "  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])


def _drain_line(check: dict) -> str:
    if check.get("failed"):
        return f"require_drain: plan failed on {_listing([f.get('host', '?') for f in check['failed']])}"
    found = check.get("disruptive") or []
    if not found:
        return f"require_drain: no disruptive change on {check.get('hosts', 0)} host(s)"
    drained = "drained by hooks.before_batch" if check.get("drained") else "and NO before_batch hook to drain"
    keys = _listing([f"{d.get('host')} {d.get('family')} {d.get('target')} {d.get('name')}" for d in found], 4)
    return printable(f"require_drain: {len(found)} disruptive change(s) ({keys}), {drained}")


def _hook_line(batch: dict, hook: dict) -> str:
    argv = " ".join(str(a) for a in hook.get("argv") or [])
    state = "ok" if hook.get("ok") else f"FAILED: {(hook.get('error') or {}).get('message', '')}"
    line = (f"batch {batch.get('number', '?')} {hook.get('hook', 'hook')}: {argv}: {state} "
            f"({hook.get('seconds', 0):.1f} s)")
    tail = [t for t in (hook.get("output") or "").split("\n") if t.strip()]
    if tail and not hook.get("ok"):
        line += f"; last output: {tail[-1]}"
    return printable(line)


def _gate_row(row: dict) -> str:
    figures = row.get("figures")
    shown = ", ".join(f"{k} {v}" for k, v in figures.items()) if isinstance(figures, dict) else ""
    return printable(f"{row.get('client', '?')} -> {row.get('server', '?')} on {row.get('rail', '?')} "
                     f"({row.get('tool', '?')}): {row.get('why') or 'failed'}" + (f" [{shown}]" if shown else ""))


def _esc(text) -> str:
    """A field for rich markup: control characters visible, brackets literal."""
    from rich.markup import escape

    return escape(printable(text))


def _name(c: dict) -> str:
    """The key's name as the profile spells it (its family says how)."""
    from nictune.host.knobs import family_named  # only for human tables

    key = c["key"]
    family = family_named(key["family"])
    return family.label(key["target"], key["name"]) if family else key["name"]


def _after(c: dict) -> str:
    bound = {"min": "at least ", "max": "at most "}.get(c.get("bound") or "", "")
    return bound + _value(c["after"])


def _disruptive(host: dict) -> str:
    n = sum(1 for c in host["changes"] if c.get("disruptive") and c["status"] == "pending")
    return f" {n} of them disruptive (the link drops or queues are reset: see DISRUPTIVE)." if n else ""


def _summary(host: dict) -> str:
    text = _summary_of(host)
    waiting = host.get("summary", {}).get("pending-reset", 0)
    if waiting and host["command"] in ("plan", "verify", "apply"):
        text += (f" {waiting} setting(s) stored, running only after a reset or reboot "
                 "(pending-reset: see NOTE; nictune resets nothing itself).")
    return text


def _summary_of(host: dict) -> str:
    s = host.get("summary", {})
    n = lambda status: s.get(status, 0)  # noqa: E731
    ok = n("ok")
    command = host["command"]
    if command == "plan":
        if n("pending"):
            return (f"{n('pending')} change(s) pending, {ok} setting(s) already as wanted."
                    + _disruptive(host))
        return f"Nothing to change: {ok} setting(s) already as wanted."
    if command == "verify":
        switch = (f" The switch port disagrees on {n('switch-mismatch')} check(s) (switch-mismatch)."
                  if n("switch-mismatch") else "")
        if n("drift"):
            return f"Drift: {n('drift')} setting(s) differ from the profile, {ok} as wanted." + switch
        return f"No drift: {ok} setting(s) as wanted." + switch
    if command == "apply":
        if host.get("error"):
            return "Apply failed; see below."
        if n("applied"):
            return f"Applied {n('applied')} change(s), each verified by reading it back; {ok} already as wanted."
        return f"Nothing to change: {ok} setting(s) already as wanted."
    if command == "rollback":
        if host.get("error"):
            return "Rollback incomplete." if host["changes"] else "Nothing restored."
        applies = host.get("rolled_back") or [host.get("journal", "?")]
        kept = f"; {n('kept')} left as the driver keeps them (see their notes)" if n("kept") else ""
        return (f"Restored {n('reverted')} setting(s) from apply "
                + (applies[0] if len(applies) == 1 else
                   f"{', '.join(applies)} (newest first)") + kept + ".")
    if command == "history":
        entries = host.get("history") or []
        undone = sum(1 for e in entries if e.get("status") == "rolled-back")
        return (f"{len(entries)} apply(s) kept (the last {host.get('kept', '?')} are), "
                f"{len(entries) - undone} not rolled back: `nictune rollback --to ID` undoes "
                "an apply and every one above it." if entries else "No apply recorded.")
    return ""
