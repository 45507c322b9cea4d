"""Ansible host patterns ("Patterns: targeting hosts and groups").

A pattern is a list of parts separated by "," (or ":" when no part could
be an address): names of hosts or groups, shell globs (web*), regular
expressions (~web\\d+, matched from the start of the name), each optionally
with a subscript ([0], [-1], [1:3], [2:]) when it names groups.  Parts
starting with "&" intersect, parts starting with "!" exclude; plain parts
are applied first, then "&", then "!", whatever their order.

One deliberate difference: Ansible warns about a part that matches nothing
and carries on; nictune refuses, because a typo in a pattern for a tool that
changes hosts should stop it, not shrink its target.  An empty final
selection is refused too (Ansible's --limit does the same), and so is an
empty --limit (Ansible ignores `--limit ""` and targets every host).
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple

from .errors import InventoryError, shown
from .ranges import split_port

if TYPE_CHECKING:
    from .model import Host, Inventory

_SUBSCRIPT = re.compile(r"(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]")
_COLON_PARTS = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
Subscript = Tuple[int, Optional[int]]


class Origin(NamedTuple):
    """Where a pattern part was written, for its error: the file and line
    (an @file of --limit) or the inventory, and what to call the part."""

    file: Optional[str]
    line: Optional[int]
    word: str  # "pattern", "--limit pattern"

    def error(self, part: str, why: str) -> InventoryError:
        return InventoryError(self.file, self.line, f"{self.word} {shown(part, 80)} {why}")


def split_pattern(pattern: str) -> List[str]:
    """'a,b[1], c' -> ['a', 'b[1]', 'c']; 'a:&b:!c' -> ['a', '&b', '!c']."""
    if "," in pattern:
        parts = pattern.split(",")
    else:
        try:
            split_port(pattern)  # an address ("10.0.0.1:22", "node[1:3]") is one part
            parts = [pattern]
        except ValueError:
            parts = _COLON_PARTS.findall(pattern)
    return [p.strip() for p in parts if p.strip()]


def select(inv: Inventory, pattern: Optional[str], limit: Optional[str] = None) -> List[Host]:
    """The hosts a pattern selects, in Ansible's order, narrowed by a --limit pattern.

    limit may name a file with "@path": one pattern per line.  The order is
    the pattern's, whatever the limit's, as in Ansible.
    """
    parts = split_pattern(pattern if pattern is not None else "all")
    if not parts:
        raise InventoryError(inv.source, None, f"pattern {shown(pattern, 80)} names no host or group")
    chosen = _evaluate(inv, parts, {}, Origin(inv.source, None, "pattern"))
    if limit is not None:
        origins = _limit_parts(inv, limit)
        if not origins:
            raise InventoryError(inv.source, None, f"--limit {shown(limit, 80)} names no host or group; "
                                 "leave --limit out to target every host")
        allowed = {h.name for h in _evaluate(inv, list(origins), origins, Origin(inv.source, None, "--limit"))}
        chosen = [h for h in chosen if h.name in allowed]
    if not chosen:
        what = f"pattern {shown(pattern or 'all', 80)}" + (f" with --limit {shown(limit, 80)}" if limit else "")
        raise InventoryError(inv.source, None, f"{what} selects no host")
    return chosen


def _limit_parts(inv: Inventory, limit: str) -> Dict[str, Origin]:
    """The parts of a --limit, in order, each with where it was written."""
    parts: Dict[str, Origin] = {}
    for part in split_pattern(limit):
        if part.startswith("@"):
            path = part[1:]
            if not os.path.isfile(path):
                raise InventoryError(path, None, "the --limit file does not exist or is not a file")
            try:
                with open(path, encoding="utf-8") as f:
                    lines = f.read().split("\n")
            except (OSError, UnicodeDecodeError) as e:
                raise InventoryError(path, None, f"cannot read the --limit file: {e}") from None
            for number, line in enumerate(lines, 1):
                if line.strip():
                    parts.setdefault(line.strip(), Origin(path, number, "--limit pattern"))
        else:
            parts.setdefault(part, Origin(inv.source, None, "--limit pattern"))
    return parts


def _evaluate(inv: Inventory, parts: List[str], origins: Dict[str, Origin], default: Origin) -> List[Host]:
    plain = [p for p in parts if p and p[0] not in "&!"]
    ordered = (plain or ["all"]) + [p for p in parts if p[:1] == "&"] + [p for p in parts if p[:1] == "!"]
    hosts: List[Host] = []
    cache: Dict[str, List[Host]] = {}
    for part in ordered:
        if part in inv.hosts:  # a plain host name wins over a group of the same name
            hosts.append(inv.hosts[part])
            continue
        origin = origins.get(part, default)
        if part[0] in "&!":
            body = part[1:]
            if not body:
                raise origin.error(part, "names nothing")
            matched = {h.name for h in _match(inv, body, cache, origin)}
            keep = part[0] == "&"
            hosts = [h for h in hosts if (h.name in matched) == keep]
        else:
            seen = {h.name for h in hosts}
            hosts += [h for h in _match(inv, part, cache, origin) if h.name not in seen]
    out, seen = [], set()
    for host in hosts:
        if host.name not in seen:
            seen.add(host.name)
            out.append(host)
    return out


def _match(inv: Inventory, part: str, cache: Dict[str, List[Host]], origin: Origin) -> List[Host]:
    if part not in cache:
        expr, subscript = _split_subscript(part)
        hosts = _enumerate(inv, expr, origin)
        if not hosts:
            raise origin.error(part, "matches no host or group")
        cache[part] = _apply_subscript(part, hosts, subscript, origin)
    return cache[part]


def _split_subscript(part: str) -> Tuple[str, Optional[Subscript]]:
    if part.startswith("~"):
        return part, None
    m = _SUBSCRIPT.fullmatch(part)
    if not m:
        return part, None
    expr, index, start, _sep, end = m.groups()
    if index is not None:
        return expr, (int(index), None)
    return expr, (int(start), int(end) if end else -1)


def _apply_subscript(part: str, hosts: List[Host], subscript: Optional[Subscript], origin: Origin) -> List[Host]:
    if subscript is None:
        return hosts
    start, end = subscript
    if end:  # Ansible reads [x:0] as [x]
        chosen = hosts[start:(len(hosts) if end == -1 else end + 1)]
    else:
        chosen = [hosts[start]] if -len(hosts) <= start < len(hosts) else []
    if not chosen:
        raise origin.error(part, f"has a subscript past the last of its {len(hosts)} host(s)")
    return chosen


def _enumerate(inv: Inventory, expr: str, origin: Origin) -> List[Host]:
    rx = _compile(expr, origin)
    groups = [g for name, g in inv.groups.items() if rx.match(name)]
    out: List[Host] = []
    for group in groups:
        out += group.all_hosts()
    if not groups or expr[0] == "~" or any(c in expr for c in ".?*["):
        out += [h for name, h in inv.hosts.items() if rx.match(name)]
    return out


def _compile(expr: str, origin: Origin) -> re.Pattern:
    try:
        return re.compile(expr[1:] if expr[0] == "~" else fnmatch.translate(expr))
    except re.error as e:
        raise origin.error(expr, f"is not a valid {'regular expression' if expr[0] == '~' else 'glob'}: "
                                 f"{e}") from None
