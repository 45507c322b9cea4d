"""YAML and JSON inventories and group_vars/host_vars files, read as Ansible reads them.

A text is read as JSON first, as Ansible's loader does (so 1e3 is a
number, not the text YAML 1.1 makes of it, and {"__ansible_vault": ...}
is a vaulted value), then as YAML.  YAML values are built by PyYAML's
safe constructor (YAML 1.1: yes/no are booleans, 017 is octal, dates
become datetime objects), plus Ansible's two tags: `!unsafe` (a string
never to be templated) and `!vault` (an encrypted string nictune keeps but
does not decrypt).  Merge keys (<<) work.  A repeated key keeps its first
position and its last value, as in Ansible, with a warning.  The structure
(groups, hosts, vars) is walked on the node tree so every host and
variable keeps its line; the tree is composed with bounds on its size and
depth (yamlpos.compose_document), so no file can ask for gigabytes.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from nictune.profile.yamlpos import OverLimit, compose_document

from .errors import InventoryError, shown
from .model import Inventory, Layer, Vaulted, Warn, Where
from .ranges import RangeError, expand_host_pattern
from .templates import Unsafe

_BASE = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
_NULL = "tag:yaml.org,2002:null"
_STR = "tag:yaml.org,2002:str"
# A JSON number or boolean: the node's value is the Python value itself.
_JSON = "tag:nictune.dev,2025:json"
SECTIONS = ("vars", "children", "hosts")
# Far beyond real inventories (a 10,000-host file with ten variables a host
# holds about 110,000 values), and refused within seconds, in megabytes.
MAX_VALUES = 500_000
MAX_DEPTH = 100


class _Loader(_BASE):  # type: ignore[misc, valid-type]
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: Unsafe(loader.construct_scalar(node)))
_Loader.add_constructor("!vault", lambda loader, node: Vaulted(loader.construct_scalar(node)))
_Loader.add_constructor(_JSON, lambda loader, node: node.value)
# Ansible's JSON decoder turns an object with one of these keys into the tagged value.
_JSON_TAGS = {"__ansible_unsafe": "!unsafe", "__ansible_vault": "!vault"}


class NotYamlInventory(Exception):
    """The text is not a YAML inventory; Ansible would try the INI parser next."""

    def __init__(self, line: Optional[int], reason: str):
        super().__init__(reason)
        self.line = line
        self.reason = reason


def _line(node: Node) -> Optional[int]:
    # Nodes made from JSON that YAML cannot read have no position.
    return node.start_mark.line + 1 if node.start_mark is not None else None


class _Document:
    """One parsed YAML or JSON text: its root node and a constructor for values."""

    def __init__(self, text: str, file: str, warn: Warn):
        self.file = file
        self.warn = warn
        self.loader = _Loader("")  # builds values from nodes; the text is composed below
        self.root = self._compose(text)

    def _compose(self, text: str) -> Optional[Node]:
        json_like = text.lstrip(" \t\r\n")[:1] in ("{", "[")
        try:
            root = compose_document(_Loader(text), MAX_VALUES, MAX_DEPTH)
        except OverLimit as e:
            raise InventoryError(self.file, e.line, e.message) from None
        except yaml.YAMLError as e:
            # JSON that YAML cannot read (surrogate pairs, keys of over 1024
            # characters) is read whole, without lines, so first bounded:
            # every value but one per container follows a comma.
            if json_like and text.count(",") + text.count("[") + text.count("{") > MAX_VALUES:
                raise InventoryError(self.file, None, f"has more than {MAX_VALUES} values") from None
            value = _json(text) if json_like else None
            if value is None:
                raise _not_yaml(e) from None
            return _nodes_of(value[0])
        if json_like and _json(text) is not None:
            return _as_json(root, text)
        return root

    def where(self, node: Node) -> Where:
        return (self.file, _line(node))

    def value(self, node: Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = mark.line + 1 if mark is not None else _line(node)
            raise InventoryError(self.file, line, " ".join(str(getattr(e, "problem", e)).split())) from None
        except RecursionError:
            raise InventoryError(self.file, _line(node), "a value is nested too deeply") from None
        except TypeError:  # a list or mapping used as a key inside a value
            raise InventoryError(self.file, _line(node), "a key must be text, not a list or mapping") from None

    def items(self, node: MappingNode) -> List[Tuple[Any, Node, Node]]:
        """(key, key node, value node) in order; a repeated key keeps its first place and last value."""
        try:
            self.loader.flatten_mapping(node)  # resolves << merge keys, as the safe loader does
        except yaml.YAMLError as e:
            raise InventoryError(self.file, _line(node), " ".join(str(getattr(e, "problem", e)).split())) from None
        out: Dict[Any, Tuple[Any, Node, Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if isinstance(key, (list, dict)):
                raise InventoryError(self.file, _line(key_node), "a key must be text, not a list or mapping")
            if key in out:
                self.warn(self.where(key_node), f"duplicate key {shown(key)}: the last one is used")
                out[key] = (out[key][0], key_node, value_node)
            else:
                out[key] = (key, key_node, value_node)
        return list(out.values())


def _not_yaml(e: yaml.YAMLError) -> NotYamlInventory:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        return NotYamlInventory(mark.line + 1 if mark else None,
                                "invalid YAML: " + " ".join(str(e.problem or "syntax error").split()))
    return NotYamlInventory(None, "invalid YAML: " + " ".join(str(e).split())[:200])


# -- JSON, as Ansible's loader reads it before trying YAML --

def _check_json_tags(pairs: Dict[str, Any]) -> Dict[str, Any]:
    for key in _JSON_TAGS:  # the first one found counts, as in Ansible's decoder
        if key in pairs:
            if not isinstance(pairs[key], str):
                raise TypeError(f"{key} is not text")  # Ansible's decoder fails, and YAML is tried
            break
    return pairs


def _json(text: str) -> Optional[Tuple[Any]]:
    """(value,) when the text is JSON as Ansible's decoder takes it, else None."""
    try:
        return (json.loads(text, object_hook=_check_json_tags),)
    except (ValueError, TypeError, RecursionError):
        return None


def _as_json(node: Node, text: str) -> Node:
    """The graph YAML composed from a JSON text, with each scalar as JSON reads it.

    JSON is YAML's flow style, so the structure is the same; only scalars
    differ (YAML 1.1 reads 1e3 as text, and its escapes are not JSON's).
    Each scalar's own text is decoded as JSON.
    """
    if isinstance(node, ScalarNode):
        value = json.loads(text[node.start_mark.index:node.end_mark.index])
        if value is None:
            return ScalarNode(_NULL, "null", node.start_mark, node.end_mark)
        return ScalarNode(_STR if isinstance(value, str) else _JSON, value, node.start_mark, node.end_mark,
                          style='"' if isinstance(value, str) else None)
    if isinstance(node, SequenceNode):
        node.value = [_as_json(item, text) for item in node.value]
        return node
    pairs = [(_as_json(k, text), _as_json(v, text)) for k, v in node.value]
    last = {k.value: v for k, v in pairs}  # a repeated key: JSON keeps the last value
    for key, tag in _JSON_TAGS.items():
        if key in last:
            return ScalarNode(tag, last[key].value, node.start_mark, node.end_mark)
    node.value = pairs
    return node


def _nodes_of(value: Any) -> Node:
    """A node graph (without positions) for a JSON value."""
    if isinstance(value, dict):
        for key, tag in _JSON_TAGS.items():
            if key in value:
                return ScalarNode(tag, value[key], None, None)
        return MappingNode("tag:yaml.org,2002:map", [(_nodes_of(k), _nodes_of(v)) for k, v in value.items()],
                           None, None)
    if isinstance(value, list):
        return SequenceNode("tag:yaml.org,2002:seq", [_nodes_of(v) for v in value], None, None)
    if value is None:
        return ScalarNode(_NULL, "null", None, None)
    return ScalarNode(_STR if isinstance(value, str) else _JSON, value, None, None)


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
        raise NotYamlInventory(_line(root), "the top level is not a mapping of groups")
    groups = doc.items(root)
    for key, key_node, value_node in groups:
        if key == "plugin" and doc.value(value_node):
            raise InventoryError(file, _line(key_node),
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
    inv.add_group(name, where)
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
        raise InventoryError(file, _line(root), "a variables file must be a mapping of names to values")
    values: Dict[str, Any] = {}
    wheres: Dict[str, Where] = {}
    for key, key_node, value_node in doc.items(root):
        if not isinstance(key, str):
            raise InventoryError(file, _line(key_node), f"variable name {shown(key)} is not text")
        values[key] = doc.value(value_node)
        wheres[key] = doc.where(key_node)
    if not values:  # "{}" is skipped like an empty file
        return None
    return values, wheres
