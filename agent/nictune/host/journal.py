"""The apply journal and the per-host lock, kept under the state directory.

The before-values of an apply are on disk before its first write, so a
crash mid-apply can still be undone by `nictune rollback`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from contextlib import contextmanager
from typing import Optional

from nictune.host.errors import Locked, NictuneError
from nictune.host.files import write_atomic
from nictune.host.validate import check_path

DEFAULT_STATE_DIR = "/var/lib/nictune"
JOURNAL_FORMAT = 1
HISTORY_KEPT = 20

APPLYING = "applying"
COMMITTED = "committed"
ROLLED_BACK = "rolled-back"
ROLLBACK_FAILED = "rollback-failed"


# A remote apply's confirmation (see nictune/host/watchdog.py).
CONFIRM_PENDING = "pending"
CONFIRMED = "confirmed"
CONFIRM_EXPIRED = "expired"
# How long after its deadline a still-pending confirmation blocks a new
# apply: the watchdog acts within a second, so only a dead one (host
# rebooted) leaves it pending that long.
CONFIRM_GRACE = 30.0


def unconfirmed(record: Optional[dict]) -> str:
    """Why a new apply must wait for `record`'s confirmation, or ''."""
    confirm = (record or {}).get("confirm")
    if not confirm or confirm.get("state") != CONFIRM_PENDING or record["status"] != COMMITTED:
        return ""
    deadline = record.get("finished", record["started"]) + confirm["timeout"]
    if time.time() > deadline + CONFIRM_GRACE:
        return ""
    return (f"apply {record['id']} awaits its controller's confirmation; unless it comes, "
            f"it is rolled back at {time.strftime('%H:%M:%S', time.localtime(deadline))}: "
            "wait for that, or run `nictune rollback`")


class Journal:
    def __init__(self, state_dir: str = DEFAULT_STATE_DIR):
        self.dir = check_path(state_dir, "state directory")
        self.path = os.path.join(self.dir, "journal.json")
        self.record: Optional[dict] = None
        # Set by the agent before a remote apply: {"token", "timeout"}.
        self.confirm: Optional[dict] = None

    def _ensure_dir(self) -> None:
        try:
            os.makedirs(os.path.join(self.dir, "history"), mode=0o700, exist_ok=True)
        except PermissionError:
            raise NictuneError(f"cannot create the state directory {self.dir}: permission "
                               "denied (apply and rollback run as root; see --state-dir)") from None

    @contextmanager
    def lock(self, wait: bool = False):
        """One apply or rollback at a time on a host (or namespace)."""
        self._ensure_dir()
        fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise Locked(f"another nictune apply or rollback holds {self.dir}/lock") from None
                raise
            yield
        finally:
            os.close(fd)

    def begin(self, changes: list, profile: Optional[str]) -> dict:
        self._ensure_dir()
        now = time.time()
        self.record = {
            "journal": JOURNAL_FORMAT,
            "id": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + f"-{os.getpid()}",
            "started": now,
            "profile": profile,
            "status": APPLYING,
            "changes": [{"key": c.key.as_dict(), "before": c.before, "after": c.after,
                         "source": c.source} for c in changes],
        }
        if self.confirm:
            self.record["confirm"] = dict(self.confirm, state=CONFIRM_PENDING)
        self._save()
        return self.record

    def finish(self, status: str) -> None:
        assert self.record is not None
        self.record["status"] = status
        self.record["finished"] = time.time()
        self._save()
        self._archive()

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
                self._save()
            return "" if confirm["state"] == CONFIRM_PENDING else confirm["state"]

    def _save(self) -> None:
        write_atomic(self.path, json.dumps(self.record, indent=1, sort_keys=True))

    def _archive(self) -> None:
        history = os.path.join(self.dir, "history")
        write_atomic(os.path.join(history, self.record["id"] + ".json"),
                     json.dumps(self.record, sort_keys=True))
        for old in sorted(os.listdir(history))[:-HISTORY_KEPT]:
            os.unlink(os.path.join(history, old))

    def load(self) -> Optional[dict]:
        try:
            with open(self.path) as f:
                self.record = json.load(f)
        except FileNotFoundError:
            return None
        return self.record
