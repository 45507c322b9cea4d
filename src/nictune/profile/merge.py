"""extends: load parent profiles and deep-merge them, keeping positions.

Each file is resolved on its own first (its parents merged left to right,
then the file on top), so what a child merges onto never contains merge
directives.  In the child, any mapping may say

    replace: true     this mapping replaces the inherited one
    drop: [a, b]      remove inherited keys a and b

Scalars and lists replace what they override; so does a bound ({min: N} or
{max: N}), which is one value, not a mapping to merge into.

Positions: a value in the merged document came from the last layer that
has its key path, so each merged path takes its position from the child if
the child has that path, else from the parent.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Dict, List, Optional, Tuple

from .check import check, locate
from .errors import ProfileError, dotted, kind, show
from .schema import SCHEMA
from .yamlpos import Parsed, Path, parse_file

MAX_FILES = 64  # diamonds re-read shared parents; this bounds the work
_MISSING = object()


class Resolver:
    def __init__(self) -> None:
        self.files: List[str] = []
        self.loads = 0

    def resolve(self, parsed: Parsed, name: str, base_dir: Optional[str],
                chain: List[Tuple[str, Optional[str]]]) -> Parsed:
        """The merged, directive-free content of one file and its parents.

        base_dir: the directory relative extends are read from (None: extends
        is not allowed).  chain: (name, real path) of the files including
        this one, for cycle detection.
        """
        doc = dict(parsed.doc)
        entries = _extends(doc.pop("extends", None), parsed)
        merged = Parsed({}, {}, {})
        for entry, at in entries:
            merged = merge_layers(merged, self._parent(entry, at, parsed, name, base_dir, chain))
        own = Parsed(doc, parsed.positions, parsed.plain)
        merged = merge_layers(merged, own)
        if name not in self.files:
            self.files.append(name)
        return merged

    def _parent(self, entry: str, at: Path, child: Parsed, name: str, base_dir: Optional[str],
                chain: List[Tuple[str, Optional[str]]]) -> Parsed:
        file, line = locate(child.positions, at)
        if base_dir is None:
            raise ProfileError(file, line, dotted(at), "extends needs a profile loaded from a file (its directory is the base)")
        target = entry if os.path.isabs(entry) else os.path.normpath(os.path.join(base_dir, entry))
        real = os.path.realpath(target)
        if any(real == seen for _, seen in chain):
            start = next(i for i, (_, seen) in enumerate(chain) if seen == real)
            cycle = " -> ".join([n for n, _ in chain[start:]] + [target])
            raise ProfileError(file, line, dotted(at), f"extends cycle: {cycle}")
        self.loads += 1
        if self.loads > MAX_FILES:
            raise ProfileError(file, line, dotted(at), f"extends reaches more than {MAX_FILES} files")
        try:
            parent = parse_file(target)
        except ProfileError as e:
            if e.file == target and e.line is None:  # could not read it at all
                raise ProfileError(file, line, dotted(at), f"cannot use {show(entry)} ({target}): {e.message}") from None
            raise
        return self.resolve(parent, target, os.path.dirname(target), chain + [(target, real)])


def _extends(value: Any, parsed: Parsed) -> List[Tuple[str, Path]]:
    if value is None:
        return []
    # The same schema part that editors see, with the same messages.
    check(value, parsed.positions, parsed.plain, SCHEMA["properties"]["extends"], ("extends",))
    if isinstance(value, str):
        return [(value, ("extends",))]
    return [(entry, ("extends", i)) for i, entry in enumerate(value)]


def merge_layers(base: Parsed, over: Parsed) -> Parsed:
    doc = _merge(base.doc, over.doc, (), over)
    positions: Dict[Path, Tuple[str, int]] = {}
    plain: Dict[Path, str] = {}
    for path in _paths(doc):
        layer = over if path in over.positions else base
        positions[path] = layer.positions[path] if path in layer.positions else locate(layer.positions, path)
        if path in layer.plain:
            plain[path] = layer.plain[path]
    return Parsed(doc, positions, plain)


def is_bound(value: Any) -> bool:
    if not isinstance(value, dict) or len(value) != 1:
        return False
    (key, number), = value.items()
    return key in ("min", "max") and isinstance(number, int) and not isinstance(number, bool)


def _merge(base: Any, over: Any, path: Path, src: Parsed) -> Any:
    if not isinstance(over, dict) or is_bound(over):
        return over
    over = dict(over)
    replace = over.pop("replace", False)
    drop = over.pop("drop", None)
    if not isinstance(replace, bool):
        raise _error(src, path + ("replace",), f"replace must be true or false, not {kind(replace)}")
    inherited = base if isinstance(base, dict) and not is_bound(base) else None
    result = {} if replace or inherited is None else dict(inherited)
    if drop is not None:
        if replace:
            raise _error(src, path + ("drop",), "use replace: true or drop, not both (replace already drops everything inherited)")
        for key, at in _drop_list(drop, path, src):
            if inherited is None or key not in inherited:
                raise _error(src, at, _nothing_to_drop(key, inherited, path))
            result.pop(key, None)  # a key listed twice is dropped once
    for key, value in over.items():
        result[key] = _merge(result.get(key, _MISSING), value, path + (key,), src)
    return result


def _drop_list(drop: Any, path: Path, src: Parsed) -> List[Tuple[str, Path]]:
    if isinstance(drop, str):
        return [(drop, path + ("drop",))]
    if isinstance(drop, list) and all(isinstance(k, str) for k in drop):
        return [(k, path + ("drop", i)) for i, k in enumerate(drop)]
    raise _error(src, path + ("drop",), f"drop must be a list of inherited key names, not {kind(drop)} (drop and replace are reserved for merging)")


def _nothing_to_drop(key: str, inherited: Optional[dict], path: Path) -> str:
    here = dotted(path) or "the top level"
    if not inherited:
        return f"cannot drop {show(key)}: nothing is inherited at {here}"
    close = difflib.get_close_matches(key, list(inherited), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    names = ", ".join(show(k) for k in list(inherited)[:20]) + (", ..." if len(inherited) > 20 else "")
    return f"cannot drop {show(key)}: it is not inherited at {here}{hint}; inherited keys: {names}"


def _error(src: Parsed, path: Path, message: str) -> ProfileError:
    file, line = locate(src.positions, path)
    return ProfileError(file, line, dotted(path), message)


def _paths(doc: Any) -> List[Path]:
    out: List[Path] = []
    stack: List[Tuple[Path, Any]] = [((), doc)]
    while stack:
        path, value = stack.pop()
        out.append(path)
        if isinstance(value, dict):
            stack.extend((path + (k,), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((path + (i,), v) for i, v in enumerate(value))
    return out
