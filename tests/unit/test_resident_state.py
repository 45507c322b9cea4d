"""The resident agent's pieces without a kernel: the desired state that
apply stores and rollback puts back (on the fake ConnectX-7 host of
tests/fakes.py, standing in for hardware this machine lacks), the flap
limiter, on_drift's reading, and the link-event parser."""

from __future__ import annotations

import copy
import json
import os
import stat
import struct
import time

import pytest

from fakes import FakeHost
from nictune.host.transaction.engine import Engine
from nictune.host.errors import JournalDamaged, StateDirError
from nictune.host.transaction.journal import Journal
from nictune.host.resident.daemon import FlapLimiter, drift_policy, parse_link_events
from nictune.profile.loader import load_profile_text
from nictune.profile.errors import ProfileError
from shipped import CX7, P1

pytestmark = pytest.mark.recorded


@pytest.fixture
def cx7(tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    state = str(tmp_path / "state")
    return host, state


def desired_file(state: str) -> dict:
    with open(os.path.join(state, "desired.json")) as f:
        return json.load(f)


def other_doc() -> dict:
    doc = copy.deepcopy(CX7.doc)
    entry = next(e for e in doc["interfaces"].values() if e.get("mtu") == 9000)
    entry["mtu"] = 4200
    return doc


def test_a_committed_apply_stores_its_profile_as_the_desired_state(cx7):
    host, state = cx7
    assert Journal(state).load_desired() is None
    out = Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path)
    assert out.error is None
    desired = desired_file(state)
    journal = Journal(state).load()
    assert desired["doc"] == CX7.doc and desired["sources"] == CX7.sources
    assert desired["path"] == CX7.path and desired["apply"] == journal["id"]
    assert journal["desired_before"] is None
    assert stat.S_IMODE(os.stat(os.path.join(state, "desired.json")).st_mode) == 0o600


def test_rollback_puts_the_previous_desired_state_back(cx7):
    host, state = cx7
    assert Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path).error is None
    first = desired_file(state)
    assert Engine(host, state).apply(other_doc(), CX7.sources, "other.yaml").error is None
    assert desired_file(state)["path"] == "other.yaml"
    assert Engine(host, state).rollback().error is None
    assert desired_file(state) == first
    # Only the last apply rolls back (engine.rollback), and only once: a
    # second plain rollback restores nothing, and says the first apply is
    # still in place (rollback --steps 1 would undo it).
    again = Engine(host, state).rollback()
    assert again.error["kind"] == "no-journal" and first["apply"] in again.error["message"]
    assert not again.changes and desired_file(state) == first


def test_rolling_back_the_first_apply_leaves_no_desired_state(cx7):
    host, state = cx7
    assert Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path).error is None
    assert Engine(host, state).rollback().error is None
    assert Journal(state).load_desired() is None


def test_an_apply_with_nothing_to_write_still_stores_its_profile(cx7):
    host, state = cx7
    os.makedirs(host.path("etc/enroot/mounts.d"))  # enroot installed: every key can be written
    assert Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path).error is None
    out = Engine(host, state).apply(CX7.doc, CX7.sources, "same.yaml")
    assert out.error is None and all(c.status == "ok" for c in out.changes)
    assert desired_file(state)["path"] == "same.yaml" and desired_file(state)["apply"] is None


def test_the_resident_agents_own_apply_keeps_the_desired_state(cx7):
    host, state = cx7
    assert Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path).error is None
    first = desired_file(state)
    out = Engine(host, state).apply(other_doc(), CX7.sources, "other.yaml", remember=False)
    assert out.error is None and desired_file(state) == first
    assert "desired_before" not in Journal(state).load()


def test_only_limits_the_writes_and_leaves_the_rest_as_drift(cx7):
    host, state = cx7
    out = Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path, remember=False,
                                    only=lambda key: key.target == P1 and key.name == "mtu")
    written = {(c.key.target, c.key.name) for c in out.changes if c.status == "applied"}
    assert written == {(P1, "mtu")}
    assert any(c.status == "drift" for c in out.changes)
    assert host.kernel.links[P1].mtu == 9000
    assert Journal(state).load_desired() is None


def test_a_desired_state_that_is_not_ours_is_refused(cx7):
    host, state = cx7
    assert Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path).error is None
    path = os.path.join(state, "desired.json")
    os.chmod(path, 0o666)
    with pytest.raises(StateDirError, match="writable by group or others"):
        Journal(state).load_desired()
    os.chmod(path, 0o600)
    with open(path, "w") as f:
        f.write("[1, 2]")
    # A damaged one gives way to its copy (written before it)...
    journal = Journal(state)
    assert journal.load_desired()["path"] == CX7.path
    assert "not a stored profile" in journal.desired_warnings[0]
    assert "desired.json.copy" in journal.desired_warnings[0]
    # ...but not when the copy is damaged too, or not nictune's.
    with open(path + ".copy", "w") as f:
        f.write('{"doc": ')
    with pytest.raises(JournalDamaged, match="not a stored profile.*copy is not usable either"
                                             ".*not JSON"):
        Journal(state).load_desired()
    os.remove(path + ".copy")
    with pytest.raises(JournalDamaged, match="copy is not usable either.*does not exist"):
        Journal(state).load_desired()
    # A damaged one does not block the next apply, which replaces it.
    assert Engine(host, state).apply(other_doc(), CX7.sources, "other.yaml").error is None
    assert desired_file(state)["path"] == "other.yaml"


def test_the_desired_state_copy_follows_every_store_and_removal(cx7):
    host, state = cx7
    copy = os.path.join(state, "desired.json.copy")
    assert Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path).error is None
    with open(copy) as f:
        assert json.load(f) == desired_file(state)
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert Engine(host, state).apply(other_doc(), CX7.sources, "other.yaml").error is None
    with open(copy) as f:
        assert json.load(f)["path"] == "other.yaml"
    with open(os.path.join(state, "desired.json"), "wb") as f:
        f.write(b"\x00\xff torn")
    assert Journal(state).load_desired()["path"] == "other.yaml"
    # A rollback puts the one before back, copy first; the first apply's
    # rollback removes both, so no stale copy stands in for nothing.
    assert Engine(host, state).rollback().error is None
    with open(copy) as f:
        assert json.load(f)["path"] == CX7.path
    Journal(state).save_desired(None)
    assert not os.path.exists(copy) and Journal(state).load_desired() is None


def test_the_flap_limiter_leaves_a_key_alone_at_its_limit_within_the_window():
    limiter = FlapLimiter(limit=3, window=600)
    assert not limiter.drifted("k", 0) and not limiter.drifted("k", 100)
    assert not limiter.drifted("other", 150)
    assert limiter.drifted("k", 599)          # the third within 600 s
    assert limiter.drifted("k", 5000)         # and it stays left alone
    assert not limiter.drifted("other", 151)
    limiter.reset()
    assert not limiter.drifted("k", 6000)


def test_drifts_spread_wider_than_the_window_are_never_left_alone():
    limiter = FlapLimiter(limit=3, window=600)
    assert not any(limiter.drifted("k", t) for t in (0, 400, 800, 1200, 1600))


def test_on_drift_reads_like_on_unsupported():
    doc = {"on_drift": {"default": "report", "host.sysctl": "restore"},
           "interfaces": {"rail": {"on_drift": {"mtu": "restore"}}, "other": {}}}
    assert drift_policy(doc, "interfaces.rail", "mtu") == "restore"
    assert drift_policy(doc, "interfaces.rail", "features.gro") == "report"
    assert drift_policy(doc, "interfaces.other", "mtu") == "report"
    assert drift_policy(doc, "host", "sysctl.net.ipv4.tcp_ecn") == "restore"
    assert drift_policy({}, "host", "sysctl.x") == "report"
    assert drift_policy({"on_drift": "restore"}, "interfaces.rail", "mtu") == "restore"


def test_the_schema_takes_on_drift_and_refuses_other_words():
    base = "nictune: 1\ninterfaces:\n  rail:\n    match: {name: eth0}\n    mtu: 9000\n"
    assert load_profile_text("on_drift: restore\n" + base).doc["on_drift"] == "restore"
    entry = base + "    on_drift: {default: report, mtu: restore}\n"
    assert load_profile_text(entry).doc["interfaces"]["rail"]["on_drift"]["mtu"] == "restore"
    with pytest.raises(ProfileError, match="on_drift"):
        load_profile_text("on_drift: fight\n" + base)


def _link_msg(kind: int, index: int, name: str) -> bytes:
    ifname = name.encode() + b"\0"
    nla = struct.pack("=HH", 4 + len(ifname), 3) + ifname
    nla += b"\0" * (-len(nla) % 4)
    body = struct.pack("=BxHiII", 0, 1, index, 0, 0) + nla
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def test_link_events_are_parsed_from_a_batch():
    data = _link_msg(16, 7, "ntv0") + _link_msg(17, 7, "ntv0") + _link_msg(16, 9, "ntv0")
    assert parse_link_events(data) == [("new", 7, "ntv0"), ("del", 7, "ntv0"), ("new", 9, "ntv0")]


def test_an_apply_whose_desired_state_cannot_be_stored_is_rolled_back(cx7, monkeypatch):
    host, state = cx7
    before = host.kernel.snapshot()

    def refuse(self, desired):
        raise StateDirError("cannot store the desired state: disk full (test)")

    monkeypatch.setattr(Journal, "save_desired", refuse)
    out = Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path)
    assert out.error["kind"] == "rolled-back" and "disk full (test)" in out.error["message"]
    assert host.kernel.snapshot() == before
    assert Journal(state).load()["status"] == "rolled-back"


def test_a_desired_state_that_is_not_a_file_refuses_the_apply_before_any_write(cx7):
    host, state = cx7
    os.makedirs(os.path.join(state, "desired.json"), mode=0o700)
    os.chmod(state, 0o700)
    before = host.kernel.snapshot()
    with pytest.raises(StateDirError, match="not a regular file"):
        Engine(host, state).apply(CX7.doc, CX7.sources, CX7.path)
    assert host.kernel.snapshot() == before


# -- the agent's start and its re-reads of the desired state ------------------------

def _agent(host, state, monkeypatch, booted: float = 0.0):
    """A Resident on the fake host, no socket; boot_time() says `booted`."""
    from nictune.host.resident import daemon

    monkeypatch.setattr(daemon, "boot_time", lambda: booted)
    lines = []
    agent = daemon.Resident(state, log=lines.append, listen=False)
    agent.host = host
    agent.lines = lines
    return agent


def _applied_then_drifted(cx7, on_drift=None) -> tuple:
    host, state = cx7
    doc = copy.deepcopy(CX7.doc)
    if on_drift:
        doc["on_drift"] = on_drift
    assert Engine(host, state).apply(doc, CX7.sources, CX7.path).error is None
    assert host.kernel.links[P1].mtu == 9000
    host.kernel.links[P1].mtu = 1500  # an operator's change, being looked into
    return host, state


def test_a_restart_reports_report_only_keys_and_writes_nothing(cx7, monkeypatch):
    host, state = _applied_then_drifted(cx7)
    agent = _agent(host, state, monkeypatch)
    assert agent.refresh_desired()
    agent.take_up("start", at_start=True)
    assert host.kernel.links[P1].mtu == 1500
    rec = agent.status["keys"][f"link:{P1}:mtu"]
    assert rec["drifted"] and rec["drifts"] == 1 and rec["on_drift"] == "report"
    assert agent.status["reapplies"] == 0 and agent.status["last_reapply"] is None
    assert agent.status["last_verify"] is not None


def test_a_restart_puts_back_restore_keys_as_drift(cx7, monkeypatch):
    host, state = _applied_then_drifted(cx7, on_drift="restore")
    agent = _agent(host, state, monkeypatch)
    assert agent.refresh_desired()
    agent.take_up("start", at_start=True)
    assert host.kernel.links[P1].mtu == 9000
    rec = agent.status["keys"][f"link:{P1}:mtu"]
    assert rec["drifts"] == 1 and rec["restores"] == 1 and not rec["drifted"]
    assert agent.status["last_reapply"]["reason"] == f"start: restore link:{P1}:mtu"


def test_a_new_desired_state_read_while_running_is_not_written_over_report_keys(cx7, monkeypatch):
    host, state = cx7
    agent = _agent(host, state, monkeypatch)
    assert not agent.refresh_desired()  # nothing stored yet
    host_doc = copy.deepcopy(CX7.doc)
    assert Engine(host, state).apply(host_doc, CX7.sources, CX7.path).error is None
    host.kernel.links[P1].mtu = 1500
    agent.cycle([], due=False)  # reads the new desired state, as each turn does
    assert host.kernel.links[P1].mtu == 1500
    assert agent.status["keys"][f"link:{P1}:mtu"]["drifted"] and agent.status["reapplies"] == 0


def test_the_first_start_since_boot_applies_the_whole_desired_state(cx7, monkeypatch):
    host, state = _applied_then_drifted(cx7)
    # The kernel booted after the apply and no agent ran since: its
    # defaults are back, nobody is looking into anything.
    time.sleep(0.01)
    booted = time.time()
    time.sleep(0.01)
    # An agent that ran in this boot (its boot id) before the clock stepped
    # forward looks older than the boot: the boot id says otherwise.
    stepped = _agent(host, state, monkeypatch, booted=booted)
    assert stepped.refresh_desired()
    stepped._previous_status = {"started": booted - 3600, "boot_id": stepped.status["boot_id"]}
    assert stepped.status["boot_id"] and not stepped.first_start_since_boot()
    stepped._previous_status["boot_id"] = "another boot"
    assert stepped.first_start_since_boot()
    agent = _agent(host, state, monkeypatch, booted=booted)
    assert agent.refresh_desired() and agent.first_start_since_boot()
    agent.take_up("start", at_start=True)
    assert host.kernel.links[P1].mtu == 9000
    assert agent.status["last_reapply"]["reason"] == "boot"
    assert not agent.status["keys"][f"link:{P1}:mtu"]["drifted"]
    # A second agent of the same boot (a restart) is not a first start.
    agent.write_status()
    host.kernel.links[P1].mtu = 1500
    again = _agent(host, state, monkeypatch, booted=booted)
    assert again.refresh_desired() and not again.first_start_since_boot()
    again.take_up("start", at_start=True)
    assert host.kernel.links[P1].mtu == 1500
    # Nor is one whose boot time is unknown.
    assert not _agent(host, state, monkeypatch, booted=0.0).first_start_since_boot()


def test_a_damaged_desired_state_gives_way_to_its_copy_and_says_so(cx7, monkeypatch):
    from nictune.host.resident import metrics

    host, state = _applied_then_drifted(cx7)
    with open(os.path.join(state, "desired.json"), "w") as f:
        f.write('{"doc": [')
    agent = _agent(host, state, monkeypatch)
    assert agent.refresh_desired() and agent.status["idle"] is None
    agent.take_up("start", at_start=True)
    assert agent.status["desired_state"]["ok"] and agent.status["desired_state"]["from_copy"]
    assert agent.status["keys"][f"link:{P1}:mtu"]["drifted"]
    assert any("using its copy" in line for line in agent.lines)
    samples = {(n, tuple(sorted(labels.items()))): v
               for n, labels, v in metrics.status_samples(agent.status)}
    assert samples[("nictune_desired_state_ok", ())] is True
    assert samples[("nictune_desired_state_from_copy", ())] is True
    assert samples[("nictune_drifted_keys", ())] >= 1


def test_a_desired_state_that_cannot_be_read_is_a_series_not_zero_drift(cx7, monkeypatch):
    from nictune.host.resident import metrics

    host, state = _applied_then_drifted(cx7)
    for name in ("desired.json", "desired.json.copy"):
        with open(os.path.join(state, name), "w") as f:
            f.write("not json")
    agent = _agent(host, state, monkeypatch)
    assert not agent.refresh_desired()
    assert agent.status["idle"].startswith("the desired state cannot be read")
    assert agent.status["desired_state"]["reason"] == "damaged"
    names = {(n, tuple(labels.items())): v for n, labels, v in metrics.status_samples(agent.status)}
    assert names[("nictune_desired_state_ok", (("reason", "damaged"),))] is False
    assert ("nictune_drifted_keys", ()) not in names  # never compared: no count at all
    # `nictune agent status` shows the agent and why it idles, not only an error.
    from typer.testing import CliRunner

    from nictune.cli.app import app

    agent.write_status()
    result = CliRunner().invoke(app, ["agent", "status", "--state-dir", state])
    assert result.exit_code == 0, result.output
    assert "desired profile: CANNOT BE READ: the desired state" in result.stdout
    assert "idle: the desired state cannot be read" in result.stdout
    # Not nictune's (group-writable): refused, another reason.
    os.chmod(os.path.join(state, "desired.json"), 0o666)
    agent.refresh_desired()
    assert agent.status["desired_state"]["reason"] == "refused"


def test_a_file_someone_else_wrote_over_nictunes_is_drift_the_agent_reports_and_leaves(cx7, monkeypatch):
    # Someone replaces the NCCL file nictune wrote with their own: the host
    # differs from the desired state, so the agent counts drift (as verify
    # does), and never writes over a file nictune did not write, whatever
    # on_drift says (an apply needs adopt: true).
    host, state = cx7
    doc = copy.deepcopy(CX7.doc)
    doc["on_drift"] = "restore"
    doc.setdefault("host", {})["nccl"] = {"env": {"NCCL_IB_TC": 106}}
    os.makedirs(host.path("etc"), exist_ok=True)
    assert Engine(host, state).apply(doc, CX7.sources, CX7.path).error is None
    with open(host.path("etc/nccl.conf"), "w") as f:
        f.write("NCCL_IB_TC=0\nROOT_PASSWORD=hunter2\n")
    agent = _agent(host, state, monkeypatch)
    assert agent.refresh_desired()
    agent.take_up("start", at_start=True)
    rec = agent.status["keys"]["nccl:host:/etc/nccl.conf"]
    assert rec["drifted"] and rec["drifts"] == 1 and rec["restores"] == 0
    with open(host.path("etc/nccl.conf")) as f:
        assert f.read() == "NCCL_IB_TC=0\nROOT_PASSWORD=hunter2\n"
    assert not any("hunter2" in line for line in agent.lines)


class _Events:
    """A ready monitor whose read() gives one batch of link events."""

    def __init__(self, events: list):
        self.events, self.downs = events, set()

    def read(self) -> list:
        events, self.events = self.events, []
        return events


def test_a_link_event_right_after_a_verify_is_verified_in_the_same_turn(cx7, monkeypatch):
    host, state = _applied_then_drifted(cx7, on_drift="restore")
    agent = _agent(host, state, monkeypatch)
    agent.limiter = FlapLimiter(limit=10)  # four drifts are not a flapping key here
    assert agent.refresh_desired()
    agent.take_up("start")  # a verify (it puts the MTU back), as the agent's own write's event asks
    assert host.kernel.links[P1].mtu == 9000
    agent.learn_links()
    index = agent.ifindex[P1]
    for n in range(3):  # drifts in quick succession, each reported by an event
        host.kernel.links[P1].mtu = 1500
        agent.cycle([_Events([("new", index, P1)])], due=False)
        assert host.kernel.links[P1].mtu == 9000, n
    assert agent.status["keys"][f"link:{P1}:mtu"]["restores"] == 4


def test_a_storm_of_link_events_is_verified_at_a_bounded_pace():
    from nictune.host.resident.daemon import Pacer

    pacer = Pacer(burst=4, gap=0.25)
    now = pacer.at
    for _ in range(4):  # a burst at once
        assert pacer.next_at(now) == now
        pacer.spend(now)
    assert pacer.next_at(now) == pytest.approx(now + 0.25)
    now += 0.1
    assert pacer.next_at(now) == pytest.approx(now + 0.15)
    now += 10  # quiet for a while: a whole burst again, never more
    for _ in range(4):
        assert pacer.next_at(now) == now
        pacer.spend(now)
    assert pacer.next_at(now) > now


def test_a_turn_that_changed_nothing_but_the_time_writes_no_status(cx7, monkeypatch):
    host, state = _applied_then_drifted(cx7)
    agent = _agent(host, state, monkeypatch)
    assert agent.refresh_desired()
    agent.take_up("start")
    agent.write_status(if_changed=True)
    path = os.path.join(state, "agent-status.json")
    first = os.stat(path).st_ino  # replaced whole (a rename): a new inode at each write
    agent.cycle([_Events([("del", 999, "gone0")])], due=False)  # a link we never kept went away
    agent.write_status(if_changed=True)
    assert os.stat(path).st_ino == first
    agent.cycle([], due=True)  # a poll: its last_verify is news
    agent.write_status(if_changed=True)
    assert os.stat(path).st_ino != first
    assert json.load(open(path))["last_verify"] == agent.status["last_verify"]
