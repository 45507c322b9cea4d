"""Load a profile: read, resolve extends, merge, validate against SCHEMA."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .check import check, locate
from .errors import ProfileError
from .merge import Resolver
from .yamlpos import Parsed, parse_file, parse_text

__all__ = ["Profile", "ProfileError", "load_profile", "load_profile_text"]


@dataclass
class Profile:
    """A merged, validated profile.

    sources: '/'-joined key path (interfaces/rails/mtu,
    host/sysctl/net.ipv4.tcp_ecn) -> "file:line" that supplied it, for every
    mapping and leaf below the root (list items are part of their list).
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


def load_profile(path: str) -> Profile:
    """Load the profile at path; raises ProfileError and nothing else."""
    parsed = parse_file(path)
    real = os.path.realpath(path)
    return _finish(parsed, path, os.path.dirname(path), real)


def load_profile_text(text: str, name: str = "<string>", base_dir: Optional[str] = None) -> Profile:
    """Load a profile from text; extends is allowed only with base_dir."""
    parsed = parse_text(text, name)
    return _finish(parsed, name, base_dir, None)


def _finish(parsed: Parsed, name: str, base_dir: Optional[str], real: Optional[str]) -> Profile:
    resolver = Resolver()
    merged = resolver.resolve(parsed, name, base_dir, [(name, real)])
    check(merged.doc, merged.positions, merged.plain)
    return Profile(name, merged.doc, _sources(merged), resolver.files)


def _sources(merged: Parsed) -> Dict[str, str]:
    out: Dict[str, str] = {}

    def walk(path: tuple, value: Any) -> None:
        if path:
            file, line = locate(merged.positions, path)
            out["/".join(path)] = f"{file}:{line}"
        if isinstance(value, dict):
            for key, child in value.items():
                walk(path + (key,), child)

    walk((), merged.doc)
    return out
