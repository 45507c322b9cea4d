"""The resident agent's Prometheus metrics (host/resident/metrics.py, issue 14 item 4).

The text is read back with prometheus_client's own parser (the oracle, from
the test extras), never with a regex of ours.  The mlx5 ethtool statistics
and RDMA hw_counters are FAKES (this kernel has no mlx5 or RDMA): a dict of
the names en_stats.c and counters.c give them, and a sysfs fixture tree
made here.  The real kernel's side is tests/netns/test_metrics_netns.py.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nictune.host.resident import metrics
from nictune.host.machine import Host

parser = pytest.importorskip("prometheus_client.parser")

# Never a proxy: the endpoint is on this machine's loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
DASHBOARD = Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "nictune.json"


def parsed(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} as prometheus_client reads
    the text; also checks each family's declared type."""
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            kind = metrics.CATALOG[s.name][0]
            assert family.type == kind, (s.name, family.type)
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _key(metric, **labels):
    return (metric, frozenset(labels.items()))


# -- format ------------------------------------------------------------------

# Interface names may hold quotes and backslashes (dev_valid_name refuses
# only '/', ':' and whitespace); key names and file targets anything.
HOSTILE = ['quo"te', "back\\slash", "new\nline", 'all\\"\n\\n', "trailing\\", "ünïcode ✓",
           '{x="1"}', "a:b:c"]


def test_hostile_label_values_round_trip_through_prometheus_clients_parser():
    keys = {f"sysctl:{name.replace(':', '-')}:{name}k": {"drifted": i % 2 == 0}
            for i, name in enumerate(HOSTILE)}
    got = parsed(metrics.render(metrics.status_samples({"keys": keys})))
    for i, name in enumerate(HOSTILE):
        labels = dict(family="sysctl", target=name.replace(":", "-"), name=name + "k")
        assert got[_key("nictune_drift", **labels)] == (1 if i % 2 == 0 else 0)
    assert got[_key("nictune_drifted_keys")] == 4


def test_escaping_is_the_formats_own():
    # Version 0.0.4: in label values \\ , \" and \n; nothing else.
    assert metrics.escape_label('a\\b"c\nd\te') == 'a\\\\b\\"c\\nd\te'
    line = metrics.render([("nictune_drift", {"family": "f", "target": "t\n", "name": '"'}, 1)])
    assert 'nictune_drift{family="f",target="t\\n",name="\\""} 1\n' in line
    # No raw line feed is left to split a sample: every line is a comment or a sample.
    assert all(row.startswith(("# ", "nictune_drift{")) for row in line.splitlines())


def test_status_series_names_types_and_values():
    # The shape host/resident/daemon.py writes (its docstring; format 1).
    status = {"nictune_agent_status": 1, "pid": 1, "reapplies": 3, "last_verify": 1764500060.0,
              "last_verify_ok": 1764500000.25, "idle": None,
              "keys": {"link:eth0:mtu": {"drifts": 2, "restores": 1, "last_drift": 1764500050.0,
                                         "left_alone": False, "drifted": True, "on_drift": "restore"},
                       "sysctl:host:net.ipv4.tcp_ecn": {"drifts": 5, "restores": 0, "drifted": False,
                                                        "left_alone": True, "on_drift": "report"}}}
    got = parsed(metrics.render(metrics.status_samples(status)))
    mtu = dict(family="link", target="eth0", name="mtu")
    ecn = dict(family="sysctl", target="host", name="net.ipv4.tcp_ecn")
    assert got == {
        _key("nictune_drift", **mtu): 1, _key("nictune_drift", **ecn): 0,
        _key("nictune_drift_events_total", **mtu): 2, _key("nictune_drift_events_total", **ecn): 5,
        _key("nictune_drift_restores_total", **mtu): 1, _key("nictune_drift_restores_total", **ecn): 0,
        _key("nictune_drift_left_alone", **mtu): 0, _key("nictune_drift_left_alone", **ecn): 1,
        _key("nictune_drifted_keys"): 1,
        _key("nictune_reapplies_total"): 3,
        _key("nictune_last_verify_timestamp_seconds"): 1764500060.0,
        _key("nictune_last_successful_verify_timestamp_seconds"): 1764500000.25,
    }
    # Nothing said is nothing shown: no invented zero re-applies or verify time.
    assert parsed(metrics.render(metrics.status_samples({}))) == {}


def test_a_key_name_may_hold_colons():
    got = parsed(metrics.render(metrics.status_samples(
        {"keys": {"files:host:/etc/x:y": {"drifted": True}}})))
    assert got[_key("nictune_drift", family="files", target="host", name="/etc/x:y")] == 1


def test_a_series_twice_is_written_once_and_unknown_metrics_are_refused():
    text = metrics.render([("nictune_drifted_keys", {}, 1), ("nictune_drifted_keys", {}, 2)])
    assert text.count("nictune_drifted_keys 1") == 1 and "nictune_drifted_keys 2" not in text
    with pytest.raises(ValueError):
        metrics.render([("nictune_made_up", {}, 1)])


def test_catalog_follows_the_naming_conventions():
    assert metrics.CATALOG
    for name, (kind, text) in metrics.CATALOG.items():
        assert re.fullmatch(r"nictune_[a-z0-9_]+", name), name
        assert (kind == "counter") == name.endswith("_total"), name
        # base units: seconds, never micro/milliseconds or bare "duration"
        assert not re.search(r"(micro|milli|_us_|_usec|_ms_)", name), name
        assert "duration" not in name or "_seconds" in name, name
        assert text and "\n" not in text


# -- the congestion counters (FAKE mlx5 and RDMA sources) -----------------------

# ethtool -S of a ConnectX port, names as en_stats.c gives them (FAKE values).
MLX5_STATS = {
    "rx_prio3_pause": 120, "tx_prio3_pause": 7, "rx_prio3_pause_duration": 2_500_000,
    "tx_prio3_pause_duration": 1500, "rx_prio3_pause_transition": 60, "rx_prio0_pause": 0,
    "rx_prio3_discards": 4, "tx_pause_storm_warning_events": 2, "tx_pause_storm_error_events": 1,
    "rx_discards_phy": 9, "rx_out_of_buffer": 11, "link_down_events_phy": 1,
    "rx_global_pause": 5, "rx_global_pause_duration": 10,
    "rx_packets": 1000, "rx3_packets": 10, "ch0_poll": 99,  # not congestion: left out
    # The netdev's byte counters (en_main.c mlx5e_get_stats: the software
    # rings in NIC mode) are node_exporter's to export, and blind to RDMA.
    "rx_bytes": 10_000, "tx_bytes": 20_000, "rx_vport_unicast_bytes": 30_000,
    # en_stats.c vport_stats_desc and pport_802_3_stats_desc
    "rx_vport_rdma_unicast_bytes": 7_000_000_000, "tx_vport_rdma_unicast_bytes": 6_000_000_000,
    "rx_vport_rdma_unicast_packets": 1_700_000, "rx_bytes_phy": 7_100_000_000,
    "tx_bytes_phy": 6_100_000_000, "rx_packets_phy": 1_800_000,
}


def test_mlx5_ethtool_statistics_map_to_conventional_series():
    got = parsed(metrics.render(metrics.ethtool_samples("rail0", MLX5_STATS)))
    p3 = dict(device="rail0", priority="3")
    assert got == {
        _key("nictune_pfc_rx_pause_frames_total", **p3): 120,
        _key("nictune_pfc_tx_pause_frames_total", **p3): 7,
        _key("nictune_pfc_rx_pause_frames_total", device="rail0", priority="0"): 0,
        # microseconds (counters.rst, en_stats.c pport_per_prio_pfc_stats_desc) -> seconds
        _key("nictune_pfc_rx_pause_duration_seconds_total", **p3): 2.5,
        _key("nictune_pfc_tx_pause_duration_seconds_total", **p3): 0.0015,
        _key("nictune_pfc_rx_pause_transitions_total", **p3): 60,
        _key("nictune_prio_rx_discards_total", **p3): 4,
        _key("nictune_pause_storm_warning_events_total", device="rail0"): 2,
        _key("nictune_pause_storm_error_events_total", device="rail0"): 1,
        _key("nictune_port_rx_discards_total", device="rail0"): 9,
        _key("nictune_rx_out_of_buffer_total", device="rail0"): 11,
        _key("nictune_link_down_events_total", device="rail0"): 1,
        _key("nictune_global_rx_pause_frames_total", device="rail0"): 5,
        _key("nictune_global_rx_pause_duration_seconds_total", device="rail0"): 1e-05,
        # Throughput that RoCE traffic moves (the netdev's rx_bytes does not)
        _key("nictune_rdma_rx_unicast_bytes_total", device="rail0"): 7_000_000_000,
        _key("nictune_rdma_tx_unicast_bytes_total", device="rail0"): 6_000_000_000,
        _key("nictune_port_rx_bytes_total", device="rail0"): 7_100_000_000,
        _key("nictune_port_tx_bytes_total", device="rail0"): 6_100_000_000,
    }


def _fixture_root(tmp_path: Path) -> Path:
    """A sysfs/procfs tree (FAKE): rail0 with netdev statistics and the
    mlx5_0 RDMA port whose GID table names it, /proc/net/snmp and
    /proc/net/tls_stat."""
    root = tmp_path / "root"
    stats = root / "sys/class/net/rail0/statistics"
    stats.mkdir(parents=True)
    (stats / "rx_bytes").write_text("123456789\n")
    (stats / "tx_packets").write_text("42\n")
    (stats / "rx_dropped").write_text("3\n")
    pci = root / "sys/bus/pci/drivers/mlx5_core"
    pci.mkdir(parents=True)
    (root / "sys/class/net/rail0/device").mkdir()
    (root / "sys/class/net/rail0/device/driver").symlink_to(pci)
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "gid_attrs/ndevs").mkdir(parents=True)
    (port / "gid_attrs/ndevs/0").write_text("rail0\n")
    hw = port / "hw_counters"
    hw.mkdir()
    for name, value in (("np_ecn_marked_roce_packets", 17), ("np_cnp_sent", 16),
                        ("rp_cnp_handled", 15), ("out_of_sequence", 2)):
        (hw / name).write_text(f"{value}\n")
    net = root / "proc/net"
    net.mkdir(parents=True)
    (net / "snmp").write_text(
        "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
        "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails "
        "EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
        "Tcp: 1 200 120000 -1 10 5 0 0 2 1000 900 37 0 1 0\n")
    (net / "tls_stat").write_text("TlsCurrTxSw                     \t1\nTlsTxSw                         \t8\n"
                                  "TlsTxDevice                     \t5\nTlsDecryptError                 \t2\n")
    return root


def test_collect_reads_rdma_and_ktls_counters_of_a_tree(tmp_path):
    root = _fixture_root(tmp_path)
    got = parsed(metrics.collect({"reapplies": 1}, Host(str(root))))
    r = dict(device="rail0")
    assert got == {
        _key("nictune_reapplies_total"): 1,
        # The netdev statistics (node_network_*{device}) and /proc/net/snmp's
        # RetransSegs (node_netstat_Tcp_RetransSegs) are node_exporter's: not
        # repeated; only the interface and its driver are named.
        _key("nictune_device_info", driver="mlx5_core", **r): 1,
        _key("nictune_roce_ecn_marked_packets_total", **r): 17,
        _key("nictune_roce_cnp_sent_total", **r): 16,
        _key("nictune_roce_cnp_handled_total", **r): 15,
        _key("nictune_roce_out_of_sequence_packets_total", **r): 2,
        _key("nictune_tls_curr_tx_sw"): 1,
        _key("nictune_tls_tx_sw_total"): 8,
        _key("nictune_tls_tx_device_total"): 5,
        _key("nictune_tls_decrypt_error_total"): 2,
    }


def test_status_interfaces_limit_what_is_read(tmp_path):
    root = _fixture_root(tmp_path)
    got = parsed(metrics.collect({"interfaces": ["other"]}, Host(str(root))))
    assert not any(dict(labels).get("device") == "rail0" for _, labels in got)



# -- serving and the textfile ------------------------------------------------

def test_textfile_is_renamed_into_place_and_parses(tmp_path):
    root = _fixture_root(tmp_path)
    out = tmp_path / "textfile"
    out.mkdir()
    target = out / "nictune.prom"
    target.write_text("old\n")
    exporter = metrics.Exporter(lambda: {"reapplies": 4}, address=None, textfile=str(target),
                                host=Host(str(root)))
    before = os.stat(target).st_ino
    exporter.write_textfile()
    assert os.stat(target).st_ino != before  # a new file renamed over, not rewritten in place
    assert sorted(os.listdir(out)) == ["nictune.prom"]
    assert parsed(target.read_text())[_key("nictune_reapplies_total")] == 4
    assert os.stat(target).st_mode & 0o777 == 0o644


@pytest.mark.parametrize("text,want", [("127.0.0.1:9463", ("127.0.0.1", 9463)),
                                       ("[::1]:0", ("::1", 0)), ("localhost:80", ("localhost", 80))])
def test_addresses(text, want):
    assert metrics.parse_address(text) == want


@pytest.mark.parametrize("text", ["127.0.0.1", ":9463", "[::1]", "a:b", "1.2.3.4:70000", ""])
def test_bad_addresses_are_refused(text):
    with pytest.raises(ValueError):
        metrics.parse_address(text)


def test_http_serves_get_metrics_only(tmp_path):
    exporter = metrics.start(lambda: {"reapplies": 2}, "127.0.0.1:0",
                             host=Host(str(_fixture_root(tmp_path))))
    try:
        base = "http://%s:%d" % exporter.address
        with _OPENER.open(base + "/metrics", timeout=10) as r:
            assert r.headers["Content-Type"] == metrics.CONTENT_TYPE
            assert parsed(r.read().decode())[_key("nictune_reapplies_total")] == 2
        for path, method in (("/", "GET"), ("/metricsx", "GET"), ("/metrics/", "GET"),
                             ("/metrics", "POST"), ("/metrics", "PUT"), ("/metrics", "DELETE")):
            with pytest.raises(urllib.error.HTTPError) as e:
                _OPENER.open(urllib.request.Request(base + path, method=method, data=b""
                                                              if method != "GET" else None), timeout=10)
            assert e.value.code == 404, (path, method)
    finally:
        exporter.stop()


# -- the Grafana dashboard -------------------------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "inf", "nan", "atan2"}
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r"\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\$\{?\w+\}?|[A-Za-z_:][A-Za-z0-9_:]*|\S")


def metric_names(expr: str) -> set:
    """The metric names a PromQL expression selects: identifiers that are not
    functions (followed by '('), keywords or label names (in {...} and the
    label lists of by/without/on/ignoring/group_*); strings and [ranges]
    are skipped."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = _LABEL_LISTS.sub(" ", expr)
    tokens = _TOKEN.findall(expr)
    names = set()
    for i, tok in enumerate(tokens):
        if not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok) or tok.lower() in _KEYWORDS:
            continue
        if i + 1 < len(tokens) and tokens[i + 1] == "(":
            continue
        names.add(tok)
    return names


def test_the_tokenizer_finds_metric_names_only():
    assert metric_names('sum by (instance, interface) (rate(a_total{x="b_total", y=~"$v"}'
                        '[$__rate_interval])) / on(instance) group_left(rail) c * 1e6 offset 5m') == {
        "a_total", "c"}
    assert metric_names('time() - d{instance=~"$instance"} == bool 1') == {"d"}


def _dashboard_queries(dashboard: dict) -> list:
    out = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels") or [])

    for panel in panels(dashboard["panels"]):
        out += [(panel["title"], t["expr"]) for t in panel.get("targets") or []]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query["query"])
            out.append((var["name"], m.group(1)))
    return out


def test_every_dashboard_query_names_an_exported_series():
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _dashboard_queries(dashboard)
    assert len(queries) > 20
    for where, expr in queries:
        names = metric_names(expr)
        assert names, (where, expr)
        assert names <= set(metrics.CATALOG) | NODE_EXPORTER, (
            where, sorted(names - set(metrics.CATALOG) - NODE_EXPORTER))
    shown = set().union(*(metric_names(e) for _, e in queries))
    # The list: drift, re-applies, last verify, pause frames and
    # duration, storms, ECN, CNP, out-of-buffer, discards, TCP retransmits, kTLS.
    for name in ("nictune_drift", "nictune_reapplies_total",
                 "nictune_last_successful_verify_timestamp_seconds",
                 "nictune_pfc_rx_pause_frames_total", "nictune_pfc_rx_pause_duration_seconds_total",
                 "nictune_pause_storm_error_events_total", "nictune_roce_ecn_marked_packets_total",
                 "nictune_roce_cnp_sent_total", "nictune_roce_cnp_handled_total",
                 "nictune_rx_out_of_buffer_total", "nictune_port_rx_discards_total",
                 "node_netstat_Tcp_RetransSegs", "nictune_tls_tx_device_total"):
        assert name in shown, name


def test_the_dashboard_plots_per_host_and_rail():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"instance", "rail"} <= set(variables)
    queries = _dashboard_queries(dashboard)
    assert [where for where, _ in queries if where not in variables], queries
    for where, expr in queries:
        if where in variables:
            continue
        assert 'instance=~"$instance"' in expr, where
        rail_metric = any(n not in _PER_HOST for n in metric_names(expr))
        assert ('device=~"$rail"' in expr) == rail_metric, (where, expr)
        assert "interface" not in expr, (where, expr)  # node_exporter's label is device


# What the dashboard takes from node_exporter rather than repeat it (its
# netstat collector, on by default).
NODE_EXPORTER = {"node_netstat_Tcp_RetransSegs"}

_PER_HOST = {"nictune_drift", "nictune_drift_events_total", "nictune_drift_restores_total",
             "nictune_drift_left_alone", "nictune_drifted_keys", "nictune_reapplies_total",
             "nictune_last_successful_verify_timestamp_seconds", "nictune_last_verify_timestamp_seconds",
             "node_netstat_Tcp_RetransSegs"} | {
    n for n in metrics.CATALOG if n.startswith("nictune_tls_")}


def test_the_textfile_is_rewritten_every_interval_until_stopped(tmp_path):
    root = _fixture_root(tmp_path)
    target = tmp_path / "nictune.prom"
    status = {"reapplies": 1}
    exporter = metrics.start(lambda: dict(status), None, textfile=str(target), interval=0.05,
                             host=Host(str(root)))
    try:
        def reapplies():
            try:
                return parsed(target.read_text()).get(_key("nictune_reapplies_total"))
            except OSError:
                return None

        deadline = time.monotonic() + 10
        while reapplies() != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reapplies() == 1
        status["reapplies"] = 7
        while reapplies() != 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reapplies() == 7
    finally:
        exporter.stop()
    assert exporter.server is None and not any(t.is_alive() for t in exporter._threads)


# -- names that are not UTF-8, and a textfile writer that outlives failures ---------

def _with_raw_interface(tmp_path: Path) -> Path:
    """The fixture tree plus an interface whose name is the bytes nt\\xff\\xfe
    (the kernel takes them: only '/', ':', whitespace and NUL are refused)."""
    root = _fixture_root(tmp_path)
    stats = os.path.join(os.fsencode(root), b"sys/class/net", b"nt\xff\xfe", b"statistics")
    os.makedirs(stats)
    with open(os.path.join(stats, b"rx_packets"), "w") as f:
        f.write("5\n")
    return root


def test_an_interface_name_that_is_not_utf8_is_a_lossless_utf8_label(tmp_path):
    root = _with_raw_interface(tmp_path)
    status = {"keys": {"link:nt\udcff\udcfe:mtu": {"drifted": True}}}
    body = metrics.collect(status, Host(str(root))).encode("utf-8")  # strict: what is served
    got = parsed(body.decode("utf-8"))
    assert got[_key("nictune_device_info", device="nt:xff:xfe", driver="")] == 1
    assert got[_key("nictune_device_info", device="rail0", driver="mlx5_core")] == 1
    assert got[_key("nictune_drift", family="link", target="nt:xff:xfe", name="mtu")] == 1


def test_name_labels_keep_utf8_and_tell_every_byte_string_apart():
    names = [b"rail0", b"q\"t\\x", "ünï".encode(), b"nt\xff", b"nt\xfe", b"nt\xc3", b"\xc3\xbc",
             b"a\\xff"]
    labels = [metrics.name_label(os.fsdecode(n)) for n in names]
    assert labels[:3] == ["rail0", 'q"t\\x', "ünï"]
    assert labels[3:6] == ["nt:xff", "nt:xfe", "nt:xc3"] and labels[6] == "ü"
    assert len(set(labels)) == len(names) == 8
    for label in labels:
        label.encode("utf-8")  # strict


def test_http_answers_a_scrape_with_a_non_utf8_interface(tmp_path):
    exporter = metrics.start(lambda: {"reapplies": 2}, "127.0.0.1:0",
                             host=Host(str(_with_raw_interface(tmp_path))))
    try:
        with _OPENER.open("http://%s:%d/metrics" % exporter.address, timeout=10) as r:
            got = parsed(r.read().decode("utf-8"))
        assert got[_key("nictune_device_info", device="nt:xff:xfe", driver="")] == 1
    finally:
        exporter.stop()


def test_the_textfile_writer_outlives_a_failure_and_logs_it_once(tmp_path):
    root = _fixture_root(tmp_path)
    target = tmp_path / "nictune.prom"
    failures = {"left": 6}
    lines = []

    def status() -> dict:
        if failures["left"]:
            failures["left"] -= 1
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")
        return {"reapplies": 3}

    exporter = metrics.start(status, None, textfile=str(target), interval=0.02,
                             host=Host(str(root)), log=lines.append)
    try:
        deadline = time.monotonic() + 10
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert parsed(target.read_text())[_key("nictune_reapplies_total")] == 3
    finally:
        exporter.stop()
    assert failures["left"] == 0 and exporter.textfile_error is None
    assert len(lines) == 2, lines  # the failure once (not six times), then its end
    assert "not written (UnicodeEncodeError" in lines[0] and "written again" in lines[1]


# -- what operators join and plot ------------------------------------------------

class _Mlx5Counters:
    """A counter source (Host.counter_source) answering ethtool -S with
    MLX5_STATS: the names en_stats.c gives (FAKE values)."""

    def ethtool_stats(self, ifname):
        return dict(MLX5_STATS)


def test_collect_exports_rdma_and_port_bytes_labelled_device(tmp_path):
    host = Host(str(_fixture_root(tmp_path)))
    host.counter_source = _Mlx5Counters()
    got = parsed(metrics.collect({}, host))
    assert got[_key("nictune_rdma_rx_unicast_bytes_total", device="rail0")] == 7_000_000_000
    assert got[_key("nictune_port_tx_bytes_total", device="rail0")] == 6_100_000_000
    per_interface = [dict(labels) for _, labels in got if labels]
    assert len(per_interface) > 10
    # node_exporter names an interface `device`: the same label joins the two
    assert all("interface" not in labels for labels in per_interface)


def test_nothing_repeats_what_node_exporter_exports():
    # node_exporter's netdev collector has every /sys/class/net/X/statistics
    # file (node_network_receive_bytes_total{device}, ...); on mlx5 the
    # netdev's rx_dropped is rx_out_of_buffer (en_main.c mlx5e_get_stats).
    assert "nictune_rx_out_of_buffer_total" in metrics.CATALOG
    assert not [n for n in metrics.CATALOG if n.startswith("nictune_netdev_")]
    # Nor its netstat collector's /proc/net/snmp RetransSegs (node_netstat_Tcp_RetransSegs).
    assert not [n for n in metrics.CATALOG if "retrans" in n and "roce" not in n]
    got = metrics.ethtool_samples("rail0", {"rx_bytes": 1, "tx_bytes": 1, "rx_packets": 1,
                                            "rx_dropped": 1, "tx_packets": 1})
    assert got == []


def test_the_throughput_panel_plots_rdma_and_port_bytes():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {where: [] for where, _ in _dashboard_queries(dashboard)}
    for where, expr in _dashboard_queries(dashboard):
        exprs[where].append(expr)
    shown = set().union(*(metric_names(e) for e in exprs["Throughput"]))
    assert shown == {"nictune_rdma_rx_unicast_bytes_total", "nictune_rdma_tx_unicast_bytes_total",
                     "nictune_port_rx_bytes_total", "nictune_port_tx_bytes_total"}
    everything = [e for group in exprs.values() for e in group]
    assert len(everything) > 20 and not [e for e in everything if "nictune_netdev_" in e]


def test_the_recorded_connectx7_host_shows_roce_throughput_the_netdev_misses(tmp_path):
    # The fake kernel of the recorded cx7-host (tests/fakes.py FakeCounters),
    # its ethtool -S under en_stats.c's names: during an NCCL job the
    # netdev's own bytes (the software rings, en_main.c mlx5e_get_stats)
    # barely move while the vport's RDMA bytes and the port's do.
    from fakes import FakeHost, load_state

    state = load_state("cx7-host")
    state["ethtool_stats"] = {"enp23s0f0np0": {
        "rx_bytes": 52_000, "tx_bytes": 48_000,
        "rx_vport_rdma_unicast_bytes": 9_100_000_000_000, "tx_vport_rdma_unicast_bytes": 8_700_000_000_000,
        "rx_bytes_phy": 9_100_400_000_000, "tx_bytes_phy": 8_700_300_000_000, "rx_prio3_pause": 12}}
    host = FakeHost(state, tmp_path / "root")
    got = parsed(metrics.collect({"interfaces": ["enp23s0f0np0"]}, host))
    port = dict(device="enp23s0f0np0")
    assert got[_key("nictune_rdma_rx_unicast_bytes_total", **port)] == 9_100_000_000_000
    assert got[_key("nictune_rdma_tx_unicast_bytes_total", **port)] == 8_700_000_000_000
    assert got[_key("nictune_port_rx_bytes_total", **port)] == 9_100_400_000_000
    assert got[_key("nictune_pfc_rx_pause_frames_total", **port)] == 12  # summed over priorities
    assert not [name for name, _ in got if "netdev" in name]


# -- cardinality: what a 10,000-node Prometheus holds ------------------------------

def _bench_metrics():
    """bench/bench_metrics.py, whose FAKE node is the one these figures are of."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_metrics.py"
    spec = importlib.util.spec_from_file_location("bench_metrics", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_by_default_priorities_and_keys_are_summed_and_detail_keeps_them(tmp_path):
    host = Host(str(_fixture_root(tmp_path)))
    host.counter_source = _Mlx5Counters()
    status = {"keys": {"link:rail0:mtu": {"drifted": True, "drifts": 2, "restores": 1},
                       "sysctl:host:net.x": {"drifted": False, "drifts": 3, "restores": 0,
                                             "left_alone": True}}}
    default = parsed(metrics.collect(status, host))
    rail = dict(device="rail0")
    # MLX5_STATS: rx_prio3_pause 120 + rx_prio0_pause 0; 2.5 s + nothing of priority 0
    assert default[_key("nictune_pfc_rx_pause_frames_total", **rail)] == 120
    assert default[_key("nictune_pfc_rx_pause_duration_seconds_total", **rail)] == 2.5
    assert default[_key("nictune_drift_events_total")] == 5
    assert default[_key("nictune_drift_restores_total")] == 1
    assert default[_key("nictune_drift_left_alone")] == 1
    # which key differs stays named: it is what the agent is for
    assert default[_key("nictune_drift", family="link", target="rail0", name="mtu")] == 1
    assert not [labels for _, labels in default if "priority" in dict(labels)]
    detail = parsed(metrics.collect(status, host, detail=True))
    assert detail[_key("nictune_pfc_rx_pause_frames_total", priority="3", **rail)] == 120
    assert detail[_key("nictune_pfc_rx_pause_frames_total", priority="0", **rail)] == 0
    assert detail[_key("nictune_drift_events_total", family="sysctl", target="host", name="net.x")] == 3
    # never a sum beside its parts: sum by (instance, device) reads the same in both modes
    assert _key("nictune_pfc_rx_pause_frames_total", **rail) not in detail
    assert _key("nictune_drift_events_total") not in detail
    assert len(metrics.DETAIL_LABELS) >= 4, metrics.DETAIL_LABELS
    for metric, labels in metrics.DETAIL_LABELS.items():
        assert metric in metrics.CATALOG and "--metrics-detail" in metrics.CATALOG[metric][1], metric


@pytest.mark.parametrize("rails", [1, 4, 8])
def test_series_per_rail_stay_within_the_budget_and_detail_is_the_option(tmp_path, rails):
    bench = _bench_metrics()
    host, status = bench.build_node(str(tmp_path / "node"), rails)
    _, alone = bench.build_node(str(tmp_path / "alone"), 0)
    for detail, low, high in ((False, 20, bench.BUDGET_PER_RAIL), (True, bench.BUDGET_PER_RAIL, 400)):
        text = metrics.collect(status, host, detail)
        got = parsed(text)
        assert len(got) == bench.series(text)
        own = len(parsed(metrics.collect(alone, host, detail)))
        per_rail = (len(got) - own) / rails
        # ConnectX-7, 8 priorities, 49 keys a rail (connectx7-roce-lossless)
        assert low < per_rail <= high, (detail, per_rail)
        per_device = [dict(labels).get("device") for _, labels in got]
        assert {f"rail{i}" for i in range(rails)} <= set(per_device)


def _shipped_queries() -> list:
    """(where, its description, expr) of every query shipped: the dashboard's
    panels and variables, and the recording rules (contrib/prometheus/)."""
    import yaml

    dashboard = json.loads(DASHBOARD.read_text())
    described = {}

    def panels(items):
        for p in items:
            described[p["title"]] = p.get("description") or ""
            panels(p.get("panels") or [])

    panels(dashboard["panels"])
    out = [(where, described.get(where, ""), expr) for where, expr in _dashboard_queries(dashboard)]
    rules = yaml.safe_load((DASHBOARD.parents[1] / "prometheus" / "nictune-rules.yml").read_text())
    out += [(r["record"], "", r["expr"]) for g in rules["groups"] for r in g["rules"]]
    return out


# Labels Prometheus adds (instance, job) and the shard config's target label (fabric).
_TARGET_LABELS = {"instance", "job", "fabric"}


def _labels_named(expr: str) -> set:
    """Label names a query matches on or groups by."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    named = set()
    for inner in re.findall(r"\{([^}]*)\}", expr):
        named |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", inner))
    for inner in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        named |= {label.strip() for label in inner.split(",") if label.strip()}
    return named


def test_every_shipped_query_finds_its_series_and_labels_in_the_default_output(tmp_path):
    # The node of bench/bench_metrics.py (mlx5 rails, RDMA, keys) and kTLS:
    # what the agent exports WITHOUT --metrics-detail.  A query may group by a
    # label only --metrics-detail adds (priority) when its panel says so.
    bench = _bench_metrics()
    host, status = bench.build_node(str(tmp_path / "node"), 2)
    (tmp_path / "node/proc/net").mkdir(parents=True)
    (tmp_path / "node/proc/net/tls_stat").write_text(
        "".join(f"{counter} 1\n" for counter in metrics.TLS_COUNTERS))
    labels_of: dict = {}
    for name, labels in parsed(metrics.collect(status, host)):
        labels_of.setdefault(name, set()).update(k for k, _ in labels)
    queries = _shipped_queries()
    assert len(queries) > 40
    marked = 0
    for where, description, expr in queries:
        names = metric_names(expr)
        assert names, (where, expr)
        if names <= NODE_EXPORTER | {"up"}:  # node_exporter's or Prometheus's own series
            continue
        names -= {"up"}
        assert names <= set(labels_of), (where, sorted(names - set(labels_of)))
        available = set().union(*(labels_of[n] for n in names)) | _TARGET_LABELS
        detail_only = set().union(*(set(metrics.DETAIL_LABELS.get(n, ())) for n in names))
        missing = _labels_named(expr) - available
        if missing and missing <= detail_only and "--metrics-detail" in description:
            marked += 1
            continue
        assert not missing, (where, sorted(missing), expr)
    assert marked >= 3  # the PFC and per-priority discard panels
