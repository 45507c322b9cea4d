"""Turn a loaded profile into the plain JSON request the agent takes."""

from __future__ import annotations

from typing import Optional

from nictune import REQUEST_FORMAT


def build_request(command: str, profile=None, show_file_content: bool = False,
                  how_far: Optional[dict] = None, lldp_wait: float = 0) -> dict:
    """show_file_content: reports carry the text of files nictune did not
    write (host/knobs/nccl.py), not a placeholder.  how_far: a rollback's
    {"to": APPLY_ID} or {"steps": N} (host/agent.py)."""
    request: dict = {"nictune_request": REQUEST_FORMAT, "command": command}
    if how_far is not None:
        request["rollback"] = dict(how_far)
    if profile is not None:
        request["profile"] = {"path": profile.path, "doc": profile.doc, "sources": profile.sources}
    if show_file_content:
        request["show_file_content"] = True
    if lldp_wait:  # knobs/switch.py: how long a silent rail is listened to
        request["lldp_wait"] = lldp_wait
    return request
