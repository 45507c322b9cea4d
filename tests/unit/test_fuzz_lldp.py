"""A CI fuzzer for nictune's LLDP decoder (tests/fuzz/lldp_driver.py):
hostile frames, which anyone on a rail's wire can send, and hostile
neighbours in a host's report, which the controller reads back.  Seeded, a
few seconds.  The driver runs in a subprocess with its address space capped
(RLIMIT_AS 1 GiB), so an unbounded allocation fails there as a MemoryError,
counted as a traceback; each case's own allocation peak is measured too.
Every case must end in a Neighbour or a one-line LldpError."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

DRIVER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fuzz", "lldp_driver.py")
SEED = int(os.environ.get("NICTUNE_FUZZ_SEED", "20261204"))  # fixed in CI; set it to explore
COUNTS = {"frames": 4000, "dicts": 1500}
ADDRESS_SPACE = 1 << 30
PEAK = 256 << 10  # a case's allocations; frames are capped at 1518 bytes


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_hostile_frames_and_report_neighbours_end_in_a_neighbour_or_a_refusal_within_bounds():
    run = subprocess.run([sys.executable, DRIVER, str(SEED), *(str(n) for n in COUNTS.values())],
                         capture_output=True, text=True, timeout=120, preexec_fn=_cap_address_space)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    print(f"\nLLDP fuzzer (seed {SEED}, {out['seed_frames']} seed frames): cases {out['cases']}, "
          f"largest allocation peak {out['peak_bytes']} bytes")
    for outcome, n in sorted(out["outcomes"].items()):
        print(f"  {outcome}: {n}")
    assert out["cases"] == COUNTS
    assert out["seed_frames"] == 4  # two encoded here, lldpd's and lldpad's (tests/fixtures/lldp)
    outcomes = out["outcomes"]
    assert sum(outcomes.values()) == sum(COUNTS.values())
    bad = {k: n for k, n in outcomes.items() if not k.endswith((": decoded", ": refused"))}
    assert not bad, (bad, out["failures"])
    assert out["peak_bytes"] < PEAK
    # Both ends were reached: mutants that still decode and mutants refused,
    # for frames and for report data alike.
    for kind in COUNTS:
        assert outcomes.get(f"{kind}: decoded", 0) >= 100, outcomes
        assert outcomes.get(f"{kind}: refused", 0) >= 100, outcomes
