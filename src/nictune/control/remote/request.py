"""Turn a loaded profile into the plain JSON request the agent takes."""

from __future__ import annotations

from nictune import REQUEST_FORMAT


def build_request(command: str, profile=None, show_file_content: bool = False,
                  lldp_wait: float = 0) -> dict:
    """show_file_content: reports carry the text of files nictune did not
    write (host/knobs/nccl.py), not a placeholder."""
    request: dict = {"nictune_request": REQUEST_FORMAT, "command": command}
    if profile is not None:
        request["profile"] = {"path": profile.path, "doc": profile.doc, "sources": profile.sources}
    if show_file_content:
        request["show_file_content"] = True
    if lldp_wait:  # knobs/switch.py: how long a silent rail is listened to
        request["lldp_wait"] = lldp_wait
    return request
