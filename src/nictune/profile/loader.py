"""Load a profile: read, resolve extends, merge, validate against SCHEMA."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .check import OWNED_SECTIONS, check, locate
from .errors import ProfileError, kind, show
from .merge import Resolver, merge_layers
from .yamlpos import Parsed, Path, parse_file, parse_text

__all__ = ["Profile", "ProfileError", "load_profile", "load_profile_parsed", "load_profile_text"]


@dataclass
class Profile:
    """A merged, validated profile.

    sources: '/'-joined key path (interfaces/rails/mtu,
    host/sysctl/net.ipv4.tcp_ecn) -> "file:line" that supplied it, for every
    mapping, list item (interfaces/rails/ipsec/sas/0) and leaf below the root.
    files: every file read, parents before the files that extend them, the
    profile itself last.
    """

    path: str
    doc: dict
    sources: Dict[str, str]
    files: List[str]

    def source(self, *keys: str) -> str:
        """"file:line" of a key path, or of its nearest ancestor that has one."""
        for end in range(len(keys), 0, -1):
            found = self.sources.get("/".join(keys[:end]))
            if found:
                return found
        return self.files[-1] if self.files else self.path


def load_profile(path: str, overrides: Sequence[Tuple[dict, str]] = ()) -> Profile:
    """Load the profile at path; raises ProfileError and nothing else.

    overrides: (mapping, "file:line") layers merged on top, lowest first --
    the `nictune:` variables of an inventory's groups and hosts, a play's
    vars.  They merge like a file that extends the profile, and the result is
    validated as a whole; errors in them name where they were set.
    """
    return load_profile_parsed(parse_file(path), path, overrides)


def load_profile_parsed(parsed: Parsed, path: str,
                        overrides: Sequence[Tuple[dict, str]] = ()) -> Profile:
    """load_profile for a file already parsed (yamlpos.read_target): the
    CLI reads its TARGET once to tell a profile from a playbook.  parsed is
    not modified, so it can be loaded again with other overrides."""
    return _finish(parsed, path, os.path.dirname(path), os.path.realpath(path), overrides)


def load_profile_text(text: str, name: str = "<string>", base_dir: Optional[str] = None) -> Profile:
    """Load a profile from text; extends is allowed only with base_dir."""
    parsed = parse_text(text, name)
    return _finish(parsed, name, base_dir, None)


def _finish(parsed: Parsed, name: str, base_dir: Optional[str], real: Optional[str],
            overrides: Sequence[Tuple[dict, str]] = ()) -> Profile:
    resolver = Resolver()
    merged = resolver.resolve(parsed, name, base_dir, [(name, real)])
    files = list(resolver.files)
    for doc, where in overrides:
        merged = merge_file_layer(merged, override_layer(doc, where))
        if where.rpartition(":")[0] not in files:
            files.append(where.rpartition(":")[0])
    check(merged.doc, merged.positions, merged.plain)
    return Profile(name, merged.doc, sources_of(merged), files)


# Profile keys an override cannot carry: they are about files, not settings.
NOT_OVERRIDABLE = ("extends", "nictune")
# Which files nictune writes where, and which it may replace
# (knobs/envfile.py): a profile says, never an inventory or a play's vars,
# which can neither set these keys nor drop or replace what a profile set.
FILE_POLICY = tuple(("host", section, key) for section in OWNED_SECTIONS
                    for key in ("path", "adopt", "allowed_dirs"))
_DECIDES = {"path": "which file nictune writes",
            "adopt": "which files nictune may replace",
            "allowed_dirs": "where nictune may write files"}


def override_layer(mapping: Any, where: str) -> Parsed:
    """An override mapping (an inventory `nictune:` variable, a play's
    vars.nictune) as a merge layer.  Inventory files give no finer
    positions, so all of it is located where the variable was set."""
    file, _, line = where.rpartition(":")
    position = (file, int(line)) if file and line.isdigit() else (where, None)
    if not isinstance(mapping, dict):
        raise ProfileError(*position, "nictune",
                           f"the nictune variable must be a mapping of profile keys, not {kind(mapping)}")
    for key in NOT_OVERRIDABLE:
        if key in mapping:
            raise ProfileError(*position, f"nictune.{key}",
                               f"{key} cannot be set from an inventory; profiles name their parents")
    positions: Dict[Path, Tuple[str, Optional[int]]] = {}

    def walk(path: Path, value: Any) -> None:
        positions[path] = position
        if isinstance(value, dict):
            for key, child in value.items():
                if not isinstance(key, str):  # YAML and INI give ints, booleans, None
                    where_key = ".".join(["nictune", *map(str, path), show(key)])
                    raise ProfileError(*position, where_key,
                                       f"profile keys are text, not {kind(key)}: quote it")
                walk(path + (key,), child)
        elif isinstance(value, list):
            for i, child in enumerate(value):
                walk(path + (i,), child)

    walk((), mapping)
    return Parsed(mapping, positions, {})


def merge_file_layer(merged: Parsed, layer: Parsed, prefix: Tuple[str, ...] = ("nictune",),
                     what: str = "an inventory") -> Parsed:
    """merge_layers for a layer that is not a profile file (an inventory's
    `nictune:` variable, a play's vars.nictune): it may not set, drop or
    replace FILE_POLICY keys.  prefix names where the layer sits (keypaths
    in errors); ProfileError at the offending key's position."""
    for keys in FILE_POLICY:
        if _sets(layer.doc, keys):
            _refuse_file_key(layer, keys, prefix, what, "set")
    result = merge_layers(merged, layer)
    before, after = file_policy(merged.doc), file_policy(result.doc)
    for keys in FILE_POLICY:
        if before.get(keys, _ABSENT) != after.get(keys, _ABSENT):
            # Set through a replace: true, or dropped: point at the section.
            _refuse_file_key(layer, keys, prefix, what, "dropped or replaced")
    return result


_ABSENT = object()


def _refuse_file_key(layer: Parsed, keys: Tuple[str, ...], prefix: Tuple[str, ...], what: str,
                     done: str) -> None:
    dotted_keys = ".".join(keys)
    raise ProfileError(*locate(layer.positions, keys), ".".join(prefix + keys),
                       f"{dotted_keys} cannot be {done} from {what}: it decides "
                       f"{_DECIDES[keys[-1]]}, so only a profile sets it")


def file_policy(doc: Any) -> Dict[Tuple[str, ...], Any]:
    """The FILE_POLICY keys doc sets, and their values."""
    out: Dict[Tuple[str, ...], Any] = {}
    for keys in FILE_POLICY:
        node = doc
        for key in keys:
            node = node.get(key, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            out[keys] = node
    return out


def _sets(mapping: Any, keys: Tuple[str, ...]) -> bool:
    for key in keys:
        if not isinstance(mapping, dict) or key not in mapping:
            return False
        mapping = mapping[key]
    return True


def sources_of(merged: Parsed) -> Dict[str, str]:
    out: Dict[str, str] = {}

    def walk(path: tuple, value: Any) -> None:
        if path:
            file, line = locate(merged.positions, path)
            out["/".join(map(str, path))] = f"{file}:{line}"
        if isinstance(value, dict):
            for key, child in value.items():
                walk(path + (key,), child)
        elif isinstance(value, list):  # an item has its own line: an error in it names that line
            for index, child in enumerate(value):
                walk(path + (index,), child)

    walk((), merged.doc)
    return out
