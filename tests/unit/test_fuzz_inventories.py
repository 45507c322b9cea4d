"""Fuzz: 1,000 mutated inventories through load, select and per-host profiles.

Mutants of our inventory cases and of the real-world inventories
(tests/fuzz/mutate.py, one fixed seed; a directory inventory with one
mutated file among its group_vars and host_vars) go the fleet commands'
way up to the network: load_inventory, a --limit selection, then each
selected host's connection settings and profile (the lab profile with the
host's `nictune:` overrides merged, linted) as control/fleet.jobs_for builds
them.  The only exception allowed out is a NictuneError, whose message is
one paragraph; each case has a time bound, so a hang or a range bomb fails
the test instead of stalling CI.  Nothing here connects anywhere: building
a job opens no session.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import traceback
from pathlib import Path

import pytest

from fuzz.mutate import mutated_ini, mutated_yaml
from nictune.control.remote import fleet
from nictune.control.remote.ssh import SshOptions
from nictune.host.errors import NictuneError
from nictune.inventory import load_inventory
from real_world import REAL_WORLD, require

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "inventory" / "cases"
SEED = int(os.environ.get("NICTUNE_FUZZ_SEED", "20261201"))  # fixed in CI; set it to explore
MUTANTS = 1000
CASE_BOUND = 5  # seconds one inventory may take before it counts as a hang
LIMITS = [None, "all", "ungrouped", "all:!*1*", "~.*0[1-3].*", "*[0:2]", "*:&all", "rack1,rails"]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _seeds() -> dict:
    files = [p for p in sorted(CASES.iterdir()) if p.is_file()]
    real = require(REAL_WORLD / "inventories")
    files += [p for p in sorted(real.iterdir()) if p.is_file()]
    seeds = {p.name: p.read_text(errors="replace") for p in files}
    assert len(seeds) >= 10, "the seed inventories are missing: the fuzz would test nothing"
    return seeds


def _mutant(rng: random.Random, name: str, text: str) -> str:
    if name.endswith((".yml", ".yaml", ".json")):
        return mutated_yaml(rng, text, rounds=rng.choice((1, 1, 2)))
    return mutated_ini(rng, text, rounds=rng.choice((1, 1, 2)))


def _fleet_jobs(path: str, profile: str, limit) -> int:
    """What a fleet plan builds before its first connection; returns the
    number of hosts given a runnable job."""
    inv = load_inventory(path)
    hosts = inv.select(limit)
    jobs = fleet.jobs_for("plan", hosts, fleet.Profiles(profile), SshOptions())
    for job in jobs:
        assert (job.target is None) == (job.error is not None), job
        if job.error:
            assert "\n" not in job.error["message"] and "internal error" not in job.error["message"]
    return sum(1 for job in jobs if job.error is None)


def test_a_thousand_mutated_inventories(tmp_path):
    seeds = _seeds()
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for name in ("lab-veth.yaml", "base-ai-host.yaml"):
        shutil.copy(REPO / "profiles" / name, profiles / name)
    profile = str(profiles / "lab-veth.yaml")
    site = tmp_path / "site"
    site_files = [p.relative_to(CASES / "site") for p in sorted((CASES / "site").rglob("*"))
                  if p.is_file() and p.name != "README.md"]

    rng = random.Random(SEED)
    outcomes = {"loaded": 0, "refused": 0, "hosts with a job": 0}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(MUTANTS):
            if rng.random() < 0.2:  # a directory inventory, one of its files mutated
                shutil.rmtree(site, ignore_errors=True)
                shutil.copytree(CASES / "site", site)
                victim = site / rng.choice(site_files)
                victim.write_text(_mutant(rng, victim.name, victim.read_text()))
                path, what = str(site), f"site/{victim.relative_to(site)}"
            else:
                name = rng.choice(sorted(seeds))
                mutant = tmp_path / f"inv-{i:04d}{Path(name).suffix}"
                mutant.write_text(_mutant(rng, name, seeds[name]), errors="surrogatepass")
                path, what = str(mutant), name
            limit = rng.choice(LIMITS)
            signal.alarm(CASE_BOUND)
            try:
                outcomes["hosts with a job"] += _fleet_jobs(path, profile, limit)
                outcomes["loaded"] += 1
            except NictuneError as e:
                text = str(e)
                assert text and "\n" not in text and "internal error" not in text, (i, what, text)
                outcomes["refused"] += 1
            except _Hang:
                pytest.fail(f"mutant {i} of {what} (limit {limit!r}) took over {CASE_BOUND} s: {path}")
            except Exception as e:  # noqa: BLE001 - the finding
                pytest.fail(f"mutant {i} of {what} (limit {limit!r}) raised "
                            f"{type(e).__name__}: {e}: {path}\n{traceback.format_exc()}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    # Both sides exercised: mutants that load and give hosts jobs, and refusals.
    assert outcomes["loaded"] >= 200 and outcomes["refused"] >= 100, outcomes
    assert outcomes["hosts with a job"] >= 500, outcomes
    print(f"\nfuzz: {MUTANTS} inventory mutants (seed {SEED}): {outcomes}")
