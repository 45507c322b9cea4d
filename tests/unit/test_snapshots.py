"""Snapshots (host/replay/snapshot.py, control/review/snapshots.py) over the fake kernel.

The golden hosts (tests/golden/states: ConnectX-7 and MANA, which no
kernel here has; tests/fakes.py FakeHost stands in) become snapshots: a
show on the fake host is recorded, and the plan from that snapshot equals
the golden plan of every golden case, key for key.  A read the snapshot
lacks is Unsupported, never a default; an offline plan writes nothing;
key files' bytes never reach a snapshot; an old snapshot is flagged.
"""

from __future__ import annotations

import json
import os

import pytest

from fakes import FakeHost, load_state
from nictune.control.review import snapshots
from nictune.host import agent
from nictune.host.transports import keyfile
from nictune.host.replay import snapshot
from nictune.profile.loader import load_profile

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(HERE), "golden")
REPO = os.path.dirname(os.path.dirname(HERE))
CASES = sorted(d for d in os.listdir(GOLDEN) if os.path.isfile(os.path.join(GOLDEN, d, "profile.yaml")))
# Cases with counter rises (expect counters.X: a second reading seconds
# later), which a snapshot of one instant cannot answer.
RISES = {"cx7-roce-counters", "cx7-shipped-roce-lossless"}


def snapshot_of(state, root) -> dict:
    """A golden host state made into a snapshot file's document: a show on
    the fake host, recorded; through JSON, as it is stored."""
    report = agent.run({"nictune_request": 1, "command": "show", "record": True,
                        "state_dir": str(root) + "-state"}, host=FakeHost(state, root))
    assert report["error"] is None, report["error"]
    return json.loads(json.dumps(report["snapshot"]))


def plan_request(profile_path: str) -> dict:
    profile = load_profile(profile_path)
    return {"nictune_request": 1, "command": "plan",
            "profile": {"path": profile.path, "doc": profile.doc, "sources": profile.sources}}


def offline(request: dict, snap: dict, label: str = "h1") -> dict:
    host = snapshot.RecordedHost(snap["reads"])
    with host.replaying():
        return agent.run(dict(request, host=label), host=host)


def stable(report: dict, roots) -> dict:
    text = json.dumps({k: report[k] for k in ("exit_code", "error", "warnings", "changes")})
    for root in roots:
        text = text.replace(str(root), "<tmp>")
    return json.loads(text.replace(REPO + os.sep, ""))


def _offline_families_aside(report: dict, snap=None) -> dict:
    """The report without the keys (and their warnings) of families that
    declare they cannot be planned from a snapshot (knobs: offline_plan,
    e.g. pcie's config space); in a snapshot's plan (snap given) each of
    them must be left unplanned rather than guessed."""
    from nictune.host import knobs

    aside = [c for c in report["changes"] if knobs.load(c["key"]["family"]).offline_plan is not None]
    if snap is not None:
        assert all(c["status"] in ("unsupported", "skipped") and c["note"] for c in aside), aside
    names = {f"{c['key']['family']} {c['key']['name']} on {c['key']['target']}" for c in aside}
    return {**report, "changes": [c for c in report["changes"] if c not in aside],
            "warnings": [w for w in report.get("warnings", []) if not any(n in w for n in names)]}


@pytest.mark.parametrize("case", CASES)
def test_a_golden_host_as_a_snapshot_plans_as_the_golden_plan(case, tmp_path):
    snap = snapshot_of(load_state(os.path.join(GOLDEN, case, "observed.json")), tmp_path / "root")
    got = stable(offline(plan_request(os.path.join(GOLDEN, case, "profile.yaml")), snap),
                 [tmp_path / "root", snapshot.FAKE_ROOT])
    with open(os.path.join(GOLDEN, case, "expected.json")) as f:
        want = json.load(f)
    got, want = _offline_families_aside(got, snap), _offline_families_aside(want)
    if case not in RISES:
        assert got == want
        return
    # A counter's rise is Unsupported with the snapshot's reason (it takes a
    # second reading seconds later); every other key as golden.
    rises = [c for c in want["changes"] if c["key"]["name"].startswith("counters.")
             and c["before"] is not None]
    assert rises
    by_key = {json.dumps(c["key"]): c for c in got["changes"]}
    for c in rises:
        mine = by_key.pop(json.dumps(c["key"]))
        assert mine["status"] == "unsupported" and mine["before"] is None
        assert mine["note"] == f"not in the snapshot of {snap['recorded']}: a counter's rise " \
                               "(a snapshot holds one instant)"
    assert list(by_key.values()) == [c for c in want["changes"] if c not in rises]


def test_the_golden_states_themselves_become_snapshots(tmp_path):
    """cx7-host and maia-host: the snapshot holds the facts and capabilities
    (drivers, device maxima, fixed features, RDMA devices and GIDs) a plan
    needs, as the file stores it."""
    for state in ("cx7-host", "maia-host"):
        snap = snapshot_of(state, tmp_path / state)
        assert snap["nictune_snapshot"] == 1 and snap["reads"]["root_is_system"] is False
        calls = snap["reads"]["calls"]
        drivers = [v["value"]["fields"]["driver"] for k, v in calls.items()
                   if k.startswith("host.drvinfo") and v.get("value")]
        assert {"cx7-host": "mlx5_core", "maia-host": "mana"}[state] in drivers
        (rings,) = [v["value"] for k, v in calls.items() if k.startswith("ethtool.rings")]
        assert any("rx-max" in dev for dev in rings.values())  # device maxima
        (features,) = [v["value"] for k, v in calls.items() if k.startswith("ethtool.features")]
        assert all("changeable" in dev["fields"] for dev in features.values())  # fixed features
        assert "open /proc/sys/net/core/rmem_max" in snap["reads"]["files"]
    # RDMA devices and GID tables (a golden case with the mlx5 sysfs tree).
    rdma = snapshot_of(load_state(os.path.join(GOLDEN, "rdma-library-files", "observed.json")),
                       tmp_path / "rdma")
    files = rdma["reads"]["files"]
    assert "listdir /sys/class/infiniband" in files
    assert any(k.startswith("open /sys/class/infiniband/mlx5_0/ports/1/gids/") for k in files)


def _without(snap: dict, prefix: str) -> dict:
    out = json.loads(json.dumps(snap))
    for part in ("calls", "files"):
        out["reads"][part] = {k: v for k, v in out["reads"][part].items() if not k.startswith(prefix)}
    return out


def test_a_read_the_snapshot_lacks_is_unsupported_not_a_default(tmp_path):
    snap = snapshot_of("cx7-host", tmp_path / "root")
    request = plan_request(os.path.join(GOLDEN, "rings-above-max", "profile.yaml"))
    when = snap["recorded"]

    report = offline(request, _without(snap, "ethtool.rings"))
    rings = [c for c in report["changes"] if c["key"]["family"] == "rings"]
    assert rings and all(c["status"] == "unsupported" for c in rings)
    assert all(f"not in the snapshot of {when}: ethtool rings()" in c["note"] for c in rings)

    # A file read: a sysctl whose value was not recorded.
    sysctl = plan_request(os.path.join(GOLDEN, "connectx7-training", "profile.yaml"))
    report = offline(sysctl, _without(snap, "open /proc/sys/net/core/rmem_max"))
    (row,) = [c for c in report["changes"] if c["key"]["name"] == "net.core.rmem_max"]
    assert row["status"] in ("unsupported", "skipped") and row["before"] is None
    assert f"not in the snapshot of {when}: the content of /proc/sys/net/core/rmem_max" in row["note"]

    # A sysctl that is not in a recorded directory listing did not exist: ENOENT, as live.
    missing = dict(sysctl, profile=dict(sysctl["profile"], doc={
        "nictune": 1, "host": {"sysctl": {"net.core.no_such_key": 1}}}, sources={}))
    (row,) = offline(missing, snap)["changes"]
    assert row["status"] == "unsupported" and "no such sysctl" in row["note"]


def test_an_offline_plan_never_writes(tmp_path):
    snap = snapshot_of("cx7-host", tmp_path / "root")
    request = plan_request(os.path.join(GOLDEN, "connectx7-training", "profile.yaml"))
    report = offline(dict(request, command="apply"), snap)
    assert report["error"] is not None and report["changed"] is False
    host = snapshot.RecordedHost(snap["reads"])
    with host.replaying():
        with pytest.raises(snapshot.SnapshotWrite):
            host.io.open("/proc/sys/net/core/rmem_max", "w")  # the host's port: its only door
        with pytest.raises(snapshot.SnapshotWrite):
            host.rtnl().set_link(2, mtu=9000)
        with pytest.raises(snapshot.SnapshotWrite):
            host.io.mkdir("/etc/nictune-was-here")
    assert not os.path.exists("/etc/nictune-was-here")
    # Outside the replay, this thread's files are its own again.
    with open(tmp_path / "after", "w") as f:
        f.write("x")


def test_key_files_never_reach_a_snapshot(tmp_path):
    key = "00112233445566778899aabbccddeeff"
    path = tmp_path / "k1.key"
    path.write_text(key + "\n")
    os.chmod(path, 0o600)
    host = FakeHost("cx7-host", tmp_path / "root")

    def run():  # families read key files through the host's port
        material, fp = host.io.key_load(str(path), 16, uid=os.geteuid())
        keyfile.wipe(material)
        return fp

    fingerprint, reads = snapshot.record(host, run, "2026-12-01T03:00:00Z")
    text = json.dumps(reads)
    assert key not in text and key.upper() not in text and key[:8] not in text
    assert fingerprint in text  # what plans and the journal carry anyway
    replay = snapshot.RecordedHost(reads)
    with replay.replaying():
        material, fp = replay.io.key_load(str(path), 16, uid=os.geteuid())
        assert fp == fingerprint and material == bytearray(16)  # no key: zeros of its length
        with pytest.raises(snapshot.NotInSnapshot, match="snapshots hold no key material"):
            replay.io.key_load(str(tmp_path / "other.key"), 16)
        # Nor can the file itself be opened through the replay (keyfile.py's
        # own os.open is the live port's, never a replay's).
        with pytest.raises(snapshot.NotInSnapshot):
            replay.io.os_open(str(path), os.O_RDONLY)
    assert fingerprint == keyfile.fingerprint((key + "\n").encode())


def test_snapshot_files_are_named_by_the_inventory_and_flagged_when_old(tmp_path):
    snap = snapshot_of("maia-host", tmp_path / "root")
    snap["recorded"] = snap["reads"]["recorded"] = "2026-11-29T00:00:00Z"
    reports = [{"host": "gpu-01", "snapshot": snap, "error": None},
               {"host": "gpu-02", "error": {"kind": "transport", "message": "timed out"}}]
    directory = str(tmp_path / "snaps")
    warnings = snapshots.save(reports, directory)
    assert warnings == ["gpu-02: no snapshot saved (timed out)"]
    assert "snapshot" not in reports[0] and reports[0]["snapshot_file"].endswith("gpu-01.json")
    assert os.stat(reports[0]["snapshot_file"]).st_mode & 0o777 == 0o600
    request = plan_request(os.path.join(GOLDEN, "maia-mana", "profile.yaml"))
    recorded_at = snapshots.recorded_at(snap)

    fresh = snapshots.run(request, "gpu-01", directory, 86400, now=recorded_at + 3600)
    assert fresh["snapshot"]["stale"] is False
    assert not any("snapshot of" in w for w in fresh["warnings"])
    old = snapshots.run(request, "gpu-01", directory, 86400, now=recorded_at + 2 * 86400)
    assert old["snapshot"] == {"file": reports[0]["snapshot_file"], "recorded": "2026-11-29T00:00:00Z",
                               "age_seconds": 2 * 86400, "stale": True}
    assert any(w.startswith("planned from a snapshot of 2026-11-29T00:00:00Z, 2d old (more than "
                            "--max-age 1d)") for w in old["warnings"])
    assert old["changes"] == fresh["changes"]

    # The file must be the host's: one copied to another host's name is refused.
    os.rename(reports[0]["snapshot_file"], os.path.join(directory, "gpu-03.json"))
    refused = snapshots.run(request, "gpu-03", directory, None)
    assert "a snapshot of 'gpu-01', not of 'gpu-03'" in refused["error"]["message"]
    missing = snapshots.run(request, "gpu-01", directory, None)
    assert "no snapshot of gpu-01" in missing["error"]["message"]
    with pytest.raises(Exception, match="90s, 30m, 24h or 7d"):
        snapshots.parse_age("yesterday")
    assert snapshots.parse_age("24h") == 86400


def test_only_commands_that_read_are_recorded(tmp_path):
    request = plan_request(os.path.join(GOLDEN, "connectx7-training", "profile.yaml"))
    host = FakeHost("cx7-host", tmp_path / "root")
    report = agent.run(dict(request, command="apply", record=True,
                            state_dir=str(tmp_path / "state")), host=host)
    assert report["error"]["kind"] == "invalid-input" and "record goes with show" in \
        report["error"]["message"]
    assert host.kernel.writes == [] and "snapshot" not in report
    # A plan (or verify) with record: its own reads, then a show's.
    report = agent.run(dict(request, record=True, state_dir=str(tmp_path / "state")), host=host)
    assert report["error"] is None and report["snapshot"]["nictune_snapshot"] == 1
    assert host.kernel.writes == []


# -- hostile snapshot files: each is its host's error, naming the file ---------------------

class _Hang(BaseException):
    pass


def _bounded(seconds: int):
    """A context in which a blocking open or read fails the test instead of hanging it."""
    import contextlib
    import signal

    @contextlib.contextmanager
    def bound():
        def alarm(signum, frame):
            raise _Hang(f"still blocked after {seconds} s")
        old = signal.signal(signal.SIGALRM, alarm)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    return bound()


def _hostile_dir(tmp_path) -> tuple:
    """A snapshot directory with a good host and one of each kind of bad file."""
    snap = snapshot_of("cx7-host", tmp_path / "root")
    directory = tmp_path / "snaps"
    directory.mkdir()

    def write(label, doc):
        (directory / f"{label}.json").write_text(json.dumps(dict(doc, host=label)))
    write("good", snap)
    wrong_type = json.loads(json.dumps(snap))
    (key,) = [k for k in wrong_type["reads"]["calls"] if k.startswith("host.drvinfo")][:1]
    wrong_type["reads"]["calls"][key]["value"]["fields"]["driver"] = 5  # int where text is
    write("int-as-text", wrong_type)
    (directory / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.symlink("/dev/zero", directory / "dev-zero.json")
    os.mkfifo(directory / "fifo.json")
    return directory, snap


@pytest.mark.parametrize("label, words", [
    ("int-as-text", "reads.calls['host.drvinfo"),
    ("deep", "nested more deeply than Python can read"),
    ("dev-zero", "a symbolic link"),
    ("fifo", "a FIFO, not a regular file"),
])
def test_a_hostile_snapshot_file_is_its_hosts_error_naming_the_file(tmp_path, label, words):
    directory, _ = _hostile_dir(tmp_path)
    request = plan_request(os.path.join(GOLDEN, "connectx7-training", "profile.yaml"))
    with _bounded(10):
        report = snapshots.run(request, label, str(directory), None)
    message = report["error"]["message"]
    assert report["error"]["kind"] == "invalid-input"
    assert message.startswith(str(directory / f"{label}.json") + ": ") and words in message, message


def test_one_bad_snapshot_leaves_the_other_hosts_planned(tmp_path):
    from types import SimpleNamespace

    directory, _ = _hostile_dir(tmp_path)
    request = plan_request(os.path.join(GOLDEN, "connectx7-training", "profile.yaml"))
    labels = ["int-as-text", "deep", "dev-zero", "fifo", "good"]
    jobs = [SimpleNamespace(label=label, request=request, error=None) for label in labels]
    with _bounded(20):
        reports = snapshots.run_jobs(jobs, str(directory), None)
    assert [r["host"] for r in reports] == labels
    assert all(str(directory / f"{r['host']}.json") in r["error"]["message"] for r in reports[:4])
    assert reports[4]["error"] is None and reports[4]["changes"]


@pytest.mark.parametrize("value", [
    {"$enum": "nictune.host.replay.snapshot:os.system", "value": "touch {marker}"},
    {"$nt": "nictune.host.agent:subprocess.getoutput", "items": ["touch {marker}"]},
    {"$dc": "nictune.host.replay.snapshot:os.system", "fields": {}},
    {"$raise": "nictune.host.replay.snapshot:os.system", "message": "touch {marker}"},
])
def test_a_snapshot_never_names_a_function_to_call(tmp_path, value):
    """The tags name nictune's data classes; a function reached through a
    module's imports ("nictune.host.replay.snapshot:os.system") is refused."""
    marker = tmp_path / "ran"
    snap = snapshot_of("cx7-host", tmp_path / "root")
    value = json.loads(json.dumps(value).replace("{marker}", str(marker)))
    key = next(k for k in snap["reads"]["calls"] if k.startswith("host.page_size"))
    snap["reads"]["calls"][key] = value if "$raise" in value else {"value": value}
    directory = tmp_path / "snaps"
    directory.mkdir()
    (directory / "h1.json").write_text(json.dumps(dict(snap, host="h1")))
    request = plan_request(os.path.join(GOLDEN, "connectx7-training", "profile.yaml"))
    report = snapshots.run(request, "h1", str(directory), None)
    assert not marker.exists()
    assert "is not the name of a nictune" in report["error"]["message"]
    assert report["error"]["message"].startswith(str(directory / "h1.json"))


def test_a_large_snapshot_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    directory = tmp_path / "snaps"
    directory.mkdir()
    with open(directory / "h1.json", "w") as f:
        f.truncate(snapshots.MAX_SNAPSHOT_BYTES + 1)  # sparse: no disk space used
    report = snapshots.run({"command": "plan"}, "h1", str(directory), None)
    assert "more than a snapshot may hold (32 MiB)" in report["error"]["message"]


def _nested(depth: int):
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("reads, words", [
    ({"calls": []}, "reads.calls is not a mapping"),
    ({"files": {"open /x": {"text": 5}}}, "reads.files['open /x'].text is not text"),
    ({"files": {"open /x": {"$bytes": "!!"}}}, "reads.files['open /x'].$bytes is not base64 text"),
    ({"files": {"chmod /x": {"value": None}}}, "is not a file operation nictune records"),
    ({"files": {"lstat /x": {"stat": [0] * 9}}}, "stat is not a list of 10 integers"),
    ({"files": {"listdir /x": {"value": [1]}}}, "value is not what listdir returns"),
    ({"files": {"open /x": {"$raise": "os", "errno": 1 << 40}}}, "errno is not an errno number"),
    ({"calls": {"k": {"fingerprint": "f", "length": 1 << 40}}}, "length is not a key length"),
    ({"calls": {"k": {"value": _nested(34)}}}, "is nested more than 32 deep"),
    ({"calls": {"k": {"value": {"$dc": "nictune.host.transports.netlink.drvinfo:DrvInfo",
                                "fields": {"driver": 5}}}}}, "field driver is 5, not str"),
    ({"calls": {"k": {"value": {"$bytes": "AA==", "x": 1}}}}, "which is no recorded value"),
])
def test_each_field_of_a_snapshot_is_checked_for_its_type(reads, words):
    from nictune.host.replay.snapshot_check import BadSnapshot, check_reads

    with pytest.raises(BadSnapshot) as e:
        check_reads(reads)
    assert words in str(e.value)


def test_a_recorded_os_error_without_a_number_is_kept():
    from nictune.host.replay.snapshot_check import check_reads

    check_reads({"files": {"open /x": {"$raise": "os", "errno": None, "strerror": "odd"}}})


def test_a_snapshot_saved_before_the_host_side_had_rooms_names_its_classes_still():
    """Snapshots name their classes by module path; those saved before the
    modules moved into host/'s rooms (facts/, transports/netlink/...) replay."""
    from nictune.host.facts.rdma import Gid
    from nictune.host.transports.netlink.drvinfo import DrvInfo

    gid = {"$dc": "nictune.host.rdma:Gid", "fields": {
        "device": "mlx5_0", "port": 1, "index": 3, "gid": "0000:0000:0000:0000:0000:ffff:c612:0001",
        "type": "RoCE v2", "ndev": "enp23s0f0np0"}}
    drv = {"$dc": "nictune.host.netlink.drvinfo:DrvInfo", "fields": {
        "driver": "mlx5_core", "version": "6.8", "fw_version": "28.39.1002", "bus_info": "0000:17:00.0"}}
    assert snapshot.decode(gid) == Gid("mlx5_0", 1, 3, "0000:0000:0000:0000:0000:ffff:c612:0001",
                                       "RoCE v2", "enp23s0f0np0")
    assert snapshot.decode(drv) == DrvInfo("mlx5_core", "6.8", "28.39.1002", "0000:17:00.0")
    # and what is saved today names where the class lives now
    assert snapshot.encode(snapshot.decode(gid))["$dc"] == "nictune.host.facts.rdma:Gid"
