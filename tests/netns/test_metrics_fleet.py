"""One real Prometheus scraping 100 nodes' metrics endpoints: 100 targets
up, and 100 times the per-node series (docs/howto/metrics-at-scale.md).

The nodes are the fleet lab's network namespaces (nictune.lab.fleet's
network: a bridge in the root namespace, mgmt0 198.19.X.Y in each, and a
veth pair rail0/rail1), without its sshd.  In each runs the resident
agent's exporter, `python -m nictune.host.resident.metrics ADDRESS STATUS.json`
on mgmt0 (the code `nictune agent run` serves; the real kernel's counters of
that namespace), serving a status of the resident agent's shape.  Not 100
full resident agents: each verifies its profile when it starts (an apply
first, ~1 s of CPU each), which on a 2-core CI machine is minutes, and the
verify adds nothing to what the scrape returns (the status it writes is the
file served here).  The exporters are ~22 MB RSS each, ~0.1 s of CPU to start.

Prometheus (Debian's binary, .venv/bin/prometheus from scripts/setup) runs
in the root namespace and scrapes the 100 over the bridge every 3 s.
Everything is removed in the finally: the exporters and Prometheus
stopped, then the lab's record removes its namespaces and bridge.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from nictune.host.resident import metrics
from nictune.lab import fleet as fleetlab
from tests.netns.test_metrics_netns import _prometheus, _stop

pytestmark = pytest.mark.netns

NODES = 100
PORT = 9463
AGENT_DIR = str(Path(metrics.__file__).resolve().parents[3])
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# A node's status (host/resident/daemon.py's shape): 12 keys per rail and 4
# host keys, one drifted.
STATUS = {"nictune_agent_status": 1, "reapplies": 1, "last_verify": 1764500060.0,
          "last_verify_ok": 1764500000.0,
          "desired_state": {"ok": True, "reason": None, "from_copy": False},
          "keys": {**{f"link:rail{r}:key{k}": {"drifted": (r, k) == (0, 0), "drifts": 1, "restores": 1,
                                               "left_alone": False}
                      for r in (0, 1) for k in range(12)},
                   **{f"sysctl:host:net.key{k}": {"drifted": False, "drifts": 0, "restores": 0,
                                                  "left_alone": False} for k in range(4)}}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with _OPENER.open(url, timeout=10) as r:
        return r.read().decode()


def _query(port: int, promql: str) -> list:
    body = _get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _scraped(port: int) -> dict:
    """What Prometheus holds now: targets up, nictune series per instance
    and in all, the drifted keys; {} while it does not answer yet."""
    try:
        total = _query(port, 'count({__name__=~"nictune_.+"})')
        return {"up": _query(port, 'up{job="nictune"} == 1'),
                "held": _query(port, 'count by (instance) ({__name__=~"nictune_.+"})'),
                "total": int(total[0]["value"][1]) if total else 0,
                "drifted": _query(port, "nictune_drift == 1")}
    except (urllib.error.URLError, ConnectionError, OSError):
        return {}


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _lab(tmp_path: Path):
    """The fleet lab's network for NODES namespaces, no sshd; (record path, hosts)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    prefix = "ntm" + secrets.token_hex(2)
    hosts = fleetlab._plan_hosts(prefix, NODES, 0, 0)
    fleetlab._check_free(prefix, hosts)
    record = fleetlab._Record(str(tmp_path / "record.json"), {
        "nictune_fleet": 1, "prefix": prefix, "dir": str(tmp_path), "created_dir": False,
        "subnet": None, "bridge": f"{prefix}br", "hosts": [], "links": [], "namespaces": [],
        "etc_netns": [], "files": [], "processes": [], "nccl_claimed": False})
    try:
        fleetlab._build_network(record, prefix, hosts)
    except BaseException:
        fleetlab.down(record.path)
        raise
    return record.path, hosts


def _start_exporters(hosts, status_file: Path, procs: list) -> None:
    """An exporter on each host's mgmt0, appended to procs as it starts (the
    caller stops them, also when one fails to start)."""
    env = {**os.environ, "PYTHONPATH": AGENT_DIR}
    for h in hosts:
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", h.netns, sys.executable, "-m", "nictune.host.resident.metrics",
             f"{h.address}:{PORT}", str(status_file)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    for h, proc in zip(hosts, procs):
        line = proc.stdout.readline()
        assert line.startswith("serving http://"), (h.netns, line, proc.stderr.read()
                                                    if proc.poll() is not None else "")


def _rss_mib(procs) -> float:
    """The exporters' resident memory (VmRSS of the Python each `ip netns exec` became)."""
    total = 0
    for proc in procs:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def test_a_real_prometheus_scrapes_100_nodes(tmp_path):
    binary = _prometheus()
    status_file = tmp_path / "status.json"
    status_file.write_text(json.dumps(STATUS))
    t0 = time.monotonic()
    record, hosts = _lab(tmp_path)
    procs, prom = [], None
    try:
        t_lab = time.monotonic() - t0
        _start_exporters(hosts, status_file, procs)
        t_exporters = time.monotonic() - t0 - t_lab
        # The per-node figure, from one node as Prometheus will see it.
        one = _get(f"http://{hosts[0].address}:{PORT}/metrics")
        per_node = _series(one)
        # 28 status series (24 + 4 keys' nictune_drift, 9 of the agent) and
        # mgmt0, rail0, rail1's device_info; kTLS's 12 only when the tls
        # module is loaded (/proc/net/tls_stat).
        assert per_node in (28 + 9 + 3, 28 + 9 + 3 + 12), one
        web = _free_port()
        config = tmp_path / "prometheus.yml"
        targets = ", ".join(f"'{h.address}:{PORT}'" for h in hosts)
        config.write_text("global:\n  scrape_interval: 3s\n  scrape_timeout: 3s\n"
                          "scrape_configs:\n  - job_name: nictune\n    static_configs:\n"
                          f"      - targets: [{targets}]\n")
        (tmp_path / "data").mkdir()
        with open(tmp_path / "prometheus.log", "w") as log:
            prom = subprocess.Popen([binary, f"--config.file={config}",
                                     f"--storage.tsdb.path={tmp_path / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{web}",
                                     "--storage.tsdb.retention.time=1h"],
                                    stdout=log, stderr=subprocess.STDOUT)
        seen = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and prom.poll() is None:
            seen = _scraped(web)
            # On a loaded machine a scrape may time out (up 0, its series
            # stale until the next): wait for a round where all 100 held.
            if (len(seen.get("up", ())) == NODES and seen["total"] == NODES * per_node
                    and len(seen["held"]) == NODES):
                break
            time.sleep(1)
        assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        t_scraped = time.monotonic() - t0 - t_lab - t_exporters
        up, held = seen.get("up", []), seen.get("held", [])
        assert len(up) == NODES, [r["metric"]["instance"] for r in up][:5]
        assert sorted(r["metric"]["instance"] for r in held) == sorted(f"{h.address}:{PORT}" for h in hosts)
        assert {int(r["value"][1]) for r in held} == {per_node}
        assert seen["total"] == NODES * per_node
        # One drifted key per node, named, on every node.
        drifted = seen["drifted"]
        assert len(drifted) == NODES and {r["metric"]["name"] for r in drifted} == {"key0"}
        print(f"\n{NODES} nodes: {per_node} series each, {NODES * per_node} in Prometheus; lab "
              f"{t_lab:.1f} s, exporters started in {t_exporters:.1f} s ({_rss_mib(procs):.0f} MiB RSS), "
              f"all scraped {t_scraped:.1f} s later; load average {os.getloadavg()[0]:.2f}")
    finally:
        if prom is not None:
            _stop(prom)
        for proc in procs:
            _stop(proc)
        fleetlab.down(record)
        assert not [h.netns for h in hosts if os.path.exists(f"/run/netns/{h.netns}")]
