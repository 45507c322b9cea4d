"""Key files: where nictune's static crypto keys come from (MACsec SAs).

A key file must be named by an absolute, normalised path with no
symbolic link on it (not the file, nor any directory above it: each is
opened from / down with O_NOFOLLOW), be a regular file (not a FIFO or
device), owned by root (uid 0) and of mode 0600 (no group/other bits, nothing
executable); anything else is refused with a message naming the file and
what is wrong, never its content.  The content is the key in hex, as
`ip macsec ... key <id> <hex>` takes it: hex digits only, one trailing
newline allowed.

The key never leaves this module's caller as text: plans, diffs, reports
and the journal carry `fingerprint(content)`, the first 8 hex digits of
the SHA-256 of the file's content (so a rotation shows as a change), and
load() returns the key as a bytearray the caller overwrites (wipe())
once the kernel has it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional, Tuple

from nictune.host.errors import InvalidInput

MAX_KEY_FILE = 4096


def fingerprint(content: bytes) -> str:
    """First 8 hex digits of SHA-256 of the key file's content."""
    import hashlib  # ~5 ms: only profiles with key files pay for it

    return hashlib.sha256(content).hexdigest()[:8]


def _parts(path: str) -> list:
    """The names on an absolute, normalised path: "/etc/k" -> ["etc", "k"]."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidInput(f"key file {path!r}: must be an absolute path")
    parts = path.split("/")[1:]
    if any(part in ("", ".", "..") for part in parts) or "\0" in path:
        raise InvalidInput(f"key file {path!r}: must be an absolute, normalised path (no '.' "
                           "or '..' parts, no '//', no trailing '/'); refused")
    return parts


def _open_no_links(path: str) -> int:
    """path opened for reading without following a symbolic link in any
    part of it: each directory from / down opened with O_NOFOLLOW relative
    to the one before (a symlinked /etc/nictune/keys would otherwise lead
    anywhere), the file with O_NONBLOCK (a FIFO must not block)."""
    parts = _parts(path)
    here = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                dir_fd=here)
            except FileNotFoundError:
                raise InvalidInput(f"key file {path}: does not exist") from None
            except OSError as e:
                where = "/" + "/".join(parts[:i + 1])
                raise InvalidInput(f"key file {path}: {where} {_not_a_directory(name, here, e)}; "
                                   "refused") from None
            os.close(here)
            here = below
        try:
            return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                           dir_fd=here)
        except FileNotFoundError:
            raise InvalidInput(f"key file {path}: does not exist") from None
        except OSError as e:
            # O_NOFOLLOW on a symlink answers ELOOP
            why = "is a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
            raise InvalidInput(f"key file {path}: {why}; refused") from None
    finally:
        os.close(here)


def _not_a_directory(name: str, parent: int, e: OSError) -> str:
    """Why a directory on a key file's path did not open."""
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return "cannot be examined"
        if stat.S_ISLNK(st.st_mode):
            return "(on its path) is a symbolic link, which nictune does not follow to a key"
        return "(on its path) is not a directory"
    return f"(on its path): {e.strerror or e}"


def _open_checked(path: str, uid: int = 0) -> int:
    fd = _open_no_links(path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"key file {path}: not a regular file; refused")
        if st.st_uid != uid:
            raise InvalidInput(f"key file {path}: owned by uid {st.st_uid}, must be owned by "
                               "root; refused")
        mode = stat.S_IMODE(st.st_mode)
        if mode != 0o600:
            raise InvalidInput(f"key file {path}: mode {mode:04o}, must be 0600 (readable by "
                               "root alone); refused")
        if st.st_size > MAX_KEY_FILE:
            raise InvalidInput(f"key file {path}: {st.st_size} bytes, too large for a key")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(fd: int) -> bytearray:
    buf = bytearray(MAX_KEY_FILE + 1)
    n = os.readv(fd, [buf])
    data = bytearray(buf[:n])
    buf[:] = bytes(len(buf))
    return data


def load(path: str, length: Optional[int] = None, uid: int = 0) -> Tuple[bytearray, str]:
    """(key, fingerprint) from the key file at `path`, after the checks
    above.  `length`: the key length in bytes the cipher needs.  The
    returned bytearray is the caller's to wipe()."""
    fd = _open_checked(path, uid)
    try:
        content = _read(fd)
    finally:
        os.close(fd)
    text = bytearray(content[:-1] if content.endswith(b"\n") else content)
    try:
        fp = fingerprint(content)
        digits = b"0123456789abcdefABCDEF"
        if not text or len(text) % 2 or any(c not in digits for c in text):
            raise InvalidInput(f"key file {path}: must hold the key in hex digits (an even "
                               "number, one trailing newline allowed)")
        key = bytearray(len(text) // 2)
        for i in range(len(key)):
            key[i] = int(text[2 * i:2 * i + 2], 16)
        if length is not None and len(key) != length:
            n = len(key)
            wipe(key)
            raise InvalidInput(f"key file {path}: holds a {n}-byte key, the cipher needs "
                               f"{length} bytes ({2 * length} hex digits)")
        return key, fp
    finally:
        wipe(content)
        wipe(text)


def check(path: str, uid: int = 0) -> str:
    """The fingerprint of the key file, after the checks (for plans); the
    key is not decoded."""
    key, fp = load(path, uid=uid)
    wipe(key)
    return fp


def wipe(buf: bytearray) -> None:
    buf[:] = bytes(len(buf))
