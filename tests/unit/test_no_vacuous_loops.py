"""A test that asserts only inside a loop passes when the loop's data is
empty, having checked nothing.  This scan finds test functions with an
assert inside a `for` loop (or an `assert all(... for x in data)`) over
data that is not a literal, where no assert outside a loop looks at that
data (a guard: `assert files`, `assert len(files) >= 6`).

Literal data: a non-empty list, tuple, set, dict or string written in the
test or assigned once at the top of its module or function, range() of
positive constants, and sorted/enumerate/zip/.items() of those."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path
from typing import Iterator, List, Set, Tuple

TESTS = Path(__file__).resolve().parent.parent

# (file relative to tests/, test function): why its loop cannot be empty
# although the scan cannot see it.
ALLOWED = {
    ("fleet/test_fleetlab.py", "test_nothing_answers_at_the_unreachable_address"):
        "no neighbour entry at all is the best outcome: nobody answered ARP",
    ("unit/test_markdown.py", "test_host_supplied_text_stays_text"):
        "no HTML block at all is as safe as only <details> ones",
}

WRAPPERS = ("sorted", "enumerate", "zip", "reversed", "list", "tuple", "set", "dict")


def is_literal(node: ast.AST, constants: Set[str]) -> bool:
    """`node` is data that cannot be empty: written out, or a name bound
    once to such data."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return bool(node.elts) and not any(isinstance(e, ast.Starred) for e in node.elts)
    if isinstance(node, ast.Dict):
        return bool(node.keys) and None not in node.keys
    if isinstance(node, ast.Constant):  # a positive int: for range(N) with N a constant
        return isinstance(node.value, (str, bytes, int)) and bool(node.value) and node.value is not True
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.Call) and not node.keywords:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "range":
            return bool(node.args) and all(is_literal(a, constants) for a in node.args)
        if isinstance(func, ast.Name) and func.id in WRAPPERS and node.args:
            return all(is_literal(a, constants) for a in node.args)
        if isinstance(func, ast.Attribute) and func.attr in ("items", "keys", "values"):
            return not node.args and is_literal(func.value, constants)
    return False


def literal_names(body: List[ast.stmt], constants: Set[str]) -> Set[str]:
    """Names `body` binds once, at its top level, to literal data."""
    bound: dict = {}
    for stmt in body:
        for target in _assigned(stmt):
            bound[target] = bound.get(target, 0) + 1
    found = set(constants)
    for stmt in body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if (len(targets) == 1 and isinstance(targets[0], ast.Name)
                    and bound[targets[0].id] == 1 and is_literal(stmt.value, found)):
                found.add(targets[0].id)
    return found


def _assigned(stmt: ast.stmt) -> Iterator[str]:
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


def names_in(node: ast.AST) -> Set[str]:
    """The names data is reached by in `node` (not builtins)."""
    return {n.id for n in ast.walk(node)
            if isinstance(n, ast.Name) and not hasattr(builtins, n.id)}


class AssertFinder(ast.NodeVisitor):
    """The asserts of one function, each with the iterables of the loops
    around it (nested functions and classes are their own business)."""

    def __init__(self):
        self.loops: List[ast.AST] = []
        self.found: List[Tuple[ast.Assert, List[ast.AST]]] = []

    def visit_FunctionDef(self, node):  # nested: not this test's body
        pass

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_For(self, node):
        self.visit(node.target)
        self.visit(node.iter)
        self.loops.append(node.iter)
        for stmt in node.body:
            self.visit(stmt)
        self.loops.pop()
        for stmt in node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_Assert(self, node):
        loops = list(self.loops)
        test = node.test
        if (isinstance(test, ast.Call) and isinstance(test.func, ast.Name)
                and test.func.id == "all" and len(test.args) == 1
                and isinstance(test.args[0], ast.GeneratorExp)):
            loops += [g.iter for g in test.args[0].generators]
        self.found.append((node, loops))


def unguarded_loops(tree: ast.Module) -> Iterator[Tuple[str, int, str]]:
    """(test name, line, loop data) of each test function that asserts in a
    loop over data that may be empty, with no guard on that data."""
    module_constants = literal_names(tree.body, set())
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.name.startswith("test"):
            continue
        constants = literal_names(fn.body, module_constants)
        finder = AssertFinder()
        for stmt in fn.body:
            finder.visit(stmt)
        guarded = set()
        for node, loops in finder.found:
            if not loops:
                guarded |= names_in(node)
        for node, loops in finder.found:
            if loops and not any(is_literal(it, constants) for it in loops) \
                    and not any(names_in(it) & guarded for it in loops):
                yield fn.name, node.lineno, ast.unparse(loops[-1])
                break


def test_the_scan_finds_an_unguarded_loop_and_passes_guarded_ones():
    source = '''
def test_unguarded(items):
    for x in items():
        assert x
def test_unguarded_all(data):
    assert all(x for x in data)
def test_guarded(files):
    assert len(files) >= 2
    for f in files:
        assert f
def test_literal():
    for x in (1, 2):
        assert x
LEVELS = ["a", "b"]
N = 3
def test_range_of_a_constant():
    for i in range(N):
        assert i < N
def test_module_literal():
    cases = {"a": 1}
    for k, v in cases.items():
        assert v
    assert all(x for x in LEVELS)
'''
    found = list(unguarded_loops(ast.parse(source)))
    assert [(name, line) for name, line, _ in found] == [("test_unguarded", 4), ("test_unguarded_all", 6)]


def test_no_test_asserts_only_in_a_loop_over_data_that_may_be_empty():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100, files
    found = []
    for path in files:
        relative = str(path.relative_to(TESTS))
        for name, line, data in unguarded_loops(ast.parse(path.read_text(), str(path))):
            if (relative, name) not in ALLOWED:
                found.append(f"tests/{relative}:{line}: {name} asserts only inside a loop over "
                             f"{data}: assert that it is not empty (or its length) first")
    assert not found, "\n".join(found)


def test_every_allowed_loop_is_still_there():
    assert ALLOWED
    for relative, name in ALLOWED:
        tree = ast.parse((TESTS / relative).read_text())
        assert name in [n for n, _, _ in unguarded_loops(tree)], (relative, name)
