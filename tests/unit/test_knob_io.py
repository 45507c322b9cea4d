"""Knob families reach the kernel through Host.io and nothing else.

A module under host/knobs/ that calls open(), uses os beyond the pure path
string functions, or imports socket, fcntl, subprocess, ctypes (or builtins,
io, shutil, tempfile, pathlib, select, mmap, which reach files and sockets
as well) would bypass the port: snapshots would miss its reads, the probe
would not see them and an offline plan would read the controller's own
machine.  This test reads the modules' syntax trees, so it needs no import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nictune.host.knobs as knobs

KNOBS = Path(knobs.__file__).parent
FORBIDDEN_MODULES = {"socket", "fcntl", "subprocess", "ctypes", "builtins", "io", "shutil",
                     "tempfile", "pathlib", "select", "mmap", "posix", "_socket"}
# os.path functions that compute on strings and never ask the file system
# (relpath and abspath read the working directory only for a relative path;
# families pass Host.path() results, which are absolute).
PURE_OS_PATH = {"join", "basename", "dirname", "relpath", "normpath", "split", "splitext",
                "isabs", "sep", "commonpath"}
PURE_OS = {"sep", "path"}
FORBIDDEN_CALLS = {"open"}
# Helpers that read the host themselves: families use the port's form.
FORBIDDEN_HELPERS = {("keyfile", "load"): "Host.io.key_load", ("keyfile", "check"): "Host.io.key_load"}


def problems(source: str, name: str) -> list:
    """What in `source` reaches the host other than through Host.io."""
    tree = ast.parse(source, name)
    found = []

    def at(node, what):
        found.append(f"{name}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in FORBIDDEN_MODULES:
                    at(node, f"import {alias.name}")
                elif top == "os" and alias.asname:
                    at(node, f"import os as {alias.asname}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in FORBIDDEN_MODULES:
                at(node, f"from {node.module} import ...")
            elif node.module == "os" and any(a.name not in PURE_OS for a in node.names):
                at(node, f"from os import {', '.join(a.name for a in node.names)}")
            elif node.module == "os.path" and any(a.name not in PURE_OS_PATH for a in node.names):
                at(node, f"from os.path import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in FORBIDDEN_CALLS:
            at(node, f"{node.func.id}()")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and (node.value.id, node.attr) in FORBIDDEN_HELPERS:
            at(node, f"{node.value.id}.{node.attr} (use {FORBIDDEN_HELPERS[node.value.id, node.attr]})")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "os" and node.attr not in PURE_OS:
            at(node, f"os.{node.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "os" \
                and node.value.attr == "path" and node.attr not in PURE_OS_PATH:
            at(node, f"os.path.{node.attr}")
        elif isinstance(node, ast.Name) and node.id == "os" and not _in_attribute(tree, node):
            at(node, "os itself (passed on, it reaches everything)")
    return found


def _in_attribute(tree, name_node) -> bool:
    """Whether `name_node` is the value of an attribute (os.path...)."""
    return any(isinstance(n, ast.Attribute) and n.value is name_node for n in ast.walk(tree))


def knob_modules() -> list:
    return sorted(KNOBS.glob("*.py"))


def test_knob_modules_reach_the_kernel_only_through_the_port():
    modules = knob_modules()
    # Every family module is scanned: a moved directory must not pass by scanning nothing.
    assert len(modules) >= 20, [m.name for m in modules]
    found = []
    for module in modules:
        found += problems(module.read_text(), f"host/knobs/{module.name}")
    assert found == [], "use Host.io (host/transports/io.py) instead:\n" + "\n".join(found)


def test_each_way_past_the_port_is_found():
    planted = {
        "with open('/proc/sys/net/core/rmem_max') as f: pass": "open()",
        "import os\nos.listdir('/sys/class/net')": "os.listdir",
        "import os\nos.path.isdir('/sys')": "os.path.isdir",
        "import os\nx = os.path.realpath('/sys')": "os.path.realpath",
        "import socket": "import socket",
        "import fcntl": "import fcntl",
        "import subprocess\nsubprocess.run(['ip', 'link'])": "import subprocess",
        "from ctypes import CDLL": "from ctypes import",
        "from os import listdir": "from os import listdir",
        "from os.path import exists": "from os.path import exists",
        "import os\nf = os\nf.listdir('/')": "os itself",
        "import os as o": "import os as o",
        "from nictune.host.transports import keyfile\nkeyfile.check(p)": "keyfile.check",
        "from nictune.host.transports import keyfile\nk, fp = keyfile.load(p, 16)": "keyfile.load",
    }
    for source, expected in planted.items():
        found = problems(source, "planted.py")
        assert len(found) >= 1 and any(expected in f for f in found), (source, found)


def test_pure_path_functions_and_the_port_pass():
    clean = ("import os\n"
             "def read(self, path):\n"
             "    full = os.path.join(self.host.root, os.path.basename(path))\n"
             "    return self.host.io.read_text(full), self.host.io.isdir(os.path.dirname(full))\n")
    assert problems(clean, "clean.py") == []
