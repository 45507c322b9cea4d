"""docs/design/modules.md lists every module under src/nictune/, and
nothing that is gone: a module added, moved or removed without its row
fails here, by name."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "nictune"
MODULE_MAP = REPO / "docs" / "design" / "modules.md"
ROW = re.compile(r"^\| `([A-Za-z0-9_/]+\.py)` \|", re.M)


def listed_modules(text: str) -> list:
    """The module paths (relative to src/nictune/) in the map's table rows."""
    return ROW.findall(text)


def package_modules() -> set:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def test_the_module_map_lists_every_module_once():
    listed = listed_modules(MODULE_MAP.read_text())
    modules = package_modules()
    assert len(modules) > 50 and len(listed) > 50  # both sides were found
    assert len(listed) == len(set(listed)), "listed twice: " + ", ".join(
        sorted({m for m in listed if listed.count(m) > 1}))
    missing, gone = sorted(modules - set(listed)), sorted(set(listed) - modules)
    assert not missing and not gone, (
        f"docs/design/modules.md is out of date: add a row for {missing}, remove {gone}")


def test_a_module_left_out_is_named():
    text = MODULE_MAP.read_text()
    without = "\n".join(line for line in text.splitlines() if "`host/transaction/engine.py`" not in line)
    assert set(package_modules()) - set(listed_modules(without)) == {"host/transaction/engine.py"}
