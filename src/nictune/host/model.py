"""The vocabulary shared by every part of nictune: keys, wanted values, changes.

Everything nictune manages is a Key (family, target, name).  Diff, verify and
rollback are written once over Keys; knob families only read and write them.

Plain classes with __slots__, not dataclasses: the agent imports this
module on every run, and dataclasses (with the inspect it imports) cost
more than the rest of a verify.  They behave as the dataclasses they were
(frozen, ordered Key; equality by value within one class; frozen ones
hashable, the others not): tests/unit/test_model_records.py compares
them with dataclass twins.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Any, Optional

HOST = "host"  # the target of host-level keys (sysctls, NCCL file)


class _Record:
    """Equality, repr (and, for frozen records, hash and read-only fields)
    as @dataclass gives them, over the class's _fields."""

    __slots__ = ()
    _fields: tuple = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__qualname__}({inner})"

    def __reduce__(self):  # copy and pickle, past the frozen __setattr__
        return type(self)._rebuilt, (self._values(),)

    @classmethod
    def _rebuilt(cls, values: tuple):
        obj = cls.__new__(cls)
        for f, v in zip(cls._fields, values):
            object.__setattr__(obj, f, v)
        return obj


def _frozen(cls):
    """Read-only fields, and a hash by value, as @dataclass(frozen=True)."""

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r}")

    cls.__setattr__, cls.__delattr__ = __setattr__, __delattr__
    cls.__hash__ = lambda self: hash(self._values())
    return cls


_FRESH = object()  # a default that stands for a new empty list or dict, as default_factory


@_frozen
class Key(_Record):
    __slots__ = _fields = __match_args__ = ("family", "target", "name")

    def __init__(self, family: str, target: str, name: str):
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "name", name)

    def _values(self) -> tuple:  # keys are hashed and compared all the time: no loop
        return (self.family, self.target, self.name)

    # Ordered by (family, target, name), as @dataclass(order=True).
    def __lt__(self, other):
        return self._values() < other._values() if other.__class__ is self.__class__ else NotImplemented

    def __le__(self, other):
        return self._values() <= other._values() if other.__class__ is self.__class__ else NotImplemented

    def __gt__(self, other):
        return self._values() > other._values() if other.__class__ is self.__class__ else NotImplemented

    def __ge__(self, other):
        return self._values() >= other._values() if other.__class__ is self.__class__ else NotImplemented

    def __str__(self) -> str:
        return f"{self.family}:{self.target}:{self.name}"

    def as_dict(self) -> dict:
        return {"family": self.family, "target": self.target, "name": self.name}

    @classmethod
    def from_dict(cls, d: dict) -> "Key":
        return cls(d["family"], d["target"], d["name"])


@_frozen
class Want(_Record):
    """A wanted value: exact, or a bound ("at least N" / "at most N").

    A bound is met by any current value on the right side of it; when it is
    not met, the bound itself is what gets written.
    """

    __slots__ = _fields = __match_args__ = ("value", "bound")

    def __init__(self, value: Any, bound: Optional[str] = None):  # bound: None, "min" or "max"
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "bound", bound)

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


@_frozen
class Desired(_Record):
    """One wanted setting, with where in which profile it was asked for."""

    __slots__ = _fields = __match_args__ = ("key", "want", "source")

    def __init__(self, key: Key, want: Want, source: str = ""):  # source: "file:line"
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "want", want)
        object.__setattr__(self, "source", source)


@_frozen
class Default(Desired):
    """A setting one family asks for on another family's key, as a default:
    the routing family's ARP and rp_filter sysctls for the rails' layout
    (knobs/routing.py).  The profile's own value for the same key wins over
    it, with no conflict (engine.Desire.add)."""

    __slots__ = ()


# What happened (or would happen) to one key.
PENDING = "pending"          # plan: would change
OK = "ok"                    # already as wanted
APPLIED = "applied"          # written and read back as wanted
UNSUPPORTED = "unsupported"  # the device or kernel cannot take it
SKIPPED = "skipped"          # unsupported, and on_unsupported said warn/skip
DRIFT = "drift"              # verify: differs from the profile
SWITCH_MISMATCH = "switch-mismatch"  # the rail's switch port disagrees (knobs/switch.py)
FAILED = "failed"            # write refused or read-back differs
REVERTED = "reverted"        # was applied, then restored to its before-value
REVERT_FAILED = "revert-failed"
KEPT = "kept"                # a rollback left it: the driver keeps it (Family.kept, in note)
NOT_APPLIED = "not-applied"  # never reached because an earlier key failed
# Stored as wanted, not running yet: it takes effect at a firmware reset, a
# driver reload or a reboot (Family.staged says which).  Never written again.
STAGED = "pending-reset"


class Change(_Record):
    __slots__ = _fields = __match_args__ = ("key", "before", "after", "status", "source", "note",
                                            "bound", "disruptive")
    __hash__ = None  # mutable, compared by value: as @dataclass

    def __init__(self, key: Key, before: Any, after: Any, status: str, source: str = "",
                 note: str = "", bound: Optional[str] = None, disruptive: str = ""):
        self.key, self.before, self.after, self.status = key, before, after, status
        self.source, self.note, self.bound = source, note, bound
        # Why writing it interrupts traffic (Family.disruptive), or "".
        self.disruptive = disruptive

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


@_frozen
class Unsupported(_Record):
    """Read result for a key the device or kernel cannot take."""

    __slots__ = _fields = __match_args__ = ("reason",)

    def __init__(self, reason: str):
        object.__setattr__(self, "reason", reason)


class Withheld(str):
    """Why nictune withholds a write the host could take: the profile has
    not given it leave to (a file nictune did not write needs adopt: true).
    The host still differs from the profile, so a read-only check (verify,
    audit, the resident agent's watch) reports the key as drift with this
    note; plan and apply refuse it as unsupported, as for any reason."""


class Outcome(_Record):
    """The result of one command on one host, before it becomes a report."""

    __slots__ = _fields = __match_args__ = ("command", "changes", "warnings", "error", "facts",
                                            "extra")
    __hash__ = None

    def __init__(self, command: str, changes: list = _FRESH, warnings: list = _FRESH,
                 error: Optional[dict] = None, facts: dict = _FRESH, extra: dict = _FRESH):
        self.command = command
        self.changes = [] if changes is _FRESH else changes  # list[Change]
        self.warnings = [] if warnings is _FRESH else warnings  # list[str]
        self.error = error  # {"kind": ..., "message": ...}
        self.facts = {} if facts is _FRESH else facts
        self.extra = {} if extra is _FRESH else extra
