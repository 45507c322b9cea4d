"""Read YAML into plain Python values, remembering the line of every key.

We convert PyYAML's node graph ourselves instead of calling safe_load so that
each mapping key and sequence item keeps its line (error messages and the
plan's "file:line" sources need it), and so that duplicate keys, which
safe_load silently lets the last one win, are an error.

The node graph is composed here too (compose_document), in one pass over
the parser's events that stops at the first value past a bound: PyYAML's
own composer builds the whole graph of a 15 MB flow list (gigabytes)
before anything can count it, and recurses once per nesting level.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml
from yaml.composer import ComposerError
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import ProfileError, dotted, kind, show

LOADER = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader

MAX_BYTES = 16 * 1024 * 1024
# Real profiles nest 5 levels deep and hold a few hundred values.  The
# limits keep the (recursive) converter off the recursion limit, bound the
# work and memory a file can ask for, and stop alias "billion laughs".
MAX_DEPTH = 32
MAX_NODES = 100_000
# int() on megabytes of digits is slow on Python < 3.11; no knob needs more.
MAX_NUMBER_CHARS = 100
# What `ansible-vault encrypt` puts at the start of a file.
VAULT_HEADER = "$ANSIBLE_VAULT;"

_TAG = "tag:yaml.org,2002:"
_STR, _SEQ, _MAP = _TAG + "str", _TAG + "seq", _TAG + "map"
# timestamp: SafeLoader would make a datetime; no knob wants one, so the
# text is kept as written.
_KEEP_TEXT = {_STR, _TAG + "timestamp"}
_constructor = SafeConstructor()
_BUILD = {
    _TAG + "null": _constructor.construct_yaml_null,
    _TAG + "bool": _constructor.construct_yaml_bool,
    _TAG + "int": _constructor.construct_yaml_int,
    _TAG + "float": _constructor.construct_yaml_float,
}

Path = Tuple[Any, ...]


@dataclass
class Parsed:
    """A document plus where its parts came from.

    positions: key path -> (file, 1-based line) for the root, every mapping
    key and every sequence item.  plain: key path -> source text of unquoted
    scalars that YAML read as something other than a string (10:20 is an
    integer, on is a boolean), so errors can suggest quoting them.
    """

    doc: dict
    positions: Dict[Path, Tuple[str, int]]
    plain: Dict[Path, str] = field(default_factory=dict)


def read_file(path: str, encoding: str = "utf-8-sig") -> str:
    """The text of a regular file of at most MAX_BYTES, as UTF-8 (by
    default without its byte-order mark; "utf-8" keeps it as U+FEFF)."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang; we refuse it just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ProfileError(path, None, "", _os_reason(e)) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ProfileError(path, None, "", "is a directory, not a profile file")
        if not stat.S_ISREG(st.st_mode):
            raise ProfileError(path, None, "", "is not a regular file")
        if st.st_size > MAX_BYTES:
            raise ProfileError(path, None, "", f"is too large ({st.st_size} bytes; the limit is 16 MiB)")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_BYTES:  # grew while we read it
                raise ProfileError(path, None, "", "is too large (the limit is 16 MiB)")
            chunks.append(chunk)
    except OSError as e:
        raise ProfileError(path, None, "", _os_reason(e)) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ProfileError(path, line, "", f"is not valid UTF-8 (byte {e.start})") from None


def _os_reason(e: OSError) -> str:
    if e.errno == errno.ENOENT:
        return "no such file"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return f"cannot read it: {e.strerror or e}"


def parse_file(path: str, kind: str = "profile") -> Parsed:
    return parse_text(read_file(path), path, kind)


# What each kind of document is at its top level, and how to say so.
_TOP = {
    "profile": (MappingNode, "a mapping that starts with 'nictune: 1'",
                "the top level of a profile must be a mapping (key: value lines)"),
    "playbook": (SequenceNode, "a list of plays, each starting with '- hosts:'",
                 "the top level of a playbook must be a list of plays, each starting with '- hosts:'"),
}


def parse_text(text: str, name: str, kind: str = "profile") -> Parsed:
    """Parse one YAML document: a profile (a mapping) or a playbook (a list)."""
    return _document(_compose(text, name), name, kind)


def read_target(path: str) -> Tuple[str, Parsed]:
    """The TARGET of plan/apply/verify/audit, read once: ("playbook", its
    plays) when the document is a list, else ("profile", its document).
    Raises ProfileError; a list whose values do not convert (a !vault tag,
    a repeated key) gets that value's error, not "a profile must be a
    mapping"."""
    root = _compose(read_file(path), path)
    if isinstance(root, SequenceNode):
        return "playbook", _document(root, path, "playbook")
    return "profile", _document(root, path, "profile")


def _compose(text: str, name: str) -> Optional[Node]:
    """The node graph of one YAML document (None if it is empty)."""
    if len(text) > MAX_BYTES:
        raise ProfileError(name, None, "", "is too large (the limit is 16 MiB)")
    if text.startswith(VAULT_HEADER):
        raise ProfileError(name, 1, "", "is encrypted with Ansible Vault, which nictune does not decrypt; "
                           "profiles and playbooks hold no secrets: keep them in plain text "
                           "(`ansible-vault decrypt FILE`)")
    try:
        return compose_document(LOADER(text))
    except OverLimit as e:
        raise ProfileError(name, e.line, "", e.message) from None
    except yaml.YAMLError as e:
        raise _yaml_error(e, name, text) from None


class OverLimit(Exception):
    """A YAML document past a bound of compose_document: where (1-based line) and why."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def compose_document(loader: Any, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Optional[Node]:
    """The node graph of the single YAML document `loader` reads (None if there is none).

    loader is a fresh PyYAML loader (C or Python) of the text.  Raises
    OverLimit at the first value past max_nodes (sequence items and mapping
    values; a key comes with its value) or level past max_depth, having
    built only that much, and yaml.YAMLError for what PyYAML's composer
    would refuse.  Aliases are not expanded here: the node they name is
    shared, and whoever walks the graph bounds what they expand to.
    """
    try:
        loader.get_event()  # stream start
        if loader.check_event(yaml.StreamEndEvent):
            return None
        document = loader.get_event()
        root = _compose_nodes(loader, max_nodes, max_depth)
        loader.get_event()  # document end
        if not loader.check_event(yaml.StreamEndEvent):
            raise ComposerError("expected a single document in the stream", document.start_mark,
                                "but found another document", loader.get_event().start_mark)
        return root
    finally:
        loader.dispose()


def _compose_nodes(loader: Any, max_nodes: int, max_depth: int) -> Node:
    anchors: Dict[str, Node] = {}
    # The collections being filled, innermost last, each with the key node
    # waiting for its value (mappings only).
    filling: List[List[Any]] = []
    count = 0
    while True:
        event = loader.get_event()
        if isinstance(event, yaml.CollectionEndEvent):
            node = filling.pop()[0]
            node.end_mark = event.end_mark
            if not filling:
                return node
            continue
        node = _node(loader, event, anchors)
        if filling:
            parent = filling[-1]
            if isinstance(parent[0], SequenceNode):
                parent[0].value.append(node)
                count += 1
            elif parent[1] is None:
                parent[1] = node
            else:
                parent[0].value.append((parent[1], node))
                parent[1] = None
                count += 1
            if count > max_nodes:
                raise OverLimit(_line(event), f"has more than {max_nodes} values")
        if isinstance(event, yaml.CollectionStartEvent):
            filling.append([node, None])
            if len(filling) > max_depth:
                raise OverLimit(_line(event), f"is nested more than {max_depth} levels deep")
        elif not filling:
            return node  # the document is one scalar or alias


def _node(loader: Any, event: Any, anchors: Dict[str, Node]) -> Node:
    """The node an alias, scalar or collection-start event stands for, as PyYAML's composer makes it."""
    if isinstance(event, yaml.AliasEvent):
        if event.anchor not in anchors:
            raise ComposerError(None, None, f"found undefined alias {event.anchor!r}", event.start_mark)
        return anchors[event.anchor]
    if event.anchor is not None and event.anchor in anchors:
        raise ComposerError(f"found duplicate anchor {event.anchor!r}; first occurrence",
                            anchors[event.anchor].start_mark, "second occurrence", event.start_mark)
    node_type = (ScalarNode if isinstance(event, yaml.ScalarEvent)
                 else SequenceNode if isinstance(event, yaml.SequenceStartEvent) else MappingNode)
    tag = event.tag
    if tag is None or tag == "!":
        tag = loader.resolve(node_type, event.value if node_type is ScalarNode else None, event.implicit)
    if node_type is ScalarNode:
        node: Node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
    else:
        node = node_type(tag, [], event.start_mark, None, flow_style=event.flow_style)
    if event.anchor is not None:
        anchors[event.anchor] = node
    return node


def _document(root: Optional[Node], name: str, kind: str) -> Parsed:
    node_type, what, wrong = _TOP[kind]
    if root is None:
        raise ProfileError(name, None, "", f"is empty; a {kind} is {what}")
    if not isinstance(root, node_type):
        raise ProfileError(name, _line(root), "", wrong)
    conv = _Converter(name)
    conv.positions[()] = (name, _line(root))
    doc = conv.convert(root, (), 0)
    return Parsed(doc, conv.positions, conv.plain)


def _yaml_error(e: yaml.YAMLError, name: str, text: str) -> ProfileError:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        what = " ".join(str(e.problem or "syntax error").split())
        if e.context and e.context_mark:
            ctx_line = e.context_mark.line + 1
            what += f" ({' '.join(e.context.split())}" + (f" at line {ctx_line})" if ctx_line != line else ")")
        return ProfileError(name, line, "", f"invalid YAML: {what}")
    if isinstance(e, yaml.reader.ReaderError):
        pos = e.position if isinstance(e.position, int) else 0
        line = text.count("\n", 0, pos) + 1
        char = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or "?")
        return ProfileError(name, line, "", f"invalid YAML: character U+{char:04X} is not allowed in YAML")
    return ProfileError(name, None, "", f"invalid YAML: {' '.join(str(e).split())[:200]}")


def _unsupported(tag: str) -> str:
    if tag == "!vault":
        return ("is an Ansible Vault value (!vault), which nictune does not decrypt: leave it out, or write "
                "it in plain text if nictune needs it (`ansible-vault decrypt` reads the vaulted value on stdin)")
    return f"the YAML tag {show(tag)} is not supported"


def _line(node: Any) -> int:
    return node.start_mark.line + 1


class _Converter:
    def __init__(self, name: str):
        self.name = name
        self.positions: Dict[Path, Tuple[str, int]] = {}
        self.plain: Dict[Path, str] = {}
        self.count = 0
        self.active: set = set()  # ids of collections being converted: alias cycles

    def fail(self, node: Any, path: Path, message: str) -> ProfileError:
        return ProfileError(self.name, _line(node), dotted(path), message)

    def convert(self, node: Any, path: Path, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise self.fail(node, path, f"has more than {MAX_NODES} values (an alias expanding too much?)")
        if depth > MAX_DEPTH:
            raise self.fail(node, path, f"is nested more than {MAX_DEPTH} levels deep (through aliases)")
        if isinstance(node, ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.active:
            raise self.fail(node, path, "an alias refers to a collection that contains it")
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode) and node.tag == _SEQ:
                return self.sequence(node, path, depth)
            if isinstance(node, MappingNode) and node.tag == _MAP:
                return self.mapping(node, path, depth)
            raise self.fail(node, path, _unsupported(node.tag))
        finally:
            self.active.discard(id(node))

    def sequence(self, node: SequenceNode, path: Path, depth: int) -> list:
        out = []
        for index, item in enumerate(node.value):
            here = path + (index,)
            self.positions[here] = (self.name, _line(item))
            out.append(self.convert(item, here, depth + 1))
        return out

    def mapping(self, node: MappingNode, path: Path, depth: int) -> dict:
        out: dict = {}
        lines: Dict[str, int] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            here = path + (key,)
            if key in lines:
                raise self.fail(key_node, here, f"duplicate key {show(key)} (first at line {lines[key]})")
            lines[key] = _line(key_node)
            self.positions[here] = (self.name, lines[key])
            out[key] = self.convert(value_node, here, depth + 1)
        return out

    def key(self, node: Any, path: Path) -> str:
        if isinstance(node, ScalarNode) and node.tag == _TAG + "merge":
            raise self.fail(node, path, "YAML merge keys (<<) are not supported; use extends, or an alias (*name) for a whole value")
        if not isinstance(node, ScalarNode):
            raise self.fail(node, path, "a key must be plain text, not a list or mapping")
        key = self.scalar(node, None)
        if isinstance(key, int) and not isinstance(key, bool) and path[-1:] == ("dscp_map",):
            return str(key)  # a DSCP number: `26: 3` reads as the mapping it looks like
        if not isinstance(key, str):
            raise self.fail(node, path, f"the key {show(node.value)} is read by YAML as {kind(key)}; keys must be text, so put it in quotes")
        return key

    def scalar(self, node: ScalarNode, path: Optional[Path]) -> Any:
        if node.tag in _KEEP_TEXT:
            return node.value
        build = _BUILD.get(node.tag)
        where = path if path is not None else ()
        if build is None:
            raise self.fail(node, where, _unsupported(node.tag))
        if node.tag != _TAG + "null" and len(node.value) > MAX_NUMBER_CHARS:
            raise self.fail(node, where, f"a {node.tag[len(_TAG):]} of {len(node.value)} characters is too long")
        try:
            value = build(node)
        except Exception:  # SafeConstructor raises ValueError, KeyError...
            raise self.fail(node, where, f"{show(node.value)} is not a valid {node.tag[len(_TAG):]}") from None
        if path is not None and not node.style:  # plain: None (Python) or '' (libyaml)
            self.plain[path] = node.value
        return value
