"""The one error inventory loading and host selection raise."""

from __future__ import annotations

import re
from typing import Optional

from nictune.host.errors import INVALID_INPUT, NictuneError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class InventoryError(NictuneError):
    """An inventory that cannot be used: where (file, line) and why, in one paragraph."""

    kind = INVALID_INPUT

    def __init__(self, file: Optional[str], line: Optional[int], message: str):
        where = "" if file is None else (file if line is None else f"{file}:{line}")
        text = f"{where}: {message}" if where else message
        if not text.endswith((".", "?", "!")):
            text += "."
        # A file name or a fragment of the inventory must not break the paragraph.
        super().__init__(_CONTROL.sub(lambda m: repr(m.group())[1:-1], text))
        self.file = file
        self.line = line
        self.reason = message

    def __str__(self) -> str:
        return self.message


def shown(value: object, limit: int = 40) -> str:
    """A short single-line rendering of inventory text for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
