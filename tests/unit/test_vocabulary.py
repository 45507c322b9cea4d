"""One vocabulary: errors are {kind, message}, refusals are NictuneErrors,
and user-facing text names no tracker numbers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nictune
from nictune.host.errors import NictuneError, SYSTEM
from nictune.host.knobs.ethtool import ApplyRefused

PACKAGE = Path(nictune.__file__).parent
TRACKER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(path: Path):
    """The string literals of a module that are not docstrings: what it may print."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_user_facing_string_names_a_tracker_number():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50  # the whole package was scanned
    hits = [f"{p.relative_to(PACKAGE)}:{line}: {text!r}" for p in modules
            for line, text in _strings(p) if TRACKER.search(text)]
    assert hits == []


def test_a_features_write_the_kernel_ignores_is_a_nictune_refusal():
    # knobs/base.py: apply raises OSError, ValueError or a NictuneError.
    e = ApplyRefused("eth0: the kernel did not change rx-gro")
    assert isinstance(e, NictuneError)
    assert e.as_dict() == {"kind": SYSTEM, "message": "eth0: the kernel did not change rx-gro"}
