"""A CI fuzzer for what a host, its learning report or a question-cache
file can hand the controller's probe path (tests/fuzz/probe_driver.py):
hostile answers (huge counts and lengths, cut frames, wrong types, deep
nesting), hostile learning reports and hostile cache files.  Seeded, a few
seconds.  The driver runs in a subprocess with its address space capped
(RLIMIT_AS 1 GiB), so that an unbounded allocation fails there as a
MemoryError, counted as a traceback, rather than take the machine; within
it each case's own allocations are measured (tracemalloc).  Before the
bounds, a host claiming a string set of 2**32 strings made the controller
size a 275 GB buffer, and a FIFO in the cache hung the lookup."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

DRIVER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fuzz", "probe_driver.py")
SEED = 2026
COUNTS = {"answers": 120, "live": 80, "questions": 200, "cache": 40}
ADDRESS_SPACE = 1 << 30
PEAK = 64 << 20  # the largest case's allocations: some 5 MB here


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_hostile_answers_reports_and_cache_files_end_in_a_report_or_a_refusal_within_bounds():
    run = subprocess.run([sys.executable, DRIVER, str(SEED), *(str(n) for n in COUNTS.values())],
                         capture_output=True, text=True, timeout=300, preexec_fn=_cap_address_space)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    print(f"\nprobe fuzzer (seed {SEED}): cases {out['cases']}, tracebacks {out['tracebacks']}, "
          f"largest allocation peak {out['peak_bytes']} bytes")
    for outcome, n in sorted(out["outcomes"].items()):
        print(f"  {outcome}: {n}")
    assert out["cases"] == COUNTS
    assert out["tracebacks"] == 0, out["failures"]
    assert out["peak_bytes"] < PEAK, out["peaks"]
    outcomes = out["outcomes"]

    def total(word: str) -> int:
        return sum(n for k, n in outcomes.items() if word in k)
    # Every kind was exercised, and the answers both went through to a
    # verify and were refused: the cases are neither all trivial nor all noise.
    assert sum(outcomes.values()) == sum(COUNTS.values())
    assert total(": report") >= 40 and total(": refused") >= 40 and total("questions: kept") >= 1
    # Asked on demand of a live probe, the same answers both make reports
    # and end the verify (the host to its agent).
    assert total("live ") == COUNTS["live"]
    assert sum(n for k, n in outcomes.items() if k.startswith("live ")
               and k.endswith(": report")) >= 20
    assert sum(n for k, n in outcomes.items() if k.startswith("live ") and k.endswith(": refused")) >= 20
    assert {k.split(":")[0] for k in outcomes if k.startswith("cache ")} >= {
        "cache fifo", "cache link to /dev/zero", "cache nested", "cache too big", "cache directory"}
