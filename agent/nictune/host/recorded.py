"""Snapshots: a host's reads, recorded at the Host seam, and replayed offline.

`nictune show --save DIR` (and `audit --save DIR`) asks the agent to run a
show under record(): every read nictune makes of the host is logged with
its answer, and the log is the snapshot.  `nictune plan --from-snapshots`
runs the same agent request in the controller against a RecordedHost,
which answers those reads from the log: the same engine and knob families
plan it, nothing re-implements the diff.

What is recorded, and how:

- the kernel handles a Host hands out (rtnl(), ethtool(), dcb(),
  devlink(), tunables(), the drvinfo ioctl, page_size(), the counter
  source), and those the MACsec and IPsec families open themselves
  (netlink/macsec.py Macsec, netlink/xfrm.py Xfrm): every method called on
  them, with its arguments and its result or error (NetlinkError errno and
  extack included);
- key files (host/keyfile.py load): their fingerprint and key length only;
- the files read under Host.root (sysfs, /proc/sys, owned files such as
  /etc/nccl.conf): open() for reading, os.stat/lstat, os.listdir,
  os.readlink, os.access, and os.open by nictune.host.files (owned files
  are read that way).  The file-system calls are intercepted for the
  recording thread only, for the length of the run (_Intercept);
- besides what show reads: every sysctl under /proc/sys/net (a later
  profile may name one show does not print) with its writability.

The owned files' content is in the snapshot: it is the host's own state
(an NCCL/UCX/MPI environment file), stored where the operator keeps
snapshots.  Secrets are not: of a key file (MACsec/IPsec SA keys) only
the fingerprint is kept (what plans and the journal carry anyway), its
os.open by keyfile.py is never recorded, and the kernel never returns
MACsec or IPsec key material over netlink.

Replaying, a read the snapshot does not hold raises NotInSnapshot (a
NictuneError the engine turns into Unsupported("... not in the snapshot of
DATE ...") for that family's keys), never a default; a path whose parent
directory was listed and does not name it is absent (ENOENT), as it was.
Anything that would write (a set_* call, open() for writing, os.open other
than for reading, mkdir, unlink...) raises SnapshotWrite.  Any other socket
to the host (OVSDB's unix socket) is not recorded: replaying refuses it as
not in the snapshot.  A counter's rise (knobs/expect.py: two readings
seconds apart) is not in any snapshot: see _ReplayCounters.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import enum
import importlib
import io
import json
import os
import re
import socket
import stat as stat_mod
import sys
import threading
from typing import Any, Callable, Dict, Optional

from nictune.host.errors import UNSUPPORTED, NictuneError
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
    that may not be nictune's: host/snapcheck.py checks its values before
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


def _class(name: Any, kind: str) -> type:
    """The nictune class a snapshot names, of the kind its tag says.  A
    snapshot is data, not code to run: never a function, nor a class that
    another module imported ("nictune.host.agent:os.system" calls nothing)."""
    if not isinstance(name, str) or not _CLASS_NAME.fullmatch(name):
        raise ValueError(f"{shown(name)} is not the name of a nictune {kind} class")
    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if (not isinstance(obj, type) or obj.__module__ != module or obj.__qualname__ != qualname
            or not _CLASS_KINDS[kind](obj)):
        raise ValueError(f"{name} is not a nictune {kind} class")
    return obj


def encode_error(e: BaseException) -> dict:
    from nictune.host.netlink.errors import NetlinkError

    if isinstance(e, NetlinkError):
        return {"$raise": "netlink", "errno": e.errno, "extack": e.extack}
    if isinstance(e, OSError):
        return {"$raise": "os", "errno": e.errno, "strerror": e.strerror}
    if isinstance(e, NictuneError):
        return {"$raise": _class_name(type(e)), "message": str(e)}
    return {"$raise": "value", "message": str(e)}


def decode_error(r: dict) -> BaseException:
    from nictune.host.netlink.errors import NetlinkError

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
    from nictune.host import health

    for name in ("rtnl", "ethtool", "dcb", "tunables"):
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


# -- file operations, for one thread at a time ------------------------------------

_REAL = {"open": builtins.open, "os.open": os.open, "stat": os.stat, "lstat": os.lstat,
         "listdir": os.listdir, "scandir": os.scandir, "readlink": os.readlink,
         "access": os.access, "socket": socket.socket}
# Writes: passed through while recording (a show writes nothing but the
# rdma_cm configfs directory it reads through, made and removed again);
# refused while replaying, but for such a directory the recording made.
_WRITE_OPS = ("mkdir", "rmdir", "unlink", "remove", "replace", "rename", "symlink", "chmod",
              "chown", "truncate", "link")
_REAL.update({op: getattr(os, op) for op in _WRITE_OPS})
_local = threading.local()
_installed = [0]
_install_lock = threading.Lock()


def _session():
    return getattr(_local, "session", None)


def _install() -> None:
    with _install_lock:
        _installed[0] += 1
        if _installed[0] > 1:
            return
        builtins.open = _open
        os.open = _os_open
        os.stat = _stat
        os.lstat = _lstat
        os.listdir = _listdir
        os.scandir = _scandir
        os.readlink = _readlink
        os.access = _access
        socket.socket = _socket
        for op in _WRITE_OPS:
            setattr(os, op, _writer(op))
        for module, attr, name in _OWN_HANDLES:
            setattr(importlib.import_module(module), attr, _own_handle(module, attr, name))
        importlib.import_module("nictune.host.keyfile").load = _key_load()
        importlib.import_module("nictune.host.netlink.ioctl")._kernel = _ioctl


def _uninstall() -> None:
    with _install_lock:
        _installed[0] -= 1
        if _installed[0]:
            return
        builtins.open = _REAL["open"]
        os.open = _REAL["os.open"]
        os.stat, os.lstat = _REAL["stat"], _REAL["lstat"]
        os.listdir, os.scandir = _REAL["listdir"], _REAL["scandir"]
        os.readlink, os.access = _REAL["readlink"], _REAL["access"]
        socket.socket = _REAL["socket"]
        for op in _WRITE_OPS:
            setattr(os, op, _REAL[op])
        for module, attr, _name in _OWN_HANDLES:
            mod = importlib.import_module(module)
            setattr(mod, attr, getattr(mod, attr).real)
        keyfile = importlib.import_module("nictune.host.keyfile")
        keyfile.load = keyfile.load.real
        ioctl = importlib.import_module("nictune.host.netlink.ioctl")
        ioctl._kernel = ioctl.kernel_siocethtool


class _Intercept:
    """Activates a session (a _Recorder or a _Replayer) for this thread."""

    def __init__(self, session):
        self.session = session

    def __enter__(self):
        if _session() is not None:
            raise RuntimeError("a recording or replay is already running in this thread")
        _install()
        _local.session = self.session
        return self.session

    def __exit__(self, *exc):
        _local.session = None
        _uninstall()


def _open(file, mode="r", *args, **kwargs):
    s = _session()
    if s is None or not isinstance(file, str):
        return _REAL["open"](file, mode, *args, **kwargs)
    return s.open(file, mode, *args, **kwargs)


def _os_open(path, flags, *args, **kwargs):
    s = _session()
    if s is None or not isinstance(path, str) or kwargs.get("dir_fd") is not None:
        if s is not None and isinstance(s, _Replayer):
            raise s.not_recorded(f"opening {path!r} relative to a directory")
        return _REAL["os.open"](path, flags, *args, **kwargs)
    return s.os_open(path, flags, *args, **kwargs)


def _simple(op: str):
    def call(path, *args, **kwargs):
        s = _session()
        if s is None or not isinstance(path, str) or kwargs.get("dir_fd") is not None:
            if s is not None and isinstance(s, _Replayer):
                raise s.not_recorded(f"{op} of {path!r}")
            return _REAL[op](path, *args, **kwargs)
        return s.simple(op, path, args, kwargs)
    return call


_stat, _lstat, _listdir, _readlink, _access = (_simple(op) for op in
                                               ("stat", "lstat", "listdir", "readlink", "access"))


def _writer(op: str):
    def call(path, *args, **kwargs):
        s = _session()
        if s is None:
            return _REAL[op](path, *args, **kwargs)
        return s.write(op, path, args, kwargs)
    return call


def _scandir(path="."):
    s = _session()
    if isinstance(s, _Replayer):
        raise s.not_recorded(f"a directory scan of {path!r}")
    return _REAL["scandir"](path)


# The handles some families open themselves, not through the Host (their
# module attribute is what those families import when they run).
_OWN_HANDLES = (("nictune.host.netlink.xfrm", "Xfrm", "xfrm"),
                ("nictune.host.netlink.macsec", "Macsec", "macsec"))


def _ioctl(sock, ifname, buf):
    s = _session()
    if hasattr(s, "ioctl"):  # host/rawreads.py
        return s.ioctl(sock, ifname, buf)
    return importlib.import_module("nictune.host.netlink.ioctl").kernel_siocethtool(sock, ifname, buf)


def _own_handle(module: str, attr: str, name: str):
    real = getattr(importlib.import_module(module), attr)

    def make(*args, **kwargs):
        s = _session()
        if hasattr(s, "socket"):  # raw sessions see the handle's own sockets
            return real(*args, **kwargs)
        if isinstance(s, _Recorder):
            return _RecordingHandle(real(*args, **kwargs), name, s.log)
        if isinstance(s, _Replayer):
            return _ReplayHandle(s.calls, name, s.where)
        return real(*args, **kwargs)
    make.real = real
    return make


def _key_load():
    """keyfile.load, whose key never enters a snapshot: recording keeps the
    fingerprint and the key's length; replaying answers with that
    fingerprint and a zeroed key of that length (a plan compares
    fingerprints; it never hands a key to the kernel)."""
    from nictune.host import keyfile

    real = keyfile.load

    def load(path, length=None, uid=0):
        s = _session()
        ident = _call_id("keyfile", "load", (path,), {"length": length})
        if isinstance(s, _Recorder):
            try:
                key, fp = real(path, length, uid)
            except Exception as e:
                s.log.calls.setdefault(ident, encode_error(e))
                raise
            s.log.calls.setdefault(ident, {"fingerprint": fp, "length": len(key)})
            return key, fp
        if isinstance(s, _Replayer):
            result = s.calls.get(ident)
            if result is None:
                raise s.not_recorded(f"key file {path} (its fingerprint; snapshots "
                                     "hold no key material)")
            if "$raise" in result:
                raise decode_error(result)
            return bytearray(result["length"]), result["fingerprint"]
        return real(path, length, uid)
    load.real = real
    return load


def _socket(*args, **kwargs):
    s = _session()
    if hasattr(s, "socket"):  # host/rawreads.py: sockets recorded or replayed raw
        return s.socket(*args, **kwargs)
    if isinstance(s, _Replayer):
        raise s.not_recorded("a socket to the host (OVSDB state is not recorded)")
    return _REAL["socket"](*args, **kwargs)


def _stat_fields(st: os.stat_result) -> list:
    return [st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
            int(st.st_atime), int(st.st_mtime), int(st.st_ctime)]


class _Recorder:
    """Logs the file operations of the recording thread under root."""

    def __init__(self, root: str, log: Log):
        self.root = os.path.abspath(root)
        self.log = log

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
            return _REAL["open"](file, mode, *args, **kwargs)
        return self._opened(f"open {rel}", file, lambda: _REAL["open"](file, mode, *args, **kwargs))

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
            with _REAL["open"](path, "rb") as g:
                data = g.read()
        except OSError as e:  # it opens, and fails on read (sysfs EOPNOTSUPP...)
            self.log.files[ident] = encode_error(e)
            return
        try:
            self.log.files[ident] = {"text": data.decode("utf-8")}
        except UnicodeDecodeError:
            self.log.files[ident] = {"$bytes": base64.b64encode(data).decode()}

    def os_open(self, path, flags, *args, **kwargs):
        rel = self.rel(path)
        reading = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_DIRECTORY) == 0
        # Only owned files' reads (host/files.py) keep their content; key
        # files (host/keyfile.py) and the journal's own files never.
        caller = sys._getframe(2).f_globals.get("__name__")
        if rel is None or not reading or caller != "nictune.host.files":
            return _REAL["os.open"](path, flags, *args, **kwargs)
        return self._opened(f"open {rel}", path, lambda: _REAL["os.open"](path, flags, *args, **kwargs))

    def write(self, op: str, path, args: tuple, kwargs: dict):
        result = _REAL[op](path, *args, **kwargs)
        rel = self.rel(path) if isinstance(path, str) else None
        if rel is not None and op in ("mkdir", "rmdir"):
            self.log.files.setdefault(f"{op} {rel}", {"value": None})
        return result

    def simple(self, op: str, path: str, args: tuple, kwargs: dict):
        rel = self.rel(path)
        if rel is None:
            return _REAL[op](path, *args, **kwargs)
        if op == "stat" and not kwargs.get("follow_symlinks", True):
            op, kwargs = "lstat", {k: v for k, v in kwargs.items() if k != "follow_symlinks"}
        ident = f"{op} {rel}" + (f" {args[0] if args else kwargs.get('mode')}" if op == "access"
                                 else "")
        try:
            result = _REAL[op](path, *args, **kwargs)
        except OSError as e:
            self.log.files.setdefault(ident, encode_error(e))
            raise
        if op in ("stat", "lstat"):
            self.log.files.setdefault(ident, {"stat": _stat_fields(result)})
        else:
            self.log.files.setdefault(ident, {"value": encode(result)})
        return result


def _read_facts(host: Host) -> None:
    """The facts and capabilities a plan reads that a show may not: the
    page size (ring minima), each interface's devlink handle, SR-IOV
    counts, OFED ECN tree and RDMA port, every RDMA device's ports, link
    layers, GID tables and traffic class, and every devlink device's
    eswitch.  Each read goes through the same function the families call,
    so that the recorded call is the one a plan makes."""
    from nictune.host import rdma
    from nictune.host.health import Health
    from nictune.host.knobs.eswitch import devlink_handle
    from nictune.host.knobs.tunable import ETHTOOL_PFC_PREVENTION_TOUT

    host.page_size()
    os.path.isdir(host.path(rdma.IB_CLASS))
    health = Health(host)
    for iface in host.interfaces():
        devlink_handle(host, iface.name)
        health.counters(iface.name)
        for read in (lambda: host.dcb().get(iface.name),
                     lambda: _tunable(host, iface.name, ETHTOOL_PFC_PREVENTION_TOUT)):
            try:
                read()
            except OSError:  # EOPNOTSUPP: recorded as such
                pass
        for name in ("sriov_numvfs", "sriov_totalvfs"):
            _read_text(host.path("sys/class/net", iface.name, "device", name))
        ecn = host.path("sys/class/net", iface.name, "ecn")
        if os.path.isdir(ecn):
            _walk(ecn)
        rdma.port_of(host, iface.name)
    for dev in rdma.devices(host):
        os.path.realpath(host.path(rdma.IB_CLASS, dev, "device"))
        for port in rdma.ports(host, dev):
            rdma.link_layer(host, dev, port)
            rdma.gids(host, dev, port)
            _read_text(host.path(rdma.IB_CLASS, dev, "tc", str(port), "traffic_class"))
        _read_cm(host, dev)
    try:
        devlink = host.devlink()
        for handle in devlink.devices():
            try:
                devlink.eswitch(handle)
            except OSError:
                pass
    except OSError:
        pass


def _read_cm(host: Host, device: str) -> None:
    """The device's rdma_cm defaults (knobs/roce.py reads them through a
    configfs directory that exists while it is held: made and removed
    again, as a plan does)."""
    from nictune.host import rdma

    if not os.path.isdir(host.path(rdma.CM_CONFIGFS)):
        return
    try:
        with rdma.cm_device(host, device) as path:
            _walk(os.path.join(path, "ports"))
    except OSError:
        pass


def _tunable(host: Host, ifname: str, tunable_id: int) -> None:
    with host.tunables() as tunables:
        tunables.get(ifname, tunable_id)


def _read_text(path: str) -> None:
    try:
        with open(path) as f:
            f.read()
    except (OSError, UnicodeDecodeError):
        pass


def _walk(top: str) -> int:
    """Every file under top read, and whether it is writable."""
    count = 0
    stack = [top]
    while stack and count < MAX_WALK_FILES:
        here = stack.pop()
        try:
            names = sorted(os.listdir(here))
        except OSError:
            continue
        for name in names:
            path = os.path.join(here, name)
            if os.path.isdir(path):
                stack.append(path)
                continue
            count += 1
            os.access(path, os.W_OK)
            os.path.isfile(path)
            _read_text(path)
    return count


def record(host: Host, run: Callable[[], Any], when: str):
    """run() on host with every read logged; (its result, the snapshot's
    "reads" part).  `when` is the time of the recording (ISO 8601 UTC)."""
    log = Log()
    _wrap_host(host, log)
    with _Intercept(_Recorder(host.root, log)):
        result = run()
        _read_facts(host)
        # Every sysctl, so that a profile can name one a show does not print.
        _walk(host.path("proc/sys/net"))
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

    def os_open(self, path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise SnapshotWrite(f"{self.where}: an offline plan never writes ({path})")
        rel = self.rel(path)
        caller = sys._getframe(2).f_globals.get("__name__")
        if caller == "nictune.host.keyfile":
            raise self.not_recorded(f"key file {path}: snapshots hold no key material")
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
        fd = _REAL["os.open"](path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        _REAL["unlink"](path)
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
        from nictune.host import rdma
        from nictune.host.health import NETDEV_STATISTICS
        from nictune.host.model import Unsupported

        names = set(stats)
        bases = [("sys/class/net", ifname, NETDEV_STATISTICS)]
        port = rdma.netdev_ports(self._host).get(ifname)
        if port:
            bases.append((rdma.IB_CLASS, port[0], "ports", str(port[1]), "hw_counters"))
        for base in bases:
            try:
                names |= set(os.listdir(self._host.path(*base)))
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

    def _drvinfo(self, ifname: str):
        return _replay_call(self.calls, "host", "drvinfo", (ifname,), {}, self.where)

    def page_size(self) -> int:
        return _replay_call(self.calls, "host", "page_size", (), {}, self.where)

    def replaying(self) -> _Intercept:
        """The context in which this thread's file reads are the snapshot's."""
        return _Intercept(_Replayer(self.reads, self.root, self.where))

    def close(self) -> None:
        pass


def snapshot_document(reads: dict, agent_version: str) -> dict:
    """The snapshot as a report carries it; the controller adds the host
    label (control/review/snapshots.py) and writes it."""
    return {"nictune_snapshot": SNAPSHOT_FORMAT, "recorded": reads["recorded"],
            "agent": agent_version, "reads": reads}
