"""Snapshots: a host's reads, recorded at the Host seam, and replayed offline.

`nictune show --save DIR` (and `audit --save DIR`) asks the agent to run a
show under record(): every read nictune makes of the host is logged with
its answer, and the log is the snapshot.  `nictune plan --from-snapshots`
runs the same agent request in the controller against a RecordedHost,
which answers those reads from the log: the same engine and knob families
plan it, nothing re-implements the diff.

What is recorded, and how:

- the kernel handles a Host hands out (rtnl(), ethtool(), dcb(),
  devlink(), tunables(), macsec(), xfrm(), the drvinfo ioctl, page_size(),
  the counter source): every method called on them, with its arguments
  and its result or error (NetlinkError errno and extack included);
- key files (Host.io.key_load): their fingerprint and key length only;
- the files read under Host.root (sysfs, /proc/sys, owned files such as
  /etc/nccl.conf) through the host's port, Host.io (host/transports/io.py): open for
  reading, os_open for reading (owned files, host/files.py), stat, lstat,
  listdir, readlink, access.  For the length of the run the host's port is
  a SessionIO over a _Recorder, which logs each operation and passes it on
  to the port the host had: nothing of the process is patched, so other
  threads and other hosts are untouched;
- besides what show reads: what each registered family declares a later
  plan may read (knobs/base.py Family.plan_reads: every sysctl under
  /proc/sys/net with its writability, RDMA GID tables, SR-IOV counts...).

The owned files' content is in the snapshot: it is the host's own state
(an NCCL/UCX/MPI environment file), stored where the operator keeps
snapshots.  Secrets are not: of a key file (MACsec/IPsec SA keys) only
the fingerprint is kept (what plans and the journal carry anyway), the
key file is read by keyfile.py behind the port and never logged, and the kernel never returns
MACsec or IPsec key material over netlink.

Replaying, a read the snapshot does not hold raises NotInSnapshot (a
NictuneError the engine turns into Unsupported("... not in the snapshot of
DATE ...") for that family's keys), never a default; a path whose parent
directory was listed and does not name it is absent (ENOENT), as it was.
Anything that would write (a set_* call, open for writing, os_open other
than for reading, mkdir, unlink...) raises SnapshotWrite.  A socket the
port is asked for (OVSDB's unix socket, a netlink socket of a handle that
is not recorded) is not in the snapshot: replaying refuses it so.  A counter's rise (knobs/expect.py: two readings
seconds apart) is not in any snapshot: see _ReplayCounters.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import io
import json
import os
import re
import stat as stat_mod
from typing import Any, Callable, Dict, Optional

from nictune.host.errors import UNSUPPORTED, NictuneError
from nictune.host.transports.io import IoctlSocket, LiveIO
from nictune.host.machine import Host

SNAPSHOT_FORMAT = 1
WRITES = ("set_", "add_", "del_", "delete", "create", "write", "apply", "flush", "new_")
# A sysctl tree this large is not a host's: stop walking, say so.
MAX_WALK_FILES = 50_000


class NotInSnapshot(NictuneError):
    """A read the snapshot did not record."""

    kind = UNSUPPORTED


class SnapshotWrite(NictuneError):
    """An offline plan tried to write."""


# -- values: JSON with type tags ------------------------------------------------

def encode(v: Any) -> Any:
    """A handle's result as JSON; decode() gives back an equal object."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, enum.Enum):
        return {"$enum": _class_name(type(v)), "value": encode(v.value)}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"$dc": _class_name(type(v)),
                "fields": {f.name: encode(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return {"$nt": _class_name(type(v)), "items": [encode(x) for x in v]}
    if isinstance(v, tuple):
        return {"$tuple": [encode(x) for x in v]}
    if isinstance(v, list):
        return [encode(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return {"$set": [encode(x) for x in sorted(v, key=repr)]}
    if isinstance(v, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in v):
            return {k: encode(x) for k, x in v.items()}
        return {"$dict": [[encode(k), encode(x)] for k, x in v.items()]}
    raise TypeError(f"cannot record a {type(v).__name__}")


def decode(v: Any) -> Any:
    """The object encode() made v from.  A snapshot is read from a file
    that may not be nictune's: host/replay/snapshot_check.py checks its values before
    a replay decodes them, and _class names only nictune's own data
    classes, never a function."""
    if isinstance(v, list):
        return [decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "$bytes" in v:
        return base64.b64decode(v["$bytes"], validate=True)
    if "$enum" in v:
        return _class(v["$enum"], "enum")(decode(v["value"]))
    if "$dc" in v:
        return _dataclass(_class(v["$dc"], "dataclass"),
                          {k: decode(x) for k, x in v["fields"].items()})
    if "$nt" in v:
        return _class(v["$nt"], "namedtuple")(*[decode(x) for x in v["items"]])
    if "$tuple" in v:
        return tuple(decode(x) for x in v["$tuple"])
    if "$set" in v:
        return {decode(x) for x in v["$set"]}
    if "$dict" in v:
        return {_hashable(decode(k)): decode(x) for k, x in v["$dict"]}
    return {k: decode(x) for k, x in v.items()}


def _dataclass(cls: type, values: dict):
    """cls from its fields' values, each of its field's type."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in values.items():
        if name not in fields:
            raise ValueError(f"{_class_name(cls)} has no field {shown(name)}")
        if not _fits(value, fields[name].type):
            raise ValueError(f"{_class_name(cls)} field {name} is {shown(value)}, "
                             f"not {fields[name].type}")
    obj = cls(**{k: x for k, x in values.items() if fields[k].init})
    for k, x in values.items():
        if not fields[k].init:
            object.__setattr__(obj, k, x)
    return obj


_SCALARS = {"int": int, "str": str, "bool": bool, "float": (int, float), "bytes": (bytes, bytearray)}
_GENERICS = {"List": list, "list": list, "Set": set, "set": set, "FrozenSet": (set, frozenset),
             "Tuple": tuple, "tuple": tuple, "Dict": dict, "dict": dict}


def _fits(value: Any, annotation: Any) -> bool:
    """Whether value is of the type a dataclass field's annotation names
    (a string: the modules use `from __future__ import annotations`); a
    type this does not know (another class) fits anything."""
    if not isinstance(annotation, str):
        return True
    text = annotation.replace(" ", "")
    options = (_split(text[len("Optional["):-1]) + ["None"] if text.startswith("Optional[")
               else _split(text, "|"))
    if len(options) > 1:
        return any(_fits(value, option) for option in options)
    if text == "None":
        return value is None
    if text in _SCALARS:  # a bool is not a number here, though Python says it is an int
        return isinstance(value, _SCALARS[text]) and (text == "bool" or not isinstance(value, bool))
    name, bracket, rest = text.partition("[")
    if name not in _GENERICS:
        return True
    if not isinstance(value, _GENERICS[name]):
        return False
    args = _split(rest[:-1]) if bracket else []
    if isinstance(value, dict) and len(args) == 2:
        return all(_fits(k, args[0]) and _fits(x, args[1]) for k, x in value.items())
    if len(args) == 1:
        return all(_fits(x, args[0]) for x in value)
    return True


def _split(text: str, sep: str = ",") -> list:
    """text's parts at sep outside brackets: "Dict[str,int],int" -> two."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def shown(value: Any, limit: int = 60) -> str:
    """repr(value), cut short: a snapshot's text can be as long as its file."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# The classes a snapshot may name: a host-side nictune module's public class.
_CLASS_NAME = re.compile(r"nictune\.host(\.[a-z][a-z0-9_]*)+:[A-Z][A-Za-z0-9_]*(\.[A-Z][A-Za-z0-9_]*)*")
_CLASS_KINDS = {
    "enum": lambda cls: issubclass(cls, enum.Enum),
    "dataclass": dataclasses.is_dataclass,
    "namedtuple": lambda cls: issubclass(cls, tuple) and hasattr(cls, "_fields"),
    "error": lambda cls: issubclass(cls, NictuneError),
}


# Modules that moved into the host side's rooms, by the name a snapshot
# saved before the move gives them: such a snapshot names its classes so.
MOVED_MODULES = {
    "nictune.host.engine": "nictune.host.transaction.engine",
    "nictune.host.journal": "nictune.host.transaction.journal",
    "nictune.host.aside": "nictune.host.transaction.aside",
    "nictune.host.watchdog": "nictune.host.transaction.watchdog",
    "nictune.host.health": "nictune.host.facts.health",
    "nictune.host.rdma": "nictune.host.facts.rdma",
    "nictune.host.nicclass": "nictune.host.facts.nicclass",
    "nictune.host.ibauto": "nictune.host.facts.ibauto",
    "nictune.host.ipsec": "nictune.host.facts.ipsec",
    "nictune.host.io": "nictune.host.transports.io",
    "nictune.host.ovsdb": "nictune.host.transports.ovsdb",
    "nictune.host.keyfile": "nictune.host.transports.keyfile",
    "nictune.host.resident": "nictune.host.resident.daemon",
    "nictune.host.metrics": "nictune.host.resident.metrics",
    "nictune.host.recorded": "nictune.host.replay.snapshot",
    "nictune.host.snapcheck": "nictune.host.replay.snapshot_check",
    "nictune.host.rawreads": "nictune.host.replay.probe_reads",
}
# and netlink/ whole, under transports/
MOVED_PACKAGE = ("nictune.host.netlink.", "nictune.host.transports.netlink.")


def _module_now(module: str) -> str:
    """Where a module a snapshot names lives today."""
    old, new = MOVED_PACKAGE
    if module.startswith(old):
        return new + module[len(old):]
    return MOVED_MODULES.get(module, module)


def _class(name: Any, kind: str) -> type:
    """The nictune class a snapshot names, of the kind its tag says.  A
    snapshot is data, not code to run: never a function, nor a class that
    another module imported ("nictune.host.agent:os.system" calls nothing)."""
    if not isinstance(name, str) or not _CLASS_NAME.fullmatch(name):
        raise ValueError(f"{shown(name)} is not the name of a nictune {kind} class")
    module, _, qualname = name.partition(":")
    module = _module_now(module)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if (not isinstance(obj, type) or obj.__module__ != module or obj.__qualname__ != qualname
            or not _CLASS_KINDS[kind](obj)):
        raise ValueError(f"{name} is not a nictune {kind} class")
    return obj


def encode_error(e: BaseException) -> dict:
    from nictune.host.transports.netlink.errors import NetlinkError

    if isinstance(e, NetlinkError):
        return {"$raise": "netlink", "errno": e.errno, "extack": e.extack}
    if isinstance(e, OSError):
        return {"$raise": "os", "errno": e.errno, "strerror": e.strerror}
    if isinstance(e, NictuneError):
        return {"$raise": _class_name(type(e)), "message": str(e)}
    return {"$raise": "value", "message": str(e)}


def decode_error(r: dict) -> BaseException:
    from nictune.host.transports.netlink.errors import NetlinkError

    kind = r["$raise"]
    if kind == "netlink":
        return NetlinkError(r["errno"], r.get("extack"))
    if kind == "os":
        return OSError(r["errno"], r.get("strerror") or os.strerror(r["errno"]))
    if kind == "value":
        return ValueError(r["message"])
    return _class(kind, "error")(r["message"])


def _call_id(handle: str, method: str, args: tuple, kwargs: dict) -> str:
    return f"{handle}.{method}" + json.dumps([encode(list(args)), encode(kwargs)],
                                              sort_keys=True, separators=(",", ":"))


# -- recording ------------------------------------------------------------------

class Log:
    """What one recorded run read: calls and file operations."""

    def __init__(self):
        self.calls: Dict[str, Any] = {}
        self.files: Dict[str, Any] = {}  # "op path[ arg]" -> result

    def call(self, handle: str, method: str, fn: Callable, args: tuple, kwargs: dict):
        ident = _call_id(handle, method, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            self.calls.setdefault(ident, encode_error(e))
            raise
        try:
            self.calls.setdefault(ident, {"value": encode(result)})
        except TypeError as e:  # cannot be kept: replaying it says so
            self.calls.setdefault(ident, {"$missing": str(e)})
        return result


class _RecordingHandle:
    """A kernel handle whose read calls go to the log on their way."""

    def __init__(self, inner, name: str, log: Log):
        self._inner, self._name, self._log = inner, name, log

    def __getattr__(self, method: str):
        attr = getattr(self._inner, method)
        if not callable(attr) or method.startswith("_") or method == "close":
            return attr
        return lambda *a, **k: self._log.call(self._name, method, attr, a, k)

    def __enter__(self):
        self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


class _RecordingCounters:
    def __init__(self, inner, log: Log):
        self._inner, self._log = inner, log

    def ethtool_stats(self, ifname: str):
        return self._log.call("counters", "ethtool_stats", self._inner.ethtool_stats, (ifname,), {})

    def now(self) -> float:
        return self._inner.now()

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _wrap_host(host: Host, log: Log) -> None:
    """Route the host's handles through the log (instance attributes: the
    same for Host and for tests' FakeHost, whose methods are its own)."""
    from nictune.host.facts import health

    # macsec, xfrm and inet: the handles the MACsec, IPsec and routing
    # families open for a phase.
    for name in ("rtnl", "ethtool", "dcb", "tunables", "macsec", "xfrm", "inet"):
        setattr(host, name, lambda make=getattr(host, name), name=name:
                _RecordingHandle(make(), name, log))
    # devlink() itself may fail (no devlink in the kernel): that is recorded too.
    make_devlink = host.devlink
    host.devlink = lambda: _RecordingHandle(_devlink_or_raise(log, make_devlink), "devlink", log)
    drvinfo, page_size = host._drvinfo, host.page_size
    host._drvinfo = lambda ifname: log.call("host", "drvinfo", drvinfo, (ifname,), {})
    host.page_size = lambda: log.call("host", "page_size", page_size, (), {})
    host.counter_source = _RecordingCounters(health.counter_source(host), log)


def _devlink_or_raise(log: Log, make: Callable):
    ident = _call_id("host", "devlink", (), {})
    try:
        handle = make()
    except Exception as e:
        log.calls.setdefault(ident, encode_error(e))
        raise
    log.calls.setdefault(ident, {"value": None})
    return handle


# -- the port, served by a session --------------------------------------------------

class SessionIO(LiveIO):
    """Host.io for a recording or a replay: each file operation, socket,
    ioctl and key-file read goes to the session (a _Recorder, a _Replayer,
    or host/replay/probe_reads.py's learner and probe replayer), which logs it on its
    way to the kernel or answers it from what was recorded.  The rest (the
    page size, the clock, the descriptor calls on what os_open gave) are
    the inner port's: the one the host had (a recording, learning) or the
    controller's own (a replay)."""

    def __init__(self, session, inner: Optional[LiveIO] = None):
        self.session = session
        self.inner = inner or LiveIO()

    def page_size(self) -> int:
        return self.inner.page_size()

    def now(self) -> float:
        return self.inner.now()

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)

    def open(self, path: str, mode: str = "r", *args, **kwargs):
        return self.session.open(path, mode, *args, **kwargs)

    def os_open(self, path: str, flags: int, mode: int = 0o777) -> int:
        return self.session.os_open(path, flags, mode)

    def stat(self, path: str):
        return self.session.simple("stat", path, (), {})

    def lstat(self, path: str):
        return self.session.simple("lstat", path, (), {})

    def listdir(self, path: str) -> list:
        return self.session.simple("listdir", path, (), {})

    def readlink(self, path: str) -> str:
        return self.session.simple("readlink", path, (), {})

    def access(self, path: str, mode: int) -> bool:
        return self.session.simple("access", path, (mode,), {})

    def scandir(self, path: str):
        return self.session.scandir(path)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        return self.session.write("mkdir", path, (mode,), {})

    def rmdir(self, path: str) -> None:
        return self.session.write("rmdir", path, (), {})

    def unlink(self, path: str) -> None:
        return self.session.write("unlink", path, (), {})

    def replace(self, src: str, dst: str) -> None:
        return self.session.write("replace", src, (dst,), {})

    def mkstemp(self, prefix: str, directory: str) -> tuple:
        return self.session.mkstemp(prefix, directory)

    def netlink(self, protocol: int):
        return self.session.netlink(protocol)

    def inet_socket(self):
        return IoctlSocket(self, self.session.inet_socket())

    def ioctl(self, sock, ifname: str, buf) -> int:
        return self.session.ioctl(sock, ifname, buf)

    def unix_connect(self, path: str, timeout: float):
        return self.session.unix_connect(path, timeout)

    def run(self, argv: list, timeout: float) -> tuple:
        return self.session.run(argv, timeout)

    def key_load(self, path: str, length=None, uid: int = 0) -> tuple:
        return self.session.key_load(path, length, uid)


def _stat_fields(st: os.stat_result) -> list:
    return [st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
            int(st.st_atime), int(st.st_mtime), int(st.st_ctime)]


def _key_ident(path: str, length) -> str:
    return _call_id("keyfile", "load", (path,), {"length": length})


class _Recorder:
    """Logs the file operations under root of the host it records; passes
    sockets, ioctls and writes through.  Key files keep their fingerprint
    and the key's length, never the key."""

    def __init__(self, root: str, log: Log, inner: Optional[LiveIO] = None):
        self.root = os.path.abspath(root)
        self.log = log
        self.inner = inner or LiveIO()  # the port the recorded operations go on to

    def _real(self, op: str):
        return getattr(self.inner, "os_open" if op == "os.open" else op)

    def rel(self, path: str) -> Optional[str]:
        """"/proc/sys/..." for a path under root; None for any other."""
        full = os.path.normpath(os.path.join(os.getcwd(), path)) if not os.path.isabs(path) \
            else os.path.normpath(path)
        if self.root == "/":
            return full
        if full == self.root:
            return "/"
        if full.startswith(self.root + os.sep):
            return "/" + os.path.relpath(full, self.root)
        return None

    def open(self, file, mode, *args, **kwargs):
        rel = self.rel(file)
        if rel is None or any(c in mode for c in "wax+"):
            return self._real("open")(file, mode, *args, **kwargs)
        return self._opened(f"open {rel}", file, lambda: self._real("open")(file, mode, *args, **kwargs))

    def _opened(self, ident: str, path, opener):
        """opener(), its failure or the file's content recorded under ident."""
        try:
            opened = opener()
        except OSError as e:
            self.log.files.setdefault(ident, encode_error(e))
            raise
        self._keep_content(ident, path)
        return opened

    def _keep_content(self, ident: str, path: str) -> None:
        if ident in self.log.files:
            return
        try:
            with self._real("open")(path, "rb") as g:
                data = g.read()
        except OSError as e:  # it opens, and fails on read (sysfs EOPNOTSUPP...)
            self.log.files[ident] = encode_error(e)
            return
        try:
            self.log.files[ident] = {"text": data.decode("utf-8")}
        except UnicodeDecodeError:
            self.log.files[ident] = {"$bytes": base64.b64encode(data).decode()}

    def os_open(self, path, flags, mode=0o777):
        """Owned files' reads (host/files.py) keep their content."""
        rel = self.rel(path)
        reading = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_DIRECTORY) == 0
        if rel is None or not reading:
            return self._real("os.open")(path, flags, mode)
        return self._opened(f"open {rel}", path, lambda: self._real("os.open")(path, flags, mode))

    def write(self, op: str, path, args: tuple, kwargs: dict):
        result = self._real(op)(path, *args, **kwargs)
        rel = self.rel(path) if isinstance(path, str) else None
        if rel is not None and op in ("mkdir", "rmdir"):
            self.log.files.setdefault(f"{op} {rel}", {"value": None})
        return result

    def simple(self, op: str, path: str, args: tuple, kwargs: dict):
        rel = self.rel(path)
        if rel is None:
            return self._real(op)(path, *args, **kwargs)
        ident = f"{op} {rel}" + (f" {args[0]}" if op == "access" else "")
        try:
            result = self._real(op)(path, *args, **kwargs)
        except OSError as e:
            self.log.files.setdefault(ident, encode_error(e))
            raise
        if op in ("stat", "lstat"):
            self.log.files.setdefault(ident, {"stat": _stat_fields(result)})
        else:
            self.log.files.setdefault(ident, {"value": encode(result)})
        return result

    def scandir(self, path: str):
        return self.inner.scandir(path)

    def mkstemp(self, prefix: str, directory: str) -> tuple:
        return self.inner.mkstemp(prefix, directory)

    def netlink(self, protocol: int):
        return self.inner.netlink(protocol)

    def inet_socket(self):
        return self.inner.inet_socket()

    def ioctl(self, sock, ifname: str, buf) -> int:
        return self.inner.ioctl(sock, ifname, buf)

    def unix_connect(self, path: str, timeout: float):
        return self.inner.unix_connect(path, timeout)

    def run(self, argv: list, timeout: float) -> tuple:
        return self.inner.run(argv, timeout)

    def key_load(self, path: str, length=None, uid: int = 0) -> tuple:
        ident = _key_ident(path, length)
        try:
            key, fp = self.inner.key_load(path, length, uid)
        except Exception as e:
            self.log.calls.setdefault(ident, encode_error(e))
            raise
        self.log.calls.setdefault(ident, {"fingerprint": fp, "length": len(key)})
        return key, fp


def plan_reads(host: Host) -> None:
    """What a later plan may read beyond what show read: every registered
    family's declaration (knobs/base.py Family.plan_reads)."""
    from nictune.host import knobs

    done = set()
    for name in knobs.CATALOG:
        family = knobs.load(name)
        if family not in done:
            done.add(family)
            family.plan_reads(host)


def record(host: Host, run: Callable[[], Any], when: str):
    """run() on host with every read logged; (its result, the snapshot's
    "reads" part).  `when` is the time of the recording (ISO 8601 UTC)."""
    log = Log()
    live = host.io
    host.io = SessionIO(_Recorder(host.root, log, live), live)
    _wrap_host(host, log)
    try:
        result = run()
        plan_reads(host)
    finally:
        host.io = live
    return result, {"root_is_system": os.path.abspath(host.root) == "/", "recorded": when,
                    "netns": host.netns, "calls": log.calls, "files": log.files}


# -- replaying --------------------------------------------------------------------

FAKE_ROOT = "/nictune-snapshot"  # the root of a snapshot recorded from a file tree


class _Replayer:
    """Serves the recorded file operations; refuses every other."""

    def __init__(self, reads: dict, root: str, where: str):
        self.calls = reads.get("calls") or {}
        self.files = reads.get("files") or {}
        self.root = root
        self.where = where
        self._listed: Dict[str, set] = {}
        for ident, result in self.files.items():
            op, _, rest = ident.partition(" ")
            if op == "listdir" and "value" in result:
                self._listed[rest] = set(result["value"])

    def not_recorded(self, what: str) -> BaseException:
        """The error for a read the recording does not hold."""
        return NotInSnapshot(f"{self.where}: {what}")

    def rel(self, path: str) -> Optional[str]:
        full = os.path.normpath(path if os.path.isabs(path) else os.path.join("/", path))
        if self.root == "/":
            return full
        if full == self.root or full.startswith(self.root + os.sep):
            return "/" + os.path.relpath(full, self.root) if full != self.root else "/"
        return None

    def _missing(self, what: str, rel: Optional[str]):
        """ENOENT when a recorded listing of an ancestor lacks the path's
        next component (it was not there); otherwise not in the snapshot."""
        if rel is not None:
            parts = rel.strip("/").split("/")
            for i in range(len(parts) - 1, -1, -1):
                listed = self._listed.get("/" + "/".join(parts[:i]) if i else "/")
                if listed is not None:
                    if parts[i] not in listed:
                        return FileNotFoundError(2, os.strerror(2), rel)
                    break
        return self.not_recorded(f"{what} of {rel or 'a path outside the host root'}")

    def _result(self, ident: str, what: str, rel: Optional[str]):
        result = self.files.get(ident) if rel is not None else None
        if result is None:
            raise self._missing(what, rel)
        if "$raise" in result:
            raise decode_error(result)
        return result

    def open(self, file, mode, *args, **kwargs):
        if any(c in mode for c in "wax+"):
            raise SnapshotWrite(f"{self.where}: an offline plan never writes ({file})")
        rel = self.rel(file)
        result = self._result(f"open {rel}", "the content", rel)
        data = result["text"].encode() if "text" in result else base64.b64decode(result["$bytes"])
        if "b" in mode:
            return io.BytesIO(data)
        return io.StringIO(data.decode(kwargs.get("encoding") or "utf-8"))

    def os_open(self, path, flags, mode=0o777):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise SnapshotWrite(f"{self.where}: an offline plan never writes ({path})")
        rel = self.rel(path)
        result = self._result(f"open {rel}", "the content", rel)
        data = result["text"].encode() if "text" in result else base64.b64decode(result["$bytes"])
        return _regular_fd(data)

    def write(self, op: str, path, args: tuple, kwargs: dict):
        rel = self.rel(path) if isinstance(path, str) else None
        if op in ("mkdir", "rmdir") and f"{op} {rel}" in self.files:
            return None  # as the recording did, and undid: nothing is touched here
        raise SnapshotWrite(f"{self.where}: an offline plan never writes ({op} {path})")

    def simple(self, op: str, path: str, args: tuple, kwargs: dict):
        if op == "stat" and not kwargs.get("follow_symlinks", True):
            op = "lstat"  # as the recording filed it
        rel = self.rel(path)
        ident = f"{op} {rel}" + (f" {args[0] if args else kwargs.get('mode')}" if op == "access"
                                 else "")
        if op == "stat" and ident not in self.files and rel in self._listed:
            # It was listed: a directory (its other fields are not nictune's concern).
            return os.stat_result([stat_mod.S_IFDIR | 0o755] + [0] * 9)
        result = self._result(ident, op, rel)
        if "stat" in result:
            return os.stat_result(result["stat"])
        return decode(result["value"])


    def scandir(self, path: str):
        raise self.not_recorded(f"a directory scan of {path!r}")

    def mkstemp(self, prefix: str, directory: str) -> tuple:
        raise SnapshotWrite(f"{self.where}: an offline plan never writes (a file in {directory})")

    def _no_socket(self) -> BaseException:
        return self.not_recorded("a socket to the host (OVSDB state is not recorded)")

    def netlink(self, protocol: int):
        raise self._no_socket()

    def inet_socket(self):
        raise self._no_socket()

    def unix_connect(self, path: str, timeout: float):
        raise self._no_socket()

    def run(self, argv: list, timeout: float) -> tuple:
        raise self.not_recorded(f"a run of {argv[0] if argv else 'a tool'} (commands are "
                                "not recorded)")

    def ioctl(self, sock, ifname: str, buf) -> int:
        raise self._no_socket()

    def key_load(self, path: str, length=None, uid: int = 0) -> tuple:
        """The recorded fingerprint and a zeroed key of the recorded length:
        a plan compares fingerprints, it never hands a key to the kernel."""
        result = self.calls.get(_key_ident(path, length))
        if result is None:
            raise self.not_recorded(f"key file {path} (its fingerprint; snapshots "
                                    "hold no key material)")
        if "$raise" in result:
            raise decode_error(result)
        return bytearray(result["length"]), result["fingerprint"]


def _regular_fd(data: bytes) -> int:
    """A descriptor of a regular file holding data, for code that checks
    fstat (host/files.py): a memfd, or elsewhere (a controller on macOS)
    an unlinked temporary file of the controller's own."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("nictune-snapshot", os.MFD_CLOEXEC)
    else:
        import tempfile
        import uuid

        path = os.path.join(tempfile.gettempdir(), f".nictune-snapshot-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(path)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _ReplayHandle:
    def __init__(self, calls: dict, name: str, where: str):
        self._calls, self._name, self._where = calls, name, where

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *a, **k: _replay_call(self._calls, self._name, method, a, k, self._where)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def close(self) -> None:
        pass


def _replay_call(calls: dict, handle: str, method: str, args: tuple, kwargs: dict, where: str):
    result = calls.get(_call_id(handle, method, args, kwargs))
    if result is None or "$missing" in result:
        if method.startswith(WRITES):
            raise SnapshotWrite(f"{where}: an offline plan never writes ({handle}.{method})")
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        raise NotInSnapshot(f"{where}: {handle} {method}({shown})")
    if "$raise" in result:
        raise decode_error(result)
    return decode(result["value"])


class _ReplayCounters:
    """The recorded counters: one instant.  Whether a counter rises takes
    a second reading some seconds later (knobs/expect.py), which no
    snapshot has: after the wait, every counter the interface had (ethtool
    statistics, its RDMA port's hw_counters, its netdev statistics, which
    health.counters takes in that order) reads as Unsupported, never as the
    same value again ("did not rise")."""

    def __init__(self, host: "RecordedHost"):
        self._host = host
        self._clock = 0.0

    def ethtool_stats(self, ifname: str):
        stats = _replay_call(self._host.calls, "counters", "ethtool_stats", (ifname,), {},
                             self._host.where)
        if not self._host.later:
            return stats
        from nictune.host.facts import rdma
        from nictune.host.facts.health import NETDEV_STATISTICS
        from nictune.host.model import Unsupported

        names = set(stats)
        bases = [("sys/class/net", ifname, NETDEV_STATISTICS)]
        port = rdma.netdev_ports(self._host).get(ifname)
        if port:
            bases.append((rdma.IB_CLASS, port[0], "ports", str(port[1]), "hw_counters"))
        for base in bases:
            try:
                names |= set(self._host.io.listdir(self._host.path(*base)))
            except (OSError, NotInSnapshot):
                pass
        why = Unsupported(f"{self._host.where}: a counter's rise (a snapshot holds one instant)")
        return {name: why for name in names}

    def now(self) -> float:
        return self._clock

    def sleep(self, seconds: float) -> None:
        self._clock += seconds
        self._host.later = True


class RecordedHost(Host):
    """A Host whose every read comes from a snapshot; read-only."""

    def __init__(self, reads: dict, label: str = "snapshot"):
        root = "/" if reads.get("root_is_system") else FAKE_ROOT
        super().__init__(root)
        self.where = f"not in the snapshot of {reads.get('recorded', '?')}"
        self.calls = reads.get("calls") or {}
        self.reads = reads
        self.later = False  # past a wait for a counter's second reading
        self.counter_source = _ReplayCounters(self)
        self.io = SessionIO(_Replayer(reads, self.root, self.where))
        # The namespace the recording ran in (its /etc/netns/NAME files):
        # the request cannot name it, the controller is not in it.
        self._netns = reads.get("netns") if isinstance(reads.get("netns"), str) else None

    @property
    def netns(self):
        return getattr(self, "_netns", None)

    @netns.setter
    def netns(self, value) -> None:
        pass  # the snapshot's, whatever the request says

    def _handle(self, name: str):
        return _ReplayHandle(self.calls, name, self.where)

    def rtnl(self):
        return self._handle("rtnl")

    def ethtool(self):
        return self._handle("ethtool")

    def dcb(self):
        return self._handle("dcb")

    def tunables(self):
        return self._handle("tunables")

    def devlink(self):
        _replay_call(self.calls, "host", "devlink", (), {}, self.where)
        return self._handle("devlink")

    def macsec(self):
        return self._handle("macsec")

    def xfrm(self):
        return self._handle("xfrm")

    def inet(self):
        return self._handle("inet")

    def _drvinfo(self, ifname: str):
        return _replay_call(self.calls, "host", "drvinfo", (ifname,), {}, self.where)

    def page_size(self) -> int:
        return _replay_call(self.calls, "host", "page_size", (), {}, self.where)

    def replaying(self):
        """Kept for callers: the snapshot answers through self.io already,
        in any thread, with nothing of the process patched."""
        import contextlib

        return contextlib.nullcontext(self)

    def close(self) -> None:
        pass


def snapshot_document(reads: dict, agent_version: str) -> dict:
    """The snapshot as a report carries it; the controller adds the host
    label (control/review/snapshots.py) and writes it."""
    return {"nictune_snapshot": SNAPSHOT_FORMAT, "recorded": reads["recorded"],
            "agent": agent_version, "reads": reads}
