"""Series per node of the resident agent's metrics, with and without
--metrics-detail: what a 10,000-node Prometheus has to hold.

    .venv/bin/python bench/bench_metrics.py [--rails 1,4,8] [--keys-per-rail 49] [--scrapes 20]

A node (FAKE, as tests/unit/test_metrics.py's): a sysfs tree of RAILS mlx5
rails, each with its RDMA port's hw_counters, and a counter source that
answers ethtool -S with a ConnectX-7 port's congestion counters under the
names en_stats.c gives them (8 priorities); a resident agent status with
KEYS_PER_RAIL keys per rail and 8 host keys (49 and 8: what the shipped
connectx7-roce-lossless profile plans on the recorded ConnectX-7 host,
98 rail keys over its 2 rails).  The real exporter (host/resident/metrics.py)
serves it on 127.0.0.1; each figure is its HTTP answer:

  series        samples in the body (every series the node adds to Prometheus)
  per rail      (series - the node's own) / rails: the node's own are what
                stays with no rail (drift of host keys, re-applies, verify times,
                kTLS when /proc/net/tls_stat is there)
  body          bytes of one scrape
  scrape ms     median wall time of SCRAPES GETs (client and server on this
                machine: load shows; the load average is printed)

Nothing here is node_exporter's: the netdev statistics and TCP retransmits
are left to it (metrics.py).  Exit 0 even when over the budget (a bench,
not a test: tests/unit/test_metrics.py holds the budget).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from nictune.host.machine import Host  # noqa: E402
from nictune.host.resident import metrics  # noqa: E402

REPRODUCE = ".venv/bin/python bench/bench_metrics.py --rails 1,4,8 --keys-per-rail 49 --scrapes 20"
KEYS_PER_RAIL = 49  # connectx7-roce-lossless on the recorded cx7 host: 98 rail keys, 2 rails
HOST_KEYS = 8       # ... and 8 host keys (sysctls)
BUDGET_PER_RAIL = 100  # issue: <= 100 series per rail beyond node_exporter's
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def mlx5_port_stats(scale: int = 1) -> dict:
    """ethtool -S of a ConnectX-7 port (FAKE values), the congestion counters
    under en_stats.c's names, 8 priorities, and some that are not congestion."""
    stats = {"rx_packets": 10 * scale, "rx_bytes": 10 * scale, "ch0_poll": scale}
    for p in range(8):
        for name in ("rx_prio{}_pause", "tx_prio{}_pause", "rx_prio{}_pause_duration",
                     "tx_prio{}_pause_duration", "rx_prio{}_pause_transition", "rx_prio{}_discards"):
            stats[name.format(p)] = p * scale
    for name in ("rx_global_pause", "tx_global_pause", "rx_global_pause_duration",
                 "tx_global_pause_duration", "tx_pause_storm_warning_events",
                 "tx_pause_storm_error_events", "rx_discards_phy", "rx_out_of_buffer",
                 "link_down_events_phy", "rx_vport_rdma_unicast_bytes", "tx_vport_rdma_unicast_bytes",
                 "rx_bytes_phy", "tx_bytes_phy"):
        stats[name] = scale
    return stats


class Mlx5Counters:
    """Host.counter_source answering ethtool -S with mlx5_port_stats()."""

    def ethtool_stats(self, ifname):
        return mlx5_port_stats()


def build_node(root: str, rails: int, keys_per_rail: int = KEYS_PER_RAIL,
               host_keys: int = HOST_KEYS) -> tuple:
    """(Host, status) of a FAKE node with `rails` mlx5 rails under root."""
    driver = os.path.join(root, "sys/bus/pci/drivers/mlx5_core")
    os.makedirs(driver, exist_ok=True)
    names = [f"rail{i}" for i in range(rails)]
    for i, name in enumerate(names):
        device = os.path.join(root, "sys/class/net", name, "device")
        os.makedirs(device, exist_ok=True)
        os.symlink(driver, os.path.join(device, "driver"))
        port = os.path.join(root, f"sys/class/infiniband/mlx5_{i}/ports/1")
        os.makedirs(os.path.join(port, "gid_attrs/ndevs"))
        with open(os.path.join(port, "gid_attrs/ndevs/0"), "w") as f:
            f.write(name + "\n")
        os.makedirs(os.path.join(port, "hw_counters"))
        for counter in metrics._RDMA:
            with open(os.path.join(port, "hw_counters", counter), "w") as f:
                f.write("7\n")
    keys = {f"sysctl:host:net.key{k}": {"drifted": False, "drifts": 0, "restores": 0,
                                         "left_alone": False} for k in range(host_keys)}
    for name in names:
        for k in range(keys_per_rail):
            keys[f"ethtool:{name}:key{k}"] = {"drifted": k == 0, "drifts": 1, "restores": 1,
                                              "left_alone": False}
    status = {"keys": keys, "reapplies": 1, "last_verify": 1764500060.0,
              "last_verify_ok": 1764500000.0,
              "desired_state": {"ok": True, "reason": None, "from_copy": False},
              "interfaces": names}
    host = Host(root)
    host.counter_source = Mlx5Counters()
    return host, status


def series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def measure(rails: int, detail: bool, keys_per_rail: int, scrapes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="nt-bench-metrics-") as root:
        host, status = build_node(root, rails, keys_per_rail)
        _, no_rails = build_node(os.path.join(root, "none"), 0, keys_per_rail)
        own = series(metrics.collect(no_rails, host, detail))
        exporter = metrics.start(lambda: status, "127.0.0.1:0", host=host, detail=detail)
        try:
            url = "http://%s:%d/metrics" % exporter.address
            times, body = [], b""
            for _ in range(scrapes):
                t0 = time.perf_counter()
                with _OPENER.open(url, timeout=10) as r:
                    body = r.read()
                times.append(time.perf_counter() - t0)
        finally:
            exporter.stop()
    total = series(body.decode())
    return {"rails": rails, "detail": detail, "series": total, "own": own,
            "per_rail": (total - own) / rails if rails else 0.0, "body": len(body),
            "scrape_ms": statistics.median(times) * 1000}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rails", default="1,4,8", help="comma-separated rail counts")
    parser.add_argument("--keys-per-rail", type=int, default=KEYS_PER_RAIL)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args(argv)
    rows = [measure(int(n), detail, args.keys_per_rail, args.scrapes)
            for n in args.rails.split(",") for detail in (False, True)]
    print(f"resident agent metrics, {args.keys_per_rail} keys per rail + {HOST_KEYS} host keys, "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print(f"{'rails':>5} {'mode':<8} {'series':>7} {'node own':>8} {'per rail':>8} {'body B':>8} "
          f"{'scrape ms':>9}")
    for r in rows:
        mode = "detail" if r["detail"] else "default"
        over = "  over budget" if not r["detail"] and r["per_rail"] > BUDGET_PER_RAIL else ""
        print(f"{r['rails']:>5} {mode:<8} {r['series']:>7} {r['own']:>8} {r['per_rail']:>8.1f} "
              f"{r['body']:>8} {r['scrape_ms']:>9.2f}{over}")
    print(f"\nbudget: <= {BUDGET_PER_RAIL} series per rail beyond node_exporter's (default mode)")
    print(f"reproduce: {REPRODUCE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
