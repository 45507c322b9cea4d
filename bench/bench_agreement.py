#!/usr/bin/env python3
"""Benchmark: fleet agreement (control/review/agreement.py) over 10,000 hosts.

The agreement is computed on the controller from the verify reports an
audit already read: no host is reached, so the bench needs no root and no
fleet.  It builds N synthetic host reports shaped as a lossless RoCE host
reports them (8 rails, each with MTU, DCB trust / DSCP map / PFC / ETS,
CNP DSCP and priority, and the interface facts; NCCL and UCX files), in F
fabrics, with 1 % of the hosts disagreeing on one value each (NCCL_IB_TC,
an MTU on one rail, PFC, firmware), then times agreement() over all of
them: median and min of R runs.  Target: under 1 s for 10,000 hosts.

It checks that every injected outlier is found, and no other host (a
figure for a computation that misses them would mean nothing).

There is no --baseline: the agreement did not exist before this bench.

    .venv/bin/python bench/bench_agreement.py [--hosts 10000] [--rails 8] [--fabrics 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
import tracemalloc

from _util import med, table

from nictune.control.review import agreement as ag
from nictune.host.knobs import nccl, ucx

TARGET_SECONDS = 1.0
OUTLIER_EVERY = 100  # 1 % of the hosts


def _change(family, target, name, value):
    return {"key": {"family": family, "target": target, "name": name}, "before": value,
            "after": value, "status": "ok"}


def host_report(name: str, rails: int, odd: str) -> dict:
    """One host's verify report; `odd` names the value it disagrees on ("")."""
    tc = 0 if odd == "NCCL_IB_TC" else 106
    changes = [_change("nccl", "host", "/etc/nccl.conf",
                       nccl.render({"NCCL_IB_TC": tc, "NCCL_IB_GID_INDEX": 3, "NCCL_IB_HCA": "=mlx5_0:1",
                                    "NCCL_DEBUG": "WARN"})),
               _change("ucx", "host", "/etc/ucx/ucx.conf", ucx.UcxFamily.syntax.render({"UCX_IB_TRAFFIC_CLASS": 106}))]
    facts = {}
    for i in range(rails):
        rail = f"rail{i}"
        changes += [
            _change("link", rail, "mtu", 4200 if (odd == "mtu" and i == rails - 1) else 9000),
            _change("dcb", rail, "trust", "dscp"),
            _change("dcb", rail, "dscp_map", {"26": 3, "48": 6}),
            _change("dcb", rail, "pfc", [4] if odd == "pfc" else [3]),
            _change("dcb", rail, "ets.prio_tc", [0, 0, 0, 1, 0, 0, 2, 0]),
            _change("dcb", rail, "ets.tc_bw", [50, 50, 0, 0, 0, 0, 0, 0]),
            _change("dcb", rail, "ets.tc_tsa", ["ets", "ets", "strict", "strict", "strict", "strict", "strict", "strict"]),
            _change("roce", rail, "ecn.cnp_dscp", 48),
            _change("roce", rail, "ecn.cnp_prio", 6),
        ]
        facts[rail] = {"driver": "mlx5_core", "firmware": "28.37.1014" if odd == "firmware" else "28.39.1002",
                       "link_speed_mbps": 400000, "rdma_device": f"mlx5_{i}", "rdma_port": 1,
                       "roce_gids": {"0": "RoCE v1 IPv6 link-local", "1": "RoCE v2 IPv6 link-local",
                                     "2": "RoCE v1 IPv4", "3": "RoCE v2 IPv4"},
                       "counters": {"rx_prio3_pause": 1200, "np_cnp_sent": 567}}
    return {"host": name, "changes": changes, "facts": facts, "error": None, "warnings": []}


def fleet(n: int, rails: int, fabrics: int, seed: int = 24):
    rng = random.Random(seed)
    odd_values = ("NCCL_IB_TC", "mtu", "pfc", "firmware")
    members, reports, injected = ag.Membership(), [], set()
    for i in range(n):
        name = f"gpu{i:05d}"
        odd = rng.choice(odd_values) if i % OUTLIER_EVERY == 7 else ""
        if odd:
            injected.add(name)
        members.add(name, f"fabric{i % fabrics}")
        reports.append(host_report(name, rails, odd))
    return reports, members, injected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10000)
    parser.add_argument("--rails", type=int, default=8)
    parser.add_argument("--fabrics", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    built = time.perf_counter()
    reports, members, injected = fleet(args.hosts, args.rails, args.fabrics)
    built = time.perf_counter() - built
    times, cpu, doc = [], [], None
    for _ in range(args.repeat):
        started, used = time.perf_counter(), time.process_time()
        doc = ag.agreement(reports, members)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    tracemalloc.start()
    ag.agreement(reports, members)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    found = ag.outlier_hosts(doc)
    print(f"fleet agreement over {args.hosts} synthetic host reports ({args.rails} rails each, "
          f"{args.fabrics} fabrics, {len(injected)} injected outliers); "
          f"Python {platform.python_version()}, {platform.machine()}")
    print(table([("agreement() wall", f"{med(times):.3f}", f"{min(times):.3f}"),
                 ("agreement() CPU", f"{med(cpu):.3f}", f"{min(cpu):.3f}")],
                ("step", "median s", "min s")))
    print(f"load average over the last minute: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPU(s)")
    print(f"reports built in {built:.2f} s (not timed); agreement's peak allocation "
          f"{peak / 2**20:.1f} MiB; {doc['summary']['compared']} values compared, "
          f"{doc['summary']['disagreeing']} disagree, {doc['summary']['outlier_hosts']} outlier hosts")
    if args.hosts >= 10000:
        verdict = "MET" if med(times) < TARGET_SECONDS else "MISSED"
        print(f"target: under {TARGET_SECONDS:.0f} s for 10,000 hosts: {verdict}")
    if found != injected:
        print(f"UNEXPECTED: outliers found {len(found)}, injected {len(injected)}; "
              f"missed {sorted(injected - found)[:5]}, extra {sorted(found - injected)[:5]}")
    print("reproduce: .venv/bin/python bench/bench_agreement.py "
          f"--hosts {args.hosts} --rails {args.rails} --fabrics {args.fabrics} --repeat {args.repeat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
