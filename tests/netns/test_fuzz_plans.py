"""Fuzz: 2,000 mutated profiles through load, lint and a real plan.

Every mutant of the shipped and golden profiles (tests/fuzz/mutate.py, one
fixed seed) is loaded and linted in this process, where the only exception
allowed out is ProfileError; each one that loads is planned by the real
agent inside a network namespace holding veth "NICs" that the lab profiles
match (tests/fuzz/plan_driver.py, one process for all of them).  Found:
a traceback, an "internal error", an exit code outside 0-2, any case that
takes longer than its bound (a hang), or any change to the namespace or to
this host's files: plan must never write.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from fuzz.mutate import mutated_yaml
from nictune.control.remote.request import build_request
from nictune.profile.errors import ProfileError
from nictune.profile.lint import lint
from nictune.profile.loader import load_profile

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("NICTUNE_FUZZ_SEED", "20261201"))  # fixed in CI; set it to explore
MUTANTS = 2000
CASE_BOUND = 5    # seconds one load+lint may take before it counts as a hang
PLANS_BOUND = 240  # seconds for every plan of the run, in one agent process


class _Hang(Exception):
    pass


def _seeds() -> dict:
    seeds = {p.name: p.read_text() for p in sorted((REPO / "profiles").glob("*.yaml"))}
    for p in sorted((REPO / "tests" / "golden").glob("*/profile.yaml")):
        seeds[f"golden-{p.parent.name}.yaml"] = p.read_text()
    assert len(seeds) >= 20, "the seed profiles are missing: the fuzz would test nothing"
    return seeds


def _alarm(signum, frame):
    raise _Hang()


def _load_and_lint(path: str):
    """The profile, or None when it is refused as it must be: ProfileError."""
    try:
        profile = load_profile(path)
        lint(profile)
        return profile
    except ProfileError as e:
        # One paragraph that names the file (the mutant, or a profile it extends).
        text = str(e)
        assert e.file and text.startswith(e.file) and "\n" not in text, text
        assert "Traceback" not in text and "internal error" not in text, text
        return None


def _settle(pair, timeout: float = 10.0) -> None:
    """Wait out IPv6 duplicate address detection on the new links, so that
    the kernel's own change (tentative -> valid) is not taken for a plan's."""
    deadline = time.monotonic() + timeout
    while '"tentative"' in pair.run(pair.ns_a, ["ip", "-j", "addr"]).stdout:
        assert time.monotonic() < deadline, "IPv6 addresses stayed tentative"
        time.sleep(0.1)


def _netns_state(pair, tmp_state: Path) -> dict:
    """What a plan must leave as it was: links, addresses, routes, features,
    the namespace's sysctls, nictune's state directory and the files it may own."""
    ns = pair.ns_a
    state = {}
    for argv in (["ip", "-j", "-d", "link", "show"], ["ip", "-j", "addr"],
                 ["ip", "-j", "route", "show", "table", "all"],
                 ["ethtool", "-k", "lab0"], ["ethtool", "-l", "lab0"]):
        state[" ".join(argv)] = pair.run(ns, argv).stdout
    sysctl = pair.run(ns, ["sysctl", "-a"]).stdout.splitlines()
    state["sysctl"] = sorted(line for line in sysctl if line.startswith("net.")
                             and "stable_secret" not in line)
    state["state dir"] = sorted(str(p) for p in tmp_state.rglob("*"))
    for path in ("/etc/nccl.conf", f"/etc/netns/{ns}"):
        state[path] = (hashlib.sha256(Path(path).read_bytes()).hexdigest()
                       if os.path.isfile(path) else os.path.exists(path))
    state["/etc temp files"] = sorted(n for n in os.listdir("/etc") if n.startswith(".nictune-"))
    return state


def test_two_thousand_mutated_profiles(veth_pair, tmp_path):
    pair = veth_pair
    # veth pairs named as the lab profiles want them (lab*, rail*), in ns_a.
    for a, b in (("lab0", "lab1"), ("rail0", "rail1")):
        made = pair.run(pair.ns_a, ["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        assert made.returncode == 0, made.stderr
        for ifname in (a, b):
            pair.run(pair.ns_a, ["ip", "link", "set", ifname, "up"])
    _settle(pair)
    work = tmp_path / "profiles"
    work.mkdir()
    seeds = _seeds()
    for name, text in seeds.items():
        (work / name).write_text(text)
    state_dir = tmp_path / "state"
    before = _netns_state(pair, state_dir)

    rng = random.Random(SEED)
    # The lab profiles are the ones whose entries match this namespace's
    # veths and that leave global sysctls alone: weighted up, so that many
    # mutants reach the diff instead of stopping at "unsupported here".
    names = sorted(seeds) + [n for n in sorted(seeds) if n.startswith("lab-")] * 8
    requests, refused = [], 0
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(MUTANTS):
            seed_name = rng.choice(names)
            text = mutated_yaml(rng, seeds[seed_name], rounds=rng.choice((1, 1, 2, 3)))
            path = work / f"mutant-{i:04d}.yaml"
            path.write_text(text, errors="surrogatepass")
            signal.alarm(CASE_BOUND)
            try:
                profile = _load_and_lint(str(path))
            except _Hang:
                pytest.fail(f"mutant {i} of {seed_name} hung for over {CASE_BOUND} s: {path}")
            except Exception as e:  # noqa: BLE001 - the finding
                pytest.fail(f"mutant {i} of {seed_name} raised {type(e).__name__}: {e}\n{text}")
            finally:
                signal.alarm(0)
            if profile is None:
                refused += 1
                path.unlink()
                continue
            requests.append((i, build_request("plan", profile)))
    finally:
        signal.signal(signal.SIGALRM, old)
    # Mutations that never pass would fuzz the parser only; all passing would
    # mean the schema refuses nothing.
    assert 100 <= len(requests) <= MUTANTS - 100, (len(requests), refused)

    driver = [sys.executable, str(REPO / "tests" / "fuzz" / "plan_driver.py"), str(state_dir)]
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}", LANG="C")
    started = time.monotonic()
    proc = subprocess.run(["ip", "netns", "exec", pair.ns_a, *driver],
                          input="".join(json.dumps(r) + "\n" for _, r in requests),
                          capture_output=True, text=True, timeout=PLANS_BOUND, env=env)
    took = time.monotonic() - started
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(reports) == len(requests), proc.stderr[-2000:]
    codes: Counter = Counter()
    errors: Counter = Counter()  # what the refusals said, for a failure's message
    for (i, _), rep in zip(requests, reports):
        assert "escaped" not in rep, f"mutant {i}: {rep.get('escaped')}"
        message = (rep.get("error") or {}).get("message", "")
        assert "internal error" not in message, f"mutant {i}: {message}"
        assert rep["exit_code"] in (0, 1, 2), (i, rep)
        assert rep["command"] == "plan" and not rep["changed"], (i, rep)
        codes[rep["exit_code"]] += 1
        errors[message[-150:]] += 1
    # Plans that reach the diff, not only refusals, or the plan path went untested.
    assert codes[2] >= 50, (codes, errors.most_common(5))

    assert _netns_state(pair, state_dir) == before
    print(f"\nfuzz: {MUTANTS} mutants (seed {SEED}), {refused} refused by load/lint, "
          f"{len(requests)} planned in {took:.1f} s, exit codes {dict(sorted(codes.items()))}")
