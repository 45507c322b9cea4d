"""The probe's question cache (control/remote/probecache.py) decides what root
opens on every host, so nothing in it is taken on trust: a directory that
is not the user's own 0700 one is not used at all (the agent answers, with
a warning), a file is read only if it is a regular 0600 file of the user's
within a size cap (never through a link, never waiting on a FIFO), and the
cache is pruned: other nictune versions, a host's older profile versions,
then the least recently used past the total caps.  Real files and
directories in tmp_path; the other owner is uid 65534 (nobody)."""

from __future__ import annotations

import base64
import json
import os
import threading

import pytest

from nictune.control.remote import probe, probecache
from nictune.host.replay import probe_reads

QUESTIONS = {"format": probe_reads.FORMAT, "files": ["open /proc/sys/net/ipv4/tcp_ecn"],
             "kernel": [["netlink", 0, base64.b64encode(bytes(20)).decode()]], "nofollow": []}
ARCHIVE = "a" * 64
NOBODY = 65534


def give_away(path: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, NOBODY, -1)


def key(host: str = "h1", profile: str = "p", archive: str = ARCHIVE) -> str:
    return probecache.QuestionCache.key([host, "198.18.0.1", 22, "root"], {"command": "verify",
                                                                           "profile": profile}, archive)


@pytest.fixture
def cache(tmp_path):
    c = probecache.QuestionCache(str(tmp_path / "cache" / "probe"))
    c.put(key(), QUESTIONS)
    return c


def path_of(cache, k: str) -> str:
    return os.path.join(cache.directory, k + ".json")


def test_what_is_kept_is_the_users_own_and_found_again(cache):
    assert cache.lookup(key()) == (QUESTIONS, False)
    st = os.stat(path_of(cache, key()))
    assert st.st_mode & 0o777 == 0o600 and os.stat(cache.directory).st_mode & 0o777 == 0o700
    assert cache.lookup(key(profile="other")) == (None, False)


@pytest.mark.parametrize("spoil, why", [
    (lambda d: os.chmod(d, 0o755), "its mode is 0755, not 0700"),
    (give_away, f"owned by uid {NOBODY}, not by this user"),
])
def test_a_directory_others_can_write_or_own_is_not_used(cache, spoil, why):
    spoil(cache.directory)
    with pytest.raises(probecache.CacheRefused) as refused:
        cache.lookup(key())
    assert why in str(refused.value) and cache.directory in str(refused.value)
    assert "every verify starts the agent" in str(refused.value)
    before = sorted(os.listdir(cache.directory))
    cache.put(key(profile="other"), QUESTIONS)  # nothing written either
    cache.drop(key())
    assert sorted(os.listdir(cache.directory)) == before


def test_a_directory_that_is_a_symbolic_link_is_not_used(cache, tmp_path):
    link = tmp_path / "elsewhere"
    os.symlink(cache.directory, link)
    with pytest.raises(probecache.CacheRefused, match="symbolic link"):
        probecache.QuestionCache(str(link)).lookup(key())


@pytest.mark.parametrize("spoil", [
    lambda p: os.chmod(p, 0o644),
    give_away,
    lambda p: (os.unlink(p), os.symlink(p + ".real", p), open(p + ".real", "w").write(json.dumps(QUESTIONS))),
    lambda p: (os.unlink(p), os.symlink("/dev/zero", p)),
    lambda p: (os.unlink(p), os.mkfifo(p, 0o600)),
    lambda p: open(p, "a").write(" " * (probecache.MAX_FILE + 1)),
    lambda p: open(p, "w").write("[" * 100_000),
    lambda p: open(p, "wb").write(b"\xff\xfe"),
], ids=["mode 0644", "other owner", "symlink", "symlink to /dev/zero", "fifo", "too big", "deep nesting",
        "not JSON"])
def test_a_file_that_is_not_a_small_regular_file_of_the_users_is_not_read_but_removed(cache, spoil):
    path = path_of(cache, key())
    spoil(path)
    found = []
    reader = threading.Thread(target=lambda: found.append(cache.lookup(key())), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # the unbounded code waits for a FIFO's writer for ever
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the lookup waited on the file")
    assert found == [(None, False)]
    assert not os.path.lexists(path)  # learned again at the next verify


def test_a_lookup_makes_the_entry_recently_used(cache):
    path = path_of(cache, key())
    os.utime(path, (1_000_000, 1_000_000))
    cache.lookup(key())
    assert os.stat(path).st_mtime > 1_000_000


def entries(cache) -> set:
    return {n[:-5] for n in os.listdir(cache.directory) if n.endswith(".json")}


def test_pruning_drops_other_versions_old_profiles_and_the_least_recently_used(cache, monkeypatch):
    real_prune = probecache.prune
    monkeypatch.setattr(probecache, "prune", lambda *a: 0)
    old_version = key(archive="b" * 64)
    cache.put(old_version, QUESTIONS)
    with open(os.path.join(cache.directory, "0" * 64 + ".json"), "w") as f:  # the old naming
        json.dump(QUESTIONS, f)
    # h1 audited with six profiles: only its four most recently used stay.
    for n in range(6):
        cache.put(key(profile=f"v{n}"), QUESTIONS)
        os.utime(path_of(cache, key(profile=f"v{n}")), (2_000_000 + n, 2_000_000 + n))
    os.utime(path_of(cache, key()), (1_000_000, 1_000_000))
    monkeypatch.setattr(probecache, "prune", real_prune)
    monkeypatch.setattr(probecache, "_pruned_at", {})
    cache.put(key(host="h2"), QUESTIONS)  # a write prunes (the first in a while)
    assert entries(cache) == {key(profile=f"v{n}") for n in range(2, 6)} | {key(host="h2")}

    # The total caps: the least recently used go first.
    monkeypatch.setattr(probecache, "MAX_ENTRIES", 3)
    monkeypatch.setattr(probecache, "_pruned_at", {})
    cache.put(key(host="h3"), QUESTIONS)
    assert entries(cache) == {key(host="h3"), key(host="h2"), key(profile="v5")}
    size = os.stat(path_of(cache, key(host="h3"))).st_size
    monkeypatch.setattr(probecache, "MAX_BYTES", 2 * size)
    monkeypatch.setattr(probecache, "_pruned_at", {})
    cache.put(key(host="h4"), QUESTIONS)
    assert len(entries(cache)) == 2 and key(host="h4") in entries(cache)


def test_pruning_runs_now_and_then_not_at_every_write(cache, monkeypatch):
    calls = []
    monkeypatch.setattr(probecache, "prune", lambda *a: calls.append(a))
    monkeypatch.setattr(probecache, "_pruned_at", {})
    for n in range(5):
        cache.put(key(host=f"h{n}"), QUESTIONS)
    assert len(calls) == 1


def test_questions_too_big_to_keep_are_not_written(cache):
    big = dict(QUESTIONS, files=["open /" + "x" * 4000] * (probecache.MAX_FILE // 4000 + 1))
    cache.put(key(host="big"), big)
    assert not os.path.exists(path_of(cache, key(host="big")))


def test_a_verify_found_not_askable_is_remembered(cache):
    cache.refused(key(host="c"), "a key file")
    assert cache.lookup(key(host="c")) == (None, True)
    assert probe.checked_questions(json.load(open(path_of(cache, key(host="c"))))) is None


# -- the first batch for a host never asked (Templates) ------------------------------

def request(host: str, profile: str = "p") -> dict:
    return {"command": "verify", "profile": profile, "host": host, "state_dir": f"/var/lib/{host}"}


def test_the_first_host_of_a_request_leads_and_the_others_start_from_its_questions(cache, monkeypatch):
    monkeypatch.setattr(probecache, "TEMPLATE_WAIT", 30.0)
    templates = probecache.Templates()
    first, lead = templates.seed(cache, request("h1"), ARCHIVE, 120)
    assert first is None and lead is not None
    got = []
    followers = [threading.Thread(target=lambda h=h: got.append(templates.seed(cache, request(h), ARCHIVE, 120)))
                 for h in ("h2", "h3")]  # other hosts, other state dirs: the same request
    for t in followers:
        t.start()
    followers[0].join(0.2)
    assert got == []  # they wait for the leader
    lead.done(QUESTIONS)
    for t in followers:
        t.join(5)
    assert got == [(QUESTIONS, None), (QUESTIONS, None)]
    # Kept under a key of no host: a later run (a new Templates) starts from it.
    assert probecache.Templates().seed(cache, request("h9"), ARCHIVE, 120) == (QUESTIONS, None)
    # Another profile is another request: it leads on its own.
    assert probecache.Templates().seed(cache, request("h9", "q"), ARCHIVE, 120)[1] is not None


def test_a_leader_that_went_to_its_agent_lets_the_next_host_lead(cache, monkeypatch):
    monkeypatch.setattr(probecache, "TEMPLATE_WAIT", 30.0)
    templates = probecache.Templates()
    _, lead = templates.seed(cache, request("h1"), ARCHIVE, 120)
    got = []
    waiting = threading.Thread(target=lambda: got.append(templates.seed(cache, request("h2"), ARCHIVE, 120)))
    waiting.start()
    lead.done(None)
    waiting.join(5)
    assert got == [(None, None)]  # released at once, with nothing to start from
    again, lead = templates.seed(cache, request("h3"), ARCHIVE, 120)
    assert again is None and lead is not None


def test_a_follower_waits_no_longer_than_the_bound(cache, monkeypatch):
    monkeypatch.setattr(probecache, "TEMPLATE_WAIT", 0.2)
    templates = probecache.Templates()
    _, lead = templates.seed(cache, request("h1"), ARCHIVE, 120)
    assert templates.seed(cache, request("h2"), ARCHIVE, 120) == (None, None)
