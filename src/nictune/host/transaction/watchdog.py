"""Confirmed commit: a remote apply undoes itself unless its controller confirms.

An MTU or PFC change can cut the SSH session that made it, and leave a host
that nobody can reach to fix.  So before a remote apply the agent forks this
watchdog, detached from the session, and the apply's journal carries the
watchdog's token.  When the agent has sent its report, the controller answers
on the same session, which proves the path still carries traffic; the agent
then marks the journal confirmed.  If that does not happen within the
timeout after the apply finished (the session died, the controller crashed,
the report never got through), the watchdog rolls that apply back, and only
that one: the check and the restore happen under the journal lock.  A
journal damaged meanwhile does not stop it: it reads the history copy (see
journal.py), or, when that is unusable too, restores from the record it read
before.
"""

from __future__ import annotations

import os
import secrets
import select
import time

from nictune.host.errors import Locked, StateDirError
from nictune.host.transaction.journal import APPLYING, COMMITTED, CONFIRM_PENDING, Journal

# The agent is given this long to finish before the watchdog stops waiting
# for it (the controller's own command timeout is shorter).
AGENT_BOUND = 600.0


def arm(state_dir: str, timeout: float) -> tuple:
    """Fork the watchdog.  Returns (token, fd): keep `fd` open while the agent
    runs; its closing, however the agent ends, tells the watchdog to look."""
    token = secrets.token_hex(8)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(w)
            os.setsid()
            if os.fork() == 0:
                _detach(r)
                _watch(state_dir, token, timeout, 3)
        finally:
            os._exit(0)
    os.close(r)
    os.waitpid(pid, 0)
    return token, w


def _detach(keep: int) -> None:
    """Let go of the SSH session: sshd ends it only when every holder of its
    pipes has closed them."""
    os.dup2(keep, 3)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(4, 65536)


def _watch(state_dir: str, token: str, timeout: float, agent_fd: int) -> None:
    select.select([agent_fd], [], [], AGENT_BOUND)
    journal = Journal(state_dir)
    seen = None  # this apply's record as last read: the fallback if the journal goes bad
    while True:
        try:
            record = journal.load()
        except StateDirError:
            if seen is None:
                return  # never read this apply's record: nothing known to undo
            # Nobody can confirm through an unreadable journal; its deadline
            # still stands, in case someone repairs it meanwhile.
            if _deadline(seen, timeout) <= time.time():
                break
            time.sleep(0.25)
            continue
        confirm = (record or {}).get("confirm") or {}
        if confirm.get("token") != token or confirm.get("state") != CONFIRM_PENDING:
            return  # nothing applied under this token, or already settled
        seen = record
        if record["status"] == APPLYING:
            break  # the agent died mid-apply: nobody will confirm
        if record["status"] != COMMITTED:
            return  # the apply failed and rolled itself back
        left = _deadline(record, timeout) - time.time()
        if left <= 0:
            break
        time.sleep(min(left, 0.25))
    _roll_back(state_dir, seen)


def _deadline(record: dict, timeout: float) -> float:
    return record.get("finished", record.get("started", 0.0)) + timeout


def _roll_back(state_dir: str, seen: dict) -> None:
    from nictune.host.transaction.engine import Engine
    from nictune.host.machine import Host

    host = Host()
    try:
        for _ in range(120):  # a manual rollback may hold the lock for a moment
            try:
                Engine(host, state_dir).rollback(only=seen["id"], seen=seen)
                return
            except Locked:
                time.sleep(0.25)
    except Exception:  # noqa: BLE001 - nobody to tell; the journal records the outcome
        pass
    finally:
        host.close()
