"""The host side (nictune/host/, what ships to targets as the agent) imports
nothing from the controller side, nor any dependency a target does not have."""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys

import nictune.host

AGENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "src")
HOST_DIR = os.path.dirname(nictune.host.__file__)
HOST_SIDE = [m.name for m in pkgutil.walk_packages(nictune.host.__path__, "nictune.host.")]
FORBIDDEN = ("yaml", "jsonschema", "typer", "rich", "click", "paramiko", "pydantic",
             "asyncio", "nictune.cli", "nictune.profile", "nictune.control",
             "nictune.inventory", "nictune.lab")
# The one module that may import pyroute2, and what from it.
PYROUTE2_DOOR = os.path.join("transports", "netlink", "_pyroute2.py")


def test_host_side_imports_only_what_a_target_has():
    code = (f"import sys, json\nfor m in {HOST_SIDE!r}: __import__(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=AGENT))
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == []
    assert "pyroute2.netlink" in loaded  # message classes only, see netlink/_pyroute2.py


def test_the_controller_loads_no_pyroute2():
    # It imports every knob family for the profile schema: the families
    # must leave their netlink modules to the agent (netlink/uapi.py holds
    # the enums a schema lists).
    code = ("import sys, json\nimport nictune.cli.app, nictune.profile.loader, nictune.profile.lint\n"
            "import nictune.profile.reference, nictune.control.remote.fleet\n"
            "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=AGENT))
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "nictune.host.knobs.sriov" in loaded  # the schema was built from the families
    assert [m for m in loaded if m == "pyroute2" or m.startswith("pyroute2.")] == []


def _imports(path: str):
    """(module, line) of every import statement in a file, lazy ones included."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside its own package by construction
                continue
            yield node.module or "", node.lineno


def test_every_host_module_imports_only_itself_the_version_and_the_stdlib():
    """Statically, so that an import inside a rarely-run branch counts too."""
    # This Python's list, plus the stdlib's own modules of the other
    # versions the agent runs on (Python's sha256 is _sha256 up to 3.11,
    # _sha2 from 3.12): resident/daemon.py asks for either.
    stdlib = sys.stdlib_module_names | {"_sha2", "_sha256"}
    bad = []
    files = 0
    for dirpath, _, names in os.walk(HOST_DIR):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, HOST_DIR)
            files += 1
            for module, line in _imports(path):
                top = module.split(".")[0]
                if module == "nictune" or module.startswith("nictune.host"):
                    continue
                if top in stdlib or top == "__future__":
                    continue
                if top == "pyroute2" and rel == PYROUTE2_DOOR:
                    continue
                bad.append(f"{rel}:{line} imports {module}")
    assert files > 20  # the scan saw the host side, not an empty directory
    assert bad == []
