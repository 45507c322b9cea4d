"""The metrics exporter (host/resident/metrics.py) as a real process inside a network
namespace, scraped over the namespace's loopback and over a veth, and by a
real Prometheus server (the binary of Debian's prometheus package, put in
.venv/bin by scripts/setup) whose query API must return the drift and
counter series.

The exporter runs as `python -m nictune.host.resident.metrics ADDRESS STATUS.json`,
serving a status file of the resident agent's shape (host/resident/daemon.py) and
the namespace's real counters.  Every process started here is stopped in a
finally, before the fixture deletes the namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from nictune.host.resident import metrics
from tests.nsenter import in_netns

pytestmark = pytest.mark.netns

parser = pytest.importorskip("prometheus_client.parser")

AGENT_DIR = str(Path(metrics.__file__).resolve().parents[3])
# Never a proxy: every address here is inside a throw-away namespace.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _start_exporter(ns: str, address: str, status_file: Path):
    env = {**os.environ, "PYTHONPATH": AGENT_DIR}
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "nictune.host.resident.metrics",
                             address, str(status_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # "serving http://HOST:PORT/metrics", or EOF if it died
    if not line.startswith("serving http://"):
        _stop(proc)
        raise AssertionError(f"exporter did not start: {line!r} {proc.stderr.read()}")
    port = int(line.strip().rsplit(":", 1)[1].split("/")[0])
    return proc, port


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


def _get(ns: str, url: str, method: str = "GET"):
    """(status, body) of a request made from inside namespace ns."""
    with in_netns(ns):
        request = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
        try:
            with _OPENER.open(request, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""


def _samples(text: str) -> dict:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in parser.text_string_to_metric_families(text) for s in f.samples}


def _info(device: str, driver: str = ""):
    return ("nictune_device_info", frozenset({"device": device, "driver": driver}.items()))


def _sysfs(pair, ns: str, stat: str) -> int:
    r = pair.run(ns, ["cat", f"/sys/class/net/{pair.ifname}/statistics/{stat}"])
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


STATUS = {"nictune_agent_status": 1, "reapplies": 2, "last_verify": 1764500060.0,
          "last_verify_ok": 1764500000.0,
          "keys": {"link:ntv0:mtu": {"drifted": True, "drifts": 1, "restores": 0, "left_alone": False},
                   'sysctl:host:we"ird\\key\nname': {"drifted": False, "drifts": 0, "restores": 0,
                                                    "left_alone": False}}}


def _quiet(pair) -> None:
    """No IPv6 on the veth: router solicitations and MLD reports would move
    its counters while they are being compared."""
    for ns in (pair.ns_a, pair.ns_b):
        r = pair.run(ns, ["sysctl", "-qw", f"net.ipv6.conf.{pair.ifname}.disable_ipv6=1"])
        assert r.returncode == 0, r.stderr


def _send_udp(pair, count: int, size: int) -> None:
    code = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for _ in range({count}): s.sendto(b'x' * {size}, ('198.18.0.1', 9))\n")
    r = pair.run(pair.ns_b, [sys.executable, "-c", code])
    assert r.returncode == 0, r.stderr


# The kernel takes quotes and backslashes in interface names (net/core/dev.c
# dev_valid_name refuses only '/', ':' and whitespace).
HOSTILE_IFNAMES = ('q"t\\x', 'b\\"{}=,')


def test_the_endpoint_in_a_namespace_serves_the_status_and_only_get_metrics(veth_pair, tmp_path):
    status_file = tmp_path / "status.json"
    status_file.write_text(json.dumps(STATUS))
    r = veth_pair.run(veth_pair.ns_a, ["ip", "link", "add", HOSTILE_IFNAMES[0], "type", "veth",
                                       "peer", "name", HOSTILE_IFNAMES[1]])
    assert r.returncode == 0, r.stderr
    proc, port = _start_exporter(veth_pair.ns_a, "127.0.0.1:0", status_file)
    try:
        base = f"http://127.0.0.1:{port}"
        code, body = _get(veth_pair.ns_a, base + "/metrics")
        assert code == 200
        got = _samples(body)
        assert got[("nictune_drift", frozenset(
            {"family": "link", "target": "ntv0", "name": "mtu"}.items()))] == 1
        assert got[("nictune_drift", frozenset(
            {"family": "sysctl", "target": "host", "name": 'we"ird\\key\nname'}.items()))] == 0
        assert got[("nictune_reapplies_total", frozenset())] == 2
        for name in HOSTILE_IFNAMES:  # escaped, and read back by the parser as the kernel has it
            assert got[_info(name)] == 1
        assert got[("nictune_last_successful_verify_timestamp_seconds", frozenset())] == 1764500000.0
        # The status file is read at every scrape.
        status_file.write_text(json.dumps(dict(STATUS, reapplies=5)))
        assert _samples(_get(veth_pair.ns_a, base + "/metrics")[1])[
            ("nictune_reapplies_total", frozenset())] == 5
        for path, method in (("/", "GET"), ("/metrics/x", "GET"), ("/favicon.ico", "GET"),
                             ("/metrics", "POST"), ("/metrics", "DELETE")):
            assert _get(veth_pair.ns_a, base + path, method)[0] == 404, (path, method)
        # Bound to the namespace's loopback: not reachable over the veth.
        with pytest.raises(urllib.error.URLError):
            with in_netns(veth_pair.ns_b):
                _OPENER.open(f"http://198.18.0.1:{port}/metrics", timeout=3)
    finally:
        _stop(proc)


def test_an_interface_name_that_is_not_utf8_leaves_every_scrape_answered(veth_pair, tmp_path):
    # The kernel takes any bytes but '/', ':', whitespace and NUL in a name:
    # one such link used to turn every scrape into HTTP 500.
    status_file = tmp_path / "status.json"
    status_file.write_text(json.dumps(STATUS))
    r = veth_pair.run(veth_pair.ns_a, ["ip", "link", "add", b"nt\xff\xfe", "type", "veth",
                                       "peer", "name", "ntraw0"])
    assert r.returncode == 0, r.stderr
    proc, port = _start_exporter(veth_pair.ns_a, "127.0.0.1:0", status_file)
    try:
        code, body = _get(veth_pair.ns_a, f"http://127.0.0.1:{port}/metrics")
        assert code == 200
        got = _samples(body)
        for name in ("nt:xff:xfe", "ntraw0", "ntv0"):
            assert got[_info(name)] == 1
        assert got[("nictune_reapplies_total", frozenset())] == 2
    finally:
        _stop(proc)


def test_a_veth_is_named_by_device_and_its_netdev_counters_are_left_to_node_exporter(veth_pair, tmp_path):
    _quiet(veth_pair)
    status_file = tmp_path / "status.json"
    status_file.write_text("{}")
    proc, port = _start_exporter(veth_pair.ns_a, "0.0.0.0:0", status_file)
    try:
        _send_udp(veth_pair, 300, 1000)
        assert _sysfs(veth_pair, veth_pair.ns_a, "rx_packets") >= 300
        got = _samples(_get(veth_pair.ns_a, f"http://127.0.0.1:{port}/metrics")[1])
        assert got[_info(veth_pair.ifname)] == 1  # a veth has no device, so no driver
        # The kernel's netdev statistics moved, but they are node_exporter's
        # (node_network_receive_packets_total{device}): not repeated here.
        assert len(got) >= 1 and not [n for n, _ in got if n.startswith("nictune_netdev_")]
        # ethtool -S of a veth (drivers/net/veth.c) has no congestion counter:
        # none is invented, and lo is left out.
        ethtool = veth_pair.run(veth_pair.ns_a, ["ethtool", "-S", veth_pair.ifname])
        assert ethtool.returncode == 0 and "peer_ifindex" in ethtool.stdout
        names = {line.split(":")[0].strip() for line in ethtool.stdout.splitlines()[1:]}
        assert metrics.ethtool_samples(veth_pair.ifname, dict.fromkeys(names, 1)) == []
        assert not [n for n, _ in got if n.startswith(("nictune_pfc_", "nictune_roce_"))]
        assert not [labels for _, labels in got if ("device", "lo") in labels]
        assert not [labels for _, labels in got if "interface" in dict(labels)]
        # Over the veth, from the other namespace.
        code, body = _get(veth_pair.ns_b, f"http://198.18.0.1:{port}/metrics")
        assert code == 200 and _samples(body)[_info(veth_pair.ifname)] == 1
    finally:
        _stop(proc)


def _dashboard_targets() -> list:
    """(panel title, expr) of every query of the shipped dashboard."""
    path = Path(AGENT_DIR).parent / "contrib" / "grafana" / "nictune.json"
    panels = json.loads(path.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets") or []]


def _filled(expr: str) -> str:
    """A dashboard query with its Grafana variables filled in."""
    return expr.replace("$instance", ".*").replace("$rail", ".*").replace("$__rate_interval", "1m")


# An exporter whose ethtool statistics are a ConnectX port's (FAKE: this
# kernel has no mlx5), under the names en_stats.c gives them, rising with
# every scrape as RoCE traffic would while the netdev's rx_bytes stays put
# (the software rings never see RDMA: en_main.c mlx5e_get_stats).  The
# rest (HTTP, rendering, the interface list) is the real exporter's.
_MLX5_EXPORTER = """
import sys, threading
from nictune.host.machine import Host
from nictune.host.resident import metrics

class Mlx5Port:
    scrapes = 0
    def ethtool_stats(self, ifname):
        self.scrapes += 1
        n = self.scrapes
        return {"rx_bytes": 1000, "tx_bytes": 1000, "rx_vport_unicast_bytes": 1000,
                "rx_vport_rdma_unicast_bytes": n * 5_000_000_000,
                "tx_vport_rdma_unicast_bytes": n * 4_000_000_000,
                "rx_bytes_phy": n * 5_100_000_000, "tx_bytes_phy": n * 4_100_000_000,
                "rx_prio3_pause": 0}

host = Host(sys.argv[1])
host.counter_source = Mlx5Port()
exporter = metrics.start(lambda: {"interfaces": ["rail0"]}, "127.0.0.1:0", host=host)
print("serving http://%s:%d/metrics" % exporter.address, flush=True)
threading.Event().wait()
"""


def _start_mlx5_exporter(ns: str, tmp_path: Path):
    root = tmp_path / "mlx5-root"
    (root / "sys/class/net/rail0").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": AGENT_DIR}
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _MLX5_EXPORTER, str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line.startswith("serving http://"):
        _stop(proc)
        raise AssertionError(f"mlx5 exporter did not start: {line!r} {proc.stderr.read()}")
    return proc, int(line.strip().rsplit(":", 1)[1].split("/")[0])


def _prometheus() -> str:
    for path in (os.path.join(os.path.dirname(sys.executable), "prometheus"),
                 shutil.which("prometheus")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("no prometheus binary (scripts/setup puts it in .venv/bin)")


def _query(ns: str, promql: str) -> list:
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    code, body = _get(ns, url)
    assert code == 200, body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_a_real_prometheus_scrapes_the_endpoint_and_answers_queries(veth_pair, tmp_path):
    binary = _prometheus()
    _quiet(veth_pair)
    status_file = tmp_path / "status.json"
    status_file.write_text(json.dumps(STATUS))
    _send_udp(veth_pair, 50, 500)
    exporter, port = _start_exporter(veth_pair.ns_a, "127.0.0.1:0", status_file)
    prom = mlx5 = None
    try:
        mlx5, mlx5_port = _start_mlx5_exporter(veth_pair.ns_a, tmp_path)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: nictune\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{port}', '127.0.0.1:{mlx5_port}']\n")
        (tmp_path / "data").mkdir()
        log = open(tmp_path / "prometheus.log", "w")
        prom = subprocess.Popen(
            ["ip", "netns", "exec", veth_pair.ns_a, binary, f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'data'}", "--web.listen-address=127.0.0.1:9090",
             "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        drift = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and prom.poll() is None:
            try:
                drift = _query(veth_pair.ns_a, "nictune_drift")
                up = _query(veth_pair.ns_a, 'up{job="nictune"}')
            except (urllib.error.URLError, ConnectionError, OSError):
                drift = up = []
            if len(drift) == 2 and len(up) == 2:  # both targets scraped
                break
            time.sleep(0.5)
        assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        got = {(r["metric"]["family"], r["metric"]["target"], r["metric"]["name"]): r["value"][1]
               for r in drift}
        assert got == {("link", "ntv0", "mtu"): "1",
                       ("sysctl", "host", 'we"ird\\key\nname'): "0"}
        assert [r["value"][1] for r in _query(veth_pair.ns_a, 'up{job="nictune"}')] == ["1", "1"]
        assert [r["value"][1] for r in _query(veth_pair.ns_a, "nictune_reapplies_total")] == ["2"]
        info = _query(veth_pair.ns_a, f'nictune_device_info{{device="{veth_pair.ifname}"}}')
        assert len(info) == 1 and info[0]["value"][1] == "1"
        # The dashboard's throughput panel, as the real server answers it (a
        # rate needs two scrapes, 1 s apart): the RoCE bytes of the mlx5
        # port, labelled `device` as node_exporter's series are.
        throughput = [expr for title, expr in _dashboard_targets() if title == "Throughput"]
        assert len(throughput) == 4
        for expr in throughput:
            rate = []
            while time.monotonic() < deadline and not rate:
                rate = _query(veth_pair.ns_a, _filled(expr))
                time.sleep(0.5)
            assert [r["metric"]["device"] for r in rate] == ["rail0"], expr
            assert float(rate[0]["value"][1]) > 1e9, (expr, rate)  # Gb/s, not the idle netdev's
        # The PFC panel by default (no --metrics-detail): one series per rail,
        # summed over priorities, its `by (..., priority)` harmless.
        pfc = [expr for title, expr in _dashboard_targets() if title == "PFC pause frames received"]
        assert len(pfc) == 1
        answer = _query(veth_pair.ns_a, _filled(pfc[0]))
        assert [(r["metric"].get("device"), r["metric"].get("priority")) for r in answer] == [("rail0", None)]
        # Every query of the shipped dashboard is valid PromQL to the real
        # server (a 400 otherwise), its Grafana variables filled in.
        for _title, expr in _dashboard_targets():
            _query(veth_pair.ns_a, _filled(expr))
    finally:
        if prom is not None:
            _stop(prom)
        if mlx5 is not None:
            _stop(mlx5)
        _stop(exporter)
        shutil.rmtree(tmp_path / "data", ignore_errors=True)  # its TSDB: tens of MB
