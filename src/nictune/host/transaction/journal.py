"""The apply journal and the locks, kept under the state directory.

The before-values of an apply are on disk before its first write, so a
crash mid-apply can still be undone by `nictune rollback`.

A state directory holds:
    journal.json        the last apply's record
    history/<id>.json   a copy of each of the last HISTORY_KEPT records of
                        users' applies, and of the last HISTORY_KEPT of the
                        resident agent's (kept apart, so that an agent
                        restoring drift never prunes the user's last apply).
                        Each copy's modification time is its apply's start,
                        so that the copies sort in the order of their
                        applies however often a rollback rewrites one.
                        Every record is written there first and to
                        journal.json second, so the newest copy is never
                        older than the journal: it stands in for a damaged
                        journal.json.  These copies are the apply history
                        (`nictune history`, and `nictune rollback --to ID`
                        or `--steps N`, which undo applies newest first,
                        one record at a time, each marked rolled back once
                        restored): as a newer apply finishes, a user's
                        apply older than the last HISTORY_KEPT loses its
                        copy, and no rollback can reach it any more.
    lock                one apply, rollback or confirmation at a time here
    desired.json        the profile of the last committed apply ({"path", "doc",
                        "sources", "apply": its id}): the host's desired state,
                        which the resident agent keeps (host/resident/daemon.py).
                        Written after its copy desired.json.copy, which
                        stands in for a damaged desired.json.  That
                        apply's record keeps the one before it
                        ("desired_before"), which its rollback puts back.
                        The resident agent's own applies (its restores and
                        re-tunes of that state) are journaled too, as
                        records "by": "agent" (ids ending in AGENT_SUFFIX):
                        `nictune rollback` passes over them to the user's
                        last apply (user_apply(); engine.Engine.rollback).
    agent-status.json   what the resident agent last wrote about itself
An apply or rollback also locks its target, outside any state directory
(TARGET_LOCK_DIR, one file per network namespace): two applies on one
namespace with different state directories must not interleave either.
That file also names the state directory of the namespace's last apply, so
that an apply from another one still waits for it to finish or be confirmed.
Once that apply has settled, the file is removed as the lock is released
(see "target lock files" below): it no longer says anything.

Root restores whatever a journal says, so nothing here may come from
another user.  Directories are created 0700 whatever the umask; every
directory and file used must be owned by the effective user and not be
writable by group or others, and so must the state directory's parents
(sticky ones such as /tmp aside); files are opened with O_NOFOLLOW,
relative to their opened directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import sys
import time
from contextlib import contextmanager, suppress

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune.host.errors import JournalDamaged, Locked, NictuneError, StateDirError
from nictune.host.validate import APPLY_ID, check_path

DEFAULT_STATE_DIR = "/var/lib/nictune"
# Format 2 added the resident agent's records ("by": "agent"): a nictune
# that knows only format 1 would roll one back as if it were the user's
# apply, so it refuses them instead.  Format 1 records are users' applies.
JOURNAL_FORMAT = 2
READABLE_FORMATS = (1, 2)
AGENT = "agent"
AGENT_SUFFIX = "-agent"
HISTORY_KEPT = 20
# Root's per-target locks.  /run is one tmpfs for every mount namespace that
# `ip netns exec` makes, so an agent in any of them finds the same lock.
TARGET_LOCK_DIR = "/run/nictune"
# getsockopt(SO_NETNS_COOKIE): Python's socket module does not name it.
_SO_NETNS_COOKIE = 71
# A journal larger than this is not one nictune wrote.
MAX_RECORD = 16 << 20
# Room an apply wants in its state directory besides its records' blocks,
# checked before its first write: a disk that fills up mid-apply costs a
# rollback.
SPACE_MARGIN = 64 << 10
INODES_NEEDED = 8

DESIRED = "desired.json"
# desired.json's copy, beside it: written first, it stands in for a damaged one.
DESIRED_COPY = "desired.json.copy"
# The resets an apply asked for (knobs/firmware.py: values stored for the next
# firmware reset or boot), with the boot they were asked in: a key still not
# running after that boot has ended is failed, never asked for again.
RESETS = "resets.json"

APPLYING = "applying"
COMMITTED = "committed"
ROLLED_BACK = "rolled-back"
ROLLBACK_FAILED = "rollback-failed"
STATUSES = (APPLYING, COMMITTED, ROLLED_BACK, ROLLBACK_FAILED)


# A remote apply's confirmation (see nictune/host/transaction/watchdog.py).
CONFIRM_PENDING = "pending"
CONFIRMED = "confirmed"
CONFIRM_EXPIRED = "expired"
CONFIRM_STATES = (CONFIRM_PENDING, CONFIRMED, CONFIRM_EXPIRED)
# How long after its deadline a still-pending confirmation blocks a new
# apply: the watchdog acts within a second, so only a dead one (host
# rebooted) leaves it pending that long.
CONFIRM_GRACE = 30.0

# An apply's id, which also names its file under history/.
_RECORD_ID = re.compile(APPLY_ID.strip("^$"))
_RECORD_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\.json")


def unconfirmed(record: Optional[dict], where: str = "") -> str:
    """Why a new apply must wait for `record`'s confirmation, or ''.
    `where` follows the apply's id (which journal it is in)."""
    confirm = (record or {}).get("confirm")
    if not confirm or confirm.get("state") != CONFIRM_PENDING or record["status"] != COMMITTED:
        return ""
    deadline = record.get("finished", record["started"]) + confirm["timeout"]
    if time.time() > deadline + CONFIRM_GRACE:
        return ""
    return (f"apply {record['id']}{where} awaits its controller's confirmation; unless it comes, "
            f"it is rolled back at {time.strftime('%H:%M:%S', time.localtime(deadline))}: "
            "wait for that, or run `nictune rollback`")


_agent_applies = [0]


def _agent_suffix() -> str:
    """The agent is one process that may apply twice in a second: a count
    keeps its ids (and history copies) apart."""
    _agent_applies[0] += 1
    return f".{_agent_applies[0]}{AGENT_SUFFIX}"


_user_applies = [0]


def _user_suffix() -> str:
    """A process that applies twice (a test, a library user) keeps its ids,
    and so its history copies, apart: the second and later get a count."""
    _user_applies[0] += 1
    return "" if _user_applies[0] == 1 else f".{_user_applies[0]}"


def is_agents(record: Optional[dict]) -> bool:
    """Whether `record` is one of the resident agent's own applies."""
    return (record or {}).get("by") == AGENT


def desired_stamp(desired: Optional[dict]):
    """What tells one stored desired state from another: the apply that
    stored it, and when."""
    return desired and (desired.get("apply"), desired.get("stored"))


def target_lock() -> str:
    """The lock of what one apply at a time protects: this thread's network
    namespace (a name is only a convention of `ip netns`)."""
    if os.geteuid() == 0:
        lock_dir = TARGET_LOCK_DIR
    else:  # /run is root's; only tests get this far without root
        lock_dir = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"nictune-{os.geteuid()}")
    return os.path.join(lock_dir, _netns_name() + ".lock")


def _netns_name() -> str:
    """The namespace's cookie (Linux >= 5.14), which no later namespace
    gets before the next boot, or else its inode, which one may: then a
    new namespace can find the last apply of a dead one recorded in its
    lock, and waits for that apply if it never finished."""
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            cookie = s.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8)
        return f"netns-{int.from_bytes(cookie, sys.byteorder)}"
    except OSError:  # ENOPROTOOPT before Linux 5.14
        pass
    try:
        st = os.stat("/proc/thread-self/ns/net")
    except FileNotFoundError:  # kernels before 3.17
        st = os.stat("/proc/self/ns/net")
    return f"net-{st.st_dev}-{st.st_ino}"


class Journal:
    def __init__(self, state_dir: str = DEFAULT_STATE_DIR, root: Optional[str] = None):
        self.dir = check_path(state_dir, "state directory")
        self.path = os.path.join(self.dir, "journal.json")
        self.history = os.path.join(self.dir, "history")
        # The Host's file root: when it is the real one, lock() also locks
        # the target.  (Another root is a test's fake host, whose kernel
        # lives in its process: nobody else can reach it.)
        self.root = root
        self.record: Optional[dict] = None
        # Set by the agent before a remote apply: {"token", "timeout"}.
        self.confirm: Optional[dict] = None
        # What the last load() worked around (a damaged journal.json).
        self.warnings: list = []
        # ... and the last load_desired() (a damaged desired.json).
        self.desired_warnings: list = []
        # The status journal.json last got from this object, for messages
        # about a write that failed after it.
        self.saved: Optional[str] = None
        self._target_fd: Optional[int] = None

    # -- locks ---------------------------------------------------------------

    @contextmanager
    def lock(self, wait: bool = False):
        """One apply or rollback at a time on this state directory and, given
        the real root, on the target.  `wait` blocks instead of raising Locked."""
        with self._target_lock(wait), self._state(create=True) as fd:
            os.close(self._history_fd(fd, create=True))
            lock = _open_checked(os.path.join(self.dir, "lock"), "lock file",
                                 os.O_RDWR | os.O_CREAT, dir_fd=fd)
            try:
                _flock(lock, wait, f"another nictune apply or rollback holds {self.dir}/lock")
                yield
            finally:
                os.close(lock)

    @contextmanager
    def _target_lock(self, wait: bool):
        if self.root is None or os.path.realpath(self.root) != "/":
            yield
            return
        path = target_lock()
        dir_fd = _open_dir(os.path.dirname(path), "lock directory", create=True)
        try:
            fd = _lock_file(dir_fd, path, wait, f"another nictune apply or rollback is running on "
                                                f"this network namespace (it holds {path}), perhaps "
                                                f"with another state directory than {self.dir}")
            try:
                self._target_fd = fd
                yield
            finally:
                self._target_fd = None
                # Hundreds of namespaces come and go (one file each): a file
                # that no longer records anything another state directory
                # must wait for goes with the lock.
                with suppress(OSError, NictuneError, ValueError):
                    _drop_if_settled(dir_fd, os.path.basename(path), fd)
                os.close(fd)
        finally:
            os.close(dir_fd)

    def other_state_dir(self) -> Optional[str]:
        """Under lock(): the state directory of the last apply on this
        target, when it is not this one (the target lock file records it)."""
        if self._target_fd is None:
            return None
        other = _claimed_state_dir(self._target_fd)
        return None if other == self.dir else other

    def _claim_target(self) -> None:
        if self._target_fd is None:
            return
        data = json.dumps({"state_dir": self.dir}).encode()
        try:
            os.ftruncate(self._target_fd, 0)
            os.pwrite(self._target_fd, data, 0)
        except OSError as e:
            raise StateDirError(f"cannot record this apply in its target lock "
                                f"{target_lock()}: {e.strerror or e}") from None

    # -- the record ----------------------------------------------------------

    def begin(self, changes: list, profile: Optional[str], aside: Optional[dict] = None,
              by: Optional[str] = None) -> dict:
        """Record the before-values, and `aside`, what the changes can take
        with them (nictune/host/transaction/aside.py): raises, having written nothing to
        the host, when the state directory cannot take them.  `by` is AGENT
        for the resident agent's own applies."""
        now = time.time()
        self.record = {
            "journal": JOURNAL_FORMAT,
            "id": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + f"-{os.getpid()}"
                  + (_agent_suffix() if by == AGENT else _user_suffix()),
            "started": now,
            "profile": profile,
            "status": APPLYING,
            "changes": [{"key": c.key.as_dict(), "before": c.before, "after": c.after,
                         "source": c.source} for c in changes],
        }
        if by is not None:
            self.record["by"] = by
        if aside:
            self.record["aside"] = aside
        if self.confirm:
            self.record["confirm"] = dict(self.confirm, state=CONFIRM_PENDING)
        self._check_space(len(_journal_text(self.record)))
        self._claim_target()
        try:
            self._write_record()
        except StateDirError:
            self._drop_copy()
            raise
        return self.record

    def finish(self, status: str, record: Optional[dict] = None) -> None:
        """Record how self.record (or another `record` of this journal,
        which then becomes self.record) ended."""
        if record is not None:
            self.record = record
        assert self.record is not None
        self.record["status"] = status
        self.record["finished"] = time.time()
        self._write_record(prune=True)

    def confirm_apply(self, token: str) -> str:
        """Confirm the apply that carries `token`.  Returns the confirmation's
        state afterwards: 'confirmed', or 'expired' when the watchdog was first,
        or '' when that apply is no longer the last one or no longer applied
        (a manual rollback came first)."""
        with self.lock(wait=True):
            record = self.load()
            confirm = (record or {}).get("confirm") or {}
            if confirm.get("token") != token:
                return ""
            if confirm["state"] == CONFIRM_PENDING and record["status"] == COMMITTED:
                confirm["state"] = CONFIRMED
                self._write_record()
            return "" if confirm["state"] == CONFIRM_PENDING else confirm["state"]

    def load(self) -> Optional[dict]:
        """The last apply's record, or None when there is none.  A damaged
        journal.json gives way to the newest history copy, with a warning in
        self.warnings; one that is not nictune's (owner, mode, a link) is
        refused: StateDirError."""
        self.warnings = []
        with self._state(create=False) as fd:
            if fd is None:
                return None
            try:
                self.record = _read_record(fd, "journal.json", self.path)
            except FileNotFoundError:
                return None
            except JournalDamaged as damaged:
                self.record = self._newest_copy(fd, damaged)
        return self.record

    def user_apply(self) -> Optional[dict]:
        """The newest record of a user's apply (not the resident agent's),
        from history/, or None when it holds none.  A damaged copy is
        JournalDamaged: skipping it would roll back an older apply."""
        with self._state(create=False) as fd:
            history = self._history_fd(fd, create=False) if fd is not None else None
            if history is None:
                return None
            try:
                names = [n for n in _records_by_age(history) if not _is_agent_file(n)]
                if not names:
                    return None
                path = os.path.join(self.history, names[-1])
                try:
                    return _read_record(history, names[-1], path)
                except FileNotFoundError:
                    raise JournalDamaged(f"the journal copy {path} vanished while it was read: "
                                         "run the rollback again") from None
            except OSError as e:
                raise StateDirError(_cannot("list", self.history, e)) from None
            finally:
                os.close(history)

    def user_records(self) -> list:
        """Every user's apply the history holds (not the resident agent's),
        newest first.  A damaged copy is JournalDamaged: a history with a
        hole in it cannot be rolled back through."""
        with self._state(create=False) as fd:
            history = self._history_fd(fd, create=False) if fd is not None else None
            if history is None:
                return []
            try:
                names = [n for n in _records_by_age(history) if not _is_agent_file(n)]
                records = []
                for name in names:
                    try:
                        records.append(_read_record(history, name, os.path.join(self.history, name)))
                    except FileNotFoundError:
                        continue  # pruned by another run meanwhile
            except OSError as e:
                raise StateDirError(_cannot("list", self.history, e)) from None
            finally:
                os.close(history)
        # Copies from before their times were the applies' own: by start.
        records.sort(key=lambda r: r.get("started") or 0, reverse=True)
        return records

    def _newest_copy(self, fd: int, damaged: JournalDamaged) -> dict:
        history = self._history_fd(fd, create=False)
        try:
            try:
                names = _records_by_age(history) if history is not None else []
            except OSError as e:
                raise StateDirError(_cannot("list", self.history, e)) from None
            if not names:
                raise JournalDamaged(
                    f"{damaged.message}, and {self.history} holds no copy of it: nictune cannot "
                    "tell what the last apply changed; look at it, then move it aside to go on")
            path = os.path.join(self.history, names[-1])
            try:
                record = _read_record(history, names[-1], path)
            except (FileNotFoundError, StateDirError) as e:
                why = getattr(e, "message", "it vanished")
                raise JournalDamaged(f"{damaged.message}, and its newest copy is not usable "
                                     f"either ({why}); look at both, then move them aside "
                                     "to go on") from None
        finally:
            if history is not None:
                os.close(history)
        self.warnings.append(f"{damaged.message}; using its newest copy {path} "
                             f"(apply {record['id']}, {record['status']})")
        return record

    # -- the desired state (the profile of the last committed apply) ----------

    def load_desired(self) -> Optional[dict]:
        """desired.json, or None when no apply has stored one.  Refused like a
        journal that is not nictune's (StateDirError).  A damaged one gives
        way to its copy (DESIRED_COPY, written before it), with a
        warning in self.desired_warnings; JournalDamaged when that is not
        usable either."""
        self.desired_warnings = []
        path = os.path.join(self.dir, DESIRED)
        with self._state(create=False) as fd:
            if fd is None:
                return None
            try:
                return _read_desired(fd, DESIRED, path)
            except FileNotFoundError:
                return None
            except JournalDamaged as damaged:
                return self._desired_copy(fd, damaged)

    def _desired_copy(self, fd: int, damaged: JournalDamaged) -> dict:
        path = os.path.join(self.dir, DESIRED_COPY)
        try:
            copy = _read_desired(fd, DESIRED_COPY, path)
        except (FileNotFoundError, StateDirError) as e:
            why = getattr(e, "message", None) or f"{path} does not exist"
            raise JournalDamaged(f"{damaged.message}; its copy is not usable either ({why}): "
                                 "apply the profile again to store it") from None
        self.desired_warnings.append(f"{damaged.message}; using its copy {path} "
                                     f"(apply {copy.get('apply')})")
        return copy

    def save_desired(self, desired: Optional[dict]) -> None:
        """Replace desired.json whole (0600), or remove it for None.  Its
        copy is written first and removed last, so it is never older than
        desired.json: it stands in for a damaged one (load_desired)."""
        try:
            with self._state(create=True) as fd:
                if desired is None:
                    for name in (DESIRED, DESIRED_COPY):
                        with suppress(FileNotFoundError):
                            os.unlink(name, dir_fd=fd)
                else:
                    text = json.dumps(desired, sort_keys=True)
                    _replace(fd, DESIRED_COPY, text)
                    _replace(fd, DESIRED, text)
        except OSError as e:
            raise StateDirError(f"cannot store the desired state in the state directory "
                                f"{self.dir}: {e.strerror or e}") from None

    def load_resets(self) -> dict:
        """resets.json: {key: {"value", "boot_id", "asked", "reset"}}, {} when
        there is none; a damaged one reads as none (it only ever makes a
        verdict stricter, never a write happen)."""
        try:
            with self._state(create=False) as fd:
                if fd is None:
                    return {}
                rfd = os.open(RESETS, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    data = json.loads(os.read(rfd, MAX_RECORD))
                finally:
                    os.close(rfd)
        except (OSError, ValueError, StateDirError):
            return {}
        return data if isinstance(data, dict) else {}

    def save_resets(self, resets: dict) -> None:
        try:
            with self._state(create=True) as fd:
                if resets:
                    _replace(fd, RESETS, json.dumps(resets, sort_keys=True))
                else:
                    with suppress(FileNotFoundError):
                        os.unlink(RESETS, dir_fd=fd)
        except OSError as e:
            raise StateDirError(f"cannot record the resets asked for in the state directory "
                                f"{self.dir}: {e.strerror or e}") from None

    # -- the state directory -------------------------------------------------

    @contextmanager
    def _state(self, create: bool):
        """The state directory's fd, checked; None if absent and not created."""
        try:
            fd = _open_dir(self.dir, "state directory", create)
        except FileNotFoundError:
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def _history_fd(self, fd: int, create: bool) -> Optional[int]:
        if create:
            _mkdir("history", dir_fd=fd, shown=self.history)
        try:
            return _open_checked(self.history, "history directory",
                                 os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd, want=stat.S_ISDIR)
        except FileNotFoundError:
            return None

    def _check_space(self, size: int) -> None:
        with self._state(create=True) as fd:
            try:
                st = os.fstatvfs(fd)
            except OSError as e:
                raise StateDirError(f"cannot check the free space in the state directory "
                                    f"{self.dir}: {e.strerror or e}") from None
        block = st.f_frsize or 4096
        # journal.json and its history copy, each beside its temporary
        # replacement while it is rewritten.
        need = 4 * -(-(size + 1024) // block) * block + SPACE_MARGIN
        free = st.f_bavail * st.f_frsize
        short = (f"{free // 1024} KiB free, and this apply's journal needs about "
                 f"{need // 1024} KiB" if free < need else
                 f"{st.f_favail} free inodes" if st.f_files and st.f_favail < INODES_NEEDED
                 else "")
        if short:
            raise StateDirError(f"the state directory {self.dir} has only {short}: nothing was "
                                "changed; make room there, or choose another --state-dir, and "
                                "apply again")

    def _write_record(self, prune: bool = False) -> None:
        """The history copy first, then journal.json (see the module doc)."""
        record = self.record
        try:
            with self._state(create=True) as fd:
                history = self._history_fd(fd, create=True)
                try:
                    name = record["id"] + ".json"
                    _replace(history, name, json.dumps(record, sort_keys=True))
                    _date_copy(history, name, record)
                    if prune:
                        for old in _prunable(_records_by_age(history)):
                            os.unlink(old, dir_fd=history)
                finally:
                    os.close(history)
                _replace(fd, "journal.json", _journal_text(record))
        except OSError as e:
            raise StateDirError(f"cannot write the journal in the state directory {self.dir}: "
                                f"{e.strerror or e}") from None
        self.saved = record["status"]

    def _drop_copy(self) -> None:
        """After a failed begin(): its history copy (if written) records an
        apply that never wrote anything.  Best effort: the failure that
        brought us here is the one to report."""
        with suppress(OSError, StateDirError), self._state(create=False) as fd:
            history = self._history_fd(fd, create=False) if fd is not None else None
            if history is not None:
                try:
                    os.unlink(self.record["id"] + ".json", dir_fd=history)
                finally:
                    os.close(history)


def _journal_text(record: dict) -> str:
    return json.dumps(record, indent=1, sort_keys=True)


# -- opening what can be trusted -----------------------------------------------

def _open_dir(path: str, what: str, create: bool) -> int:
    """Open directory `path` (made 0700 with its missing parents if
    `create`), after checking it and its parents.  FileNotFoundError when
    absent and not created."""
    if create:
        _make_dirs(path)
    _check_parents(path, what)
    return _open_checked(path, what, os.O_RDONLY | os.O_DIRECTORY, want=stat.S_ISDIR)


def _make_dirs(path: str) -> None:
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        _mkdir(d)


def _mkdir(path: str, dir_fd: Optional[int] = None, shown: Optional[str] = None) -> None:
    """mkdir 0700: the umask can only take bits away, and those bits are
    put back on the new directory itself, never through a link."""
    try:
        os.mkdir(path, 0o700, dir_fd=dir_fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    except FileExistsError:
        return  # whoever made it, it is checked before use
    except OSError as e:
        raise StateDirError(_cannot("create", shown or path, e)) from None


def _check_parents(path: str, what: str) -> None:
    """Who may rename or replace a parent of `path` decides what it is."""
    uid = os.geteuid()
    parent = os.path.realpath(os.path.dirname(path))
    while True:
        st = os.lstat(parent)
        open_to_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, uid) or open_to_others:
            raise StateDirError(
                f"the {what} {path} is inside {parent}, which "
                + (f"is owned by uid {st.st_uid}" if st.st_uid not in (0, uid) else
                   f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
                + ": whoever may replace it could make nictune restore from their files; "
                "use a directory only root can change")
        if parent == "/":
            return
        parent = os.path.dirname(parent)


def _open_checked(path: str, what: str, flags: int, dir_fd: Optional[int] = None,
                  want=stat.S_ISREG) -> int:
    """Open `path` (by its last part, relative to `dir_fd` if given), not
    through a link, and refuse it unless it is of the wanted type, ours,
    and writable by nobody else.  FileNotFoundError passes through."""
    name = os.path.basename(path) if dir_fd is not None else path
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        # A link is ELOOP, or ENOTDIR where a directory is wanted.
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(name, dir_fd):
            raise StateDirError(f"the {what} {path} is a symbolic link: nictune opens its "
                                "state only through real files and directories; remove the "
                                "link") from None
        if e.errno == errno.ENOTDIR:
            raise StateDirError(f"the {what} {path} is not a directory") from None
        raise StateDirError(_cannot("open", path, e, what)) from None
    try:
        st = os.fstat(fd)
        if not want(st.st_mode):
            kind = "directory" if want is stat.S_ISDIR else "regular file"
            raise StateDirError(f"the {what} {path} is not a {kind}: nictune did not make it; "
                                "remove it")
        _check_owned(st, path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, dir_fd: Optional[int]) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _check_owned(st: os.stat_result, path: str, what: str) -> None:
    uid = os.geteuid()
    if st.st_uid != uid:
        raise StateDirError(f"the {what} {path} belongs to uid {st.st_uid}, not {uid}: nictune "
                            "trusts only its own state (root restores what a journal says); "
                            "remove it if you do not know how it got there")
    if st.st_mode & 0o022:
        raise StateDirError(f"the {what} {path} is writable by group or others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): nictune trusts only state nobody "
                            f"else can change; `chmod go-w {path}` if it is nictune's")


def _cannot(verb: str, path: str, e: OSError, what: str = "") -> str:
    hint = (" (apply and rollback run as root; see --state-dir)"
            if isinstance(e, PermissionError) else "")
    return f"cannot {verb} the {what + ' ' if what else ''}{path}: {e.strerror or e}{hint}"


def _flock(fd: int, wait: bool, held: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            raise Locked(held) from None
        raise


# -- target lock files -----------------------------------------------------------
# One file per network namespace in TARGET_LOCK_DIR.  A file is removed only
# by a process that holds its flock (unlink while holding), and whoever
# takes a lock checks, once it holds it, that the path still names the
# inode it locked, else opens the path again: a process that opened the
# file just before it was removed, and got the lock once it was, never
# holds a lock nobody else can find.  (flock(2) locks the inode, not the
# name.)
_LOCK_ATTEMPTS = 100


def _lock_file(dir_fd: int, path: str, wait: bool, held: str) -> int:
    name = os.path.basename(path)
    for _ in range(_LOCK_ATTEMPTS):
        fd = _open_checked(path, "target lock", os.O_RDWR | os.O_CREAT, dir_fd=dir_fd)
        try:
            _flock(fd, wait, held)
            if _still_named(dir_fd, name, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed (or replaced) while we waited: lock the new one
    raise StateDirError(f"the target lock {path} was removed {_LOCK_ATTEMPTS} times while "
                        "nictune waited for it: something other than nictune is removing it")


def _still_named(dir_fd: int, name: str, fd: int) -> bool:
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _claimed_state_dir(fd: int) -> Optional[str]:
    """The state directory a target lock file records (_claim_target), or
    None when it records none (empty: never claimed) or is not ours."""
    try:
        other = json.loads(os.pread(fd, 8192, 0)).get("state_dir")
        return check_path(other, "state directory")
    except (ValueError, AttributeError):
        return None


def _drop_if_settled(dir_fd: int, name: str, fd: int) -> bool:
    """Holding `fd`'s flock: remove the file when the apply it records has
    settled (finished, and not awaiting a confirmation), so that no other
    state directory's apply has to wait for it.  True when removed."""
    if os.pread(fd, 1, 0):
        claimed = _claimed_state_dir(fd)
        if claimed is None:
            return False  # something we cannot read: keep it
        record = Journal(claimed).load()  # a damaged one raises: kept
        if record is not None and (record["status"] == APPLYING or unconfirmed(record)):
            return False
    os.unlink(name, dir_fd=dir_fd)
    return True


# -- reading and writing records ------------------------------------------------

def _read_record(dir_fd: int, name: str, path: str) -> dict:
    """The record in `name`: FileNotFoundError, StateDirError (not ours) or
    JournalDamaged (not a record)."""
    fd = _open_checked(path, "journal", os.O_RDONLY, dir_fd=dir_fd)
    try:
        data = b""
        while len(data) <= MAX_RECORD:
            more = os.read(fd, MAX_RECORD + 1 - len(data))
            if not more:
                break
            data += more
    except OSError as e:
        raise JournalDamaged(f"the journal {path} cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    problem = _parse_problem(data)
    if isinstance(problem, str):
        raise JournalDamaged(f"the journal {path} is damaged: {problem}")
    return problem


def _read_desired(dir_fd: int, name: str, path: str) -> dict:
    """The stored profile in `name`: FileNotFoundError, StateDirError (not
    ours) or JournalDamaged (not a stored profile)."""
    fd = _open_checked(path, "desired state", os.O_RDONLY, dir_fd=dir_fd)
    try:
        data = os.read(fd, MAX_RECORD + 1)
    except OSError as e:
        raise JournalDamaged(f"the desired state {path} cannot be read: "
                             f"{e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        desired = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise JournalDamaged(f"the desired state {path} is not JSON ({e})") from None
    if not (isinstance(desired, dict) and isinstance(desired.get("doc"), dict)
            and isinstance(desired.get("sources", {}), dict)):
        raise JournalDamaged(f"the desired state {path} is not a stored profile (doc, sources)")
    return desired


def _parse_problem(data: bytes):
    """The record in `data`, or what is wrong with it (a str)."""
    if len(data) > MAX_RECORD:
        return f"it is larger than {MAX_RECORD >> 20} MiB"
    if not data.strip():
        return "it is empty"
    try:
        record = json.loads(data)
    except UnicodeDecodeError:
        return "it is not text"
    except (ValueError, RecursionError) as e:
        return f"it is not JSON ({e})"
    return _shape_problem(record) or record


def _shape_problem(record) -> str:
    """'' when `record` has the shape begin() and finish() give one."""
    if not isinstance(record, dict):
        return f"it holds a JSON {type(record).__name__}, not a record"
    if record.get("journal") not in READABLE_FORMATS:
        return (f"its format 'journal' is {record.get('journal')!r}, not one of "
                f"{', '.join(map(str, READABLE_FORMATS))}")
    if record.get("by", AGENT) != AGENT or ("by" in record and record["journal"] < 2):
        return "its 'by' is not 'agent' (the resident agent's applies), nor absent (a user's)"
    if not isinstance(record.get("id"), str) or not _RECORD_ID.fullmatch(record["id"]):
        return "its 'id' is missing or not an apply id"
    if record.get("status") not in STATUSES:
        return f"its 'status' {record.get('status')!r} is not one of {', '.join(STATUSES)}"
    for name in ("started", "finished"):
        if name in record and not _is_number(record[name]):
            return f"its '{name}' is not a time"
    if record["status"] != APPLYING and "finished" not in record:
        return f"it is {record['status']} but has no 'finished' time"
    if not isinstance(record.get("profile"), (str, type(None))):
        return "its 'profile' is not text"
    if not isinstance(record.get("desired_before", {}), (dict, type(None))):
        return "its 'desired_before' is not a stored profile"
    if not isinstance(record.get("aside", {}), dict):
        return "its 'aside' is not a mapping"
    if not isinstance(record.get("changes"), list):
        return "its 'changes' are missing or not a list"
    for n, change in enumerate(record["changes"], 1):
        problem = _change_problem(change)
        if problem:
            return f"its change {n} {problem}"
    confirm = record.get("confirm")
    if confirm is not None:
        if not (isinstance(confirm, dict) and isinstance(confirm.get("token"), str)
                and _is_number(confirm.get("timeout")) and confirm.get("state") in CONFIRM_STATES
                and _is_number(record.get("started"))):
            return "its 'confirm' is not a confirmation (token, timeout, state, and a start time)"
    return ""


def _change_problem(change) -> str:
    if not isinstance(change, dict):
        return "is not a mapping"
    key = change.get("key")
    if not isinstance(key, dict) or not all(isinstance(key.get(k), str)
                                            for k in ("family", "target", "name")):
        return "has no key of text family, target and name"
    if "before" not in change or "after" not in change:
        return "lacks its before or after value"
    if not isinstance(change.get("source", ""), str):
        return "has a 'source' that is not text"
    return ""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_agent_file(name: str) -> bool:
    return name.endswith(AGENT_SUFFIX + ".json")


def _prunable(names: list) -> list:
    """Of history file names, oldest first: all but the newest HISTORY_KEPT
    users' and the newest HISTORY_KEPT of the agent's."""
    agents = [n for n in names if _is_agent_file(n)]
    users = [n for n in names if not _is_agent_file(n)]
    return agents[:-HISTORY_KEPT] + users[:-HISTORY_KEPT]


def _date_copy(dir_fd: int, name: str, record: dict) -> None:
    """Give a history copy its apply's start as its modification time
    (_records_by_age: a rollback that rewrites an old copy must not make
    it the newest)."""
    started = record.get("started")
    if _is_number(started):
        ns = int(started * 1e9)
        os.utime(name, ns=(ns, ns), dir_fd=dir_fd, follow_symlinks=False)


def _records_by_age(dir_fd: int) -> list:
    """History file names, oldest first, by their applies' starts (each
    copy's modification time, _date_copy; ids of one second do not sort
    by time)."""
    dated = []
    for name in os.listdir(dir_fd):
        if not _RECORD_FILE.fullmatch(name):
            continue  # a temporary file, or not nictune's
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # pruned by another run meanwhile
        if stat.S_ISREG(st.st_mode):
            dated.append((st.st_mtime_ns, name))
    return [name for _, name in sorted(dated)]


def _replace(dir_fd: int, name: str, text: str) -> None:
    """Replace `name` whole: a temporary file beside it, fsync, rename (a
    rename replaces a link, never what it points to)."""
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(text.encode())
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)
