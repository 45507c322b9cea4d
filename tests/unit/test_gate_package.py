"""The traffic gate is a package with a file per concern, and production
code imports each name from the file that defines it (the package's own
names are kept for the tests only)."""

from __future__ import annotations

import re
from pathlib import Path

import nictune
import nictune.control.rollout.gate as gate

PACKAGE = Path(nictune.__file__).parent
CONCERNS = ("schema", "spec", "pairing", "parsers", "rows", "rails", "iperf3", "ib_write_bw", "nccl", "counters",
            "baselines", "parallel", "runner", "ipsec")


def test_the_gate_is_a_package_with_a_file_per_concern():
    assert hasattr(gate, "__path__")
    room = Path(gate.__file__).parent
    assert sorted(p.stem for p in room.glob("*.py")) == sorted(("__init__",) + CONCERNS)
    for concern in CONCERNS:
        lines = len((room / f"{concern}.py").read_text().splitlines())
        assert lines <= 250, f"gate/{concern}.py has {lines} lines"


def test_production_code_imports_from_the_gates_files_not_the_package():
    importer = re.compile(r"from nictune\.control\.rollout\.gate import|from nictune\.control\.rollout import gate\b"
                          r"|import nictune\.control\.rollout\.gate\b(?!\.)")
    modules = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(modules) > 50
    found = [f"{p.relative_to(PACKAGE)}" for p in modules if importer.search(p.read_text())]
    assert found == []
