"""The agent as shipped to SSH targets: a zipapp of nictune's host side.

It holds exactly nictune/__init__.py (the version) and the nictune/host/
package, plus the four pyroute2 modules the netlink message classes need:
an allow-list, so nothing of the controller can slip in.  A target needs
only python3 >= 3.9.  The archive is built
byte-for-byte reproducibly, so its SHA-256 names it in the target's cache and
it is re-sent only when the code changed.

BOOTSTRAP is the only code that runs on the target before the agent: it
answers "have" or "need" for the archive, unpacks and byte-compiles a new
one into <state dir>/agent/<sha256>/ (once: later runs import the compiled
modules), and hands stdin over to the agent.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shlex
import zipfile
from dataclasses import dataclass

import nictune

# What ships: the version module and the host side, nothing else.
SHIPPED = ("__init__.py", "host")
# What nictune/host/netlink/_pyroute2.py imports; tests/unit/test_agentzip.py
# checks this list against what the host side really loads.
PYROUTE2_FILES = (
    "pyroute2/__init__.py",
    "pyroute2/common.py",
    "pyroute2/netlink/__init__.py",
    "pyroute2/netlink/exceptions.py",
)
MAIN = "import sys\nfrom nictune.host.agent import main\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    files: tuple


def _host_side_files() -> list:
    """(archive name, path) of every module in SHIPPED."""
    root = os.path.dirname(nictune.__file__)
    out = [("nictune/__init__.py", os.path.join(root, "__init__.py"))]
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "host")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                out.append(("nictune/" + os.path.relpath(path, root).replace(os.sep, "/"), path))
    return out


def _pyroute2_files() -> list:
    import importlib.util

    spec = importlib.util.find_spec("pyroute2")
    base = os.path.dirname(list(spec.submodule_search_locations)[0])
    return [(name, os.path.join(base, *name.split("/"))) for name in PYROUTE2_FILES]


@functools.lru_cache(maxsize=1)
def build() -> Bundle:
    entries = sorted(_host_side_files() + _pyroute2_files())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, path in entries:
            with open(path, "rb") as f:
                _add(z, name, f.read())
        _add(z, "__main__.py", MAIN.encode())
    data = buf.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest(), tuple(n for n, _ in entries))


def _add(z: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, _EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, data, compresslevel=9)


# Runs as `python3 -I -S -c BOOTSTRAP <sha256> <state dir>` on the target.  Kept
# small and import-light: on the usual path ("have") it imports only os and
# sys before the agent.
BOOTSTRAP = r"""
import os, sys
if sys.version_info < (3, 9):
    sys.stderr.write("nictune: the agent needs python3 >= 3.9, this is %s\n" % sys.version.split()[0])
    sys.exit(3)
sha, state = sys.argv[1], sys.argv[2]
cache = os.path.join(state, "agent")
home = os.path.join(cache, sha)
out, inp = sys.stdout.buffer, sys.stdin.buffer
if os.path.isdir(home):
    out.write(b"have\n"); out.flush()
else:
    import compileall, hashlib, io, shutil, tempfile, zipfile
    out.write(b"need\n"); out.flush()
    size = int(inp.readline())
    data = inp.read(size)
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
        sys.stderr.write("nictune: the agent archive arrived damaged\n")
        sys.exit(3)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=cache, prefix=".new-")
    zipfile.ZipFile(io.BytesIO(data)).extractall(tmp)
    compileall.compile_dir(tmp, quiet=2)
    try:
        os.rename(tmp, home)
    except OSError:
        shutil.rmtree(tmp)  # another run unpacked the same archive first
    for old in os.listdir(cache):
        if old != sha and not old.startswith("."):
            shutil.rmtree(os.path.join(cache, old), ignore_errors=True)
sys.path.insert(0, home)
from nictune.host.agent import main
code = main()
sys.stdout.flush()
os._exit(code)  # interpreter teardown costs ~10 ms per host and does nothing here
"""


def remote_command(python: str, sha256: str, state_dir: str, sudo: bool) -> str:
    """The one command line the controller runs on a target.  SSH hands it to
    the login shell, so every word is quoted; none comes from a profile."""
    # -I -S: no user site, no PYTHON* variables, no site-packages: the
    # agent imports only what it carries, and starts faster.
    argv = [python, "-I", "-S", "-c", BOOTSTRAP, sha256, state_dir]
    if sudo:
        argv = ["sudo", "-n", "--"] + argv
    return "exec " + " ".join(shlex.quote(a) for a in argv)
