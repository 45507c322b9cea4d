"""The fleet tests share their set-up instead of copying it: a fleet starts
through tests/fleet/fleet_helpers.py (so the session's safety net knows
it, and every fleet gets the same prefix and removal), and no helper is
written out twice in tests/fleet."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

FLEET = Path(__file__).resolve().parent.parent / "fleet"
# fleet_helpers starts fleets for everyone; test_fleetlab tests up/down themselves.
MAY_START_FLEETS = ("fleet_helpers.py", "test_fleetlab.py")


def modules() -> dict:
    found = {p.name: ast.parse(p.read_text(), str(p)) for p in sorted(FLEET.glob("*.py"))}
    assert len(found) > 10, sorted(found)
    return found


def test_fleets_start_only_through_fleet_helpers():
    starts = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "up" and ast.unparse(node.func.value) == "fleetlab"
                    and name not in MAY_START_FLEETS):
                starts.append(f"tests/fleet/{name}:{node.lineno}")
    assert not starts, ("start fleets with the conftest's fleet/make_fleet or "
                        f"fleet_helpers.running_fleet: {starts}")


def test_no_helper_is_written_out_twice():
    where = defaultdict(list)
    helpers = 0
    for name, tree in modules().items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
                helpers += 1
                body = ast.dump(ast.Module(body=node.body, type_ignores=[]))
                where[(node.name, body)].append(f"{name}:{node.lineno}")
    assert helpers > 20, helpers
    copies = {key[0]: places for key, places in where.items() if len(places) > 1}
    assert not copies, f"move these to tests/fleet/fleet_helpers.py: {copies}"
