"""What hosts and tools print, read as untrusted: iperf3's JSON, a rail's
address, the counters script and the GID table.  Anything that does not
parse is BadOutput, a ValueError."""

from __future__ import annotations

import ipaddress
import json
import math
import re
from typing import Any, Dict, Optional, Tuple

from nictune.host.validate import IFNAME, matches

MAX_JSON = 4 * 2**20
MAX_BPS = 1e15  # 1 Pbit/s: more is not a measurement
MAX_STREAMS = 128  # iperf3's own (src/iperf.h)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class BadOutput(ValueError):
    pass


def clean(text: str, limit: int = 200) -> str:
    return _CONTROL.sub(" ", text)[:limit]


def bounded_number(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise BadOutput(f"{what} is not a number from {low:g} to {high:g}")
    return float(value)


def _mapping(parent: Any, key: str, what: str) -> dict:
    value = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(value, dict):
        raise BadOutput(f"{what} has no {key} mapping")
    return value


def parse_iperf3(text: str, udp: bool = False, streams: Optional[int] = None) -> Dict[str, float]:
    """Figures of an iperf3 client's --json output: {"gbps", "retransmits"}
    (TCP; retransmits only when reported) or {"gbps", "lost_percent"} (UDP).
    TCP figures are of all streams together: end.sum_received/sum_sent,
    else (output with per-stream figures only) the sum of end.streams'
    receiver and sender figures.  With `streams`, a TCP run that reports
    another number of streams is refused (a stream that never connected
    must not pass as a slower rail).  Raises BadOutput for an error iperf3
    reports or output that is not its JSON (too long, too deep, wrong
    types, numbers out of range)."""
    if len(text) > MAX_JSON:
        raise BadOutput(f"the iperf3 output is longer than {MAX_JSON // 2**20} MiB")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise BadOutput("the iperf3 output is not JSON") from None
    if not isinstance(doc, dict):
        raise BadOutput("the iperf3 output is not a JSON object")
    if doc.get("error") is not None:
        raise BadOutput(f"iperf3: {clean(str(doc['error']))}")
    end = _mapping(doc, "end", "the iperf3 output")
    received = end.get("sum_received")
    figures: Dict[str, float] = {}
    if udp:
        loss_from = received if isinstance(received, dict) and "lost_percent" in received \
            else _mapping(end, "sum", "the iperf3 output's end")
        figures["lost_percent"] = bounded_number(loss_from.get("lost_percent"), "lost_percent", 0, 100)
        bps_from = received if isinstance(received, dict) else loss_from
    else:
        per_stream = _tcp_streams(end, streams)
        bps_from = end.get("sum_received") if isinstance(end.get("sum_received"), dict) or not per_stream \
            else _summed(per_stream, "receiver")
        if not isinstance(bps_from, dict):
            raise BadOutput("the iperf3 output's end has no sum_received mapping")
        sent = end.get("sum_sent") if isinstance(end.get("sum_sent"), dict) or not per_stream \
            else _summed(per_stream, "sender", "retransmits")
        if isinstance(sent, dict) and sent.get("retransmits") is not None:
            figures["retransmits"] = int(bounded_number(sent["retransmits"], "retransmits", 0, 2**62))
    bps = bounded_number(bps_from.get("bits_per_second"), "bits_per_second", 0, MAX_BPS)
    figures["gbps"] = round(bps / 1e9, 6)
    return figures


def _tcp_streams(end: dict, expected: Optional[int]) -> list:
    """end.streams of a TCP run, checked against the number asked for."""
    listed = end.get("streams")
    listed = listed if isinstance(listed, list) else []
    if expected is not None and listed and len(listed) != expected:
        raise BadOutput(f"iperf3 reported {len(listed)} streams, not the {expected} asked for")
    return listed


def _summed(streams: list, side: str, extra: Optional[str] = None) -> dict:
    """{"bits_per_second", extra} summed over the streams' `side` figures
    (output that lists the streams but carries no sum of them)."""
    total: Dict[str, float] = {"bits_per_second": 0.0}
    for i, stream in enumerate(streams[:MAX_STREAMS]):
        figures = _mapping(stream, side, f"the iperf3 output's stream {i}")
        total["bits_per_second"] += bounded_number(figures.get("bits_per_second"), "bits_per_second", 0, MAX_BPS)
        if extra and figures.get(extra) is not None:
            total[extra] = total.get(extra, 0) + bounded_number(figures[extra], extra, 0, 2**62)
    return total


def parse_rail_address(text: str, rail: str) -> str:
    """The address to use on `rail`, from `ip -j addr show dev RAIL`: the
    first global IPv4 one, else the first global IPv6 one."""
    found: Dict[str, str] = {}
    for address in _global_addresses(text, rail):
        found.setdefault(f"v{address.version}", str(address))
    if not found:
        raise BadOutput(f"{rail} has no global IP address")
    return found.get("v4") or found["v6"]


def rail_addresses(text: str, rail: str) -> set:
    """Every global address of `rail`, from `ip -j addr show dev RAIL`."""
    return {str(a) for a in _global_addresses(text, rail)}


def _global_addresses(text: str, rail: str) -> list:
    if len(text) > MAX_JSON:
        raise BadOutput("the ip output is too long")
    try:
        doc = json.loads(text or "[]")
    except (ValueError, RecursionError):
        raise BadOutput("the ip output is not JSON") from None
    links = [link for link in doc if isinstance(link, dict) and link.get("ifname") == rail] \
        if isinstance(doc, list) else []
    if not links:
        raise BadOutput(f"no interface {rail}")
    out = []
    infos = links[0].get("addr_info")
    for info in infos if isinstance(infos, list) else []:
        if not isinstance(info, dict) or info.get("scope") != "global" or not isinstance(info.get("local"), str):
            continue
        try:
            address = ipaddress.ip_address(info["local"])
        except ValueError:
            continue
        if _scope_id_is_plain(getattr(address, "scope_id", None)):
            out.append(address)
    return out


def _scope_id_is_plain(scope: Optional[str]) -> bool:
    """An IPv6 scope id ("fe80::1%eth2") as the kernel gives one: an
    interface name (nictune's rule for them) or an interface index.
    Python's ipaddress takes any text after "%", so "%$(reboot) x" would
    otherwise ride along into the iperf3 and ping arguments."""
    if scope is None:
        return True
    if scope.isascii() and scope.isdigit():
        return len(scope) <= 10 and int(scope) <= 0xFFFFFFFF
    return matches(IFNAME, scope)


# Reads the sources health.counters() reads, for the rail in $1: ethtool
# statistics, the hw_counters of an RDMA port whose GID table names it
# (rdma.netdev_ports: the first port wins), the netdev statistics.
COUNTERS_SCRIPT = r"""
d=/sys/class/net/$1
[ -d "$d" ] || { echo "no interface $1" >&2; exit 3; }
echo "== ethtool"
ethtool -S "$1" 2>/dev/null
echo "== rdma"
for p in /sys/class/infiniband/*/ports/*; do
    if grep -qsxF -e "$1" "$p"/gid_attrs/ndevs/*; then
        grep -sH . "$p"/hw_counters/*
        break
    fi
done
echo "== netdev"
grep -sH . "$d"/statistics/*
echo "== tls"
cat /proc/net/tls_stat 2>/dev/null || true   # absent without the tls module
"""
MAX_COUNTERS = 20000
_COUNTER_VALUE = re.compile(r"^[0-9]{1,20}$")


def parse_counters(text: str) -> Dict[str, int]:
    """{counter: value} from COUNTERS_SCRIPT's output; ethtool's win over the
    RDMA port's, which win over the netdev statistics (health.counters())."""
    sections: Dict[str, Dict[str, int]] = {"ethtool": {}, "rdma": {}, "netdev": {}, "tls": {}}
    current: Optional[Dict[str, int]] = None
    for line in text.splitlines()[:MAX_COUNTERS + 10]:
        if line.startswith("== ") and line[3:] in sections:
            current = sections[line[3:]]
            continue
        if current is None:
            continue
        if current is sections["ethtool"]:
            name, sep, value = line.rpartition(":")
            name = name.strip()
        elif current is sections["tls"]:  # "TlsTxDevice    3": the namespace's kTLS counters
            name, sep, value = (line.split() + ["", ""])[0], " ", (line.split() + ["", ""])[1]
            sep = sep if name.startswith("Tls") else ""
        else:  # grep -H: /path/to/name:value
            path, sep, value = line.rpartition(":")
            name = path.rsplit("/", 1)[-1]
        value = value.strip()
        if sep and name and len(name) <= 128 and _COUNTER_VALUE.match(value) and int(value) < 2**64:
            current[name] = int(value)
    return {**sections["tls"], **sections["netdev"], **sections["rdma"], **sections["ethtool"]}


# The GID table entries built from the rail in $1 (host/facts/rdma.py gids():
# gids/N, gid_attrs/types/N, gid_attrs/ndevs/N), of every RDMA port.
GIDS_SCRIPT = r"""
for p in /sys/class/infiniband/*/ports/*; do
    for n in $(grep -lsxF -e "$1" "$p"/gid_attrs/ndevs/*); do
        i=${n##*/}
        printf 'gid %s %s %s %s\n' "${p#/sys/class/infiniband/}" "$i" \
            "$(cat "$p/gids/$i" 2>/dev/null)" "$(cat "$p/gid_attrs/types/$i" 2>/dev/null)"
    done
done
"""
_GID_LINE = re.compile(r"^gid (\S{1,64})/ports/([0-9]{1,3}) ([0-9]{1,5}) ([0-9a-f:]{2,39}) (.{0,32})$")


def rdma_endpoint(text: str, rail: str):
    """(perftest.Endpoint, the GID's address) of the RoCE port of `rail`,
    from GIDS_SCRIPT's output, with the GID NCCL would select by default
    (ibauto.Wanted().pick: the lowest index of a RoCE v2 IPv4 GID); the
    first port in device and port order, as ibauto.select.  BadOutput
    when the rail has none."""
    from nictune.control.rollout import perftest
    from nictune.host.facts import ibauto
    from nictune.host.facts import rdma
    from nictune.host.validate import IBDEV, matches

    tables: Dict[Tuple[str, int], list] = {}
    for line in text.splitlines()[:4096]:
        m = _GID_LINE.match(line)
        if m and matches(IBDEV, m.group(1)) and not m.group(1).startswith("-"):
            gid = rdma.Gid(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5) or None, rail)
            tables.setdefault((gid.device, gid.port), []).append(gid)
    wanted = ibauto.Wanted()
    for key in sorted(tables):
        gid = wanted.pick(tables[key])
        if gid is not None:
            return perftest.Endpoint(key[0], key[1], gid.index), gid.ipv4 or gid.gid
    raise BadOutput(f"{rail} has no RDMA port with a {wanted}" if tables else f"{rail} has no RDMA port")
