"""The journal and the locks when the state directory fails, on the real kernel.

The agent runs as it does over SSH or for --netns (one JSON line in, one
out), under `ip netns exec`, so the MTU it writes is really written; what
is left afterwards is read back with `ip -j link`.  Faults come from
tests/netns/fault_agent.py (a filesystem that fills up, EIO, an apply held
mid-write) or from a small tmpfs mounted under the test's directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from netns_helpers import wait_for

import nictune
from nictune import REQUEST_FORMAT

pytestmark = pytest.mark.netns

FAULT_AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_agent.py")


def _request(state, mtu: int = 4000, command: str = "apply", confirm=None) -> bytes:
    request = {"nictune_request": REQUEST_FORMAT, "command": command, "state_dir": str(state)}
    if command == "apply":
        doc = {"nictune": 1, "interfaces": {"rail": {"match": {"name": "ntv0"}, "mtu": mtu}}}
        request["profile"] = {"path": "faults.yaml", "doc": doc, "sources": {}}
    if confirm:
        request["confirm"] = {"timeout": confirm}
    return (json.dumps(request) + "\n").encode()


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(nictune.__file__)))


def _argv(pair, *fault: str) -> list:
    agent = [FAULT_AGENT, *fault] if fault else ["-m", "nictune.host.agent"]
    return ["ip", "netns", "exec", pair.ns_a, sys.executable, *agent]


def _run(pair, request: bytes, *fault: str) -> dict:
    proc = subprocess.run(_argv(pair, *fault), input=request, capture_output=True, env=_env(),
                          timeout=120)
    assert proc.stdout, proc.stderr.decode()
    return json.loads(proc.stdout.splitlines()[0])


def _mtu(pair) -> int:
    out = pair.run(pair.ns_a, ["ip", "-j", "link", "show", "ntv0"]).stdout
    return json.loads(out)[0]["mtu"]


def _journal(state) -> dict:
    return json.loads((state / "journal.json").read_text())


def _status(state):
    """The journal's status, or None while it is still damaged."""
    try:
        return _journal(state)["status"]
    except ValueError:
        return None


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs of the test's own, unmounted whatever happens."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "nttmpfs",
                              str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# -- item 5: a state directory that fails after the kernel was written ----------

def test_a_nearly_full_state_directory_is_refused_before_any_write(veth_pair, small_fs):
    state = small_fs / "state"
    # Leave 32 KiB: less than an apply's journal wants with its margin.
    (small_fs / "filler").write_bytes(b"\0" * ((1 << 20) - (32 << 10)))
    report = _run(veth_pair, _request(state))
    assert report["exit_code"] == 1 and report["error"]["kind"] == "system", report
    message = report["error"]["message"]
    assert str(state) in message and "KiB free" in message and "nothing was changed" in message
    assert _mtu(veth_pair) == 1500
    assert not (state / "journal.json").exists()


def test_a_disk_filling_up_mid_apply_rolls_the_host_back(veth_pair, small_fs):
    state = small_fs / "state"
    filler = small_fs / "filler"
    report = _run(veth_pair, _request(state), "fill", str(filler))
    # The MTU was written (then the disk filled): the host went back, and
    # the report says why and where.
    assert report["exit_code"] == 3 and report["error"]["kind"] == "rolled-back", report
    message = report["error"]["message"]
    assert str(state) in message and "No space left on device" in message
    assert "still says 'applying'" in message
    assert [c["status"] for c in report["changes"]] == ["reverted"]
    assert _mtu(veth_pair) == 1500
    # Once there is room, rollback finds the host as it was and settles the journal.
    filler.unlink()
    report = _run(veth_pair, _request(state, command="rollback"))
    assert report["exit_code"] == 0, report
    assert _journal(state)["status"] == "rolled-back"
    assert _run(veth_pair, _request(state))["exit_code"] == 0
    assert _mtu(veth_pair) == 4000


def test_eio_on_every_journal_write_after_the_kernel_write_rolls_back(veth_pair, tmp_path):
    state = tmp_path / "state"
    report = _run(veth_pair, _request(state), "eio", "-")
    assert report["exit_code"] == 3 and report["error"]["kind"] == "rolled-back", report
    message = report["error"]["message"]
    assert str(state) in message and "Input/output error" in message
    assert _mtu(veth_pair) == 1500
    assert _journal(state)["status"] == "applying"  # what the message says is left
    # The next apply is told to roll that one back first; rollback then clears it.
    assert _run(veth_pair, _request(state))["error"]["kind"] == "interrupted"
    assert _run(veth_pair, _request(state, command="rollback"))["exit_code"] == 0
    assert _run(veth_pair, _request(state))["exit_code"] == 0 and _mtu(veth_pair) == 4000


# -- item 6: the watchdog when the journal is damaged -----------------------------

def _applied_unconfirmed(pair, state, timeout: float) -> None:
    """An apply whose session dies after its report: its watchdog decides."""
    agent = subprocess.Popen(_argv(pair), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=_env())
    agent.stdin.write(_request(state, confirm=timeout))
    agent.stdin.flush()
    report = json.loads(agent.stdout.readline())
    assert report["ok"] and report["changed"], report
    assert _mtu(pair) == 4000
    return agent


def test_watchdog_rolls_back_from_the_history_copy_of_a_damaged_journal(veth_pair, tmp_path):
    state = tmp_path / "state"
    agent = _applied_unconfirmed(veth_pair, state, timeout=2.0)
    (state / "journal.json").write_bytes(b'{"journal": 1, "id": "2')  # truncated
    agent.stdin.close()
    agent.wait(timeout=30)
    assert wait_for(lambda: _mtu(veth_pair) == 1500, 15.0)
    # The watchdog's rollback rewrote the journal whole.
    assert wait_for(lambda: _status(state) == "rolled-back", 15.0)
    assert _journal(state)["confirm"]["state"] == "expired"


def test_watchdog_rolls_back_from_what_it_read_when_journal_and_copy_are_lost(veth_pair, tmp_path):
    state = tmp_path / "state"
    agent = _applied_unconfirmed(veth_pair, state, timeout=5.0)
    agent.stdin.close()
    agent.wait(timeout=30)
    time.sleep(1.0)  # the watchdog has read the journal by now (it polls every 0.25 s)
    for path in [state / "journal.json", *(state / "history").iterdir()]:
        path.write_bytes(b"\x89\x00\xff not json")
    assert _mtu(veth_pair) == 4000
    assert wait_for(lambda: _mtu(veth_pair) == 1500, 15.0)
    assert wait_for(lambda: _status(state) == "rolled-back", 15.0)


# -- item 8: one apply at a time per namespace, whatever the state directory --------

def test_a_second_state_directory_does_not_let_a_second_apply_in(veth_pair, tmp_path):
    gate = tmp_path / "gate"
    first = subprocess.Popen(_argv(veth_pair, "block", str(gate)), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        first.stdin.write(_request(tmp_path / "state-a", mtu=4000))
        first.stdin.close()
        assert wait_for(lambda: os.path.exists(str(gate) + ".entered"), 60)
        # The first apply is mid-write; another state directory changes nothing.
        second = _run(veth_pair, _request(tmp_path / "state-b", mtu=5000))
        assert second["exit_code"] == 1 and second["error"]["kind"] == "locked", second
        assert "network namespace" in second["error"]["message"]
        gate.touch()
        report = json.loads(first.stdout.readline())
        assert report["exit_code"] == 0, report
    finally:
        gate.touch()
        first.wait(timeout=60)
    assert _mtu(veth_pair) == 4000
    assert not (tmp_path / "state-b" / "journal.json").exists()


def test_an_apply_awaiting_confirmation_holds_the_namespace_for_other_state_dirs(veth_pair,
                                                                               tmp_path):
    first = subprocess.Popen(_argv(veth_pair), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=_env())
    try:
        first.stdin.write(_request(tmp_path / "state-a", confirm=30.0))
        first.stdin.flush()
        assert json.loads(first.stdout.readline())["changed"]
        second = _run(veth_pair, _request(tmp_path / "state-b", mtu=5000))
        assert second["error"]["kind"] == "locked", second
        message = second["error"]["message"]
        assert "awaits its controller's confirmation" in message
        assert str(tmp_path / "state-a") in message
        assert _mtu(veth_pair) == 4000
        first.stdin.write(b"confirm\n")
        first.stdin.flush()
        assert json.loads(first.stdout.readline()) == {"nictune_confirm": "confirmed"}
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    # Confirmed: the namespace is free again, from any state directory.
    assert _run(veth_pair, _request(tmp_path / "state-b", mtu=5000))["exit_code"] == 0
    assert _mtu(veth_pair) == 5000


# -- an agent killed before it reported ------------------------------------------------

def _netns_target(pair, tmp_path, *fault: str):
    from nictune.control.remote.targets import NetnsTarget

    target = NetnsTarget(pair.ns_a, str(tmp_path / "state"))
    target.argv = lambda: _argv(pair, *fault)
    return target


def test_a_killed_apply_says_what_its_journal_holds_and_how_to_undo_it(veth_pair, tmp_path):
    from nictune.host.errors import Interrupted

    request = json.loads(_request(tmp_path / "unused"))
    with pytest.raises(Interrupted) as e:
        _netns_target(veth_pair, tmp_path, "kill", "after").run(request)
    message = str(e.value)
    assert _mtu(veth_pair) == 4000  # partly changed: written, never committed
    record = json.loads((tmp_path / "state" / "netns" / veth_pair.ns_a / "journal.json").read_text())
    assert record["status"] == "applying"
    assert "the agent was killed by signal 9 (SIGKILL) before it reported" in message
    assert f"in the middle of apply {record['id']}" in message
    assert "1 before-value(s)" in message and "link mtu on ntv0" in message
    rollback = f"nictune rollback --netns {veth_pair.ns_a} --state-dir {tmp_path / 'state'}"
    assert f"`{rollback}` restores them" in message
    assert e.value.as_dict()["kind"] == "interrupted"
    # What it says to run does undo it.
    from nictune.cli.app import app
    from typer.testing import CliRunner

    args = rollback.split()[1:]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _mtu(veth_pair) == 1500


def test_an_apply_killed_before_its_journal_says_nothing_was_written(veth_pair, tmp_path):
    from nictune.host.errors import TransportError

    request = json.loads(_request(tmp_path / "unused"))
    with pytest.raises(TransportError) as e:
        _netns_target(veth_pair, tmp_path, "kill", "before").run(request)
    assert "killed by signal 9 (SIGKILL)" in str(e.value)
    assert "it journaled nothing" in str(e.value) and "the host is as it was" in str(e.value)
    assert _mtu(veth_pair) == 1500


# -- the per-namespace lock files in /run/nictune ----------------------------------------

def _lock_path(pair) -> str:
    r = subprocess.run(["ip", "netns", "exec", pair.ns_a, sys.executable, "-c",
                        "from nictune.host.transaction.journal import target_lock; print(target_lock())"],
                       capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_settled_apply_leaves_no_lock_file_behind(veth_pair, tmp_path):
    lock = _lock_path(veth_pair)
    assert lock.startswith("/run/nictune/net") and not os.path.exists(lock)
    assert _run(veth_pair, _request(tmp_path / "state"))["exit_code"] == 0
    assert _mtu(veth_pair) == 4000
    assert not os.path.exists(lock)  # one file per namespace made, hundreds left: no more
    assert _run(veth_pair, _request(tmp_path / "state", command="rollback"))["exit_code"] == 0
    assert not os.path.exists(lock) and _mtu(veth_pair) == 1500


def test_the_lock_file_stays_while_it_says_something_then_goes(veth_pair, tmp_path):
    lock = _lock_path(veth_pair)
    state_a = tmp_path / "state-a"
    # Killed mid-apply: the file keeps naming state-a, so state-b still waits.
    proc = subprocess.run(_argv(veth_pair, "kill", "after"), input=_request(state_a),
                          capture_output=True, env=_env(), timeout=120)
    assert proc.returncode == -9 and _mtu(veth_pair) == 4000
    with open(lock) as f:
        assert json.load(f) == {"state_dir": str(state_a)}
    second = _run(veth_pair, _request(tmp_path / "state-b", mtu=5000))
    assert second["error"]["kind"] == "interrupted" and str(state_a) in second["error"]["message"]
    assert os.path.exists(lock)
    # Rolled back, it says nothing any more.
    assert _run(veth_pair, _request(state_a, command="rollback"))["exit_code"] == 0
    assert _mtu(veth_pair) == 1500 and not os.path.exists(lock)
    assert _run(veth_pair, _request(tmp_path / "state-b", mtu=5000))["exit_code"] == 0
    assert not os.path.exists(lock)
