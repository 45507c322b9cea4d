"""The questions the probe asks (control/remote/probe.py), kept on the controller.

What a host's verify read, kept so that its next verify asks it all in
one batch, one round trip; a read it lacks is asked on demand, so the
cache is only a shortcut, and an answer is never kept.  Also kept: a
request's questions under a key of no host (Templates: the first batch
for a host never audited), and a verify no probe can answer (its reason:
the host goes to its agent at once until the key changes).

One file per (host, request, agent archive) in a directory of the
controller user's own, `$XDG_CACHE_HOME/nictune/probe` (~/.cache/...).
What is read back decides what root opens on every host, so nothing in the
directory is taken on trust:

- the directory must be the running user's, mode 0700 and not a symbolic
  link, or it is not used at all (CacheRefused: the verify goes to the
  agent, with a warning saying why);
- a file is opened without following a link and without waiting on a
  FIFO, and read only if it is a regular file of the user's, mode 0600, of
  at most MAX_FILE bytes; anything else is removed (the next verify asks
  on demand);
- what it holds is checked as a host's report is (probe.checked_questions).

The cache is pruned (prune()), at a process's first write to it and then
at most every PRUNE_INTERVAL seconds: files of another agent archive (an
older nictune: never looked up again) and of the old naming go; a host
keeps its MAX_PER_HOST most recently used files (one per profile version
or command line it is audited with); then the least recently used files go
until at most MAX_ENTRIES files and MAX_BYTES bytes are left.  A lookup
that finds a file touches it, so "least recently used" is by mtime.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import threading
import time
from typing import Optional

from nictune.control.remote import probe
from nictune.host.files import read_capped
from nictune.host.replay import probe_reads

# A checked question set (probe.MAX_QUESTION_BYTES of paths and requests)
# as JSON: base64 and quoting add a half at most.
MAX_FILE = 2 * probe.MAX_QUESTION_BYTES
MAX_PER_HOST = 4
MAX_ENTRIES = 250_000
MAX_BYTES = 2 << 30
PRUNE_INTERVAL = 60.0
STALE_TEMPORARY = 3600.0  # seconds: a writer that died left it
# archive tag - host tag - the whole key
_NAME = re.compile(r"^([0-9a-f]{12})-([0-9a-f]{16})-[0-9a-f]{64}\.json$")
_TEMPORARY = re.compile(r"^\..*\.tmp$")
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

_pruned_at: dict = {}  # directory -> time.monotonic() of its last pruning here
_pruning = threading.Lock()


class CacheRefused(Exception):
    """The cache directory is not safe to read: nothing in it is used."""


def _tag(value: str, length: int) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]


def archive_tag(archive: str) -> str:
    return _tag(archive, 12)


class QuestionCache:
    """The questions a verify asked, or, for a verify a probe cannot ask, why not:
    that host and request then go to the agent without a probe,
    until the profile or nictune changes (the key)."""

    def __init__(self, directory: Optional[str] = None):
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        self.directory = directory or os.path.join(home, "nictune", "probe")

    @staticmethod
    def key(where: list, request: dict, archive: str) -> str:
        asked = {k: v for k, v in request.items() if k not in ("learn",)}
        text = json.dumps([where, asked, archive], sort_keys=True, separators=(",", ":"), default=str)
        host = json.dumps(where, separators=(",", ":"), default=str)
        return f"{archive_tag(archive)}-{_tag(host, 16)}-{hashlib.sha256(text.encode()).hexdigest()}"

    # -- reading -------------------------------------------------------------

    def lookup(self, key: str) -> tuple:
        """(the questions to ask or None, whether this verify was found not
        to be askable by a probe).  Raises CacheRefused when the directory
        is not the user's own."""
        directory = self._open_directory(create=False)
        if directory is None:
            return None, False
        try:
            kept = self._read(directory, key + ".json")
        finally:
            os.close(directory)
        questions = probe.checked_questions(kept)
        return questions, questions is None and probe.refusal(kept) is not None

    def _read(self, directory: int, name: str):
        """The file's JSON, or None; a file that is not one of ours, or not
        JSON, is removed (the next verify asks on demand)."""
        try:
            fd = os.open(name, _READ, dir_fd=directory)
        except OSError as e:
            if e.errno != errno.ENOENT:  # a symbolic link (ELOOP), unreadable
                _unlink(directory, name)
            return None
        try:
            st = os.fstat(fd)
            data = read_capped(os.read, fd, MAX_FILE) if _is_own_file(st) else None
            if data is not None:
                os.utime(fd)  # the least recently used go first (prune)
        except OSError:
            data = None
        finally:
            os.close(fd)
        try:
            kept = json.loads(data) if data is not None else None
        except (ValueError, RecursionError):
            kept = None
        if kept is None:
            _unlink(directory, name)
        return kept

    # -- writing -------------------------------------------------------------

    def refused(self, key: str, why: str) -> None:
        """Keep that this verify needs a read no probe can answer (why): the
        next one goes to the agent at once."""
        self.put(key, {"format": probe_reads.FORMAT, "why_not": [why[:200]]})

    def put(self, key: str, q: dict) -> None:
        data = json.dumps(q).encode()
        if len(data) > MAX_FILE:
            return
        try:
            directory = self._open_directory(create=True)
        except (CacheRefused, OSError):
            return  # not kept: the next audit asks on demand
        try:
            _write(directory, key + ".json", data)
            self._prune_now_and_then(directory, key[:12])
        except OSError:
            pass
        finally:
            os.close(directory)

    def drop(self, key: str) -> None:
        try:
            directory = self._open_directory(create=False)
        except CacheRefused:
            return
        if directory is not None:
            _unlink(directory, key + ".json")
            os.close(directory)

    # -- the directory -------------------------------------------------------

    def _open_directory(self, create: bool) -> Optional[int]:
        """The directory, opened and checked; None when it does not exist."""
        if create:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            why = "it is a symbolic link" if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
            raise CacheRefused(self._refused(why)) from None
        st = os.fstat(fd)
        why = _not_private(st, 0o700)
        if why:
            os.close(fd)
            raise CacheRefused(self._refused(why))
        return fd

    def _refused(self, why: str) -> str:
        return (f"the probe's question cache {self.directory} is not used: {why}; every verify "
                "starts the agent until it is the user's own directory, mode 0700 (or is removed)")

    def _prune_now_and_then(self, directory: int, current: str) -> None:
        with _pruning:
            last = _pruned_at.get(self.directory)
            now = time.monotonic()
            if last is not None and now - last < PRUNE_INTERVAL:
                return
            _pruned_at[self.directory] = now
        prune(directory, current)


def _not_private(st: os.stat_result, mode: int) -> str:
    """Why st is not the running user's with at most `mode`, or ''."""
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if stat.S_IMODE(st.st_mode) & ~mode:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}, not {mode:04o}"
    return ""


def _is_own_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and not _not_private(st, 0o600) and st.st_size <= MAX_FILE


def _write(directory: int, name: str, data: bytes) -> None:
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    _unlink(directory, tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=directory)
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)


def _unlink(directory: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=directory)
    except OSError:
        pass


def prune(directory: int, current: str) -> int:
    """Remove what the policy above says goes; the number removed.
    `current` is the archive tag of the nictune running."""
    kept, gone = [], []
    now = time.time()
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            match = _NAME.fullmatch(entry.name)
            if match and match.group(1) == current and stat.S_ISREG(st.st_mode):
                kept.append((st.st_mtime, entry.name, match.group(2), st.st_size))
            elif match or entry.name.endswith(".json") or (
                    _TEMPORARY.fullmatch(entry.name) and now - st.st_mtime > STALE_TEMPORARY):
                gone.append(entry.name)
    kept.sort(reverse=True)  # most recently used first
    per_host: dict = {}
    entries_left, bytes_left = 0, 0
    for mtime, name, host, size in kept:
        per_host[host] = per_host.get(host, 0) + 1
        if (per_host[host] > MAX_PER_HOST or entries_left + 1 > MAX_ENTRIES
                or bytes_left + size > MAX_BYTES):
            gone.append(name)
        else:
            entries_left, bytes_left = entries_left + 1, bytes_left + size
    for name in gone:
        _unlink(directory, name)
    return len(gone)


# -- a first batch for a host never asked before ------------------------------------

# How long a host with no questions of its own waits for the first host of
# its request to finish, so as to start from that host's questions rather
# than ask every read on demand (a round trip each, 44 for the bench's
# profile on a lab host).  Measured with 50 cold hosts at once (forks 50, a
# loaded 2-core machine, 6 rounds each, interleaved): waiting, 92 round
# trips in all, wall 3.3 s (median), controller CPU 22 ms a host; each on
# its own, 2,150 round trips, 5.2 s, 28 ms.  A bound: a leader that hangs
# costs its followers this much at most, and they then go on alone.
TEMPLATE_WAIT = 5.0


class _Lead:
    """The first host of a request this run: its questions become the template."""

    def __init__(self, templates: "Templates", key: tuple, cache: QuestionCache):
        self._templates, self._key, self._cache = templates, key, cache

    def done(self, questions: Optional[dict]) -> None:
        """questions: what the leader's verify used; None when it went to its agent."""
        self._templates.settle(self._key, questions)
        if questions is not None:
            self._cache.put(self._key[1], questions)


class Templates:
    """The questions one host was asked, offered as the first batch to the
    other hosts audited with the same request (the profile, not the host),
    in this run and, kept in the question cache under a key of no host, in
    later runs: hosts of one profile mostly read the same things, and a
    question a host does not need costs it only the read.  The first host
    of a request leads; the others of that request wait for it (at most
    TEMPLATE_WAIT) rather than each ask every read one round trip at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict = {}    # key -> questions (None: its leader went to its agent)
        self._waits: dict = {}    # key -> threading.Event, set when the leader is done

    @staticmethod
    def key(request: dict, archive: str) -> str:
        asked = {k: v for k, v in request.items() if k not in ("host", "state_dir")}
        # A "host" of its own per request: pruning keeps MAX_PER_HOST files a host.
        text = json.dumps(asked, sort_keys=True, separators=(",", ":"), default=str)
        return QuestionCache.key(["any host", _tag(text, 32)], asked, archive)

    def seed(self, cache: QuestionCache, request: dict, archive: str, timeout: float) -> tuple:
        """(The questions to ask first or None, a _Lead to tell when this
        host leads its request, else None)."""
        key = self.key(request, archive)
        here = (cache.directory, key)
        with self._lock:
            if here in self._known:
                return self._known[here], None
            event = self._waits.get(here)
            leads = event is None
            if leads:
                event = self._waits[here] = threading.Event()
        if leads:
            try:
                kept = cache.lookup(key)[0]
            except CacheRefused:
                kept = None
            if kept is None:
                return None, _Lead(self, here, cache)
            self.settle(here, kept)
            return kept, None
        event.wait(min(TEMPLATE_WAIT, timeout / 4))
        with self._lock:
            return self._known.get(here), None

    def settle(self, here: tuple, questions: Optional[dict]) -> None:
        """The leader is done: its questions are the template; None (it
        went to its agent): the next host of the request leads."""
        with self._lock:
            if questions is not None:
                self._known.setdefault(here, questions)
            event = self._waits.pop(here) if questions is None else self._waits.get(here)
        if event is not None:
            event.set()


TEMPLATES = Templates()
