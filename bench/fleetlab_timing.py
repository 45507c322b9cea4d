#!/usr/bin/env python3
"""Benchmark: how long the fleet lab takes to come up and go down.

For each fleet size N (default 10 50 100 200 sshd hosts; up to 1,000) it times
fleetlab.up() (namespaces, bridge, keys, files, N sshd started and each
sending its banner) and fleetlab.down() (servers stopped, namespaces, links
and files removed), and the CPU this process and its children used, so the
figures say how much of the wall time was this machine's 2 cores at work,
and the memory the fleet holds once up: the drop of MemAvailable (kernel
objects: namespaces, veths, sockets, plus the servers) and the PSS of its
sshd listeners, in all and per host.
Each N runs --repeat times; the median and min are printed.

Everything is built with a random prefix nt<hex> in a temporary directory
and removed in a `finally`, also on Ctrl-C and SIGTERM.  Needs root.

    sudo .venv/bin/python bench/fleetlab_timing.py [--sizes 10 50 100 200] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time

from nictune.lab import fleet as fleetlab


def cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def mem_available_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def servers_pss_kb(record: str) -> int:
    with open(record) as f:
        pids = [p["pid"] for p in json.load(f)["processes"]]
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total


def one_round(n: int) -> dict:
    directory = tempfile.mkdtemp(prefix="ntbench-fleet-")
    record = os.path.join(directory, "record.json")
    try:
        m0, c0, t0 = mem_available_kb(), cpu(), time.monotonic()
        fleetlab.up(n, directory, prefix="nt" + secrets.token_hex(2))
        t1 = time.monotonic()
        mem_kb, pss_kb = m0 - mem_available_kb(), servers_pss_kb(record)
        fleetlab.down(record)
        c2, t2 = cpu(), time.monotonic()
    finally:
        fleetlab.down(record)
        if os.path.isdir(directory):
            os.rmdir(directory)
    # Children's CPU counts only once they are reaped: the sshds are reaped by down().
    return {"up_s": t1 - t0, "down_s": t2 - t1, "cpu_s": c2 - c0, "mem_kb": mem_kb, "sshd_pss_kb": pss_kb}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.stderr.write("needs root (network namespaces, sshd)\n")
        return 1
    results = {}
    print(f"{'hosts':>5}  {'up median':>9}  {'up min':>7}  {'down median':>11}  {'down min':>8}  "
          f"{'CPU/round':>9}  {'per host up':>11}  {'memory':>8}  {'sshd PSS':>8}  {'mem/host':>8}")

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        for n in args.sizes:
            rounds = [one_round(n) for _ in range(args.repeat)]
            up = [r["up_s"] for r in rounds]
            down = [r["down_s"] for r in rounds]
            results[n] = rounds
            print(f"{n:>5}  {statistics.median(up):>8.2f}s  {min(up):>6.2f}s  {statistics.median(down):>10.2f}s  "
                  f"{min(down):>7.2f}s  {statistics.median(r['cpu_s'] for r in rounds):>8.2f}s  "
                  f"{1000 * statistics.median(up) / n:>9.1f}ms  "
                  f"{statistics.median(r['mem_kb'] for r in rounds) / 1024:>6.0f}MB  "
                  f"{statistics.median(r['sshd_pss_kb'] for r in rounds) / 1024:>6.0f}MB  "
                  f"{statistics.median(r['mem_kb'] for r in rounds) / n / 1024:>6.2f}MB", flush=True)
    except KeyboardInterrupt:
        return 130
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "rounds": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
