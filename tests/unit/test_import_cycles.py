"""No import cycle between nictune's modules, and no arrow back up from the
controller's rooms to the CLI.

The graph is read from the source (ast), so an import in a branch that no
test runs counts too.  What counts as an arrow from module A to module B:
- every `import`/`from ... import` in A, at module level or inside a
  function: a lazy import is still a dependency, and a circle through one
  only waits for the first call to bite (none is exempt: the agent's
  start-up cost is a reason to import late, never a reason to import in a
  circle);
- importing B.C also runs B's `__init__.py`, so it is an arrow to the
  package B too (unless A lives inside B: B is already loading then);
- not imports under `if TYPE_CHECKING:`: they never run, and name types
  only (annotations are strings under `from __future__ import annotations`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nictune

PACKAGE = Path(nictune.__file__).parent
# Rooms below the CLI: the CLI drives them, they never reach back into it.
BELOW_THE_CLI = ("control", "inventory", "profile", "host", "lab")


def module_names(root: Path) -> dict:
    """dotted module name -> file, for every module of the package at root."""
    found = {}
    for path in root.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set:
    """The import nodes under `if TYPE_CHECKING:`."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                guarded.update(id(n) for n in ast.walk(inner))
    return guarded


def _imported(node: ast.AST, module: str, is_package: bool) -> list:
    """The dotted names an import statement may load (a name imported from a
    module may be a submodule: both are tried)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(root: Path) -> dict:
    """module -> the modules of the same package it imports (see the docstring)."""
    modules = module_names(root)

    def known(name: str):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        guarded = _type_checking_only(tree)
        targets = set()
        for node in ast.walk(tree):
            if id(node) in guarded:
                continue
            for name in _imported(node, module, path.name == "__init__.py"):
                target = known(name)
                if target is None or target == module:
                    continue
                targets.add(target)
                parts = target.split(".")
                for i in range(2, len(parts)):  # the packages on the way run their __init__
                    package = ".".join(parts[:i])
                    if package in modules and package != module and not module.startswith(package + "."):
                        targets.add(package)
        graph[module] = targets
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module, each as a
    sorted list with the arrows inside it (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component))
    return found


def test_no_module_imports_itself_round_a_circle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 120  # the scan saw the whole package
    assert sum(len(targets) for targets in graph.values()) > 400  # and its imports
    assert cycles(graph) == []


def test_nothing_below_the_cli_imports_it():
    graph = import_graph(PACKAGE)
    below = [m for m in graph if m.split(".")[1:2] and m.split(".")[1] in BELOW_THE_CLI]
    assert len(below) > 100
    up = sorted(f"{m} -> {t}" for m in below for t in graph[m] if t.startswith("nictune.cli"))
    assert up == []


def _plant(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_planted_circle_through_a_lazy_import_is_found(tmp_path):
    root = _plant(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from pkg.c import g\n",
        "c.py": "from . import a\n",
        "d.py": "import pkg.a\n",
    })
    assert cycles(import_graph(root)) == [["pkg.a -> pkg.b", "pkg.b -> pkg.c", "pkg.c -> pkg.a"]]


def test_a_circle_through_a_package_init_is_found_and_type_checking_is_not(tmp_path):
    root = _plant(tmp_path, {
        "__init__.py": "",
        "room/__init__.py": "from pkg.room.heavy import x\n",
        "room/heavy.py": "from pkg import user\n",
        "room/light.py": "",
        "user.py": "from pkg.room.light import y\n",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import user\n",
    })
    graph = import_graph(root)
    assert "pkg.user" not in graph["pkg.typed"]
    assert cycles(graph) == [["pkg.room -> pkg.room.heavy", "pkg.room.heavy -> pkg.user",
                              "pkg.user -> pkg.room"]]
