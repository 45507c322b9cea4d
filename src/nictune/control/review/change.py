"""The effect of a profile change, apart from the drift the fleet already has.

`nictune plan TARGET --base REF` (or `--base-file OLD`) sends each host one
request that carries both profiles: the new one (TARGET with the host's
inventory layers) and the base (the same at REF, control/review/gitrev.py).  The
host plans both through the same engine (host/agent.py, request version 2),
so `auto` values, match: selectors and interface names resolve on the host
for both sides; nothing is written.  From the two plans of each host:

- effect: the keys whose *wanted* value the change alters, old wanted ->
  new wanted with file:line on both sides, keys the change adds or removes
  included.  Where a key's source line moved but its value did not, it is
  no effect.
- drift: the keys where the host today differs from the *old* wanted value
  (the base plan's pending/drift keys): what an apply of the base would fix.
- lint: findings of `nictune lint` that the change introduces or fixes.

Hosts whose effect rows are identical share a group, so a change to 2,000
hosts reads as a few tables; drift is grouped the same way.

Snapshots: effect() takes nothing but host reports whose `changes` are the
new plan and whose `base` is the base plan.  With `--from-snapshots DIR`
the same version-2 request runs in the controller against each host's
snapshot (control/review/snapshots.py, host/replay/snapshot.py RecordedHost), which
produces the same reports, and everything here works on them unchanged.

The change document (`"change"` in the `--json` envelope), format 1:

    {"nictune_change": 1,
     "base": {"ref": "HEAD~1", "commit": "<sha>"} | {"file": "old.yaml"},
     "summary": {"hosts", "affected", "groups", "drifted", "errors"},
     "effect": [{"hosts": [...], "rows": [ROW, ...]}, ...],   # most hosts first
     "drift": [{"hosts": [...], "rows": [DRIFT, ...]}, ...],
     "errors": [{"host", "side": "new"|"base", "kind", "message"}],
     "lint": {"introduced": [FINDING], "fixed": [FINDING]},
     "agreement": {"hosts", "rows", "fixed_hosts", "after"}}  # hosts in a fabric only
    (agreement: control/review/agreement.py change_effect: the hosts the change
    makes disagree with their fabric, the rows, the hosts it brings back, and
    the agreement document of what the new profile wants.)
    ROW:   {"key": {family, target, name}, "change": "changed"|"added"|"removed",
            "old": WANT | null, "new": WANT | null}
    WANT:  {"value": ..., "bound": null|"min"|"max", "source": "file:line"}
    DRIFT: {"key", "current": ..., "wanted": WANT, "status": "pending"|"drift"}
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Callable, Dict, List, Optional

from nictune.control.render import listing, value as show_value  # show_value: markdown.py's too
from nictune.host.agent import BASE_FORMAT
from nictune.host.errors import TRANSPORT, NictuneError, error

CHANGE_FORMAT = 1
DRIFTED = ("pending", "drift")  # the base plan's word for "current != old wanted"


# -- requests -------------------------------------------------------------------

def with_base(request: dict, base) -> dict:
    """A plan request that also carries the base profile (a loaded Profile,
    or None: nothing was wanted before, e.g. a host new in the inventory)."""
    doc, sources, path = ({"nictune": 1}, {}, "") if base is None else (
        base.doc, base.sources, base.path)
    return dict(request, nictune_request=BASE_FORMAT,
                base={"path": path, "doc": doc, "sources": sources})


def relabel(profile, root: str, label: str):
    """A base profile loaded from a revision's temporary directory, with its
    file:line sources named as the revision's ("HEAD~1:profiles/a.yaml:12")."""
    prefix = root.rstrip(os.sep) + os.sep

    def named(text: str) -> str:
        return label + ":" + text[len(prefix):] if text.startswith(prefix) else text

    profile.sources = {k: named(v) for k, v in profile.sources.items()}
    profile.files = [named(f) for f in profile.files]
    profile.path = named(profile.path)
    return profile


class BaseProfiles:
    """Each host's base profile: the base file with the host's inventory
    layers as they were at the base (or as they are, for an inventory
    outside the profile's repository, and for --base-file).

    base_of(host_name, layers) -> Profile, None (no base: the host or the
    profile is new in the change) or raises the base's ProfileError."""

    def __init__(self, path: Optional[str], layers_of: Optional[Callable] = None,
                 label: Optional[Callable] = None):
        self.path = path  # None: the profile does not exist at the base
        self.layers_of = layers_of  # host name -> layers, or None for "not in the base"
        self.label = label or (lambda p: p)
        self._cache: Dict[str, object] = {}

    def for_host(self, name: str, current_layers: list):
        if self.path is None:
            return None
        layers = self.layers_of(name) if self.layers_of else current_layers
        if layers is None:
            return None
        key = repr(layers)
        if key not in self._cache:
            from nictune.profile.loader import load_profile

            try:
                self._cache[key] = self.label(load_profile(self.path, overrides=layers))
            except NictuneError as e:
                self._cache[key] = e
        found = self._cache[key]
        if isinstance(found, Exception):
            raise found
        return found


# -- the effect -------------------------------------------------------------------

def _want(c: dict) -> dict:
    return {"value": c.get("after"), "bound": c.get("bound"), "source": c.get("source") or ""}


def _same_want(a: dict, b: dict) -> bool:
    return (a["value"], a["bound"]) == (b["value"], b["bound"])


def _key_id(c: dict) -> tuple:
    k = c["key"]
    return (k["family"], k["target"], k["name"])


def host_effect(host: dict) -> List[dict]:
    """The rows of one host whose wanted value the change alters."""
    new = {_key_id(c): c for c in host.get("changes") or []}
    old = {_key_id(c): c for c in (host.get("base") or {}).get("changes") or []}
    rows = []
    for kid in list(new) + [k for k in old if k not in new]:
        n, o = new.get(kid), old.get(kid)
        if n is not None and o is not None and _same_want(_want(n), _want(o)):
            continue
        rows.append({"key": (n or o)["key"],
                     "change": "changed" if n and o else "added" if n else "removed",
                     "old": _want(o) if o else None, "new": _want(n) if n else None})
    return rows


def host_drift(host: dict) -> List[dict]:
    """Keys where the host differs from what the base wanted."""
    return [{"key": c["key"], "current": c.get("before"), "wanted": _want(c), "status": c["status"]}
            for c in (host.get("base") or {}).get("changes") or [] if c.get("status") in DRIFTED]


def _grouped(rows_of: Dict[str, List[dict]]) -> List[dict]:
    groups: Dict[str, dict] = {}
    for name, rows in rows_of.items():
        if not rows:
            continue
        key = json.dumps(rows, sort_keys=True, default=str)
        groups.setdefault(key, {"hosts": [], "rows": rows})["hosts"].append(name)
    return sorted(groups.values(), key=lambda g: -len(g["hosts"]))


def effect(hosts: List[dict], base: dict, lint: Optional[dict] = None,
           base_errors: Optional[Dict[str, dict]] = None) -> dict:
    """The change document of a plan with a base, from its host reports.
    base_errors: hosts whose base profile could not be built (name -> error)."""
    base_errors = base_errors or {}
    errors: List[dict] = []
    effects: Dict[str, List[dict]] = {}
    drifts: Dict[str, List[dict]] = {}
    for h in hosts:
        name = h["host"]
        if h.get("error"):
            errors.append({"host": name, "side": "new", **_error_fields(h["error"])})
        if name in base_errors:
            errors.append({"host": name, "side": "base", **_error_fields(base_errors[name])})
            continue
        problem = checked_base(h)
        if problem:
            if not h.get("error"):  # an unreachable host has no base, and says why already
                errors.append({"host": name, "side": "base", **error(TRANSPORT, problem)})
            continue
        if h["base"].get("error"):
            errors.append({"host": name, "side": "base", **_error_fields(h["base"]["error"])})
        drifts[name] = host_drift(h)
        if _unplanned(h) or _unplanned(h["base"]):
            # A side whose plan stopped (a conflict, a bad value) has no keys:
            # comparing with it would list every key as added or removed.
            continue
        effects[name] = host_effect(h)
    groups = _grouped(effects)
    drift_groups = _grouped(drifts)
    return {
        "nictune_change": CHANGE_FORMAT,
        "base": base,
        "summary": {"hosts": len(hosts), "affected": sum(len(g["hosts"]) for g in groups),
                    "groups": len(groups), "drifted": sum(len(g["hosts"]) for g in drift_groups),
                    "errors": len({e["host"] for e in errors})},
        "effect": groups,
        "drift": drift_groups,
        "errors": errors,
        "lint": lint or {"introduced": [], "fixed": []},
    }


def _unplanned(side: dict) -> bool:
    return bool(side.get("error")) and not side.get("changes")


def _error_fields(error) -> dict:
    if isinstance(error, NictuneError):
        error = error.as_dict()
    return {"kind": str(error.get("kind", "")), "message": str(error.get("message", ""))}


def checked_base(host: dict) -> Optional[str]:
    """Why a host report's base plan cannot be used, or None.  The base
    comes from the host like the rest of its report (control/remote/hostreport.py
    checks the rest): its shape is checked before anything reads it."""
    from nictune.control.remote.hostreport import ProtocolError, _check_change

    base = host.get("base")
    if base is None:
        return "the host's agent did not plan the base profile (an agent older than request version 2?)"
    if not isinstance(base, dict) or not isinstance(base.get("changes"), list):
        return "the base plan in the host's report is not {changes, warnings, error}"
    try:
        for i, c in enumerate(base["changes"]):
            if not isinstance(c, dict):
                return f"base.changes[{i}] is not an object"
            _check_change(host["host"], i, c)
    except ProtocolError as e:
        return f"the base plan in the host's report cannot be used: {e}"
    error = base.get("error")
    if error is not None and not (isinstance(error, dict) and isinstance(error.get("kind"), str)
                                  and isinstance(error.get("message"), str)):
        return "base.error is not {kind, message} or null"
    return None


# -- lint on change ---------------------------------------------------------------

def lint_change(new_findings: list, old_findings: list) -> dict:
    """Findings the change introduces or fixes.

    A finding is matched by (code, severity, message), counted as a
    multiset, never by its locations: a change that adds a line above a
    finding moves its file:line without touching it, and the base's
    locations name the revision ("HEAD~1:a.yaml:3"), the new ones the work
    tree.  Lint messages name entries, keys and values, not lines, so a
    finding whose values the change alters (an MTU that now leaves a smaller
    RoCE MTU) shows as fixed in its old words and introduced in its new."""
    def ident(f) -> tuple:
        return (f.code, f.severity, f.message)

    new_count = Counter(ident(f) for f in new_findings)
    old_count = Counter(ident(f) for f in old_findings)
    introduced, fixed = new_count - old_count, old_count - new_count
    return {"introduced": _take(new_findings, introduced, ident),
            "fixed": _take(old_findings, fixed, ident)}


def _take(findings: list, wanted: Counter, ident) -> List[dict]:
    left = Counter(wanted)
    out = []
    for f in findings:
        if left[ident(f)] > 0:
            left[ident(f)] -= 1
            out.append(f.as_dict())
    return out


# -- plain text --------------------------------------------------------------------

def show_want(w: Optional[dict]) -> str:
    if w is None:
        return "(not set)"
    bound = {"min": "at least ", "max": "at most "}.get(w.get("bound") or "", "")
    return bound + show_value(w["value"])


def setting(key: dict) -> str:
    from nictune.host.knobs import family_named

    family = family_named(key["family"])
    name = family.label(key["target"], key["name"]) if family else key["name"]
    return f"{key['family']} {name}"


def text_lines(doc: dict) -> List[str]:
    """The change document for a terminal or a log (control characters are
    made visible by the printer)."""
    s = doc["summary"]
    out = [f"Change against {base_label(doc['base'])}: {s['affected']} of {s['hosts']} host(s) "
           f"affected, in {s['groups']} group(s); {s['drifted']} host(s) already drift from the "
           f"base; {s['errors']} host(s) with errors."]
    from nictune.control.review.agreement import change_line

    fabric = change_line(doc.get("agreement"))
    if fabric:
        out.append(fabric)
    for g in doc["effect"]:
        out.append(f"effect on {len(g['hosts'])} host(s): {listing(g['hosts'])}")
        out += _table(("target", "setting", "old wanted", "new wanted", "old source", "new source"),
                      [(r["key"]["target"], setting(r["key"]), show_want(r["old"]),
                        show_want(r["new"]), (r["old"] or {}).get("source", ""),
                        (r["new"] or {}).get("source", "")) for r in g["rows"]])
    for g in doc["drift"]:
        out.append(f"drift already on {len(g['hosts'])} host(s), not this change: {listing(g['hosts'])}")
        out += _table(("target", "setting", "current", "old wanted", "source"),
                      [(r["key"]["target"], setting(r["key"]), show_value(r["current"]),
                        show_want(r["wanted"]), r["wanted"]["source"]) for r in g["rows"]])
    for e in doc["errors"]:
        out.append(f"error ({e['side']}) {e['host']}: {e['message']}")
    for word in ("introduced", "fixed"):
        for f in doc["lint"][word]:
            out.append(f"lint {word}: {f['severity']} {f['code']}: {f['message']} "
                       f"({', '.join(f['locations'])})")
    return out


def _table(header: tuple, rows: List[tuple]) -> List[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    return ["  " + "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
            for r in [header] + rows]


def base_label(base: dict) -> str:
    if base.get("file"):
        return str(base["file"])
    commit = str(base.get("commit") or "")[:12]
    return f"{base.get('ref')} ({commit})" if commit else str(base.get("ref"))
