"""The agent as shipped to SSH targets: a zipapp of nictune's host side.

It holds exactly nictune/__init__.py (the version) and the nictune/host/
package, plus the four pyroute2 modules the netlink message classes need:
an allow-list, so nothing of the controller can slip in.  A target needs
only python3 >= 3.9.  The archive is built
byte-for-byte reproducibly, so its SHA-256 names it in the target's cache and
it is re-sent only when the code changed.

BOOTSTRAP is the only code that runs on the target before the agent: it
checks the cached copy (ownership, permissions and a manifest of hashes,
and of the module sources' sizes and mtimes, on every run), answers "have" or "need" for the archive, unpacks,
byte-compiles and seals a new one into <state dir>/agent/<sha256>/ (once:
later runs import the compiled modules), and hands stdin over to the agent.
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
# What nictune/host/transports/netlink/_pyroute2.py imports; tests/unit/test_agentzip.py
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
# small and import-light: on the usual path ("have") it imports only os, sys
# and the interpreter's built-in BLAKE2 before the agent.
#
# The unpacked agent runs as root, so it is trusted only as far as it is
# checked, on every run: the state directory, agent/ and every directory and
# file under agent/<sha256>/ must be this user's and writable by nobody else,
# and nothing from agent/ down a symlink (so no other user can change the
# code between the check and the import); no file may be missing or added;
# and every file Python may execute must be as the MANIFEST written when it
# was unpacked says, for this python.  That is every byte of each compiled
# module (.pyc, timestamp-checked: compiled so at unpacking) and of any file
# without one, hashed; a module's source is compared by size and mtime (ns)
# only, for Python runs its .pyc while the source's mtime (s) and size are
# those the .pyc records, and a source whose size or mtime changed is
# refused here before it could run instead.  So every byte that runs from
# the cache is as unpacked, as when every file was hashed; what is no longer
# seen is a source changed with its size and mtime put back (a deliberate
# utimensat by its owner, root) or decayed on disk, neither of which runs:
# only a traceback would quote it.  Hashing the sources as well cost 40 %
# more (2 of some 6 ms per run on the lab: the hash is BLAKE2b, the
# interpreter's built-in SHA-256 took twice as long, and importing hashlib
# for OpenSSL's costs more than it saves).  A cache that fails is removed
# and the archive asked for again ("need <why>"); the controller reports
# why.  A MANIFEST of the format before (every file hashed) is checked as it
# says.
BOOTSTRAP = r"""
import os, sys
if sys.version_info < (3, 9):
    sys.stderr.write("nictune: the agent needs python3 >= 3.9, this is %s\n" % sys.version.split()[0])
    sys.exit(3)
try:
    from _blake2 import blake2b  # hashlib's import alone costs ~3 ms
except ImportError:
    from hashlib import blake2b
sha, state = sys.argv[1], sys.argv[2]
cache = os.path.join(state, "agent")
home = os.path.join(cache, sha)
out, inp = sys.stdout.buffer, sys.stdin.buffer
uid, DIR, FILE = os.geteuid(), 0o040000, 0o100000
TAG = sys.implementation.cache_tag
SEAL = "nictune-agent-manifest 2 %s" % TAG
HASHED_ONLY = "nictune-agent-manifest 1 %s" % TAG  # every file hashed, no stat kept

def unsafe(name, st, kind):
    if st.st_mode & 0o170000 != kind:
        return "%s is not a %s" % (name, "directory" if kind == DIR else "regular file")
    if st.st_uid != uid:
        return "%s is owned by uid %d, not %d" % (name, st.st_uid, uid)
    if st.st_mode & 0o022:
        return "%s is writable by group or others" % name
    return None

def digest(path):
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        return blake2b(f.read(), digest_size=32).hexdigest()

def compiled(name):
    # The .pyc Python runs for the module source `name`, "" for other files.
    folder, _, base = name.rpartition("/")
    if not base.endswith(".py"):
        return ""
    return "%s__pycache__/%s.%s.pyc" % (folder + "/" if folder else "", base[:-3], TAG)

def damage(top):
    try:
        with os.fdopen(os.open(os.path.join(top, "MANIFEST"), os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            lines = f.read().decode().splitlines()
        fields = 4 if lines and lines[0] == SEAL else 2
        want = {}
        for line in lines[1:]:
            parts = line.split(" ", fields - 1)  # hash [size mtime_ns] name
            if len(parts) != fields:
                raise ValueError(line)
            want[parts[-1]] = parts[:-1]
    except (OSError, ValueError):
        return "its MANIFEST is missing or unreadable"
    if not lines or lines[0] not in (SEAL, HASHED_ONLY):
        return "its MANIFEST is not %r" % SEAL
    try:
        seen, todo = 0, [""]
        while todo:
            rel = todo.pop()
            why = unsafe(rel or "its directory", os.lstat(os.path.join(top, rel)), DIR)
            if why:
                return why
            with os.scandir(os.path.join(top, rel)) as entries:
                for e in entries:
                    name = rel + e.name
                    if e.is_dir(follow_symlinks=False):
                        todo.append(name + "/")
                        continue
                    st = e.stat(follow_symlinks=False)
                    why = unsafe(name, st, FILE)
                    if why:
                        return why
                    if name == "MANIFEST":
                        continue
                    if name not in want:
                        return "%s is not part of the agent" % name
                    if fields == 4 and compiled(name) in want:  # its .pyc, hashed, is what runs
                        same = want[name][1:] == ["%d" % st.st_size, "%d" % st.st_mtime_ns]
                    else:
                        same = digest(e.path) == want[name][0]
                    if not same:
                        return "%s differs from the copy unpacked" % name
                    seen += 1
    except OSError as e:
        return "its files cannot be read (%s)" % (e.strerror or e)
    return None if seen == len(want) else "%d of its files are missing" % (len(want) - seen)

def seal(top):
    lines = [SEAL]
    for dirpath, dirnames, filenames in os.walk(top):
        for n in filenames:
            path = os.path.join(dirpath, n)
            st = os.lstat(path)
            lines.append("%s %d %d %s" % (digest(path), st.st_size, st.st_mtime_ns, os.path.relpath(path, top)))
    with open(os.path.join(top, "MANIFEST"), "w") as f:
        f.write("\n".join(lines) + "\n")

def discard(path):
    import shutil
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)

def cached():
    # None if home holds the agent as sealed; else why not ("" if never
    # unpacked), after removing what failed.
    if not os.path.lexists(cache):
        return ""
    why = unsafe(cache, os.lstat(cache), DIR)
    if why:
        discard(cache)
        return why
    if not os.path.lexists(home):
        return ""
    why = damage(home)
    if why:
        discard(home)
    return why

def refuse(why):
    sys.stderr.write("nictune: will not run the agent from %s: %s\n" % (state, why))
    sys.exit(3)

mask = os.umask(0o077)  # what the bootstrap creates is this user's alone
if os.path.exists(state):
    why = unsafe(state, os.stat(state), DIR)
    if why:
        refuse(why + " (it must be a directory owned by uid %d and writable by nobody else)" % uid)
why = cached()
if why is None:
    out.write(b"have\n"); out.flush()
else:
    import compileall, hashlib, io, py_compile, tempfile, zipfile
    out.write(b"need %s\n" % why.encode("unicode_escape")[:300] if why else b"need\n"); out.flush()
    size = int(inp.readline())
    data = inp.read(size)
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
        sys.stderr.write("nictune: the agent archive arrived damaged\n")
        sys.exit(3)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=cache, prefix=".new-")
    zipfile.ZipFile(io.BytesIO(data)).extractall(tmp)
    # Timestamp .pycs whatever SOURCE_DATE_EPOCH says: Python runs one
    # without reading its source while the source's mtime and size hold.
    compileall.compile_dir(tmp, quiet=2, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    seal(tmp)
    try:
        os.rename(tmp, home)
    except OSError:  # another run unpacked the same archive first: check it as any cache
        discard(tmp)
        why = damage(home)
        if why:
            refuse("%s: %s" % (home, why))
    for old in os.listdir(cache):
        if old != sha and not old.startswith("."):
            discard(os.path.join(cache, old))
os.umask(mask)
sys.dont_write_bytecode = True  # the cache stays as sealed
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
