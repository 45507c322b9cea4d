"""How long `nictune slurm-health` takes on a node, against its --budget.

In a network namespace of its own (root): the verify the check makes, in
a fresh process each round as Slurm runs it (`python -c`, importing what the
CLI imports), and the verify alone inside one process.  The Slurm side (one
`sinfo`, at most one `scontrol`) is not included: it is slurmctld's latency,
measured by tests/fleet/test_slurm_health_fleet.py's runs as a whole.

    sudo .venv/bin/python bench/bench_slurm_health.py [--rounds 20]

A bench, not a test: exit 0 even when the target (1 s, a tenth of the
default budget) is missed; 1 when it could not run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from _util import med, table

NS = "ntbenchslurm"
PROFILE = "nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n"
TARGET = 1.0
ONE = ("import sys; from nictune.cli.reporting import load_profile; from nictune.control import slurmhealth; "
       "from nictune.control.remote.request import build_request; "
       "import time; q = build_request('verify', load_profile(sys.argv[1])); t = time.perf_counter(); "
       "r, via = slurmhealth.verify(q, sys.argv[2], None, 10); "
       "print(time.perf_counter() - t); print(slurmhealth.drift_reason(r))")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (a network namespace)", file=sys.stderr)
        return 1
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            profile = os.path.join(tmp, "p.yaml")
            with open(profile, "w") as f:
                f.write(PROFILE)
            cold, inner = [], []
            for _ in range(args.rounds):
                started = time.perf_counter()
                out = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", ONE, profile, tmp],
                                     capture_output=True, text=True, check=True).stdout.strip()
                cold.append(time.perf_counter() - started)
                seconds, out = out.split("\n", 1)
                inner.append(float(seconds))
            assert out == "nictune: sysctl net.ipv4.tcp_ecn 2 != 1", out  # it did verify, and found the drift
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)
    print(table([["the check's process, Python's start and imports included", f"{med(cold):.3f}",
                  f"{min(cold):.3f}", f"{TARGET:.1f}"],
                 ["the verify alone (what --budget times)", f"{med(inner):.3f}", f"{min(inner):.3f}", ""]],
                ("measure", "median s", "min s", "target s")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
