"""PN high-water marks of static MACsec keys, kept in the state directory
(knobs/macsec.py says why): {fingerprint: {"tx": pn, "rx": pn}} in
macsec-pn.json, 0600, replaced whole like the journal's files.  A key is
named by its fingerprint (keyfile.fingerprint), never by a byte of it.
Marks only rise: every save merges with what is there."""

from __future__ import annotations

import fcntl
import json
import os

from nictune.host.errors import InvalidInput
from nictune.host.transaction.journal import _open_dir, _replace

PN_MARKS = "macsec-pn.json"
PN_MARKS_LOCK = "macsec-pn.lock"


def raise_mark(marks: dict, fp: str, direction: str, pn: int) -> None:
    mine = marks.setdefault(fp, {})
    mine[direction] = max(mine.get(direction, 0), pn)


def load_marks(state_dir: str) -> dict:
    """The marks kept in the state directory ({} when none yet)."""
    try:
        fd = _open_dir(state_dir, "state directory", create=False)
    except FileNotFoundError:
        return {}
    try:
        try:
            f = os.open(PN_MARKS, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            return {}
        with os.fdopen(f) as stream:
            data = json.load(stream)
    except ValueError:
        raise InvalidInput(f"{state_dir}/{PN_MARKS} is damaged: without it nictune cannot tell "
                           "which PNs static MACsec keys have used; rotate the keys") from None
    finally:
        os.close(fd)
    marks = data.get("marks") if isinstance(data, dict) else None
    return marks if isinstance(marks, dict) else {}


def save_marks(state_dir: str, new: dict) -> dict:
    """Merge `new` into the kept marks (each only ever rises); the result.
    Under a lock of its own: a verify's read-back (which holds no apply
    lock) must not write back an older mark over an apply's reservation."""
    fd = _open_dir(state_dir, "state directory", create=True)
    try:
        lock = os.open(PN_MARKS_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600, dir_fd=fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            marks = load_marks(state_dir)
            for fp, directions in new.items():
                for direction, pn in directions.items():
                    raise_mark(marks, fp, direction, pn)
            _replace(fd, PN_MARKS, json.dumps({"version": 1, "marks": marks}, sort_keys=True))
        finally:
            os.close(lock)  # drops the lock
    finally:
        os.close(fd)
    return marks
