"""The one abstraction for a setting: a knob family.

A family turns a profile section into Keys for this host (expand), reads the
current values in one batch (read), says whether the device can take a value
(check), and writes (apply).  Diff, verify, journal and rollback are written
once, in the engine, over what families return.
"""

from __future__ import annotations

from typing import Callable, Optional

from nictune.host.machine import Host
from nictune.host.model import Desired, Key, Want

# source(path...) -> "file:line" of that profile key, for reviews.
SourceOf = Callable[..., str]


class Family:
    name = ""            # Key.family
    sections: tuple = ()       # keys of an interfaces entry this family owns
    host_sections: tuple = ()  # keys of the host: section this family owns
    read_only = False          # facts to check (expect:), never written

    def __init__(self, host: Host):
        self.host = host

    def driver_of(self, ifname: str) -> Optional[str]:
        """The driver of interface `ifname` (ethtool -i), or None."""
        return next((i.driver for i in self.host.interfaces() if i.name == ifname), None)

    # -- profile -> keys ---------------------------------------------------
    def expand(self, target: str, sections: dict, source: SourceOf) -> list:
        """Default: each owned section is a mapping of setting name -> value."""
        out = []
        for section, settings in sections.items():
            for name, raw in settings.items():
                out.append(Desired(Key(self.name, target, self.key_name(name)),
                                   Want.parse(raw), source(section, name)))
        return out

    def key_name(self, name: str) -> str:
        return name

    # -- host -> values ----------------------------------------------------
    def read(self, keys: list) -> dict:
        """Current value (or Unsupported) of every key, in one batch."""
        raise NotImplementedError

    def met(self, key: Key, want: Want, current) -> bool:
        """Whether `current` is as wanted.  Families whose values are not
        compared plainly override this (a firmware expectation such as
        ">=28.39" is not an equality)."""
        return want.satisfied_by(current)

    def check(self, key: Key, want: Want) -> Optional[str]:
        """Why the device cannot take `want`, from limits seen by read()."""
        return None

    def note(self, key: Key) -> str:
        """Something a reviewer should know about this key, shown in plans."""
        return ""

    def apply(self, items: list) -> None:
        """Write [(key, value)]; raise on refusal.  Success is decided by
        reading back, never by this returning."""
        raise NotImplementedError

    def revert(self, items: list) -> None:
        """Restore [(key, before)], in the order given.  Families with coupled
        settings override this; plain ones just write the old values."""
        self.apply(items)

    # -- host -> profile (nictune show) ----------------------------------
    def show(self, target: str) -> dict:
        """Current values of this family on `target`, as profile sections."""
        return {}


def group_by_target(items: list) -> dict:
    grouped: dict = {}
    for key, value in items:
        grouped.setdefault(key.target, {})[key.name] = value
    return grouped

