"""One result shape for what the controller runs besides a host's agent: a
hook command, a traffic gate, an agent install.

Every Ansible module returns {changed, failed, msg}; these return
{ok, changed, message, error}, and their own fields beside them (a hook's
argv and output, a gate's measurements, an install's paths):

    ok       bool: it did what it was asked (a gate also says "passed")
    changed  [str]: what it changed that nictune can name (the files an
             install wrote or removed); empty when nothing, or unknown
    message  str: one line for a human ("" when there is nothing to say)
    error    {kind, message} (host/errors.py error()) or null when ok
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from nictune.host.errors import NictuneError, error


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str = ""
    error: Optional[dict] = None
    changed: List[str] = field(default_factory=list)

    @classmethod
    def failed(cls, kind: str, message: str, changed: Optional[List[str]] = None) -> "Outcome":
        return cls(False, message, error(kind, message), list(changed or []))

    @classmethod
    def of_error(cls, e: NictuneError) -> "Outcome":
        return cls(False, e.message, e.as_dict())

    def fields(self) -> dict:
        """The result's fields, to merge into its report entry."""
        return {"ok": self.ok, "changed": list(self.changed), "message": self.message,
                "error": self.error}
