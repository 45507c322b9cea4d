"""Text for terminals and report files: control characters made visible.

A name or value that reaches a screen may come from anywhere: an interface
the kernel accepted, a file on a host, a host that lies.  C0 and C1 control
characters (and DEL) in it would move the cursor, recolour the terminal or
start a new line that looks like nictune's own, so every printed field goes
through printable() first.  Host side, because the agent words its own
messages with it too (a skipped interface's name); the controller's
printers, JUnit and Prometheus writers use the same function.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text) -> str:
    """str(text) with each control character written as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def shown_name(name) -> str:
    """A name the kernel gave us, quoted and printable: bytes that are not
    UTF-8 (the kernel allows them in interface names) as \\xNN too."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    return "'" + printable(name) + "'"
