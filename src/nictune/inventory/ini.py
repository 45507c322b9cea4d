"""INI inventories, read as Ansible's ini inventory plugin reads them.

Lines before any [section] are hosts of "ungrouped".  [name] lists hosts,
[name:children] groups, [name:vars] key=value lines.  A group may be named
in a :children section before it is declared; one never declared is an
error at the end.  Values, both on host lines (after shell-style
splitting, which drops quotes and "# comments") and in :vars sections
(taken raw up to the end of the line), are read as Python literals when
they are one (1 -> int, True -> bool, [1, 2] -> list, "a b" -> str) and
kept as text otherwise ({{ templates }}, 01, yes).
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from typing import Any, Dict, List, Optional, Tuple

from .errors import InventoryError, shown
from .model import Inventory
from .ranges import RangeError, expand_host_pattern

_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?")
_GROUP_NAME = re.compile(r"([^:\]\s]+)\s*(?:#.*)?")
_KINDS = ("hosts", "children", "vars")
# Shortcuts for the values most lines hold, giving what literal_eval would:
# a plain decimal integer, or text that cannot be a Python literal: a word
# whose first name is not True/False/None, with no quotes, brackets or +,
# or a dotted address (1.2.3 is a syntax error to Python).
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,17}")
_NOT_LITERAL = re.compile(r"(?!True|False|None)[A-Za-z_][A-Za-z0-9_.:/@-]*|[0-9]+(?:\.[0-9]+){2,}")
# A host line shell-style splitting would leave as it is: no quotes,
# escapes or comments, words separated by spaces or tabs.
_PLAIN_LINE = re.compile(r"[^'\"\\#\s]+(?:[ \t]+[^'\"\\#\s]+)*")


def parse_value(text: str) -> Any:
    """An INI value as Ansible reads it: a Python literal if it is one, else the text."""
    if _DECIMAL.fullmatch(text):
        return int(text)
    if _NOT_LITERAL.fullmatch(text):
        return text
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "\d" in a path is an invalid escape to Python
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    except (TypeError, MemoryError, RecursionError):
        raise ValueError(f"{shown(text)} looks like a Python literal but cannot be read as one") from None
    return _plain(value)


def _plain(value: Any) -> Any:
    # What literal_eval gives that inventory variables cannot hold becomes
    # what Ansible makes of it: tuples and sets are lists, bytes are text.
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if value is Ellipsis:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


class _Pending:
    """A group named before it was declared: by [g:vars], or as a child."""

    def __init__(self, line: int, kind: str, parents: Optional[List[str]] = None):
        self.line = line
        self.kind = kind
        self.parents = parents or []


def read_ini_inventory(inv: Inventory, text: str, file: str) -> None:
    _IniReader(inv, file).read(text)


class _IniReader:
    def __init__(self, inv: Inventory, file: str):
        self.inv = inv
        self.file = file
        self.pending: Dict[str, _Pending] = {}

    def fail(self, line: int, message: str) -> InventoryError:
        return InventoryError(self.file, line, message)

    def read(self, text: str) -> None:
        group, kind = "ungrouped", "hosts"
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            section = _SECTION.fullmatch(line)
            if section:
                group, kind = self.section(section.group(1), section.group(2) or "hosts", line, number)
            elif line.startswith("[") and line.endswith("]"):
                raise self.fail(number, f"invalid section header {shown(line)}: a section is [group], "
                                "[group:children] or [group:vars], with no spaces")
            elif kind == "hosts":
                self.host_line(group, line, number)
            elif kind == "vars":
                self.vars_line(group, line, number)
            else:
                self.child_line(group, line, number)
        for name, decl in self.pending.items():
            if decl.kind == "vars":
                raise self.fail(decl.line, f"section [{name}:vars] is for a group that is never declared")
            raise self.fail(decl.line, f"section [{decl.parents[-1]}:children] names group {name!r}, "
                            "which is never declared")

    def section(self, name: str, kind: str, line: str, number: int) -> Tuple[str, str]:
        if kind not in _KINDS:
            raise self.fail(number, f"section {shown(line)} has unknown type {kind!r} "
                            "(expected hosts, children or vars)")
        if name not in self.inv.groups:
            # [g:vars] alone does not declare g; it must be declared somewhere.
            if kind == "vars" and name not in self.pending:
                self.pending[name] = _Pending(number, kind)
            self.inv.add_group(name, (self.file, number))
        if name in self.pending and kind != "vars":
            if self.pending[name].kind == "children":
                self.resolve_children(name, number)
            else:
                del self.pending[name]
        return name, kind

    def resolve_children(self, name: str, number: int) -> None:
        for parent in self.pending[name].parents:
            self.inv.add_child(parent, name, (self.file, number))
            if parent in self.pending and self.pending[parent].kind == "children":
                self.resolve_children(parent, number)
        del self.pending[name]

    def host_line(self, group: str, line: str, number: int) -> None:
        if _PLAIN_LINE.fullmatch(line):
            tokens = line.split()
        else:
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as e:
                raise self.fail(number, f"cannot split the host line: {e}") from None
        if not tokens:
            raise self.fail(number, "a host line has no host name")
        pattern = tokens[0]
        try:
            names, port = expand_host_pattern(pattern)
        except RangeError as e:
            raise self.fail(number, f"host pattern {shown(pattern)}: {e}") from None
        if pattern.strip().endswith(":") and port is None:
            raise self.fail(number, f"host pattern {shown(pattern)} ends in ':', which must be followed by a port")
        if "---" in (n.strip() for n in names):
            raise self.fail(number, "a host named '---': this looks like a YAML file")
        variables = []
        for token in tokens[1:]:
            key, eq, value = token.partition("=")
            if not eq:
                raise self.fail(number, f"expected key=value after the host name, got {shown(token)}")
            variables.append((key, self.value(value, number)))
        where = (self.file, number)
        for name in names:
            self.inv.add_host(name, group, port, where)
            for key, value in variables:
                self.inv.set_variable(name, key, value, where)

    def vars_line(self, group: str, line: str, number: int) -> None:
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not key:
            raise self.fail(number, f"expected key=value in [{group}:vars]")
        self.inv.set_variable(group, key, self.value(value.strip(), number), (self.file, number))

    def child_line(self, group: str, line: str, number: int) -> None:
        m = _GROUP_NAME.fullmatch(line)
        if not m:
            raise self.fail(number, f"expected a group name in [{group}:children], got {shown(line)}")
        child = m.group(1)
        if child in self.inv.groups:
            self.inv.add_child(group, child, (self.file, number))
        elif child in self.pending:
            self.pending[child].parents.append(group)
        else:
            self.pending[child] = _Pending(number, "children", [group])

    def value(self, text: str, number: int) -> Any:
        try:
            return parse_value(text)
        except ValueError as e:
            raise self.fail(number, str(e)) from None
