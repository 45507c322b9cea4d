"""Expectations: health facts an interface must show, never written.

    expect:
      driver: mlx5_core
      firmware: ">=28.39"             # ==, >=, <=, >, < or a plain exact version
      link_speed_mbps: 400000
      pcie_width: 16
      pcie_speed_gts: 32
      counters: {rx_out_of_buffer: {max: 0}}

Keys are family "expect", name the fact ("counters.<name>" for counters).
The family is read-only: the engine never writes it; plan, verify and
apply report an unmet expectation as drift.  A fact the host does not
report reads as None, which meets no expectation.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from nictune.host.knobs.base import Family
from nictune.host.model import Desired, Key, Want
from nictune.host.validate import COUNTER_NAME, DRIVER, VERSION_WANT, check

FACTS = ("driver", "firmware", "link_speed_mbps", "pcie_width", "pcie_speed_gts")
COUNTER_PREFIX = "counters."

_OPS = {
    "==": lambda a, b: a == b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


def _parts(version: str) -> Optional[Tuple[int, ...]]:
    """"28.39.1002 (MT_0000000838)" -> (28, 39, 1002); None if not numeric."""
    head = version.strip().split(" ", 1)[0] if version else ""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", head):
        return None
    return tuple(int(p) for p in head.split("."))


def version_met(wanted: str, actual: Optional[str]) -> bool:
    """Whether firmware `actual` meets `wanted`, comparing numerically per
    dotted part; missing trailing parts count as 0 (28.39 == 28.39.0)."""
    m = re.fullmatch(r"(==|>=|<=|>|<)?(.*)", wanted)
    op, want_text = (m.group(1) or "=="), m.group(2)
    want, have = _parts(want_text), _parts(actual or "")
    if want is None or have is None:
        return False
    width = max(len(want), len(have))
    pad = lambda t: t + (0,) * (width - len(t))  # noqa: E731
    return _OPS[op](pad(have), pad(want))


class ExpectFamily(Family):
    name = "expect"
    position = 110
    position_note = "never written: read after everything else"
    sections = ("expect",)
    settings = tuple(f"expect.{fact}" for fact in FACTS) + ("expect.counters",)
    read_only = True  # the engine reports unmet keys as drift, never writes them

    @classmethod
    def schema(cls, s):
        return {"entry": {"expect": s.section(
            "Health facts the interface must show. nictune only reads them: an unmet "
            "expectation is reported as drift, never written.", {
                "driver": s.text(DRIVER, 32, "Kernel driver name (ethtool -i)."),
                "firmware": s.text(VERSION_WANT, 80, "Firmware version (ethtool -i), compared numerically per dotted part."),
                "link_speed_mbps": s.wanted(1, s.U32, "Link speed in Mb/s (/sys/class/net/X/speed)."),
                "pcie_width": s.wanted(1, 32, "PCIe link width in lanes, as the device trained."),
                "pcie_speed_gts": {"enum": [2.5, 5, 8, 16, 32, 64],
                                   "description": "PCIe link speed in GT/s, as the device trained (32 = Gen5)."},
                "counters": s.mapping(
                    "Counters (ethtool -S, RDMA hw_counters), each with the value or bound it must meet.",
                    s.text(COUNTER_NAME, 64), s.wanted(0, s.U64_MAX, "Counter value."), 64),
            }, minProperties=1)}}

    def __init__(self, host):
        super().__init__(host)
        # Here, not at the top: the controller imports this module for its
        # schema alone, and health pulls in rdma and the interface facts.
        from nictune.host.health import Health

        self.health = Health(host)

    def expand(self, target, sections, source):
        section = sections.get("expect") or {}
        out = []
        for fact in FACTS:
            if fact in section:
                raw = section[fact]
                if fact == "firmware":
                    check(VERSION_WANT, str(raw), "firmware expectation")
                out.append(Desired(Key(self.name, target, fact), Want.parse(raw),
                                   source("expect", fact)))
        for counter, raw in (section.get("counters") or {}).items():
            check(COUNTER_NAME, counter, "counter name")
            out.append(Desired(Key(self.name, target, COUNTER_PREFIX + counter),
                               Want.parse(raw), source("expect", "counters", counter)))
        return out

    def read(self, keys):
        facts: dict = {}
        counters: dict = {}
        interfaces = {i.name: i for i in self.host.interfaces()}
        out = {}
        for key in keys:
            iface = interfaces.get(key.target)
            if iface is None:
                out[key] = None
            elif key.name.startswith(COUNTER_PREFIX):
                if key.target not in counters:
                    counters[key.target] = self.health.counters(key.target)
                out[key] = counters[key.target].get(key.name[len(COUNTER_PREFIX):])
            else:
                if key.target not in facts:
                    facts[key.target] = self.health.of(iface)
                out[key] = facts[key.target].get(key.name)
        return out

    def met(self, key: Key, want: Want, current) -> bool:
        if key.name == "firmware" and want.bound is None:
            return version_met(str(want.value), current)
        return super().met(key, want, current)

    def note(self, key):
        return "expected; nictune reads it, never sets it"
