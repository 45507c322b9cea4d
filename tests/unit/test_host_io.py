"""Host.io (host/transports/io.py): the one door to the kernel, and its adapters.

The live port's derived operations answer as os.path does; a recording and
the probe's learning wrap the host's own port (a fake host stays fake) and
patch nothing process-wide; a recording asks every registered family what
a later plan may read (Family.plan_reads)."""

from __future__ import annotations

import builtins
import json
import os
import socket

from fakes import FakeHost

from nictune.host import knobs

from nictune.host.replay import probe_reads

from nictune.host.replay import snapshot
from nictune.host.transports.io import LiveIO


def _tree(tmp_path):
    """Files, directories and symlinks: relative, absolute, chained,
    dangling, looping and through '..'."""
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/b/file").write_text("x")
    os.symlink("b", tmp_path / "a/rel")
    os.symlink(str(tmp_path / "a/b/file"), tmp_path / "abs")
    os.symlink("a/rel/file", tmp_path / "chain")
    os.symlink("nowhere", tmp_path / "dangling")
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    os.symlink("../a/b", tmp_path / "a/b/up")
    return ["a", "a/rel", "a/rel/file", "abs", "chain", "dangling", "loop1", "a/b/up/file",
            "a/b/up/up/../file", "a/./b//file", "missing/x", "a/rel/../b/file"]


def test_the_live_port_answers_as_os_path_does(tmp_path):
    io = LiveIO()
    paths = _tree(tmp_path)
    assert len(paths) == 12
    for rel in paths:
        path = str(tmp_path / rel)
        assert io.realpath(path) == os.path.realpath(path), rel
        assert io.isdir(path) == os.path.isdir(path), rel
        assert io.isfile(path) == os.path.isfile(path), rel
        assert io.exists(path) == os.path.exists(path), rel
        assert io.lexists(path) == os.path.lexists(path), rel


def test_makedirs_makes_what_is_missing_and_takes_what_is_there(tmp_path):
    io = LiveIO()
    io.makedirs(str(tmp_path / "x/y/z"), 0o755)
    assert (tmp_path / "x/y/z").is_dir()
    io.makedirs(str(tmp_path / "x/y/z"), 0o755)  # exist_ok
    (tmp_path / "f").write_text("")
    try:
        io.makedirs(str(tmp_path / "f"), 0o755)
    except FileExistsError:
        pass
    else:
        raise AssertionError("a file where a directory should be was taken")


def test_a_recording_patches_nothing_and_keeps_the_hosts_own_port(tmp_path):
    state = {"links": [], "page_size": 65536}
    host = FakeHost(state, tmp_path / "root")
    (tmp_path / "root/proc/sys/net/core").mkdir(parents=True)
    (tmp_path / "root/proc/sys/net/core/somaxconn").write_text("4096\n")
    originals = (builtins.open, os.open, os.stat, os.listdir, socket.socket)
    seen = []

    def run():
        seen.append((builtins.open, os.open, os.stat, os.listdir, socket.socket))
        return host.page_size()

    page, reads = snapshot.record(host, run, "2026-12-01T03:00:00Z")
    assert seen == [originals]  # nothing of the process was swapped, even while recording
    assert page == 65536  # the fake host's page size, through its own port
    assert reads["calls"]['host.page_size[[],{}]'] == {"value": 65536}
    assert reads["files"]["open /proc/sys/net/core/somaxconn"] == {"text": "4096\n"}
    assert host.io.page_size() == 65536 and not isinstance(host.io, snapshot.SessionIO)
    replay = snapshot.RecordedHost(reads)
    assert replay.page_size() == 65536
    assert replay.io.read_text("/nictune-snapshot/proc/sys/net/core/somaxconn") == "4096\n"


def test_learning_keeps_the_hosts_own_port_and_patches_nothing(tmp_path):
    host = FakeHost({"links": []}, tmp_path / "root")
    (tmp_path / "root/sys/class/net").mkdir(parents=True)
    originals = (builtins.open, os.open, os.listdir, socket.socket)

    def run():
        assert (builtins.open, os.open, os.listdir, socket.socket) == originals
        host.io.sleep(3)  # the fake port's clock, not this process's
        return host.io.listdir(host.path("sys/class/net"))

    listing, questions = probe_reads.learn(host, run)
    assert listing == [] and host.io.waits == [3]
    assert questions["files"] == ["listdir /sys/class/net"]


def test_a_recording_asks_every_registered_family_what_a_plan_may_read(tmp_path, monkeypatch):
    classes = {knobs.load(name) for name in knobs.CATALOG}
    assert len(classes) >= 15
    asked = []
    for cls in classes:
        monkeypatch.setattr(cls, "plan_reads", classmethod(lambda c, host: asked.append(c)))
    host = FakeHost({"links": []}, tmp_path / "root")
    snapshot.record(host, lambda: None, "2026-12-01T03:00:00Z")
    assert sorted(asked, key=lambda c: c.__name__) == sorted(classes, key=lambda c: c.__name__)


def test_macsec_key_files_are_read_through_the_port(tmp_path):
    """The MACsec family's key-file check goes through Host.io: a recording
    keeps its fingerprint (no key), a replay answers with it."""
    from nictune.host.knobs.macsec import MacsecFamily

    key = tmp_path / "tx.key"
    key.write_text("00112233445566778899aabbccddeeff\n")
    os.chmod(key, 0o600)
    section = {"macsec": {"cipher": "gcm-aes-xpn-128", "tx_sa": {
        "an": 0, "pn": 1, "ssci": 1, "salt": "00" * 12, "key_file": str(key)}}}

    def expand(host):
        return [(d.key, d.want.value) for d in
                MacsecFamily(host).expand("enp23s0f0np0", section, lambda *p: "profile.yaml")]

    host = FakeHost("cx7-host", tmp_path / "root")
    desired, reads = snapshot.record(host, lambda: expand(host), "2026-12-01T03:00:00Z")
    assert any("key" in str(value) for _, value in desired), desired
    loads = [ident for ident in reads["calls"] if ident.startswith("keyfile.load")]
    assert len(loads) == 1 and "00112233" not in json.dumps(reads)
    assert expand(snapshot.RecordedHost(reads)) == desired


FORMAT1 = os.path.join(os.path.dirname(__file__), "..", "fixtures", "snapshots",
                       "cx7-rails-format1.json")


def test_a_snapshot_written_before_the_port_replays_as_a_new_one(tmp_path):
    """tests/fixtures/snapshots/cx7-rails-format1.json: a show of
    fakes.cx7_rails_state() recorded by the code that patched open/os/socket
    (format 1).  Today's recording of the same host holds the same reads,
    and both plan the same profile alike, key for key."""
    from fakes import cx7_rails_state

    from nictune.host import agent
    from nictune.profile.loader import load_profile

    with open(FORMAT1) as f:
        old = json.load(f)
    assert old["nictune_snapshot"] == snapshot.SNAPSHOT_FORMAT == 1
    report = agent.run({"nictune_request": 1, "command": "show", "record": True,
                        "state_dir": str(tmp_path / "state")},
                       host=FakeHost(cx7_rails_state(), tmp_path / "root"))
    new = json.loads(json.dumps(report["snapshot"]))
    # Families registered after the recording ask more, in their plan_reads
    # (knobs/irq.py) or in the files they own (knobs/jobenv.py, and /etc
    # itself: /etc/environment's directory): nothing else differs.
    from nictune.host.knobs.irq import IrqFamily

    later_host = FakeHost(cx7_rails_state(), tmp_path / "later")
    _, later = snapshot.record(later_host, lambda: IrqFamily.plan_reads(later_host),
                               "2026-12-01T03:00:00Z")
    added = ("/etc/slurm", "/etc/enroot", "/etc/environment")
    for part in ("calls", "files"):  # the same questions (stat answers hold inodes and times)
        assert len(old["reads"][part]) > 10
        assert set(old["reads"][part]) <= set(new["reads"][part]), part
        extra = set(new["reads"][part]) - set(old["reads"][part]) - set(later[part])
        assert all(ident == "stat /etc" or any(p in ident for p in added) for ident in extra), \
            sorted(extra)
    profile = load_profile(os.path.join(os.path.dirname(__file__), "..", "golden",
                                        "connectx7-training", "profile.yaml"))
    request = {"nictune_request": 1, "command": "plan",
               "profile": {"path": profile.path, "doc": profile.doc, "sources": profile.sources}}

    def plan(snap):
        out = agent.run(dict(request, host="h1"), host=snapshot.RecordedHost(snap["reads"]))
        return out["error"], out["changes"]

    from nictune.host import knobs

    # Asked since the old recording: the rails' addresses, rules and routes
    # (knobs/routing.py) and the IPv6 sysctls that keep their GIDs still.
    later_keys = ("routing", ".addr_gen_mode", ".accept_ra")

    def without_new_files(result):  # the old recording cannot answer their questions
        error, changes = result  # (nor can a snapshot answer pcie's: offline_plan)
        # How many settings the error counts depends on those left out.
        return error and error["kind"], [
            c for c in changes if c["key"]["family"] not in ("enroot_mounts", "routing")
            and not c["key"]["name"].endswith(later_keys[1:])
            and knobs.load(c["key"]["family"]).offline_plan is None]

    error, changes = plan(old)
    [mounts] = [c for c in changes if c["key"]["family"] == "enroot_mounts"]
    assert "not in the snapshot" in mounts["note"]
    assert len(changes) > 20 and sum(c["status"] == "pending" for c in changes) > 5
    assert without_new_files(plan(new)) == without_new_files((error, changes))
