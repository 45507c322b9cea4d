"""Turn a loaded profile into the plain JSON request the agent takes."""

from __future__ import annotations

from typing import Optional

from nictune import REQUEST_FORMAT


def build_request(command: str, profile=None) -> dict:
    request: dict = {"nictune_request": REQUEST_FORMAT, "command": command}
    if profile is not None:
        request["profile"] = {"path": profile.path, "doc": profile.doc, "sources": profile.sources}
    return request


def combined_exit(codes: list, default: Optional[int] = 0) -> int:
    """One exit code for many hosts: the most serious wins."""
    for code in (4, 3, 1, 2):
        if code in codes:
            return code
    return default or 0
