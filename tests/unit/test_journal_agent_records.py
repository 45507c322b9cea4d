"""`nictune rollback` and the resident agent's own journal records.

The agent journals every apply it makes ("by": "agent", host/resident/daemon.py);
a user's rollback must still undo the user's last apply and put back the
desired state before it (engine.Engine.rollback, journal.user_apply).  On
the fake ConnectX-7 host of tests/fakes.py, with a real state directory;
the same with the agent as a process in a namespace is in
tests/netns/test_resident_agent.py.
"""

from __future__ import annotations

import json
import os

import pytest

from fakes import FakeHost
from nictune.host.transaction import journal
from nictune.host import model as m
from nictune.host.transaction.engine import Engine, Superseded
from nictune.host.errors import JournalDamaged
from shipped import P0, P1

pytestmark = pytest.mark.recorded

A = {"nictune": 1, "interfaces": {
    "rails": {"match": {"name": [P0, P1]}, "mtu": 9000, "rings": {"rx": 4096}}}}
B = {"nictune": 1, "interfaces": {"rails": {"match": {"name": [P0, P1]}, "mtu": 4000}}}


class Box:
    def __init__(self, tmp_path):
        self.host = FakeHost("cx7-host", tmp_path / "root")
        self.kernel = self.host.kernel
        self.state = tmp_path / "state"
        self.initial = self.kernel.snapshot()

    def engine(self) -> Engine:
        return Engine(self.host, str(self.state))

    def apply(self, doc, path):
        out = self.engine().apply(doc, {}, path)
        assert out.error is None, out.error
        return self.record()

    def agent_restore(self, **kw):
        """What the resident agent does: apply the stored desired state
        (resident.Resident.reapply)."""
        d = self.engine().journal.load_desired()
        return self.engine().apply(d["doc"], d["sources"], d["path"], remember=False,
                                   keeping=d, **kw)

    def record(self) -> dict:
        return json.loads((self.state / "journal.json").read_text())

    def copy(self, record_id: str) -> dict:
        return json.loads((self.state / "history" / f"{record_id}.json").read_text())

    def desired(self) -> dict:
        return json.loads((self.state / "desired.json").read_text())

    def mtus(self) -> tuple:
        return self.kernel.links[P0].mtu, self.kernel.links[P1].mtu


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


def test_rollback_passes_over_the_agents_restores_to_the_users_apply(box):
    first = box.apply(A, "a.yaml")
    after_a = box.kernel.snapshot()
    second = box.apply(B, "b.yaml")
    assert box.mtus() == (4000, 4000) and box.desired()["apply"] == second["id"]
    box.kernel.links[P0].mtu = 1500  # drift, which the agent puts back
    out = box.agent_restore()
    assert out.error is None and box.mtus() == (4000, 4000)
    mine = box.record()
    assert mine["by"] == "agent" and mine["id"].endswith("-agent")
    assert [c["before"] for c in mine["changes"]] == [1500]

    out = box.engine().rollback()
    assert out.error is None, out.error
    assert out.extra["journal"] == second["id"]
    # A's values, not the drifted 1500 the agent's record holds as before.
    assert box.mtus() == (9000, 9000) and box.kernel.snapshot() == after_a
    assert box.desired()["apply"] == first["id"] and box.desired()["path"] == "a.yaml"
    assert box.record()["id"] == second["id"] and box.record()["status"] == "rolled-back"
    assert box.copy(mine["id"])["status"] == "committed"  # kept as what it was
    # Once more: that apply was rolled back; nothing else is touched, and
    # the first apply, still in place, is named (rollback --steps 1 undoes it).
    again = box.engine().rollback()
    assert again.changes == [] and again.error["kind"] == "no-journal"
    assert "already rolled back" in again.error["message"] and first["id"] in again.error["message"]
    assert box.mtus() == (9000, 9000)


def test_the_agent_applying_a_replaced_desired_state_writes_nothing(box):
    box.apply(A, "a.yaml")
    box.apply(B, "b.yaml")
    kept = box.engine().journal.load_desired()  # what a running agent holds
    assert box.engine().rollback().error is None
    box.kernel.links[P0].mtu = 1500
    with pytest.raises(Superseded):
        box.engine().apply(kept["doc"], {}, kept["path"], remember=False, keeping=kept)
    assert box.mtus() == (1500, 9000)
    assert box.record()["status"] == "rolled-back"  # no record of the agent's


def test_an_unfinished_agent_apply_is_undone_with_the_users(box):
    class Crash(BaseException):
        """The agent dies mid-apply: nothing catches it."""

    box.apply(A, "a.yaml")
    box.kernel.links[P0].mtu = box.kernel.links[P1].mtu = 1500
    box.kernel.fail("set_link", P1, error=Crash())
    with pytest.raises(Crash):
        box.agent_restore()
    box.kernel.faults.clear()
    assert box.record()["by"] == "agent" and box.record()["status"] == "applying"
    assert box.mtus() == (9000, 1500)  # P0 written before the crash

    out = box.engine().rollback()
    assert out.error is None, out.error
    assert any("the resident agent's" in w and "had not finished" in w for w in out.warnings)
    # (The drift above was set past the fake's ipv6 mtu mirror: compare what nictune wrote.)
    now = box.kernel.snapshot()
    assert now["links"] == box.initial["links"] and now["ops"] == box.initial["ops"]
    assert not (box.state / "desired.json").exists()  # the one before the first apply
    agents = [n for n in os.listdir(box.state / "history") if n.endswith("-agent.json")]
    assert [box.copy(n[:-5])["status"] for n in agents] == ["rolled-back"]


def test_the_agents_records_never_prune_the_users_last_apply(box, monkeypatch):
    monkeypatch.setattr(journal, "HISTORY_KEPT", 2)
    first = box.apply(A, "a.yaml")
    for n in range(4):
        box.kernel.links[P1].mtu = 1500 + n
        assert box.agent_restore().error is None
    names = sorted(os.listdir(box.state / "history"))
    assert f"{first['id']}.json" in names
    assert len([n for n in names if n.endswith("-agent.json")]) == 2
    assert box.engine().rollback().error is None
    assert box.kernel.snapshot() == box.initial


def test_a_journal_of_the_previous_format_still_rolls_back(box):
    record = box.apply(A, "a.yaml")
    old = {k: v for k, v in record.items() if k != "by"}
    old["journal"] = 1
    for path in (box.state / "journal.json", box.state / "history" / f"{record['id']}.json"):
        path.write_text(json.dumps(old))
    out = box.engine().rollback()
    assert out.error is None and {c.status for c in out.changes} == {m.REVERTED}
    assert box.kernel.snapshot() == box.initial


@pytest.mark.parametrize("fields, why", [
    ({"journal": 3}, "format 'journal' is 3"),
    ({"by": "someone"}, "'by' is not 'agent'"),
    ({"journal": 1, "by": "agent"}, "'by' is not 'agent'"),  # format 1 had no agent records
])
def test_records_of_another_shape_are_refused(box, fields, why):
    record = box.apply(A, "a.yaml")
    record.update(fields)
    for path in (box.state / "journal.json", box.state / "history" / f"{record['id']}.json"):
        path.write_text(json.dumps(record))
    with pytest.raises(JournalDamaged, match=why):
        box.engine().rollback()
    assert box.mtus() == (9000, 9000)
