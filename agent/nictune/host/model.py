"""The vocabulary shared by every part of nictune: keys, wanted values, changes.

Everything nictune manages is a Key (family, target, name).  Diff, verify and
rollback are written once over Keys; knob families only read and write them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

HOST = "host"  # the target of host-level keys (sysctls, NCCL file)


@dataclass(frozen=True, order=True)
class Key:
    family: str
    target: str
    name: str

    def __str__(self) -> str:
        return f"{self.family}:{self.target}:{self.name}"

    def as_dict(self) -> dict:
        return {"family": self.family, "target": self.target, "name": self.name}

    @classmethod
    def from_dict(cls, d: dict) -> "Key":
        return cls(d["family"], d["target"], d["name"])


@dataclass(frozen=True)
class Want:
    """A wanted value: exact, or a bound ("at least N" / "at most N").

    A bound is met by any current value on the right side of it; when it is
    not met, the bound itself is what gets written.
    """

    value: Any
    bound: Optional[str] = None  # None, "min" or "max"

    def satisfied_by(self, current: Any) -> bool:
        if self.bound is None:
            return current == self.value
        if not isinstance(current, (int, float)) or isinstance(current, bool):
            return False
        return current >= self.value if self.bound == "min" else current <= self.value

    def as_json(self) -> Any:
        return self.value if self.bound is None else {self.bound: self.value}

    @classmethod
    def parse(cls, raw: Any) -> "Want":
        if isinstance(raw, dict) and len(raw) == 1 and next(iter(raw)) in ("min", "max"):
            (bound, value), = raw.items()
            return cls(value, bound)
        return cls(raw)


@dataclass(frozen=True)
class Desired:
    """One wanted setting, with where in which profile it was asked for."""

    key: Key
    want: Want
    source: str = ""  # "file:line", for reviews and error messages


# What happened (or would happen) to one key.
PENDING = "pending"          # plan: would change
OK = "ok"                    # already as wanted
APPLIED = "applied"          # written and read back as wanted
UNSUPPORTED = "unsupported"  # the device or kernel cannot take it
SKIPPED = "skipped"          # unsupported, and on_unsupported said warn/skip
DRIFT = "drift"              # verify: differs from the profile
FAILED = "failed"            # write refused or read-back differs
REVERTED = "reverted"        # was applied, then restored to its before-value
REVERT_FAILED = "revert-failed"
NOT_APPLIED = "not-applied"  # never reached because an earlier key failed


@dataclass
class Change:
    key: Key
    before: Any
    after: Any
    status: str
    source: str = ""
    note: str = ""
    bound: Optional[str] = None
    # Why writing it interrupts traffic (Family.disruptive), or "".
    disruptive: str = ""

    def as_dict(self) -> dict:
        d = {
            "key": self.key.as_dict(),
            "before": self.before,
            "after": self.after,
            "status": self.status,
            "source": self.source,
        }
        if self.note:
            d["note"] = self.note
        if self.bound:
            d["bound"] = self.bound
        if self.disruptive:
            d["disruptive"] = self.disruptive
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Change":
        return cls(
            Key.from_dict(d["key"]),
            d.get("before"),
            d.get("after"),
            d["status"],
            d.get("source", ""),
            d.get("note", ""),
            d.get("bound"),
            d.get("disruptive", ""),
        )


@dataclass(frozen=True)
class Unsupported:
    """Read result for a key the device or kernel cannot take."""

    reason: str


@dataclass
class Outcome:
    """The result of one command on one host, before it becomes a report."""

    command: str
    changes: list = field(default_factory=list)  # list[Change]
    warnings: list = field(default_factory=list)  # list[str]
    error: Optional[dict] = None  # {"kind": ..., "message": ...}
    facts: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
