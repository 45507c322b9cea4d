"""The one error type profile loading raises, and how values are shown in it.

Profiles may come from anywhere, so nothing taken from a profile is echoed
verbatim: strings are shown through repr() (newlines become \\n) and cut to
about 40 characters, and the final text is forced onto one line.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from nictune.host.errors import PROFILE, NictuneError, error

SHOW_LIMIT = 40

_PLAIN_PART = re.compile(r"[A-Za-z0-9_.@*?!:+/\[\]-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ProfileError(NictuneError):
    """A profile that cannot be loaded: where (file, line, keypath) and why.

    `message` is the bare reason; str() and as_dict() give the whole
    one-line text with file, line and keypath."""

    kind = PROFILE

    def __init__(self, file: str, line: Optional[int], keypath: str, message: str):
        super().__init__(message)
        self.args = (file, line, keypath, message)  # so copy/pickle can rebuild it
        self.file = file
        self.line = line
        self.keypath = keypath

    def as_dict(self) -> dict:
        return error(self.kind, str(self))

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        parts = [where, self.keypath, self.message] if self.keypath else [where, self.message]
        text = ": ".join(parts)
        if not text.endswith((".", "?", "!")):
            text += "."
        # Last line of defence for the one-paragraph promise: a file name or
        # message fragment with a control character must not break the line.
        return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def show(value: Any, limit: int = SHOW_LIMIT) -> str:
    """A short, single-line rendering of a profile value, YAML-flavoured."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def kind(value: Any) -> str:
    """What a value is, for "expected X, got Y" messages."""
    if isinstance(value, bool):
        return f"the boolean {show(value)}"
    if value is None:
        return "an empty value (null)"
    if isinstance(value, int):
        return f"the integer {show(value)}"
    if isinstance(value, float):
        return f"the number {show(value)}"
    if isinstance(value, str):
        return f"the string {show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def dotted(path: Iterable[Any]) -> str:
    """interfaces.rails.mtu; list indexes as [i]; odd keys shown via show()."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = part if _PLAIN_PART.fullmatch(part) else show(part)
        out += ("." if out else "") + text
    return out


def has_control(value: str) -> bool:
    return _CONTROL.search(value) is not None
