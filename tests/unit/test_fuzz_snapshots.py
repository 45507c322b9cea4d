"""Fuzz: hostile snapshot files through `plan --from-snapshots`.

Snapshot files may be committed for reviewers' CI, so their content is
anybody's.  From one good snapshot (a golden host recorded on the fake
kernel), one fixed seed makes mutants: a field of another type at any
place, a key dropped, huge text and lists, nesting deeper than a recording
and deeper than Python's parser, class names that would call a function
(os.system), truncated JSON, bytes that are not UTF-8; and files that are
not files: a symlink to /dev/zero, a FIFO, a directory, a socket, a file
larger than the cap.  tests/fuzz/snapshot_driver.py plans them in a child
process with a memory limit, each under a time bound, then as one fleet.

Expected: no traceback, no hang, no allocation past the limit, no command
run; every host whose snapshot is refused has an error naming its file,
and the good hosts among them plan as they would alone.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
from collections import Counter

import pytest

from fakes import FakeHost, load_state
from nictune.control.review import snapshots
from nictune.host import agent
from nictune.profile.loader import load_profile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(REPO, "tests", "golden")
CASE = "connectx7-training"
SEED = int(os.environ.get("NICTUNE_FUZZ_SEED", "20261204"))  # fixed in CI; set it to explore
MUTANTS = 240
MEMORY_LIMIT = 1 << 30  # the child's address space: a file that never ends fails here
DRIVER_BOUND = 240  # seconds for the whole child; each host has its own bound in the driver


def _hostile_values(marker: str) -> list:
    """Values a red team puts where a snapshot field is: each type, edges,
    size, depth, and tagged values naming functions to call."""
    deep: object = 0
    for _ in range(40):  # deeper than any recorded value, shallower than the JSON parser's limit
        deep = [deep]
    run = ["touch", marker]
    return [
        None, True, False, 0, -1, 1 << 70, 10 ** 400, 1.5, float("nan"), "", "x" * (2 << 20),
        [0] * 200_000, [], {}, deep, {"a": {"b": None}}, "2026-13-45T99:99:99Z", "\ud800",
        {"$nt": "nictune.host.agent:subprocess.Popen", "items": [run]},
        {"$enum": "nictune.host.replay.snapshot:os.system", "value": " ".join(run)},
        {"$dc": "nictune.host.transports.keyfile:os.system", "fields": {}},
        {"$raise": "nictune.host.replay.snapshot:os.system", "message": " ".join(run)},
        {"$raise": "os", "errno": 10 ** 30, "strerror": None},
        {"$raise": "netlink", "errno": "EPERM"},
        {"$dc": "nictune.host.transports.netlink.rtnl:Link", "fields": {"mtu": "9000"}},
        {"$dc": "nictune.host.transports.netlink.rtnl:Link", "fields": {"__class__": 1}},
        {"$enum": "nictune.host.errors:NoSuchThing", "value": 1},
        {"$bytes": "!!not base64"}, {"$set": [[1]]}, {"$dict": [[{}, 1]]}, {"$tuple": 5},
        {"$bytes": "AA==", "extra": 1}, {"value": 1}, {"stat": [1] * 10}, {"stat": ["x"] * 10},
        {"text": 5}, {"fingerprint": "f", "length": 1 << 40},
    ]


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _mutant(rng: random.Random, good: dict, values: list) -> bytes:
    doc = json.loads(json.dumps(good))
    paths = [p for p in _paths(doc) if p]
    path = rng.choice(paths)
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    op = rng.randrange(10)
    if op < 6:
        parent[path[-1]] = rng.choice(values)
    elif op == 6 and isinstance(parent, dict):
        del parent[path[-1]]
    elif op == 7:  # JSON nesting deeper than Python's parser takes
        text = json.dumps(doc)
        cut = rng.randrange(len(text))
        return (text[:cut] + "[" * 200_000 + text[cut:]).encode()
    elif op == 8:  # truncated, or bytes that are not UTF-8
        text = json.dumps(doc).encode()
        cut = rng.randrange(len(text))
        return text[:cut] if rng.random() < 0.5 else text[:cut] + b"\xff\xfe" + text[cut:]
    else:
        parent[path[-1]] = rng.choice(values)
        doc["reads"]["calls"][rng.choice(["x", "rtnl.links[[],{}]"])] = rng.choice(values)
    return json.dumps(doc).encode(errors="surrogatepass")


def _good_snapshot(tmp_path) -> dict:
    root = tmp_path / "root"
    report = agent.run({"nictune_request": 1, "command": "show", "record": True,
                        "state_dir": str(tmp_path / "state")},
                       host=FakeHost(load_state(os.path.join(GOLDEN, CASE, "observed.json")), root))
    assert report["error"] is None, report["error"]
    snap = report["snapshot"]
    return {"nictune_snapshot": 1, "host": None, "recorded": snap["recorded"],
            "agent": snap["agent"], "reads": snap["reads"]}


def _special_files(directory, good_file) -> list:
    """The labels of files that are not snapshot files, each named for what it is."""
    made = []

    def path(label):
        made.append(label)
        return os.path.join(directory, label + ".json")
    os.symlink("/dev/zero", path("link-to-dev-zero"))
    os.mkfifo(path("fifo"))
    os.mkfifo(os.path.join(directory, "fifo-target"))
    os.symlink(os.path.join(directory, "fifo-target"), path("link-to-fifo"))
    os.mkdir(path("directory"))
    os.symlink(good_file, path("link-to-good"))
    open(path("empty"), "w").close()
    with open(path("sparse-huge"), "w") as f:
        f.truncate(65 << 20)  # above the cap, without the disk space
    with open(path("deep-brackets"), "w") as f:
        f.write("[" * 1_000_000)
    # Just under the cap, JSON of the kind that costs the most memory per byte.
    with open(path("cap-of-mappings"), "wb") as f:
        f.write(b"[" + b"{}," * ((snapshots.MAX_SNAPSHOT_BYTES - 8) // 3) + b"0]")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path("socket"))
    return made


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.fixture
def snapshot_dir(tmp_path):
    """The fuzz cases' directory, removed after the test (a file of 32 MiB among them)."""
    directory = tmp_path / "snaps"
    directory.mkdir()
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_hostile_snapshot_files_are_refused_per_host(tmp_path, snapshot_dir):
    directory = snapshot_dir
    marker = str(tmp_path / "code-ran")
    good = _good_snapshot(tmp_path)
    goods = ["good-01", "good-02"]
    for label in goods:
        (directory / f"{label}.json").write_text(json.dumps(dict(good, host=label)))
    rng = random.Random(SEED)
    values = _hostile_values(marker)
    mutants = []
    for i in range(MUTANTS):
        label = f"mutant-{i:04d}"
        data = _mutant(rng, dict(good, host=label), values)
        (directory / f"{label}.json").write_bytes(data)
        mutants.append(label)
    specials = _special_files(str(directory), str(directory / "good-01.json"))
    profile = load_profile(os.path.join(GOLDEN, CASE, "profile.yaml"))
    request = {"nictune_request": 1, "command": "plan",
               "profile": {"path": profile.path, "doc": profile.doc, "sources": profile.sources}}
    (tmp_path / "request.json").write_text(json.dumps(request))
    # Good hosts first, in the middle and last: a bad host must not stop the ones after it.
    labels = [goods[0]] + mutants[:MUTANTS // 2] + specials + mutants[MUTANTS // 2:] + [goods[1]]

    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "fuzz", "snapshot_driver.py"), str(directory),
         str(tmp_path / "request.json"), *labels],
        capture_output=True, text=True, timeout=DRIVER_BOUND, preexec_fn=_limit_memory,
        env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"), LANG="C"))
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(lines) == len(labels) + 1, proc.stderr[-3000:]
    results, fleet = lines[:-1], lines[-1]["fleet"]

    outcomes = Counter(r["outcome"] for r in results)
    escaped = [r for r in results if r["outcome"] in ("traceback", "hang", "memory")]
    assert not escaped, escaped[:3]
    assert not os.path.exists(marker), "a snapshot ran a command"
    by_label = {r["label"]: r for r in results}
    for label in goods:
        assert by_label[label]["outcome"] == "planned", by_label[label]
    refused, replay_errors = [], []  # the file refused; the plan from it stopped (a read it lacks)
    for r in (r for r in results if r["outcome"] == "error"):
        file = os.path.join(str(directory), r["label"] + ".json")
        assert "\n" not in r["message"], r
        if r["message"].startswith(file + ": "):
            assert len(r["message"]) < 1000, r  # what is wrong, not the file's text
            refused.append(r)
        else:  # an internal error always names the file
            assert "internal error" not in r["message"], r
            replay_errors.append(r)
    assert specials
    for label in specials:
        assert by_label[label] in refused, by_label[label]
    # Mutations that never pass would test the file checks only.
    assert len(refused) >= MUTANTS // 2 and outcomes["planned"] >= 20, outcomes

    # As one fleet: every host has its report, the same one it had alone.
    assert isinstance(fleet, list), fleet
    assert [r["label"] for r in fleet] == labels
    for r in fleet:
        alone = by_label[r["label"]]
        assert (r["error"] is None) == (alone["outcome"] == "planned"), (r, alone)
    why = Counter(r["message"].split(": ", 2)[1][:40] for r in refused)
    blamed = sum("does not replay" in r["message"] for r in refused)
    print(f"\nsnapshot fuzz: {len(labels)} hosts (seed {SEED}: {MUTANTS} mutants, "
          f"{len(specials)} special files, {len(goods)} good), outcomes {dict(outcomes)} "
          f"({len(refused)} refused naming the file, {blamed} of them as not replaying; "
          f"{len(replay_errors)} plans stopped by a read the snapshot lacks), "
          f"0 tracebacks, 0 hangs, 0 over {MEMORY_LIMIT >> 20} MiB, 0 commands run; "
          f"refusals: {dict(why.most_common(6))}")
