"""The apply history and rollback through it (engine.Engine.rollback,
journal.Journal.user_records), without a kernel: on the fake ConnectX-7
host of tests/fakes.py and on a host root of files, with real state
directories.  The same chain on a real kernel is tests/netns/test_rollback_history.py.
"""

from __future__ import annotations

import json
import os

import pytest

from fakes import FakeHost
from nictune.host import agent
from nictune.host.errors import InvalidInput, NoJournal
from nictune.host.knobs.nccl import HEADER
from nictune.host.machine import Host
from nictune.host.transaction import engine as engine_mod
from nictune.host.transaction import journal
from nictune.host.transaction.engine import Engine
from shipped import P0, P1

pytestmark = pytest.mark.recorded


def rails(mtu: int, **more) -> dict:
    return {"nictune": 1, "interfaces": {"rails": {"match": {"name": [P0, P1]}, "mtu": mtu, **more}}}


class Box:
    """A fake ConnectX-7 host and a state directory."""

    def __init__(self, tmp_path):
        self.host = FakeHost("cx7-host", tmp_path / "root")
        self.kernel = self.host.kernel
        self.state = tmp_path / "state"
        self.initial = self.kernel.snapshot()

    def engine(self) -> Engine:
        return Engine(self.host, str(self.state))

    def apply(self, doc: dict, path: str) -> str:
        out = self.engine().apply(doc, {}, path)
        assert out.error is None, out.error
        return json.loads((self.state / "journal.json").read_text())["id"]


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


def test_three_applies_are_undone_newest_first_back_to_the_start(box):
    ids = [box.apply(rails(9000, rings={"rx": 4096}), "a.yaml"), box.apply(rails(4000), "b.yaml"),
           box.apply(rails(4200), "c.yaml")]
    assert len(set(ids)) == 3
    history = box.engine().history().extra["history"]
    assert [e["id"] for e in history] == ids[::-1]
    assert [e["profile"] for e in history] == ["c.yaml", "b.yaml", "a.yaml"]
    out = box.engine().rollback(to=ids[0])
    assert out.error is None and out.extra["rolled_back"] == ids[::-1]
    assert box.kernel.snapshot() == box.initial
    # The desired state went back with each: none before the first apply.
    assert not (box.state / "desired.json").exists()


def test_steps_count_the_applies_not_rolled_back_yet(box):
    a = box.apply(rails(9000), "a.yaml")
    after_a = box.kernel.snapshot()
    b = box.apply(rails(4000), "b.yaml")
    c = box.apply(rails(4200), "c.yaml")
    assert box.engine().rollback().extra["rolled_back"] == [c]
    out = box.engine().rollback(steps=1)
    assert out.error is None and out.extra["rolled_back"] == [b]
    assert box.kernel.snapshot() == after_a
    assert json.loads((box.state / "desired.json").read_text())["apply"] == a


def test_a_plain_rollback_after_a_rollback_names_what_is_still_applied(box):
    a = box.apply(rails(9000), "a.yaml")
    after_a = box.kernel.snapshot()
    box.apply(rails(4000), "b.yaml")
    assert box.engine().rollback().error is None
    out = box.engine().rollback()
    assert out.error["kind"] == "no-journal" and a in out.error["message"]
    assert "a.yaml" in out.error["message"] and not out.changes
    assert box.kernel.snapshot() == after_a


def test_too_many_steps_or_an_unknown_id_restore_nothing(box):
    a = box.apply(rails(9000), "a.yaml")
    box.apply(rails(4000), "b.yaml")
    state = box.kernel.snapshot()
    with pytest.raises(NoJournal, match="holds 2 apply"):
        box.engine().rollback(steps=3)
    with pytest.raises(NoJournal, match=a):
        box.engine().rollback(to="19990101T000000Z-1")
    assert box.kernel.snapshot() == state


def test_rewriting_an_old_record_keeps_the_history_in_apply_order(box):
    a = box.apply(rails(9000), "a.yaml")
    b = box.apply(rails(4000), "b.yaml")
    assert box.engine().rollback(to=a).error is None  # rewrites b's copy, then a's
    assert [r["id"] for r in box.engine().journal.user_records()] == [b, a]
    fd = os.open(box.state / "history", os.O_RDONLY)
    try:
        assert journal._records_by_age(fd) == [f"{a}.json", f"{b}.json"]
    finally:
        os.close(fd)


def test_the_history_is_bounded_and_rollback_cannot_pass_its_end(box, monkeypatch):
    monkeypatch.setattr(journal, "HISTORY_KEPT", 2)
    monkeypatch.setattr(engine_mod, "HISTORY_KEPT", 2)
    ids = [box.apply(rails(mtu), f"{mtu}.yaml") for mtu in (9000, 4000, 4200)]
    kept = [e["id"] for e in box.engine().history().extra["history"]]
    assert kept == ids[:0:-1]
    with pytest.raises(NoJournal, match="the last 2 of your applies are kept"):
        box.engine().rollback(to=ids[0])
    assert box.engine().rollback(to=ids[1]).extra["rolled_back"] == ids[:0:-1]


def test_a_walk_that_dies_part_way_is_finished_by_the_same_command(box, monkeypatch):
    a = box.apply(rails(9000, rings={"rx": 4096}), "a.yaml")
    b = box.apply(rails(4000), "b.yaml")
    c = box.apply(rails(4200), "c.yaml")
    real = engine_mod.restore
    calls = []

    def dies_on_the_second(fams, changes):
        calls.append(1)
        if len(calls) == 2:  # b's keys: half written, then the process is gone
            fams.write(changes[0].key.family, [(changes[0].key, changes[0].before)], revert=True)
            raise KeyboardInterrupt
        return real(fams, changes)

    monkeypatch.setattr(engine_mod, "restore", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        box.engine().rollback(to=a)
    monkeypatch.setattr(engine_mod, "restore", real)
    statuses = {e["id"]: e["status"] for e in box.engine().history().extra["history"]}
    assert statuses == {c: "rolled-back", b: "committed", a: "committed"}
    out = box.engine().rollback(to=a)
    assert out.error is None and out.extra["rolled_back"] == [b, a]
    assert box.kernel.snapshot() == box.initial


def test_a_failed_restore_stops_the_walk_before_older_applies(box, monkeypatch):
    a = box.apply(rails(9000), "a.yaml")
    b = box.apply(rails(4000), "b.yaml")
    state = box.kernel.snapshot()
    monkeypatch.setattr(engine_mod.aside, "restore", lambda host, record: ["a route"])
    out = box.engine().rollback(to=a)
    assert out.error["kind"] == "rollback-failed" and a in out.error["message"]
    assert out.extra["rolled_back"] == [] and box.kernel.snapshot() != state
    statuses = {e["id"]: e["status"] for e in box.engine().history().extra["history"]}
    assert statuses == {b: "rollback-failed", a: "committed"}


# -- files nictune owns: each apply's before is the last one's after -----------------

SECRET = "NCCL_DEBUG=INFO\nROOT_PASSWORD=hunter2\n"  # a file nictune did not write


def nccl(env: dict, **more) -> dict:
    return {"nictune": 1, "host": {"nccl": {"env": env, **more}}}


def run(root, command: str, doc: dict = None, **extra) -> dict:
    request = {"nictune_request": 1, "command": command, **extra,
               "state_dir": str(root.parent / "state")}
    if doc is not None:
        request["profile"] = {"path": "p.yaml", "doc": doc, "sources": {}}
    report = agent.run(request, host=Host(str(root)))
    json.dumps(report)  # what travels
    return report


def test_an_adopted_file_comes_back_through_two_applies_and_never_shows(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    path = root / "etc" / "nccl.conf"
    path.write_text(SECRET)
    assert run(root, "apply", nccl({"NCCL_IB_TC": 106}, adopt=True))["exit_code"] == 0
    assert run(root, "apply", nccl({"NCCL_IB_TC": 41}))["exit_code"] == 0
    assert path.read_text() == HEADER + "NCCL_IB_TC=41\n"
    history = run(root, "history")
    entries = history["history"]
    assert len(entries) == 2 and entries[0]["summary"] == "1 setting(s): nccl /etc/nccl.conf"
    report = run(root, "rollback", rollback={"to": entries[1]["id"]})
    assert report["exit_code"] == 0, report
    assert report["rolled_back"] == [entries[0]["id"], entries[1]["id"]]
    assert path.read_text() == SECRET
    assert "hunter2" not in json.dumps(report) + json.dumps(history)


@pytest.mark.parametrize("how, why", [
    ({"to": "../etc"}, "not an apply id"),
    ({"steps": 0}, "whole number from 1"),
    ({"steps": True}, "whole number from 1"),
    ({"to": "a", "steps": 1}, "as {to: APPLY_ID} or {steps: N}"),
    ({"until": "a"}, "as {to: APPLY_ID} or {steps: N}"),
])
def test_a_request_that_says_how_far_badly_is_refused(how, why):
    with pytest.raises(InvalidInput, match=why.replace("{", r"\{").replace("}", r"\}")):
        agent._validated({"nictune_request": 1, "command": "rollback", "rollback": how})
    with pytest.raises(InvalidInput, match="goes with command rollback"):
        agent._validated({"nictune_request": 1, "command": "history", "rollback": {"steps": 1}})


def test_an_unfinished_agent_apply_is_undone_when_no_apply_of_the_users_is_kept(box):
    # The user's copies gone (a state directory cleaned by hand): the
    # resident agent's half-done apply is still undone, alone.
    class Crash(BaseException):
        """The agent dies mid-apply: nothing catches it."""

    first = box.apply(rails(9000), "a.yaml")
    box.kernel.links[P0].mtu = box.kernel.links[P1].mtu = 1500
    box.kernel.fail("set_link", P1, error=Crash())
    d = box.engine().journal.load_desired()
    with pytest.raises(Crash):
        box.engine().apply(d["doc"], d["sources"], d["path"], remember=False, keeping=d)
    box.kernel.faults.clear()
    os.unlink(box.state / "history" / f"{first}.json")
    out = box.engine().rollback()
    assert out.error is None, out.error
    assert any("the resident agent's" in w for w in out.warnings)
    assert (box.kernel.links[P0].mtu, box.kernel.links[P1].mtu) == (1500, 1500)


@pytest.mark.parametrize("field, value", [
    ("history", [{"id": 1, "status": "committed", "summary": ""}]),
    ("history", [{"id": "x", "status": "committed", "summary": "", "profile": ["p"]}]),
    ("history", {"id": "x"}),
    ("rolled_back", ["x", 2]),
    ("kept", -1),
])
def test_a_host_report_with_a_history_the_printer_cannot_read_is_refused(field, value):
    from nictune.control.remote.hostreport import ProtocolError, accept

    good = {"changes": [], "warnings": [], "error": None, "seconds": 0.1,
            "history": [{"id": "x", "status": "committed", "summary": "", "started": None}],
            "rolled_back": ["x"], "kept": 20}
    assert accept(good, "h1", "history")["history"] == good["history"]
    with pytest.raises(ProtocolError, match=field):
        accept(dict(good, **{field: value}), "h1", "history")
