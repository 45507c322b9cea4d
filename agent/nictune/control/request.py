"""Turn a loaded profile into the plain JSON request the agent takes."""

from __future__ import annotations

from nictune import REQUEST_FORMAT


def build_request(command: str, profile=None) -> dict:
    request: dict = {"nictune_request": REQUEST_FORMAT, "command": command}
    if profile is not None:
        request["profile"] = {"path": profile.path, "doc": profile.doc, "sources": profile.sources}
    return request
