"""The schema of an interface entry's `expect:` section (health
expectations, read-only: see nictune.host.knobs.expect).

A function of schema.py's own building blocks, so that this module does not
import schema.py (which imports it) and the words stay schema.py's.
schema.py hooks it in with:

    PATTERN_WORDS.update(EXPECT_PATTERN_WORDS)
    ... in _ENTRY["properties"]:  "expect": expect_schema(_text, _wanted),
"""

from __future__ import annotations

from typing import Callable

from nictune.host import validate as v
from nictune.host.validate import COUNTER_NAME, VERSION_WANT

U32, U64_MAX = 4294967295, 2**64 - 1

EXPECT_PATTERN_WORDS = {
    VERSION_WANT: "a dotted version such as 28.39.1002, optionally after ==, >=, <=, > or <",
    COUNTER_NAME: "a counter name: 1-64 letters, digits, '_', '.' or '-'",
}


def expect_schema(text: Callable[..., dict], wanted: Callable[..., dict]) -> dict:
    """text(pattern, max_length, description) and wanted(lo, hi, what) are
    schema.py's _text and _wanted."""
    return {
        "type": "object",
        "description": "Health facts the interface must show. nictune only reads them: an unmet "
                       "expectation is reported as drift, never written.",
        "properties": {
            "driver": text(v.DRIVER, 32, "Kernel driver name (ethtool -i)."),
            "firmware": text(VERSION_WANT, 80, "Firmware version (ethtool -i), compared numerically per dotted part."),
            "link_speed_mbps": wanted(1, U32, "Link speed in Mb/s (/sys/class/net/X/speed)."),
            "pcie_width": wanted(1, 32, "PCIe link width in lanes, as the device trained."),
            "pcie_speed_gts": {"enum": [2.5, 5, 8, 16, 32, 64],
                               "description": "PCIe link speed in GT/s, as the device trained (32 = Gen5)."},
            "counters": {
                "type": "object",
                "description": "Counters (ethtool -S, RDMA hw_counters), each with the value or bound it must meet.",
                "propertyNames": text(COUNTER_NAME, 64),
                "additionalProperties": wanted(0, U64_MAX, "Counter value."),
                "maxProperties": 64,
            },
        },
        "additionalProperties": False,
        "minProperties": 1,
    }
