"""YAML inventories and group_vars/host_vars files, read as Ansible reads them.

Values are built by PyYAML's safe constructor (YAML 1.1: yes/no are
booleans, 017 is octal, dates become datetime objects), plus Ansible's two
tags: `!unsafe` (a string never to be templated) and `!vault` (an
encrypted string nictune keeps but does not decrypt).  Merge keys (<<)
work.  A repeated key keeps its first position and its last value, as in
Ansible, with a warning.  The structure (groups, hosts, vars) is walked
on the node tree so every host and variable keeps its line.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from .errors import InventoryError, shown
from .model import Inventory, Layer, Warn, Where
from .ranges import RangeError, expand_host_pattern

_BASE = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
_NULL = "tag:yaml.org,2002:null"
_STR = "tag:yaml.org,2002:str"
SECTIONS = ("vars", "children", "hosts")


class Unsafe(str):
    """A `!unsafe` string: Ansible never templates it."""


class Vaulted:
    """A `!vault` value: Ansible Vault ciphertext, kept as is and never shown."""

    def __init__(self, ciphertext: str):
        self.ciphertext = ciphertext

    def __repr__(self) -> str:
        return "Vaulted(<encrypted>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vaulted) and other.ciphertext == self.ciphertext

    def __hash__(self) -> int:
        return hash(self.ciphertext)


class _Loader(_BASE):  # type: ignore[misc, valid-type]
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: Unsafe(loader.construct_scalar(node)))
_Loader.add_constructor("!vault", lambda loader, node: Vaulted(loader.construct_scalar(node)))


class NotYamlInventory(Exception):
    """The text is not a YAML inventory; Ansible would try the INI parser next."""

    def __init__(self, line: Optional[int], reason: str):
        super().__init__(reason)
        self.line = line
        self.reason = reason


class _Document:
    """One parsed YAML text: its root node and a constructor for values."""

    def __init__(self, text: str, file: str, warn: Warn):
        self.file = file
        self.warn = warn
        self.loader = _Loader(text)
        try:
            self.root = self.loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            raise NotYamlInventory(mark.line + 1 if mark else None,
                                   "invalid YAML: " + " ".join(str(e.problem or "syntax error").split())) from None
        except yaml.YAMLError as e:
            raise NotYamlInventory(None, "invalid YAML: " + " ".join(str(e).split())[:200]) from None

    def where(self, node: Node) -> Where:
        return (self.file, node.start_mark.line + 1)

    def value(self, node: Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None) or node.start_mark
            raise InventoryError(self.file, mark.line + 1, " ".join(str(getattr(e, "problem", e)).split())) from None
        except RecursionError:
            raise InventoryError(self.file, node.start_mark.line + 1, "a value is nested too deeply") from None
        except TypeError:  # a list or mapping used as a key inside a value
            raise InventoryError(self.file, node.start_mark.line + 1, "a key must be text, not a list or mapping") from None

    def items(self, node: MappingNode) -> List[Tuple[Any, Node, Node]]:
        """(key, key node, value node) in order; a repeated key keeps its first place and last value."""
        try:
            self.loader.flatten_mapping(node)  # resolves << merge keys, as the safe loader does
        except yaml.YAMLError as e:
            raise InventoryError(self.file, node.start_mark.line + 1, " ".join(str(getattr(e, "problem", e)).split())) from None
        out: Dict[Any, Tuple[Any, Node, Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if isinstance(key, (list, dict)):
                raise InventoryError(self.file, key_node.start_mark.line + 1, "a key must be text, not a list or mapping")
            if key in out:
                self.warn(self.where(key_node), f"duplicate key {shown(key)}: the last one is used")
                out[key] = (out[key][0], key_node, value_node)
            else:
                out[key] = (key, key_node, value_node)
        return list(out.values())


def _is_null(node: Optional[Node]) -> bool:
    return node is None or (isinstance(node, ScalarNode) and node.tag == _NULL)


def _is_text(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _STR


def read_yaml_inventory(inv: Inventory, text: str, file: str) -> None:
    """Add the groups and hosts of a YAML inventory text to inv.

    NotYamlInventory when the text is not YAML, or not a mapping of groups
    (the caller then tries INI, as Ansible does); InventoryError when it is a
    YAML inventory with a mistake in it.
    """
    doc = _Document(text, file, inv.warn)
    root = doc.root
    if root is None or _is_null(root):
        raise NotYamlInventory(None, "the YAML document is empty")
    if not isinstance(root, MappingNode):
        raise NotYamlInventory(root.start_mark.line + 1, "the top level is not a mapping of groups")
    groups = doc.items(root)
    for key, key_node, value_node in groups:
        if key == "plugin" and doc.value(value_node):
            raise InventoryError(file, key_node.start_mark.line + 1,
                                 "this is an inventory plugin configuration; nictune reads only static "
                                 "INI and YAML inventories")
    for name, key_node, value_node in groups:
        _group(inv, doc, name, key_node, value_node)


def _group(inv: Inventory, doc: _Document, name: Any, key_node: Node, node: Node) -> Any:
    where = doc.where(key_node)
    if not (_is_null(node) or isinstance(node, MappingNode)):
        inv.warn(where, f"skipped {shown(name)}: a group must be a mapping of hosts, children and vars")
        return name
    if not isinstance(name, str) or not name:
        raise InventoryError(doc.file, where[1], f"group name {shown(name)} must be non-empty text")
    inv.add_group(name)
    if _is_null(node):
        return name
    for key, section_key, value in doc.items(node):
        key_where = doc.where(section_key)
        if key in SECTIONS and _is_text(value):
            _section_from_text(inv, doc, name, key, value)
            continue
        if not (_is_null(value) or isinstance(value, MappingNode)):
            if key in SECTIONS:
                raise InventoryError(doc.file, key_where[1], f"'{key}' of group {name!r} must be a mapping")
            inv.warn(key_where, f"skipped key {shown(key)} of group {name!r}: it is not a mapping")
            continue
        if _is_null(value):
            continue
        if key == "vars":
            for var, var_node, var_value in doc.items(value):
                inv.set_variable(name, var, doc.value(var_value), doc.where(var_node))
        elif key == "children":
            for child, child_key, child_node in doc.items(value):
                child = _group(inv, doc, child, child_key, child_node)
                inv.add_child(name, child, doc.where(child_key))
        elif key == "hosts":
            for pattern, host_key, host_node in doc.items(value):
                _hosts(inv, doc, name, pattern, host_key, host_node)
        else:
            inv.warn(key_where, f"skipped key {shown(key)} of group {name!r}: only vars, children and hosts are read")
    return name


def _section_from_text(inv: Inventory, doc: _Document, group: str, key: str, node: ScalarNode) -> None:
    # Ansible reads "hosts: web1" as "hosts: {web1: null}"; the same for vars and children.
    text = node.value
    if key == "vars":
        inv.set_variable(group, text, None, doc.where(node))
    elif key == "children":
        inv.add_child(group, _group(inv, doc, text, node, None), doc.where(node))
    else:
        _hosts(inv, doc, group, text, node, None)


def _hosts(inv: Inventory, doc: _Document, group: str, pattern: Any, key_node: Node, node: Optional[Node]) -> None:
    where = doc.where(key_node)
    if not isinstance(pattern, str):
        raise InventoryError(doc.file, where[1], f"host pattern {shown(pattern)} must be text; "
                             "put numbers in quotes")
    try:
        names, port = expand_host_pattern(pattern)
    except RangeError as e:
        raise InventoryError(doc.file, where[1], f"host pattern {shown(pattern)}: {e}") from None
    variables: List[Tuple[Any, Node, Node]] = []
    if node is not None and not _is_null(node):
        if isinstance(node, MappingNode):
            variables = doc.items(node)
        elif doc.value(node):
            raise InventoryError(doc.file, where[1], f"host {shown(pattern)} must be followed by a mapping "
                                 "of variables (or nothing)")
    for host in names:
        inv.add_host(host, group, port, where)
        for var, var_key, var_node in variables:
            inv.set_variable(host, var, doc.value(var_node), doc.where(var_key))


def read_vars_file(text: str, file: str, warn: Warn) -> Optional[Layer]:
    """The variables of one group_vars/host_vars file with their lines; None if it is empty."""
    try:
        doc = _Document(text, file, warn)
    except NotYamlInventory as e:
        raise InventoryError(file, e.line, e.reason) from None
    root = doc.root
    if root is None or _is_null(root):
        return None
    if not isinstance(root, MappingNode):
        value = doc.value(root)
        if not value:  # Ansible skips empty files, and also an empty list or string
            return None
        raise InventoryError(file, root.start_mark.line + 1, "a variables file must be a mapping of names to values")
    values: Dict[str, Any] = {}
    wheres: Dict[str, Where] = {}
    for key, key_node, value_node in doc.items(root):
        if not isinstance(key, str):
            raise InventoryError(file, key_node.start_mark.line + 1, f"variable name {shown(key)} is not text")
        values[key] = doc.value(value_node)
        wheres[key] = doc.where(key_node)
    if not values:  # "{}" is skipped like an empty file
        return None
    return values, wheres
