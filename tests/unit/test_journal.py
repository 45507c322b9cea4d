"""The journal on the fake kernel: damaged journals, a failing state
directory, and the trust a state directory must earn.

The engine applies to a recorded ConnectX-7 host (tests/fakes.py); the
state directory is a real one under the test's tmp_path.  The same faults
on the real kernel, with the watchdog and the per-namespace lock, are in
tests/netns/test_journal_faults.py.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat

import pytest

from fakes import FakeHost
from nictune.host import agent
from nictune.host.transaction import journal
from nictune.host import model as m
from nictune.host.transaction.engine import Engine
from nictune.host.errors import Interrupted, JournalDamaged, StateDirError
from shipped import P0, P1

pytestmark = pytest.mark.recorded

DOC = {"nictune": 1, "interfaces": {
    "rails": {"match": {"name": [P0, P1]}, "mtu": 9000, "rings": {"rx": 4096}}}}
OTHER = {"nictune": 1, "interfaces": {"rails": {"match": {"name": P0}, "mtu": 4000}}}


class Box:
    """A fake host and a state directory of the test's own."""

    def __init__(self, tmp_path, state="state"):
        self.host = FakeHost("cx7-host", tmp_path / "root")
        self.kernel = self.host.kernel
        self.state = tmp_path / state
        self.initial = self.kernel.snapshot()

    def engine(self) -> Engine:
        return Engine(self.host, str(self.state))

    def apply(self, doc=DOC):
        return self.engine().apply(doc, {}, "p.yaml")

    def run(self, command: str, doc=DOC) -> dict:
        """Through the agent, as the CLI would: a report, never a traceback."""
        request = {"nictune_request": 1, "command": command, "state_dir": str(self.state)}
        if command != "rollback":
            request["profile"] = {"path": "p.yaml", "doc": doc, "sources": {}}
        return agent.run(request, host=self.host)

    @property
    def journal_path(self):
        return self.state / "journal.json"

    def record(self) -> dict:
        return json.loads(self.journal_path.read_text())

    def copies(self) -> list:
        return sorted(os.listdir(self.state / "history"))


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


def mtus(box) -> tuple:
    return box.kernel.links[P0].mtu, box.kernel.links[P1].mtu


# -- item 6: a damaged journal ----------------------------------------------------

def _truncated(text: str) -> bytes:
    return text.encode()[: len(text) // 2]


def _retyped(**fields):
    def damage(text: str) -> bytes:
        record = json.loads(text)
        record.update(fields)
        return json.dumps(record).encode()
    return damage


def _bad_change(text: str) -> bytes:
    record = json.loads(text)
    record["changes"][0]["key"] = ["link", P0, "mtu"]
    return json.dumps(record).encode()


DAMAGE = {
    "truncated": _truncated,
    "empty": lambda text: b"",
    "list": lambda text: b"[]",
    "object": lambda text: b"{}",
    "binary": lambda text: b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 40,
    "status-a-number": _retyped(status=5),
    "changes-text": _retyped(changes="mtu"),
    "id-a-path": _retyped(id="../../etc/passwd"),
    "finished-text": _retyped(finished="yesterday"),
    "change-key-a-list": _bad_change,
}


@pytest.mark.parametrize("form", DAMAGE)
def test_rollback_restores_from_the_history_copy_of_a_damaged_journal(box, form):
    assert box.apply().error is None
    assert mtus(box) == (9000, 9000)
    box.journal_path.write_bytes(DAMAGE[form](box.journal_path.read_text()))

    out = box.engine().rollback()
    assert out.error is None, out.error
    assert box.kernel.snapshot() == box.initial
    [warning] = out.warnings
    assert str(box.journal_path) in warning and "damaged" in warning
    assert str(box.state / "history") in warning
    # The rollback wrote the journal whole again.
    assert box.record()["status"] == "rolled-back"


@pytest.mark.parametrize("form", DAMAGE)
def test_apply_goes_on_past_a_damaged_journal_of_a_finished_apply(box, form):
    assert box.apply().error is None
    box.journal_path.write_bytes(DAMAGE[form](box.journal_path.read_text()))
    out = box.apply(OTHER)
    assert out.error is None, out.error
    assert any(str(box.journal_path) in w for w in out.warnings)
    assert mtus(box) == (4000, 9000)
    assert box.record()["status"] == "committed"


@pytest.mark.parametrize("form", ["truncated", "empty", "object", "binary"])
def test_without_any_copy_the_error_names_the_file_and_no_key(box, form):
    assert box.apply().error is None
    box.journal_path.write_bytes(DAMAGE[form](box.journal_path.read_text()))
    for copy in box.copies():
        os.unlink(box.state / "history" / copy)
    for command in ("rollback", "apply"):
        report = box.run(command)
        assert report["exit_code"] == 1, report
        message = report["error"]["message"]
        assert str(box.journal_path) in message and "no copy" in message
        assert "KeyError" not in message and "internal error" not in message
    assert mtus(box) == (9000, 9000)


def test_a_damaged_journal_of_a_crashed_apply_still_blocks_applies(box):
    """Its history copy is written before the first write, so the record of
    what a crashed apply overwrote survives damage to journal.json."""
    class Crash(BaseException):
        """The process dies mid-apply: nothing catches it."""

    box.kernel.fail("set_link", P1, error=Crash())
    with pytest.raises(Crash):
        box.apply()
    box.kernel.faults.clear()
    assert box.record()["status"] == "applying"
    box.journal_path.write_bytes(b"")

    with pytest.raises(Interrupted) as refused:
        box.apply()
    assert str(box.journal_path) in refused.value.message
    out = box.engine().rollback()
    assert out.error is None and box.kernel.snapshot() == box.initial
    assert any("had not finished" in w for w in out.warnings)


def test_a_journal_naming_an_unknown_family_is_refused_by_name(box):
    assert box.apply().error is None
    record = box.record()
    record["changes"][0]["key"]["family"] = "warp-drive"
    box.journal_path.write_text(json.dumps(record))
    with pytest.raises(JournalDamaged) as refused:
        box.engine().rollback()
    assert "warp-drive" in refused.value.message and str(box.state) in refused.value.message


# -- item 5: the state directory fails after the kernel was written -------------------

def _fail_journal_writes(monkeypatch, box, code: int, times: int = 1000):
    """Journal writes fail with `code` once the kernel has been written."""
    real = journal._replace
    failures = []

    def replace(dir_fd, name, text):
        if box.kernel.writes and len(failures) < times:
            failures.append(name)
            raise OSError(code, os.strerror(code))
        real(dir_fd, name, text)

    monkeypatch.setattr(journal, "_replace", replace)
    return failures


def test_a_commit_that_cannot_be_written_rolls_the_host_back(box, monkeypatch):
    _fail_journal_writes(monkeypatch, box, errno.ENOSPC)
    report = box.run("apply")
    assert report["exit_code"] == 3 and report["error"]["kind"] == "rolled-back"
    message = report["error"]["message"]
    assert str(box.state) in message and "No space left on device" in message
    assert "still says 'applying'" in message
    assert {c["status"] for c in report["changes"]} == {m.REVERTED}
    assert box.kernel.snapshot() == box.initial
    assert box.record()["status"] == "applying"

    monkeypatch.undo()
    report = box.run("rollback")
    assert report["exit_code"] == 0, report
    assert box.record()["status"] == "rolled-back"
    assert box.kernel.snapshot() == box.initial
    assert box.run("apply")["exit_code"] == 0


def test_a_commit_that_fails_once_is_recorded_as_rolled_back(box, monkeypatch):
    _fail_journal_writes(monkeypatch, box, errno.EIO, times=1)
    report = box.run("apply")
    assert report["exit_code"] == 3, report
    message = report["error"]["message"]
    assert "Input/output error" in message and "still says" not in message
    assert box.record()["status"] == "rolled-back"
    assert box.kernel.snapshot() == box.initial


def test_a_restore_the_journal_cannot_record_is_reported_with_what_is_left(box, monkeypatch):
    box.kernel.fail("set_link", P1, errno.EPERM)  # the apply fails on P1...
    # ...and P0's rings cannot go back.
    box.kernel.fail("set_rings", P0, errno.EPERM, when=lambda values: values.get("rx") != 4096)
    _fail_journal_writes(monkeypatch, box, errno.EIO)
    report = box.run("apply")
    assert report["exit_code"] == 4 and report["error"]["kind"] == "rollback-failed", report
    message = report["error"]["message"]
    assert f"rings:{P0}:rx" in message and str(box.state) in message
    assert "retries the restore" in message


def test_a_rollback_the_journal_cannot_record_says_so(box, monkeypatch):
    assert box.apply().error is None
    box.kernel.writes.clear()
    _fail_journal_writes(monkeypatch, box, errno.ENOSPC)
    report = box.run("rollback")
    assert report["exit_code"] == 1, report
    message = report["error"]["message"]
    assert message.startswith("every change was restored") and str(box.state) in message
    assert box.kernel.snapshot() == box.initial


def test_a_full_state_directory_is_refused_before_the_first_write(box, monkeypatch):
    real = os.fstatvfs

    def nearly_full(fd):
        st = real(fd)
        return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, 3, 3, st.f_files,
                                  st.f_ffree, st.f_favail, st.f_flag, st.f_namemax))

    monkeypatch.setattr(os, "fstatvfs", nearly_full)
    report = box.run("apply")
    assert report["exit_code"] == 1
    message = report["error"]["message"]
    assert str(box.state) in message and "12 KiB free" in message
    assert box.kernel.writes == [] and not box.journal_path.exists()


# -- item 7: what a state directory must be ------------------------------------------

def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_state_is_private_whatever_the_umask(tmp_path):
    box = Box(tmp_path, state="state/netns/nt0")
    old = os.umask(0)
    try:
        assert box.apply().error is None
    finally:
        os.umask(old)
    for d in ("state", "state/netns", "state/netns/nt0", "state/netns/nt0/history"):
        assert _mode(tmp_path / d) == 0o700, d
    assert _mode(box.journal_path) == _mode(box.state / "lock") == 0o600
    assert [_mode(box.state / "history" / c) for c in box.copies()] == [0o600]


def _refused(box, *words, commands=("apply", "rollback")):
    for command in commands:
        report = box.run(command)
        assert report["exit_code"] == 1, report
        message = report["error"]["message"]
        assert all(w in message for w in words), message
    assert mtus(box) == (9000, 9000)  # the apply before stays as it was


def test_a_journal_of_another_user_is_refused(box):
    assert box.apply().error is None
    os.chown(box.journal_path, 65534, 65534)
    _refused(box, str(box.journal_path), "uid 65534")


def test_a_journal_others_may_write_is_refused(box):
    assert box.apply().error is None
    os.chmod(box.journal_path, 0o666)
    _refused(box, str(box.journal_path), "writable by group or others", "chmod go-w")


def test_a_journal_that_is_a_link_is_not_followed(box, tmp_path):
    assert box.apply().error is None
    elsewhere = tmp_path / "forged.json"
    os.rename(box.journal_path, elsewhere)
    os.symlink(elsewhere, box.journal_path)
    _refused(box, str(box.journal_path), "symbolic link")


def test_a_journal_that_is_a_fifo_is_refused_without_waiting(box):
    assert box.apply().error is None
    os.unlink(box.journal_path)
    os.mkfifo(box.journal_path, 0o600)

    def hung(signum, frame):
        raise AssertionError("opening the journal waited for a writer")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        _refused(box, str(box.journal_path), "not a regular file")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_history_link_deletes_nothing_elsewhere(box, tmp_path):
    assert box.apply().error is None
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    names = [f"2020010{i}T000000Z-1.json" for i in range(1, 10)] + ["notes.txt"]
    names += [f"2021{i:02d}01T000000Z-1.json" for i in range(1, 13)]
    for name in names:
        (elsewhere / name).write_text("{}")
    history = box.state / "history"
    for copy in box.copies():
        os.unlink(history / copy)
    os.rmdir(history)
    os.symlink(elsewhere, history)
    _refused(box, str(history), "symbolic link")
    assert sorted(os.listdir(elsewhere)) == sorted(names)


def test_a_state_directory_others_may_write_is_refused(box):
    assert box.apply().error is None
    os.chmod(box.state, 0o777)
    _refused(box, str(box.state), "writable by group or others")


def test_a_state_directory_inside_one_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    box = Box(tmp_path, state="shared/state")
    report = box.run("apply")
    assert report["exit_code"] == 1 and str(shared) in report["error"]["message"]
    assert box.kernel.writes == []
    # A sticky directory (such as /tmp) is fine: nobody may rename another's entries.
    os.chmod(shared, 0o1777)
    assert box.run("apply")["exit_code"] == 0


def test_a_state_directory_of_another_user_is_refused(tmp_path):
    box = Box(tmp_path)
    box.state.mkdir(mode=0o700)
    os.chown(box.state, 65534, 65534)
    with pytest.raises(StateDirError) as refused:
        box.apply()
    assert str(box.state) in refused.value.message and "uid 65534" in refused.value.message
    assert box.kernel.writes == []


# -- target lock files: removed while held, never lost to a waiter -----------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="target locks live in TARGET_LOCK_DIR as root")
def test_a_waiter_on_a_lock_file_removed_meanwhile_locks_the_new_one(tmp_path, monkeypatch):
    import threading

    locks = tmp_path / "locks"
    monkeypatch.setattr(journal, "TARGET_LOCK_DIR", str(locks))
    real_flock, waiting, calls = journal._flock, threading.Event(), []

    def flock(fd, wait, held):
        if threading.current_thread().name == "waiter" and "network namespace" in held:
            calls.append(os.fstat(fd).st_ino)  # the target lock's, not the state directory's
            waiting.set()
        real_flock(fd, wait, held)

    monkeypatch.setattr(journal, "_flock", flock)
    seen = {}

    def waiter():
        with journal.Journal(str(tmp_path / "b"), root="/").lock(wait=True):
            path = journal.target_lock()
            seen["exists"] = os.path.exists(path)
            seen["path"] = os.stat(path).st_ino

    first = journal.Journal(str(tmp_path / "a"), root="/")
    holding = first.lock()
    holding.__enter__()
    path = journal.target_lock()
    old_inode = os.stat(path).st_ino
    thread = threading.Thread(target=waiter, name="waiter")
    try:
        thread.start()
        assert waiting.wait(10)  # the waiter opened the file and blocks in flock
        thread.join(0.2)
        assert thread.is_alive()
    finally:
        holding.__exit__(None, None, None)  # settled (it never claimed): removed, then released
    thread.join(10)
    assert not thread.is_alive()
    # It first waited on the old inode, found it gone once it got it, and
    # locked the file now at the path instead.
    # (An inode number may come again once its file is gone: the count tells.)
    assert len(calls) == 2 and calls[0] == old_inode, calls
    assert seen["exists"] and seen["path"] == calls[1]
    assert not os.path.exists(path)  # and it, too, removed its file on the way out
