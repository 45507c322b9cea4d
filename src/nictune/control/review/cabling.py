"""The cabling plan: which switch port each host's rail should reach, and
an audit's check of it against the neighbours the hosts saw over LLDP.

Every host can match its own profile and a rail still be cabled to the
wrong leaf: NCCL's rings then cross the spine (or cannot reach the peer at
all) and nothing on the host says why.  The plan is a CSV file next to the
inventory (`cabling.csv`, or `nictune audit --cabling FILE`):

    # host,rail,switch,port   (comments and blank lines are ignored)
    host,rail,switch,port
    gpu01,rail0,leaf1,swp1
    gpu01,rail1,leaf2*,swp1

`host` is the inventory name, `rail` the host's netdev, `switch` a shell
pattern (fnmatch, case-sensitive) over the neighbour's LLDP system name
(its chassis id when it sends no name), `port` the neighbour's port, equal
to its LLDP port id or its port description (a switch sends its interface
name in one of them: Cumulus in the port id, lldpd's default in the port
description).  Why CSV and not Cumulus PTM's DOT file: a plan is a table
generated from the cable database per host and rail, a spreadsheet opens
it, and a pattern per row (a leaf's name) needs no DOT attribute syntax.

The file is read strictly (load_plan): at most MAX_BYTES and MAX_ROWS, one
record per line, exactly the four columns, each field bounded and
printable, a (host, rail) at most once; anything else is one CablingError
naming file:line.

check() is pure: {host: {rail: Neighbour or None}} for the hosts read, and
the plan, give the cabling document.  The audit takes the neighbours from
the verify reports it already has (neighbours_of: each rail's
facts[rail]["neighbour"], host/facts/lldp.py to_dict()); no host is asked
again.  Per planned rail, one status:

    ok              the neighbour is the planned switch and port
    no-neighbour    nothing heard on the rail (or no such rail read)
    duplicate-port  another host or rail sees the same switch port
    swapped         the rail sees what another rail of the host should,
                    and that rail sees this one's
    wrong-switch    the neighbour's name does not match the pattern
    wrong-port      the planned switch, another port

Each row has the expected and the seen neighbour, and, for a wrong
neighbour that the plan gives to another rail, which one (`planned_for`):
two hosts with their rails crossed each name the other.  The document
("cabling" in the --json envelope) is described in
docs/reference/report-format.md.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Dict, List, Mapping, Optional, Tuple

from nictune.host.errors import InvalidInput
from nictune.host.facts.lldp import LldpError, Neighbour, from_dict
from nictune.host.text import printable

CABLING_FORMAT = 1
DEFAULT_NAME = "cabling.csv"     # looked for next to the inventory
NEIGHBOUR_FACT = "neighbour"     # the key of a rail's facts that holds its Neighbour
HEADER = ("host", "rail", "switch", "port")
MAX_BYTES = 8 * 1024 * 1024
MAX_ROWS = 100_000
MAX_FIELD = {"host": 255, "rail": 15, "switch": 255, "port": 255}  # rail: IFNAMSIZ - 1
FAILING = ("no-neighbour", "duplicate-port", "swapped", "wrong-switch", "wrong-port")
STATUSES = ("ok",) + FAILING
# Control characters (what host/text.py printable() escapes), and the
# bidirectional and zero-width ones that change how a name reads.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


class CablingError(InvalidInput):
    """A cabling plan that cannot be read; the message names file:line."""


@dataclass(frozen=True)
class Expected:
    host: str
    rail: str
    switch: str          # fnmatch pattern over the system name
    port: str
    source: str          # file:line

    def label(self) -> str:
        return f"{self.switch} port {self.port}"


# -- reading the plan ---------------------------------------------------------

def default_path(inventory: Optional[str]) -> Optional[str]:
    """cabling.csv next to the inventory (in it, for a directory), if there."""
    if not inventory:
        return None
    folder = inventory if os.path.isdir(inventory) else os.path.dirname(os.path.abspath(inventory))
    path = os.path.join(folder, DEFAULT_NAME)
    return path if os.path.isfile(path) else None


def load_plan(path: str) -> List[Expected]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise CablingError(f"cannot read the cabling plan {path}: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise CablingError(f"{path}: a cabling plan is at most {MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise CablingError(f"{path}:{line}: not UTF-8 text") from None
    return parse_plan(text, path)


def parse_plan(text: str, path: str) -> List[Expected]:
    """The rows of a plan's text; CablingError at the first bad line."""
    rows: List[Expected] = []
    seen: Dict[Tuple[str, str], str] = {}
    header_seen = False
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        line = line[:-1] if line.endswith("\r") else line
        where = f"{path}:{number}"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = _fields(line, where)
        if not header_seen:
            if tuple(f.lower() for f in fields) != HEADER:
                raise CablingError(f"{where}: the first row of a cabling plan is the header "
                                   f"{','.join(HEADER)}, not {printable(line)[:120]!r}")
            header_seen = True
            continue
        if len(rows) >= MAX_ROWS:
            raise CablingError(f"{where}: a cabling plan has at most {MAX_ROWS} rows")
        row = Expected(*fields, source=where)
        first = seen.setdefault((row.host, row.rail), where)
        if first != where:
            raise CablingError(f"{where}: host {row.host!r} rail {row.rail!r} is planned twice "
                               f"(first at line {first.rsplit(':', 1)[1]})")
        rows.append(row)
    if not header_seen:
        raise CablingError(f"{path}: the cabling plan is empty (no {','.join(HEADER)} header)")
    return rows


def _fields(line: str, where: str) -> List[str]:
    if '"' in line:  # quoted fields: CSV's rules; a plain line is its commas
        try:
            fields = next(csv.reader([line], strict=True))
        except csv.Error as e:
            raise CablingError(f"{where}: not a CSV record ({e})") from None
    else:
        fields = line.split(",")
    if len(fields) != len(HEADER):
        raise CablingError(f"{where}: {len(fields)} column(s), expected {len(HEADER)} "
                           f"({','.join(HEADER)})")
    out = []
    for name, value in zip(HEADER, fields):
        if _CONTROL.search(value):  # before strip(): a \r or \t at an edge is one too
            raise CablingError(f"{where}: column {name} holds a control or invisible character: "
                               f"'{value[:80].encode('unicode_escape').decode('ascii')}'")
        value = value.strip()
        if not value:
            raise CablingError(f"{where}: column {name} is empty")
        if len(value) > MAX_FIELD[name]:
            raise CablingError(f"{where}: column {name} is {len(value)} characters, at most "
                               f"{MAX_FIELD[name]}")
        if name != "switch" and any(c in value for c in "*?["):
            raise CablingError(f"{where}: column {name} is a name, not a pattern: {value!r}")
        out.append(value)
    return out


# -- the neighbours the reports carry ---------------------------------------------

def neighbours_of(host_report: dict) -> Optional[Dict[str, Optional[Neighbour]]]:
    """rail -> Neighbour (None: none heard) from a verify report's facts;
    None for a host that could not be audited.  A neighbour that does not
    read (the report is the host's word) counts as none heard."""
    if host_report.get("error"):
        return None
    out: Dict[str, Optional[Neighbour]] = {}
    facts_of = host_report.get("facts")
    for rail, facts in (facts_of.items() if isinstance(facts_of, dict) else ()):
        data = facts.get(NEIGHBOUR_FACT) if isinstance(facts, dict) else None
        try:
            out[rail] = None if data is None else from_dict(data)
        except (LldpError, TypeError, AttributeError, KeyError, RecursionError):
            out[rail] = None  # from_dict() means to raise LldpError only; a host's junk never escapes
    return out


# -- the check ----------------------------------------------------------------

def matches(expected: Expected, n: Neighbour) -> bool:
    return switch_matches(expected, n) and expected.port in (n.port_id, n.port_description)


def switch_matches(expected: Expected, n: Neighbour) -> bool:
    return fnmatchcase(n.system_name or n.chassis_id, expected.switch)


def check(plan: List[Expected], seen: Mapping[str, Mapping[str, Optional[Neighbour]]],
          path: str = "", audited: Optional[set] = None) -> dict:
    """The cabling document: a row per planned rail of the hosts in `seen`
    (the hosts whose reports were read), rows of other hosts left out
    (`not_read` names the audited ones among them)."""
    by_host: Dict[str, Dict[str, Expected]] = {}
    for e in plan:
        by_host.setdefault(e.host, {})[e.rail] = e
    by_port: Dict[str, List[Expected]] = {}
    for e in plan:
        by_port.setdefault(e.port, []).append(e)
    claims = _claims(seen)
    rows = [_row(e, seen[e.host].get(e.rail), by_host, seen, claims, by_port)
            for e in plan if e.host in seen]
    summary = {status: 0 for status in STATUSES}
    for row in rows:
        summary[row["status"]] += 1
    summary["rails"] = len(rows)
    summary["failing"] = sum(summary[s] for s in FAILING)
    audited = set(seen) if audited is None else audited
    return {"nictune_cabling": CABLING_FORMAT, "plan": path, "summary": summary, "rails": rows,
            "not_read": sorted({e.host for e in plan if e.host in audited and e.host not in seen}),
            "unplanned": sorted(h for h in seen if h not in by_host)}


def _port_key(n: Neighbour) -> Tuple[str, str]:
    return (n.chassis_id, n.port_id)


def _claims(seen) -> Dict[Tuple[str, str], List[str]]:
    """switch port -> the "host rail"s that see it, over every rail read."""
    out: Dict[Tuple[str, str], List[str]] = {}
    for host in sorted(seen):
        for rail in sorted(seen[host]):
            n = seen[host][rail]
            if n is not None:
                out.setdefault(_port_key(n), []).append(f"{host} {rail}")
    return out


def _planned_for(e: Expected, n: Neighbour, by_port) -> Optional[str]:
    """The other planned rail that n is the neighbour of, if any: looked up
    by port, so that a plan of 100,000 rails is not scanned per rail."""
    for port in dict.fromkeys((n.port_id, n.port_description)):
        for o in by_port.get(port, ()):
            if (o.host, o.rail) != (e.host, e.rail) and matches(o, n):
                return f"{o.host} {o.rail}"
    return None


def _row(e: Expected, n: Optional[Neighbour], by_host, seen, claims, by_port) -> dict:
    row = {"host": e.host, "rail": e.rail,
           "expected": {"switch": e.switch, "port": e.port, "source": e.source},
           "seen": None if n is None else _seen(n)}
    if n is None:
        row["status"] = "no-neighbour"
        heard = "no LLDP neighbour heard" if e.rail in seen[e.host] else "no such rail in its report"
        row["message"] = f"{e.host} {e.rail}: expected {e.label()} ({e.source}), {heard}"
        return row
    others = [c for c in claims.get(_port_key(n), []) if c != f"{e.host} {e.rail}"]
    as_planned = matches(e, n)
    if as_planned and not others:
        row.update(status="ok", message=f"{e.host} {e.rail}: {_label(n)} as planned ({e.source})")
        return row
    planned_for = None if as_planned else _planned_for(e, n, by_port)
    swapped = None if as_planned else _swapped_with(e, n, by_host, seen)
    seen_text = f"expected {e.label()} ({e.source}), seen {_label(n)}"
    if others:
        row.update(status="duplicate-port", claimed_by=others,
                   message=f"{e.host} {e.rail}: {_label(n)} is also seen by {', '.join(others)}; "
                           f"{seen_text}")
    elif swapped:
        row.update(status="swapped", swapped_with=swapped,
                   message=f"{e.host} {e.rail} and {swapped} are swapped: {seen_text}, planned for "
                           f"{swapped}")
    else:
        status = "wrong-port" if switch_matches(e, n) else "wrong-switch"
        also = f", which the plan gives {planned_for}" if planned_for else ""
        where = "port" if status == "wrong-port" else "switch"
        row.update(status=status, message=f"{e.host} {e.rail} is on the wrong {where}: {seen_text}{also}")
    if planned_for:
        row["planned_for"] = planned_for
    return row


def _swapped_with(e: Expected, n: Neighbour, by_host, seen) -> Optional[str]:
    """The host's other rail whose planned neighbour this rail sees while it
    sees this rail's planned one."""
    for rail, other in sorted(by_host[e.host].items()):
        if rail == e.rail or not matches(other, n):
            continue
        theirs = seen[e.host].get(rail)
        if theirs is not None and matches(e, theirs):
            return rail
    return None


def _seen(n: Neighbour) -> dict:
    return {"system_name": n.system_name, "chassis_id": n.chassis_id, "port": seen_port(n),
            "port_id": n.port_id, "port_description": n.port_description, "source": n.source}


def seen_port(n: Neighbour) -> str:
    """The port as a person names it: the port id when it is an interface
    name, else the description (lldpd's default id is the port's MAC)."""
    if n.port_subtype in ("interface-name", "interface-alias") or not n.port_description:
        return n.port_id
    return n.port_description


def _label(n: Neighbour) -> str:
    return f"{n.system_name or n.chassis_id} port {seen_port(n)}"


# -- the audit ----------------------------------------------------------------

def for_audit(hosts: List[dict], plan: List[Expected], path: str) -> dict:
    """The cabling document of an audit's host reports."""
    seen = {}
    for report in hosts:
        neighbours = neighbours_of(report)
        if neighbours is not None:
            seen[report["host"]] = neighbours
    return check(plan, seen, path, audited={r["host"] for r in hosts})


def text_lines(doc: Optional[dict]) -> List[str]:
    """The terminal's lines: the verdict, then one per rail that is not ok."""
    if not doc:
        return []
    s = doc["summary"]
    lines = [f"cabling ({doc.get('plan') or 'plan'}): {s['ok']} of {s['rails']} rail(s) as planned"
             + (f", {s['failing']} not" if s["failing"] else "")]
    lines += [f"  {row['message']}" for row in doc["rails"] if row["status"] != "ok"]
    if doc.get("not_read"):
        lines.append(f"  not checked (could not be audited): {', '.join(doc['not_read'])}")
    return lines
