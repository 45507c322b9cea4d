"""Validation of the names we put into kernel requests."""

from __future__ import annotations

import re

# IFNAMSIZ-1 characters; "." and ".." are not valid device names.
_IFNAME_RE = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9_.@-]{1,15}$")


def validate_ifname(name: str) -> str:
    if not isinstance(name, str) or not _IFNAME_RE.fullmatch(name):
        raise ValueError(f"invalid interface name: {name!r}")
    return name
