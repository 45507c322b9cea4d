"""Keeps the derived part of host/knobs/__init__.py (CATALOG) in step with
REGISTRY and the family classes: `python -m nictune.profile.catalog`
rewrites it; tests/unit/test_agent_imports.py fails while it is stale.

It lives on the controller side because it writes a source file, which
nothing under host/knobs/ may do."""

from __future__ import annotations

import sys

from nictune.host import knobs

BEGIN = "# BEGIN derived by profile/catalog.py"
END = "# END derived by profile/catalog.py."


def _source() -> str:
    return knobs.__file__


def _span(text: str) -> tuple:
    begin = text.index("\n", text.index(BEGIN)) + 1
    return begin, text.index(END)


def written() -> str:
    """The derived part as host/knobs/__init__.py holds it now."""
    with open(_source()) as f:
        text = f.read()
    begin, end = _span(text)
    return text[begin:end]


def write() -> bool:
    """Rewrite the derived part; whether it changed."""
    with open(_source()) as f:
        text = f.read()
    begin, end = _span(text)
    new = text[:begin] + knobs.derived_catalog() + text[end:]
    if new != text:
        with open(_source(), "w") as f:
            f.write(new)
    return new != text


if __name__ == "__main__":
    sys.stdout.write("rewrote CATALOG in " + _source() + "\n" if write() else "CATALOG is up to date\n")
