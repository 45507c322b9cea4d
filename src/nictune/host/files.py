"""Reading and writing files so that a reader never sees half of one.

Files nictune owns (the NCCL file) are regular files or absent; anything
else at their path (a symlink, a FIFO, a device, a directory) is refused
before it is opened for writing, and checked again on the open file
descriptor, so that nothing is followed, blocks or reads without end.

A write goes to a temporary file beside the target (TEMP_PREFIX, the
writer's pid, random letters), which is fsynced and renamed over it,
keeping the target's mode and owner.  A file that is itself a mount point
(a bind mount in a container) cannot be renamed over, and a file that is
the source of bind mounts (/etc/netns/NAME/...) must keep its inode for
them to see the change: both are rewritten in place, over the old bytes
and then cut to length, so that a crash leaves the old text, the new one,
or the new one followed by the old one's tail, never an empty file.  A
crash can also leave the temporary file: remove_stale_temps() removes
those whose writer is gone.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune.host.errors import UNSUPPORTED, NictuneError

TEMP_PREFIX = ".nictune-"
# An owned file is read whole into memory: NCCL reads lines of up to 1023
# bytes, and the largest file a profile renders is about 125 KiB.
MAX_OWNED_BYTES = 1 << 20
NEW_FILE_MODE = 0o644

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
# Never follow, never wait for a writer, never take a terminal.
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafeFile(NictuneError):
    """An owned path that is not a regular file nictune may read or replace."""

    kind = UNSUPPORTED


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _regular(mode: int, shown: str) -> None:
    if not stat.S_ISREG(mode):
        raise UnsafeFile(f"{shown} is {_kind(mode)}, not a regular file; nictune reads and "
                         "replaces only regular files")


def _io(io):
    """The port given, or the running host's (the controller's own files)."""
    if io is not None:
        return io
    from nictune.host.transports.io import LIVE

    return LIVE


def existing(path: str, shown: str, io=None) -> Optional[os.stat_result]:
    """lstat of an owned path: None when absent, UnsafeFile when not a regular file."""
    try:
        st = _io(io).lstat(path)
    except FileNotFoundError:
        return None
    _regular(st.st_mode, shown)
    return st


def _open(io, path: str, flags: int, shown: str) -> int:
    try:
        fd = io.os_open(path, flags | _OPEN)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink put there since the lstat
            raise UnsafeFile(f"{shown} is a symbolic link, not a regular file") from None
        raise
    try:
        _regular(io.fstat(fd).st_mode, shown)  # swapped since the lstat?
    except BaseException:
        io.close(fd)
        raise
    return fd


def read_owned(path: str, shown: str, cap: int = MAX_OWNED_BYTES, io=None) -> Optional[bytes]:
    """The bytes of an owned file, or None when there is none.  Checked
    with lstat before opening (opening some devices has effects of its own)
    and with fstat after; at most cap + 1 bytes are read."""
    io = _io(io)
    if existing(path, shown, io) is None:
        return None
    try:
        fd = _open(io, path, os.O_RDONLY, shown)
    except FileNotFoundError:
        return None
    try:
        data = read_capped(io.read, fd, cap)
    finally:
        io.close(fd)
    if data is None:
        raise UnsafeFile(f"{shown} is larger than {cap // 1024} KiB, more than any file nictune "
                         "writes; it is neither read nor replaced")
    return data


def read_capped(read, fd: int, cap: int) -> Optional[bytes]:
    """What `read(fd, n)` gives up to its end, or None past `cap` bytes:
    at most cap + 1 bytes are read, whatever the file claims or grows to."""
    chunks, size = [], 0
    while size <= cap:
        chunk = read(fd, min(1 << 20, cap + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks) if size <= cap else None


def write_owned(path: str, text: str, shown: str, keep_inode: bool = False, io=None,
                new_mode: int = NEW_FILE_MODE) -> None:
    """Replace an owned file with `text`, keeping its mode and owner (a new
    file is new_mode, 0644 unless said, and root's when root writes it).
    keep_inode: rewrite an existing file in place (it is the source of
    bind mounts)."""
    io = _io(io)
    data = text.encode()
    st = existing(path, shown, io)
    if st is not None and keep_inode:
        _rewrite_in_place(io, path, data, shown)
        return
    if st is not None:
        mode, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
    else:
        mode, owner = new_mode, ((0, 0) if os.geteuid() == 0 else None)
    _replace(io, path, data, mode, owner, busy_in_place=True, shown=shown)


def remove_owned(path: str, shown: str, io=None) -> None:
    """Remove an owned file, if there is one (a rollback to "no file")."""
    io = _io(io)
    if existing(path, shown, io) is not None:
        io.unlink(path)


def write_atomic(path: str, text: str, mode: int = 0o600, busy_in_place: bool = False) -> None:
    """Write `text` to `path` through a temporary file, with `mode`.  With
    `busy_in_place`, a path that cannot be renamed over (a mount point) is
    rewritten in place instead."""
    _replace(_io(None), path, text.encode(), mode, None, busy_in_place, path)


def _replace(io, path: str, data: bytes, mode: int, owner: Optional[tuple], busy_in_place: bool,
             shown: str) -> None:
    directory = os.path.dirname(path)
    fd, tmp = io.mkstemp(f"{TEMP_PREFIX}{os.getpid()}-", directory)
    try:
        try:
            _write_all(io, fd, data)
            io.fchmod(fd, mode)
            made = io.fstat(fd)
            if owner is not None and owner != (made.st_uid, made.st_gid):
                io.fchown(fd, *owner)
            io.fsync(fd)
        finally:
            io.close(fd)
        try:
            io.replace(tmp, path)
        except OSError as e:
            if not (busy_in_place and e.errno == errno.EBUSY):
                raise
            _rewrite_in_place(io, path, data, shown)
        else:
            _sync_dir(io, directory)
    finally:
        if io.lexists(tmp):
            io.unlink(tmp)


def _rewrite_in_place(io, path: str, data: bytes, shown: str) -> None:
    # Never O_TRUNC: the old bytes stay until the new ones are over them.
    fd = _open(io, path, os.O_WRONLY, shown)
    try:
        _write_all(io, fd, data)
        io.ftruncate(fd, len(data))
        io.fsync(fd)
    finally:
        io.close(fd)


def _write_all(io, fd: int, data: bytes) -> None:
    done = 0
    while done < len(data):
        done += io.pwrite(fd, data[done:], done)


def _sync_dir(io, directory: str) -> None:
    """Make the rename itself durable."""
    fd = io.os_open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        io.fsync(fd)
    finally:
        io.close(fd)


def remove_stale_temps(directory: str, io=None) -> list:
    """Remove the temporary files a crashed nictune left in `directory`:
    regular files named TEMP_PREFIX... whose writer is no longer running
    (names without a pid come from older versions).  Symlinks, directories
    and anything else are left alone; nothing is followed.  Returns the
    names removed."""
    io = _io(io)
    try:
        dfd = io.os_open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    removed = []
    try:
        for name in io.listdir_at(dfd):
            if not name.startswith(TEMP_PREFIX) or _writer_alive(name):
                continue
            try:
                st = io.lstat_at(dfd, name)
                if stat.S_ISREG(st.st_mode):
                    io.unlink_at(dfd, name)  # unlink never follows a symlink
                    removed.append(name)
            except FileNotFoundError:
                continue
    finally:
        io.close(dfd)
    return removed


def _writer_alive(name: str) -> bool:
    pid = name[len(TEMP_PREFIX):].partition("-")[0]
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:
        return True  # there, but not ours to signal
    return True
