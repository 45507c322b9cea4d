"""Lint cases: a profile with seeded inconsistencies and the findings it must
produce (code, severity and both file:line sides), nothing more or less."""

from __future__ import annotations

import json
import os

import pytest

from nictune.profile.lint import lint_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")
CASES = sorted(n[:-len(".yaml")] for n in os.listdir(HERE) if n.endswith(".yaml"))


@pytest.mark.parametrize("case", CASES)
def test_lint_finds_exactly_the_seeded_inconsistencies(case):
    with open(os.path.join(HERE, f"{case}.expected.json")) as f:
        expected = json.load(f)
    found = [{"code": f.code, "severity": f.severity,
              "locations": [os.path.basename(loc) for loc in f.locations]}
             for f in lint_file(os.path.join(HERE, f"{case}.yaml"))]
    assert sorted(found, key=json.dumps) == sorted(expected, key=json.dumps)
