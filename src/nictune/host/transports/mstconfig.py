"""mstconfig (Debian package mstflint): the NIC's non-volatile configuration
where the kernel has no devlink param for it.

Only argv lists, through Host.io.run:

    mstconfig -e -d 0000:03:00.0 q SRIOV_EN NUM_OF_VFS     query, with -e the
        Default, Current and Next Boot columns
    mstconfig -y -d 0000:03:00.0 set SRIOV_EN=1 NUM_OF_VFS=16

The output is parsed strictly: the table must carry the header
"Configurations:  Default  Current  Next Boot" (what -e prints), every
key asked for must have a row of exactly three values, and a value is
read as the number mstconfig prints in parentheses ("True(1)", "ETH(2)")
or a plain number ("255", "0xff").  Anything else is a ValueError naming
the line, never a traceback.  Recorded real outputs, with their public
sources: tests/recorded/mstconfig/.

A row marked "*" is one whose next-boot value differs from the default or
the current one (mstconfig prints that legend under the table): the marker
is read, not trusted; the columns are compared.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run
    from typing import Dict, List, Tuple

TOOL = "mstconfig"
TIMEOUT = 60.0
# A query of a dozen keys prints a few KB; the whole table about 40 KB.
MAX_OUTPUT = 1 << 20
_HEADER = re.compile(r"^\s*Configurations:\s+Default\s+Current\s+Next Boot\s*$")
_ROW = re.compile(r"^(\*)?\s+([A-Z0-9_]+(?:\[\d+\])?)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")
_VALUE = re.compile(r"^(?:[A-Za-z0-9_]*\((\d+)\)|(0x[0-9a-fA-F]+)|(\d+))$")
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_KEY = re.compile(r"^[A-Z0-9_]{1,64}$")


class Row:
    __slots__ = ("default", "current", "next_boot", "text")

    def __init__(self, default: int, current: int, next_boot: int, text: str):
        self.default, self.current, self.next_boot, self.text = default, current, next_boot, text


def _number(text: str, line_no: int, line: str) -> int:
    m = _VALUE.match(text)
    if m is None:
        raise ValueError(f"mstconfig output line {line_no}: value {text[:40]!r} is not a number "
                         f"or NAME(number): {line.strip()[:120]!r}")
    paren, hexa, dec = m.groups()
    return int(paren) if paren is not None else int(hexa, 16) if hexa is not None else int(dec)


def parse_query(text: str, keys: "List[str]") -> "Dict[str, Row]":
    """The rows of `keys` in `mstconfig -e q` output; ValueError otherwise."""
    if len(text) > MAX_OUTPUT:
        raise ValueError(f"mstconfig printed more than {MAX_OUTPUT} bytes")
    lines = text.splitlines()
    start = next((n for n, line in enumerate(lines) if _HEADER.match(line)), None)
    if start is None:
        raise ValueError("mstconfig output has no 'Configurations: Default Current Next Boot' "
                         "header (was -e given? is this mstconfig?)")
    rows: dict = {}
    for n, line in enumerate(lines[start + 1:], start + 2):
        m = _ROW.match(line)
        if m is None:
            continue  # the legend, blank lines, a warning: not rows
        _, key, default, current, next_boot = m.groups()
        if key in rows:
            raise ValueError(f"mstconfig output line {n}: {key} printed twice")
        rows[key] = (n, line, default, current, next_boot)
    out = {}
    for key in keys:
        if key not in rows:
            raise ValueError(f"mstconfig output has no row for {key}")
        n, line, *values = rows[key]
        default, current, next_boot = (_number(v, n, line) for v in values)
        out[key] = Row(default, current, next_boot, line.strip())
    return out


def check_device(pci: str) -> str:
    if not isinstance(pci, str) or not _PCI.match(pci):
        raise ValueError(f"not a PCI address for mstconfig: {pci!r}")
    return pci


def query_argv(pci: str, keys: "List[str]") -> "List[str]":
    for key in keys:
        if not _KEY.match(key):
            raise ValueError(f"not an mstconfig key: {key!r}")
    return [TOOL, "-e", "-d", check_device(pci), "q", *keys]


def set_argv(pci: str, values: "Dict[str, int]") -> "List[str]":
    pairs = []
    for key, value in values.items():
        if not _KEY.match(key) or isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"not an mstconfig setting: {key!r}={value!r}")
        pairs.append(f"{key}={value}")
    return [TOOL, "-y", "-d", check_device(pci), "set", *pairs]


def run(io, argv: "List[str]") -> str:
    """stdout of `argv`; OSError when the tool is absent or refuses."""
    rc, out, err = io.run(argv, TIMEOUT)
    if rc != 0:
        said = " ".join((err or out or "").split())[:300]
        raise OSError(f"{' '.join(argv[:5])}... exited {rc}: {said or 'no message'}")
    return out


def query(io, pci: str, keys: "List[str]") -> "Dict[str, Row]":
    return parse_query(run(io, query_argv(pci, keys)), keys)


def write(io, pci: str, values: "Dict[str, int]") -> None:
    run(io, set_argv(pci, values))
