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


def existing(path: str, shown: str) -> Optional[os.stat_result]:
    """lstat of an owned path: None when absent, UnsafeFile when not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    _regular(st.st_mode, shown)
    return st


def _open(path: str, flags: int, shown: str) -> int:
    try:
        fd = os.open(path, flags | _OPEN)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink put there since the lstat
            raise UnsafeFile(f"{shown} is a symbolic link, not a regular file") from None
        raise
    try:
        _regular(os.fstat(fd).st_mode, shown)  # swapped since the lstat?
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_owned(path: str, shown: str, cap: int = MAX_OWNED_BYTES) -> Optional[bytes]:
    """The bytes of an owned file, or None when there is none.  Checked
    with lstat before opening (opening some devices has effects of its own)
    and with fstat after; at most cap + 1 bytes are read."""
    if existing(path, shown) is None:
        return None
    try:
        fd = _open(path, os.O_RDONLY, shown)
    except FileNotFoundError:
        return None
    try:
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, cap + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > cap:
        raise UnsafeFile(f"{shown} is larger than {cap // 1024} KiB, more than any file nictune "
                         "writes; it is neither read nor replaced")
    return b"".join(chunks)


def write_owned(path: str, text: str, shown: str, keep_inode: bool = False) -> None:
    """Replace an owned file with `text`, keeping its mode and owner (a new
    file is 0644, and root's when root writes it).  keep_inode: rewrite an
    existing file in place (it is the source of bind mounts)."""
    data = text.encode()
    st = existing(path, shown)
    if st is not None and keep_inode:
        _rewrite_in_place(path, data, shown)
        return
    if st is not None:
        mode, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
    else:
        mode, owner = NEW_FILE_MODE, ((0, 0) if os.geteuid() == 0 else None)
    _replace(path, data, mode, owner, busy_in_place=True, shown=shown)


def remove_owned(path: str, shown: str) -> None:
    """Remove an owned file, if there is one (a rollback to "no file")."""
    if existing(path, shown) is not None:
        os.unlink(path)


def write_atomic(path: str, text: str, mode: int = 0o600, busy_in_place: bool = False) -> None:
    """Write `text` to `path` through a temporary file, with `mode`.  With
    `busy_in_place`, a path that cannot be renamed over (a mount point) is
    rewritten in place instead."""
    _replace(path, text.encode(), mode, None, busy_in_place, path)


def _replace(path: str, data: bytes, mode: int, owner: Optional[tuple], busy_in_place: bool,
             shown: str) -> None:
    import tempfile  # only writers pay for it (plan, verify and audit never write)

    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=directory)
    try:
        try:
            _write_all(fd, data)
            os.fchmod(fd, mode)
            made = os.fstat(fd)
            if owner is not None and owner != (made.st_uid, made.st_gid):
                os.fchown(fd, *owner)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)
        except OSError as e:
            if not (busy_in_place and e.errno == errno.EBUSY):
                raise
            _rewrite_in_place(path, data, shown)
        else:
            _sync_dir(directory)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _rewrite_in_place(path: str, data: bytes, shown: str) -> None:
    # Never O_TRUNC: the old bytes stay until the new ones are over them.
    fd = _open(path, os.O_WRONLY, shown)
    try:
        _write_all(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)


def _sync_dir(directory: str) -> None:
    """Make the rename itself durable."""
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(directory: str) -> list:
    """Remove the temporary files a crashed nictune left in `directory`:
    regular files named TEMP_PREFIX... whose writer is no longer running
    (names without a pid come from older versions).  Symlinks, directories
    and anything else are left alone; nothing is followed.  Returns the
    names removed."""
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    removed = []
    try:
        for name in os.listdir(dfd):
            if not name.startswith(TEMP_PREFIX) or _writer_alive(name):
                continue
            try:
                st = os.lstat(name, dir_fd=dfd)
                if stat.S_ISREG(st.st_mode):
                    os.unlink(name, dir_fd=dfd)  # unlink never follows a symlink
                    removed.append(name)
            except FileNotFoundError:
                continue
    finally:
        os.close(dfd)
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
