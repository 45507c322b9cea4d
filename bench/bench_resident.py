"""The resident agent's budgets on a namespace of 8 rails: memory, idle CPU,
how fast drift is put back, how fast a re-created rail is re-tuned.

    sudo .venv/bin/python bench/bench_resident.py [--rails 8] [--idle-seconds 60]
        [--drifts 100] [--recreates 10] [--rounds 1] [--baseline DIR] [--no-metrics] [--lldp]

A namespace with RAILS veth rails (_util.RailLab, as bench_lldp_listener.py),
a committed profile keeping them (MTU, GRO, rp_filter, a host sysctl;
on_drift: restore) and `nictune agent run --netns` keeping it with its
defaults (--interval 30, the metrics endpoint on 127.0.0.1:9463 unless
--no-metrics; with --lldp the entry has switch: checks, so the LLDP
listener runs too) but --flap-limit 1000, so that a hundred drifts are not taken
for a flapping key.  After its start verify:

  rss      VmRSS, and Pss / anonymous memory from /proc/PID/smaps_rollup;
  idle     CPU time (utime + stime) over IDLE_SECONDS with nothing
           happening (10 ms ticks: 0 means not one tick); the budget is
           indistinguishable from zero over 10 minutes (--idle-seconds 600);
  drift    `ip link set railN mtu 1500`, DRIFTS times over the rails in
           turn, half a second apart; each from the netlink event that
           reported it (bench/_resident_probe.py listens to RTMGRP_LINK in
           the namespace itself) to the read-back showing 9000 again:
           p50 / p99 / max (budget: p99 <= 100 ms);
  recreate delete a rail and create it again under its name, RECREATES
           times; from the new link's event to the read-back showing its
           MTU and rp_filter again: p50 / max (budget: 1 s).

Budgets: RSS <= 20 MB.  With --baseline DIR (another checkout: its src/ is
put on PYTHONPATH instead of this one's) both versions take turns in each
round.  Exit 0 even when a budget is missed (a bench, not a test), 1 when
it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _util import (  # noqa: E402
    BenchError, RailLab, cpu_seconds, med, rss_kib, start_resident, stop_resident, table)

REPRODUCE = "sudo .venv/bin/python bench/bench_resident.py"
PROBE = os.path.join(HERE, "_resident_probe.py")
RSS_BUDGET_KIB = 20 * 1024
DRIFT_P99_BUDGET_MS = 100
RECREATE_BUDGET_MS = 1000


def profile(lldp: bool = False) -> str:
    return ("nictune: 1\non_drift: restore\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n"
            "interfaces:\n  rails:\n    match: {name: \"rail*\"}\n    mtu: 9000\n"
            "    features: {gro: on}\n    sysctl: {ipv4.rp_filter: 2}\n"
            + ("    switch: {lldp: optional}\n" if lldp else ""))


def smaps(pid: int) -> dict:
    """Pss and Anonymous of /proc/PID/smaps_rollup, KiB."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Pss", "Anonymous"):
                out[name.lower()] = int(rest.split()[0])
    return out


def percentile(values: list, p: float) -> float:
    """Nearest-rank percentile (p in 0..100); nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


def probe(lab: RailLab, *argv) -> dict:
    proc = subprocess.run(["ip", "netns", "exec", lab.host, sys.executable, PROBE, *map(str, argv)],
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise BenchError(f"_resident_probe.py {argv[0]}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout)


def measure(lab: RailLab, src: str, args) -> dict:
    extra = ["--flap-limit", "1000"] + (["--metrics-address", ""] if args.no_metrics else [])
    with tempfile.TemporaryDirectory(prefix="nt-resident-bench-") as state:
        agent = start_resident(lab, state, profile(args.lldp), src, *extra)
        try:
            time.sleep(2)
            pid = agent.pid
            row = {"rss_kib": rss_kib(pid), **smaps(pid)}
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            time.sleep(args.idle_seconds)
            row["idle_cpu_ms"] = (cpu_seconds(pid) - cpu0) * 1000
            row["idle_s"] = time.monotonic() - t0
            drift = probe(lab, "drift", lab.rails, args.drifts, args.gap)
            row["drift_ms"], row["drift_missed"] = drift["latencies_ms"], drift["missed"]
            recreate = probe(lab, "recreate", lab.rails, args.recreates, args.gap, lab.switch)
            row["recreate_ms"], row["recreate_missed"] = recreate["latencies_ms"], recreate["missed"]
            row["rss_after_kib"] = rss_kib(pid)
            if agent.poll() is not None:
                raise BenchError("the resident agent exited during the round")
            return row
        finally:
            stop_resident(agent)


def summary(rows: list) -> dict:
    drift = [x for r in rows for x in r["drift_ms"]]
    recreate = [x for r in rows for x in r["recreate_ms"]]
    return {
        "rss_kib": med([r["rss_kib"] for r in rows]), "pss_kib": med([r["pss"] for r in rows]),
        "anon_kib": med([r["anonymous"] for r in rows]),
        "rss_after_kib": med([r["rss_after_kib"] for r in rows]),
        "idle_cpu_ms": med([r["idle_cpu_ms"] for r in rows]), "idle_s": med([r["idle_s"] for r in rows]),
        "drift_p50": percentile(drift, 50), "drift_p99": percentile(drift, 99),
        "drift_max": max(drift, default=float("nan")), "drifts": len(drift),
        "drift_missed": sum(r["drift_missed"] for r in rows),
        "recreate_p50": percentile(recreate, 50), "recreate_max": max(recreate, default=float("nan")),
        "recreates": len(recreate), "recreate_missed": sum(r["recreate_missed"] for r in rows),
    }


def report(results: dict, args) -> None:
    header = ("version", "RSS KiB", "Pss", "anon", "RSS end", f"idle CPU ms/{args.idle_seconds:g}s",
              "drift p50", "p99", "max", "missed", "re-create p50", "max", "missed")
    rows = []
    for name, s in results.items():
        rows.append((name, f"{s['rss_kib']:.0f}", f"{s['pss_kib']:.0f}", f"{s['anon_kib']:.0f}",
                     f"{s['rss_after_kib']:.0f}", f"{s['idle_cpu_ms']:.0f}",
                     f"{s['drift_p50']:.1f}", f"{s['drift_p99']:.1f}", f"{s['drift_max']:.1f}",
                     f"{s['drift_missed']}/{s['drifts'] + s['drift_missed']}",
                     f"{s['recreate_p50']:.0f}", f"{s['recreate_max']:.0f}",
                     f"{s['recreate_missed']}/{s['recreates'] + s['recreate_missed']}"))
    print(f"\nresident agent, {args.rails} rails, {args.rounds} round(s), metrics "
          f"{'off' if args.no_metrics else 'on'}, LLDP listener {'on' if args.lldp else 'off'}; "
          f"times in ms; load average {os.getloadavg()[0]:.2f}")
    print(table(rows, header))
    s = results["this"]
    print(f"\nbudgets: RSS {s['rss_kib']:.0f} KiB (<= {RSS_BUDGET_KIB}: "
          f"{'met' if s['rss_kib'] <= RSS_BUDGET_KIB else 'MISSED'}); idle CPU {s['idle_cpu_ms']:.0f} ms "
          f"in {s['idle_s']:.0f} s; drift p99 {s['drift_p99']:.1f} ms (<= {DRIFT_P99_BUDGET_MS}: "
          f"{'met' if s['drift_p99'] <= DRIFT_P99_BUDGET_MS and not s['drift_missed'] else 'MISSED'}); "
          f"re-create max {s['recreate_max']:.0f} ms (<= {RECREATE_BUDGET_MS}: "
          f"{'met' if s['recreate_max'] <= RECREATE_BUDGET_MS and not s['recreate_missed'] else 'MISSED'})")
    print(f"reproduce: {REPRODUCE} --rails {args.rails} --idle-seconds {args.idle_seconds:g} "
          f"--drifts {args.drifts} --recreates {args.recreates} --rounds {args.rounds}"
          + (" --no-metrics" if args.no_metrics else "") + (" --lldp" if args.lldp else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rails", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=60,
                        help="the idle window (600 for the 10-minute budget)")
    parser.add_argument("--drifts", type=int, default=100)
    parser.add_argument("--recreates", type=int, default=10)
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between two drifts")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", default=None, help="another checkout, measured in turn")
    parser.add_argument("--no-metrics", action="store_true", help="run the agent without its endpoint")
    parser.add_argument("--lldp", action="store_true",
                        help="the rails' entry checks the switch port: the LLDP listener runs")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_resident: run as root (network namespaces)", file=sys.stderr)
        return 1
    versions = {"this": os.path.join(os.path.dirname(HERE), "src")}
    if args.baseline:
        versions["baseline"] = os.path.join(os.path.abspath(args.baseline), "src")
    rows: dict = {name: [] for name in versions}
    lab = RailLab(args.rails, str(os.getpid() % 10000))
    try:
        for r in range(args.rounds):
            for name, src in (versions.items() if r % 2 == 0 else reversed(versions.items())):
                rows[name].append(measure(lab, src, args))
                row = rows[name][-1]
                print(f"round {r + 1} {name}: rss {row['rss_kib']} KiB, idle {row['idle_cpu_ms']:.0f} ms, "
                      f"drift p50 {statistics.median(row['drift_ms'] or [float('nan')]):.1f} ms, "
                      f"re-create p50 {statistics.median(row['recreate_ms'] or [float('nan')]):.0f} ms",
                      flush=True)
    except (BenchError, subprocess.SubprocessError, OSError) as e:
        print(f"bench_resident: {e}", file=sys.stderr)
        return 1
    finally:
        lab.close()
    report({name: summary(r) for name, r in rows.items()}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
