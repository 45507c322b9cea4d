"""The resident agent's Prometheus metrics (issue 14, item 4): what it
keeps (drift per key, re-applies, last successful verify) and the
congestion counters the health facts read (host/facts/health.py), per interface
and priority, in the text exposition format version 0.0.4, served over
HTTP and optionally written as a node_exporter textfile.

Imported by the resident agent only, never by a plain verify (threading
and http.server cost every run: tests/unit/test_agent_imports.py).  The
host side has no dependencies, so the format is written here by hand.

The status is the resident agent's (host/resident/daemon.py, whose docstring has
its whole shape; format 1).  What is read of it, each part optional:

    {"keys": {"family:target:name": {"drifted": bool, "drifts": int,
                                     "restores": int, "left_alone": bool}},
     "reapplies": int,             # re-applies since the agent started
     "last_verify": float | None,  # unix seconds of the last verify
     "last_verify_ok": float | None,  # ... of the last that left no drift
     "desired_state": {"ok": bool, "reason": str | None, "from_copy": bool},
     "interfaces": [str]}          # whose counters to show; absent (as
                                   # daemon.py has it): every netdev but lo

Wiring is one call, `exporter = start(lambda: agent.status, address,
textfile)`, and `exporter.stop()` on the way out; every scrape (and each
textfile write, every `interval` seconds) reads the status and the kernel
anew.  `python -m nictune.host.resident.metrics ADDRESS STATUS.json` serves a
status file instead (daemon.py's agent-status.json, or a test's).

Naming (https://prometheus.io/docs/practices/naming/): the nictune_ prefix,
_total on counters, base units (pause durations in seconds, byte counts in
bytes), what a series is about in labels (device, priority) and never a
value in a label: a drifted key is nictune_drift{family,target,name} 1,
not a label holding its value (a value may be a secret, and each change
would make a new series).  Sources the host lacks (no mlx5 ethtool
statistics on a veth, no RDMA device, no tls module) leave their series
out rather than show zeros that were never read.  Label values are UTF-8:
an interface name's bytes that are not are written ':xNN' (name_label).

Cardinality (a 10,000-node Prometheus): nothing node_exporter already
exports is repeated (below: the netdev statistics, TCP retransmits), and
the series per priority and the per-key counters are summed over those
labels unless the agent runs with --metrics-detail (DETAIL_LABELS, fold):
about 28 series per mlx5 rail plus one nictune_drift per key kept.
bench/bench_metrics.py counts them; docs/howto/metrics-at-scale.md says how
a site aggregates beyond one Prometheus.
"""

from __future__ import annotations

import math
import os
import re
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from nictune.host.facts import rdma
from nictune.host.files import write_atomic
from nictune.host.facts.health import TLS_COUNTERS, TLS_STAT, counter_source, parse_tls_stat
from nictune.host.machine import Host
from nictune.host.facts.rdma import _read

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Loopback by default: the counters tell an attacker how loaded the fabric
# is.  The Prometheus wiki's exporter range (9100-9999) has been fully
# allocated since 2023, so no port there is ours alone: 9463 is a choice
# (not checked against that list); the address is configurable.
DEFAULT_ADDRESS = "127.0.0.1:9463"
DEFAULT_INTERVAL = 15.0  # seconds between textfile writes: a scrape interval

COUNTER, GAUGE = "counter", "gauge"

# -- what nictune exports -------------------------------------------------------
# metric -> (type, help).  Every series rendered is one of these, so the
# Grafana dashboard's queries are checked against this table (tests/unit/
# test_metrics.py).
CATALOG: dict = {
    "nictune_drift": (GAUGE, "1 when the key differs from the desired state, 0 when it matches."),
    "nictune_drift_events_total": (COUNTER, "Times the key was seen to drift since the agent started."),
    "nictune_drift_restores_total": (COUNTER, "Times the agent put the drifted key back."),
    "nictune_drift_left_alone": (GAUGE, "1 when the key drifted too often and is left alone (flapping); "
                                        "summed over keys, the number of keys left alone."),
    "nictune_drifted_keys": (GAUGE, "Keys of the desired state that differ from it now."),
    "nictune_desired_state_ok": (
        GAUGE, "1 when the stored desired state was read (or none is stored); 0 when it cannot be "
               "and the agent keeps nothing: reason damaged (desired.json and its copy are not a "
               "stored profile) or refused (not nictune's: owner, mode, a link)."),
    "nictune_desired_state_from_copy": (
        GAUGE, "1 when desired.json is damaged and its copy (written before it) stands in."),
    "nictune_reapplies_total": (COUNTER, "Re-applies of the desired state since the agent started."),
    "nictune_last_verify_timestamp_seconds": (GAUGE, "Unix time of the last verify."),
    "nictune_last_successful_verify_timestamp_seconds": (
        GAUGE, "Unix time of the last verify that found no drift."),
}

# -- what only --metrics-detail shows ---------------------------------------------
# metric -> the labels it has only with detail on.  Without detail each of
# these metrics is one series per device (or per node) summed over the
# labels dropped, under the same name: `sum by (instance, device)` reads
# the same in both modes, and a 10,000-node Prometheus holds ~30 series
# per rail rather than ~80 (8 priorities).  nictune_drift stays per key:
# which key differs is what the agent is for.
DETAIL_LABELS: dict = {
    "nictune_drift_events_total": ("family", "target", "name"),
    "nictune_drift_restores_total": ("family", "target", "name"),
    "nictune_drift_left_alone": ("family", "target", "name"),
}
DETAIL_NOTE = " Per {labels} with --metrics-detail; else summed over them."

# ethtool -S names (mlx5: drivers/net/ethernet/mellanox/mlx5/core/en_stats.c)
# -> (metric, help, divisor to base units).  Pause durations: en_stats.c
# pport_per_prio_pfc_stats_desc "rx_%s_pause_duration" / "tx_%s_pause_duration"
# (%s is "prio<N>" or "global") read PPCNT's rx/tx_pause_duration, which
# Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst
# gives "in microSec": scaled to seconds.
_US = 1_000_000  # a divisor: 10 / 1e6 is 1e-05, 10 * 1e-6 is not
_ETHTOOL = (
    (r"(?P<dir>rx|tx)_prio(?P<priority>[0-7])_pause", "nictune_pfc_{dir}_pause_frames_total",
     "PFC pause frames {dirword} on the priority (en_stats.c pport_per_prio_pfc_stats_desc).", 1),
    (r"(?P<dir>rx|tx)_prio(?P<priority>[0-7])_pause_duration",
     "nictune_pfc_{dir}_pause_duration_seconds_total",
     "Time paused by PFC frames {dirword} on the priority (mlx5 counts microseconds).", _US),
    (r"rx_prio(?P<priority>[0-7])_pause_transition", "nictune_pfc_rx_pause_transitions_total",
     "Transitions from XOFF to XON on the priority.", 1),
    (r"rx_prio(?P<priority>[0-7])_discards", "nictune_prio_rx_discards_total",
     "Frames of the priority dropped on receive for lack of buffers "
     "(en_stats.c pport_per_prio_traffic_stats_desc).", 1),
    (r"(?P<dir>rx|tx)_global_pause", "nictune_global_{dir}_pause_frames_total",
     "Link-level (global) pause frames {dirword}.", 1),
    (r"(?P<dir>rx|tx)_global_pause_duration", "nictune_global_{dir}_pause_duration_seconds_total",
     "Time paused by link-level pause frames {dirword} (mlx5 counts microseconds).", _US),
    (r"tx_pause_storm_warning_events", "nictune_pause_storm_warning_events_total",
     "Times the port sent pause long enough to near a PFC storm "
     "(en_stats.c pport_pfc_stall_stats_desc).", 1),
    (r"tx_pause_storm_error_events", "nictune_pause_storm_error_events_total",
     "PFC storms: times the device stopped sending pause (en_stats.c pport_pfc_stall_stats_desc).", 1),
    (r"rx_discards_phy", "nictune_port_rx_discards_total",
     "Frames the port dropped on receive for lack of buffers (en_stats.c pport_2863_stats_desc).", 1),
    (r"rx_out_of_buffer", "nictune_rx_out_of_buffer_total",
     "Times a receive queue had no software buffer (en_stats.c q_stats_desc).", 1),
    (r"link_down_events_phy", "nictune_link_down_events_total", "Times the link went down.", 1),
    # Throughput.  The netdev's rx_bytes/tx_bytes are no measure of a rail:
    # in NIC mode mlx5 fills them from its software ring counters, which
    # never see RDMA (en_main.c mlx5e_get_stats, mlx5e_fold_sw_stats64), and
    # on a switchdev uplink from the port's (all of its traffic).  The vport
    # RDMA counters are the RoCE bytes of this function (en_stats.c
    # vport_stats_desc: QUERY_VPORT_COUNTER received/transmitted_ib_unicast
    # octets), the _phy ones the port's, everything on the wire (en_stats.c
    # pport_802_3_stats_desc: PPCNT a_octets_received_ok/_transmitted_ok).
    (r"(?P<dir>rx|tx)_vport_rdma_unicast_bytes", "nictune_rdma_{dir}_unicast_bytes_total",
     "RDMA (RoCE) unicast bytes {dirword} by the function's vport "
     "(en_stats.c vport_stats_desc {dir}_vport_rdma_unicast_bytes).", 1),
    (r"(?P<dir>rx|tx)_bytes_phy", "nictune_port_{dir}_bytes_total",
     "Bytes {dirword} on the physical port, every kind of traffic "
     "(en_stats.c pport_802_3_stats_desc {dir}_bytes_phy).", 1),
)
_DIRWORD = {"rx": "received", "tx": "sent"}

# RDMA port hw_counters (drivers/infiniband/hw/mlx5/counters.c) of the port
# whose GID table names the interface.
_RDMA = {
    "np_ecn_marked_roce_packets": ("nictune_roce_ecn_marked_packets_total",
                                   "ECN-marked RoCE packets received (notification point)."),
    "np_cnp_sent": ("nictune_roce_cnp_sent_total", "CNPs sent as notification point."),
    "rp_cnp_handled": ("nictune_roce_cnp_handled_total", "CNPs acted on as reaction point."),
    "out_of_sequence": ("nictune_roce_out_of_sequence_packets_total", "RoCE packets received out of order."),
    "packet_seq_err": ("nictune_roce_packet_sequence_errors_total", "NAKs for sequence errors received."),
    "local_ack_timeout_err": ("nictune_roce_local_ack_timeouts_total", "QP ACK timer expiries."),
    "rx_icrc_encapsulated": ("nictune_roce_icrc_errors_total", "RoCE packets with a bad ICRC."),
}

# What is left out: /sys/class/net/X/statistics.  node_exporter's netdev
# collector exports every one of them (node_network_receive_bytes_total
# {device}, ...), and on mlx5 none says more than what is here: rx_bytes
# and tx_bytes miss RDMA (above), rx_dropped (rx_missed_errors since
# "net/mlx5e: Use rx_missed_errors instead of rx_dropped") is
# rx_out_of_buffer again (en_main.c mlx5e_get_stats).  Each interface is
# named by the label `device`, node_exporter's, so the two join
# (`on (instance, device)`).  TCP retransmits are left out for the same
# reason: node_exporter's netstat collector (on by default) has RetransSegs
# of /proc/net/snmp as node_netstat_Tcp_RetransSegs.  What is kept is not
# node_exporter's by default: its ethtool collector (node_ethtool_*, which
# would have the mlx5 counters) is off by default, and nothing of it reads
# RDMA hw_counters, /proc/net/tls_stat, or the driver behind a device.
# One overlap is kept on purpose: mlx5 also reports rx_out_of_buffer as the
# netdev's rx_missed_errors (node_network_receive_missed_errors_total when
# node_exporter reads netlink, folded into receive_drop_total when it reads
# /proc/net/dev); one series per rail, named for what it counts, beside the
# port's and the priorities' discards that node_exporter has not.
DEVICE = "device"


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _tls_metric(counter: str) -> tuple:
    """(metric, type) of a /proc/net/tls_stat counter: TlsCurr* say how
    many sockets there are now (net/tls/tls_main.c tls_sk_proto_cleanup
    decrements them), the others are totals."""
    if counter.startswith("TlsCurr"):
        return "nictune_" + _snake(counter), GAUGE
    return "nictune_" + _snake(counter) + "_total", COUNTER


def _build_catalog() -> None:
    for pattern, metric, text, _scale in _ETHTOOL:
        for d in ("rx", "tx") if "{dir}" in metric else ("",):
            CATALOG[metric.format(dir=d)] = (COUNTER, text.format(dir=d, dirword=_DIRWORD.get(d, "")))
            if "(?P<priority>" in pattern:
                DETAIL_LABELS[metric.format(dir=d)] = ("priority",)
    for metric, text in _RDMA.values():
        CATALOG[metric] = (COUNTER, text)
    CATALOG["nictune_device_info"] = (
        GAUGE, "1 for each interface whose counters the agent reads; driver: its kernel driver "
               "(/sys/class/net/<device>/device/driver; empty for a virtual one).")
    for counter in TLS_COUNTERS:
        metric, kind = _tls_metric(counter)
        CATALOG[metric] = (kind, f"{counter} of /proc/net/tls_stat (this network namespace's kTLS).")
    for metric, labels in DETAIL_LABELS.items():
        kind, text = CATALOG[metric]
        CATALOG[metric] = (kind, text + DETAIL_NOTE.format(labels=", ".join(labels)))


_build_catalog()
_ETHTOOL_RE = [(re.compile(p + "$"), m, s) for p, m, _t, s in _ETHTOOL]


# -- the exposition format ---------------------------------------------------

def escape_label(value) -> str:
    """A label value as the format writes it: backslash, double quote and
    line feed escaped; everything else, as UTF-8, is allowed as it is."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def name_label(name) -> str:
    """A name (an interface's above all) as a label value, which must be
    UTF-8.  The kernel's interface names are bytes: Linux refuses only '/',
    ':', whitespace and NUL in them (net/core/dev.c dev_valid_name), and
    Python hands the bytes that are not UTF-8 over as lone surrogates (PEP
    383), which no UTF-8 encoder takes.  Each such byte becomes ':x' and
    its two hex digits (b'nt\\xff' is 'nt:xff'): no interface name or key
    target holds a colon, so the label still names exactly one interface,
    and a name that is UTF-8 is left as it is."""
    text = str(name)
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(_byte_escape, text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _byte_escape(match) -> str:
    char = match.group()
    if "\udc80" <= char <= "\udcff":  # the byte 0x80-0xff that was not UTF-8
        return f":x{ord(char) - 0xDC00:02x}"
    # Not from a name the kernel gave (no decoder makes these): its bytes.
    return "".join(f":x{b:02x}" for b in char.encode("utf-8", "surrogatepass"))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def render(samples) -> str:
    """Samples, (metric, {label: value}, value) each, as exposition text:
    each metric's HELP and TYPE, then its samples, metrics in catalog
    order; a sample whose metric and labels came before is dropped (a
    series twice makes Prometheus refuse the whole scrape)."""
    by_metric: dict = {}
    for metric, labels, value in samples:
        if metric not in CATALOG:
            raise ValueError(f"{metric} is not a metric nictune exports")
        series = by_metric.setdefault(metric, {})
        series.setdefault(tuple(labels.items()), value)
    lines = []
    for metric in (m for m in CATALOG if m in by_metric):
        kind, text = CATALOG[metric]
        lines.append(f"# HELP {metric} {_escape_help(text)}")
        lines.append(f"# TYPE {metric} {kind}")
        for labels, value in by_metric[metric].items():
            inner = ",".join(f'{k}="{escape_label(name_label(v))}"' for k, v in labels)
            lines.append(f"{metric}{{{inner}}} {format_value(value)}" if inner
                         else f"{metric} {format_value(value)}")
    return "\n".join(lines) + "\n"


# -- what is read ----------------------------------------------------------

def _key_labels(name: str) -> dict:
    # model.Key.__str__ is "family:target:name"; neither a family nor a
    # target (an interface, "host", a namespace) holds a colon, a name may.
    family, target, key = (name.split(":", 2) + ["", ""])[:3]
    return {"family": family, "target": target, "name": key}


def fold(samples: list, detail: bool = False) -> list:
    """Samples as the exporter shows them: with detail, as they are;
    without, each metric of DETAIL_LABELS summed over its detail labels
    (one series per device or per node, in the order first seen)."""
    if detail:
        return samples
    out, sums = [], {}
    for metric, labels, value in samples:
        dropped = DETAIL_LABELS.get(metric)
        if not dropped:
            out.append((metric, labels, value))
            continue
        kept = {k: v for k, v in labels.items() if k not in dropped}
        key = (metric, tuple(kept.items()))
        if key not in sums:
            sums[key] = len(out)
            out.append((metric, kept, 0))
        index = sums[key]
        out[index] = (metric, kept, out[index][2] + value)
    return out


def status_samples(status: dict) -> list:
    """The resident agent's own series from its status (shape above), per key."""
    out = []
    # list(): the agent's thread may add keys while a scrape reads them
    keys = list((status.get("keys") or {}).items())
    for name, rec in keys:
        labels = _key_labels(name)
        out.append(("nictune_drift", labels, bool(rec.get("drifted"))))
        out.append(("nictune_drift_events_total", labels, int(rec.get("drifts") or 0)))
        out.append(("nictune_drift_restores_total", labels, int(rec.get("restores") or 0)))
        out.append(("nictune_drift_left_alone", labels, bool(rec.get("left_alone"))))
    desired = status.get("desired_state")
    if isinstance(desired, dict):
        ok = bool(desired.get("ok"))
        out.append(("nictune_desired_state_ok",
                    {} if ok else {"reason": str(desired.get("reason") or "unknown")}, ok))
        out.append(("nictune_desired_state_from_copy", {}, bool(desired.get("from_copy"))))
    # Without a readable desired state no key was compared: no count, not 0.
    if "keys" in status and (not isinstance(desired, dict) or desired.get("ok")):
        out.append(("nictune_drifted_keys", {}, sum(1 for _, r in keys if r.get("drifted"))))
    if "reapplies" in status:
        out.append(("nictune_reapplies_total", {}, int(status["reapplies"] or 0)))
    for field, metric in (("last_verify", "nictune_last_verify_timestamp_seconds"),
                          ("last_verify_ok", "nictune_last_successful_verify_timestamp_seconds")):
        if status.get(field) is not None:
            out.append((metric, {}, float(status[field])))
    return out


def ethtool_samples(ifname: str, stats: dict) -> list:
    """Congestion series of one interface's ethtool statistics."""
    out = []
    for name, value in sorted(stats.items()):
        for pattern, metric, scale in _ETHTOOL_RE:
            m = pattern.match(name)
            if not m:
                continue
            groups = m.groupdict()
            labels = {DEVICE: ifname}
            if "priority" in groups:
                labels["priority"] = groups["priority"]
            out.append((metric.format(dir=groups.get("dir", "")), labels,
                        value / scale if scale != 1 else value))
            break
    return out


def _number(path: str):
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def rdma_samples(host: Host, ifname: str, ports: dict) -> list:
    port = ports.get(ifname)
    if not port:
        return []
    base = host.path(rdma.IB_CLASS, port[0], "ports", str(port[1]), "hw_counters")
    out = []
    for counter, (metric, _text) in _RDMA.items():
        value = _number(os.path.join(base, counter))
        if value is not None:
            out.append((metric, {DEVICE: ifname}, value))
    return out


def device_samples(host: Host, ifname: str) -> list:
    """The interface's info series: it is watched, and by which driver."""
    if not os.path.isdir(host.path("sys/class/net", ifname)):
        return []  # named by the status but not (or no longer) here
    try:
        driver = os.path.basename(os.readlink(host.path("sys/class/net", ifname, "device", "driver")))
    except OSError:  # a virtual interface (veth, bond) has no device
        driver = ""
    return [("nictune_device_info", {DEVICE: ifname, "driver": driver}, 1)]


def namespace_samples(host: Host) -> list:
    """What is the network namespace's, not an interface's: the kTLS
    counters (its TCP retransmits are node_exporter's: above)."""
    out = []
    text = _read(host.path(TLS_STAT))
    try:
        tls = parse_tls_stat(text) if text is not None else {}
    except ValueError:
        tls = {}
    for counter in TLS_COUNTERS:  # a newer kernel's further ones are not in CATALOG
        if counter in tls:
            out.append((_tls_metric(counter)[0], {}, tls[counter]))
    return out


def interfaces_of(host: Host, status: dict) -> list:
    names = status.get("interfaces")
    if names is None:
        try:
            names = [n for n in os.listdir(host.path("sys/class/net")) if n != "lo"]
        except OSError:
            names = []
    return sorted(names)


def collect(status: dict, host=None, detail: bool = False) -> str:
    """The exposition text of `status` and of what the kernel (or the Host's
    fixture tree) counts now; detail: the series per priority and per key
    (DETAIL_LABELS), else summed over them."""
    host = host or Host()
    source = counter_source(host)
    ports = rdma.netdev_ports(host)
    samples = status_samples(status)
    for ifname in interfaces_of(host, status):
        try:
            stats = source.ethtool_stats(ifname)
        except OSError:  # gone since listed, or a driver without statistics
            stats = {}
        except ValueError:  # a name the kernel took but netlink/names.py refuses to send
            stats = {}
        samples += ethtool_samples(ifname, stats)
        samples += rdma_samples(host, ifname, ports)
        samples += device_samples(host, ifname)
    samples += namespace_samples(host)
    return render(fold(samples, detail))


# -- serving ----------------------------------------------------------------

def parse_address(text: str) -> tuple:
    """"HOST:PORT" or "[V6]:PORT" -> (host, port); ValueError otherwise."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:([0-9]{1,5})|([^:\[\]]+):([0-9]{1,5})", text or "")
    if not m:
        raise ValueError(f"metrics address {text!r} is not HOST:PORT or [IPV6]:PORT")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics address {text!r}: port {port} is out of range")
    return host, int(port)


def _handler(produce):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?", 1)[0] != "/metrics":
                return self._not_found()
            try:
                body = produce().encode()
            except Exception as e:  # a scrape must answer, not kill the thread
                self.send_error(500, explain=type(e).__name__)
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _not_found(self):
            self.send_error(404)

        do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_found

        def log_message(self, *args):  # the journal is for changes, not scrapes
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple, handler):
        if ":" in address[0]:
            import socket

            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def server_bind(self):
        # HTTPServer's looks the host's name up (socket.getfqdn), which
        # loads the idna codec and unicodedata (0.8 MB of the resident
        # agent's RSS) for a name that nothing here uses.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Exporter:
    """The HTTP endpoint and the textfile writer of one resident agent."""

    def __init__(self, status, address: str = DEFAULT_ADDRESS, textfile=None,
                 interval: float = DEFAULT_INTERVAL, host=None, log=None, detail: bool = False):
        self._status = status
        self._host = host
        self.detail = detail
        self.textfile = textfile
        self.interval = interval
        self.log = log or (lambda line: None)
        self.textfile_error = None  # why the last textfile write failed, or None
        self._stop = threading.Event()
        self._threads: list = []
        self.server = None
        if address:
            self.server = _Server(parse_address(address), _handler(self.text))

    @property
    def address(self) -> tuple:
        return self.server.server_address[:2] if self.server else None

    def text(self) -> str:
        return collect(self._status(), self._host, self.detail)

    def write_textfile(self) -> None:
        """The textfile, renamed into place: node_exporter never reads half
        of it, nor the temporary (a dot name that does not end in .prom)."""
        write_atomic(os.path.abspath(self.textfile), self.text(), mode=0o644)

    def start(self) -> "Exporter":
        if self.server:
            self._spawn(self.server.serve_forever)
        if self.textfile:
            self._spawn(self._textfile_loop)
        return self

    def _spawn(self, target) -> None:
        thread = threading.Thread(target=target, name="nictune-metrics", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _textfile_loop(self) -> None:
        while True:
            self._write_textfile_once()
            if self._stop.wait(self.interval):
                return

    def _write_textfile_once(self) -> None:
        """One write; whatever fails (a full or read-only disk, a value the
        text cannot hold) is logged when it first appears and when it is
        over, never each interval, and the next interval tries again: the
        writer outlives any one failure."""
        try:
            self.write_textfile()
        except Exception as e:  # noqa: BLE001 - the writer must not die of one write
            why = f"{type(e).__name__}: {e}"
            if why != self.textfile_error:
                self.log(f"metrics textfile {self.textfile} not written ({why}); "
                         f"trying again every {self.interval:g} s")
            self.textfile_error = why
            return
        if self.textfile_error is not None:
            self.log(f"metrics textfile {self.textfile} written again")
        self.textfile_error = None

    def stop(self) -> None:
        self._stop.set()
        if self.server:
            self.server.shutdown()
            self.server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)


def start(status, address: str = DEFAULT_ADDRESS, textfile=None,
          interval: float = DEFAULT_INTERVAL, host=None, log=None, detail: bool = False) -> Exporter:
    """Serve `status()` (a callable returning the dict above) and the
    kernel's counters on `address` (None: no HTTP), and write them to
    `textfile` every `interval` seconds when given; `log(line)` hears of
    textfile writes that fail; detail: per priority and per key (fold)."""
    return Exporter(status, address, textfile, interval, host, log, detail).start()


def _status_file(path):
    """A status read from a JSON file at every scrape ({} without one)."""
    import json

    def status() -> dict:
        if not path:
            return {}
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    return status


def main(argv=None) -> int:
    """`python -m nictune.host.resident.metrics [--detail] [ADDRESS [STATUS.json]]`:
    the counters, and a status kept in a file, without a resident agent (a
    quick look, and the tests' exporter in a namespace); --detail as the
    agent's --metrics-detail."""
    import sys

    args = sys.argv[1:] if argv is None else list(argv)
    detail = "--detail" in args
    args = [a for a in args if a != "--detail"]
    exporter = start(_status_file(args[1] if len(args) > 1 else None),
                     args[0] if args else DEFAULT_ADDRESS, detail=detail)
    print("serving http://%s:%d/metrics" % exporter.address, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        exporter.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
