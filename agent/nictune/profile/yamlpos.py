"""Read YAML into plain Python values, remembering the line of every key.

We convert PyYAML's node graph ourselves instead of calling safe_load so that
each mapping key and sequence item keeps its line (error messages and the
plan's "file:line" sources need it), and so that duplicate keys, which
safe_load silently lets the last one win, are an error.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import ProfileError, dotted, kind, show

LOADER = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader

MAX_BYTES = 16 * 1024 * 1024
# Real profiles nest 5 levels deep.  The limits keep the pure-Python
# composer off its recursion limit and stop alias "billion laughs".
MAX_DEPTH = 32
MAX_NODES = 100_000
# int() on megabytes of digits is slow on Python < 3.11; no knob needs more.
MAX_NUMBER_CHARS = 100

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


def read_file(path: str) -> str:
    """The text of a regular file of at most MAX_BYTES, as UTF-8."""
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
        return data.decode("utf-8-sig")
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
    plays) or ("profile", its document).  Raises ProfileError with the
    profile's messages, as a file that is not a playbook is a profile."""
    root = _compose(read_file(path), path)
    if isinstance(root, SequenceNode):
        try:
            return "playbook", _document(root, path, "playbook")
        except ProfileError:
            # A list that does not convert has always been reported as a
            # broken profile (the top-level error below), not as a playbook.
            pass
    return "profile", _document(root, path, "profile")


def _compose(text: str, name: str) -> Optional[Node]:
    """The node graph of one YAML document (None if it is empty)."""
    if len(text) > MAX_BYTES:
        raise ProfileError(name, None, "", "is too large (the limit is 16 MiB)")
    _check_depth(text, name)
    try:
        return yaml.compose(text, Loader=LOADER)
    except yaml.YAMLError as e:
        raise _yaml_error(e, name, text) from None


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


def _check_depth(text: str, name: str) -> None:
    # The event parser is iterative, so this catches deep nesting before
    # the (recursive) composer sees it.
    depth = 0
    try:
        for event in yaml.parse(text, Loader=LOADER):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ProfileError(name, event.start_mark.line + 1, "",
                                       f"is nested more than {MAX_DEPTH} levels deep")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as e:
        raise _yaml_error(e, name, text) from None


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
            raise self.fail(node, path, f"the YAML tag {show(node.tag)} is not supported")
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
            raise self.fail(node, where, f"the YAML tag {show(node.tag)} is not supported")
        if node.tag != _TAG + "null" and len(node.value) > MAX_NUMBER_CHARS:
            raise self.fail(node, where, f"a {node.tag[len(_TAG):]} of {len(node.value)} characters is too long")
        try:
            value = build(node)
        except Exception:  # SafeConstructor raises ValueError, KeyError...
            raise self.fail(node, where, f"{show(node.value)} is not a valid {node.tag[len(_TAG):]}") from None
        if path is not None and not node.style:  # plain: None (Python) or '' (libyaml)
            self.plain[path] = node.value
        return value
