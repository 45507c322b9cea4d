"""Where a rail's switch neighbour is read from, in order of preference.

1. listener: the resident agent's own LLDP listener (transports/lldpsock.py),
   whose last frames per rail it keeps in its state directory (lldp.json).
2. lldpd: a running lldpd, through lldpcli (`lldpcli -f json0 show
   neighbors details`; lldpd's control socket speaks a private marshalling
   that only liblldpctl reads).  lldpd does not decode the 802.1Qaz TLVs,
   but keeps them as unknown TLVs (OUI, subtype, bytes), which nictune's
   decoder reads.
3. lldpad: a running lldpad, through its client socket (the abstract
   AF_UNIX address /com/intel/lldpad, the protocol lldptool speaks): the
   neighbour's TLVs, raw, for nictune's decoder.
4. dcbnl: the DCBX peer's ETS, PFC and APP table where the driver keeps
   them (DCB_ATTR_IEEE_PEER_ETS / _PFC / _APP; no chassis or port identity).
5. wait: with `--lldp-wait SECONDS`, a bounded wait for a frame on each
   rail that none of the above answered.

Every source's bytes go through facts/lldp.py's strict decoder; a source
that is absent (no daemon running, no socket) is skipped and named in the
"tried" list that a rail with no neighbour reports.  A frame older than its
own TTL has expired and is not used.
"""

from __future__ import annotations

import json
import os
import socket
import struct

from nictune.host.facts import lldp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

LLDPCLI = ("/usr/sbin/lldpcli", "/usr/bin/lldpcli")
LLDPCLI_TIMEOUT = 5.0
MAX_TOOL_OUTPUT = 1 << 20
LLDPAD_SOCKET = "\0/com/intel/lldpad"
LLDPAD_TIMEOUT = 2.0
MAX_WAIT = 120  # seconds: what --lldp-wait may ask


class Found:
    """A rail's neighbour (merged from its live frames) and the sources tried."""

    def __init__(self, neighbour: "Optional[lldp.Neighbour]", tried: list, others: int = 0,
                 refused: "Optional[str]" = None):
        self.neighbour = neighbour
        self.tried = tried        # ["listener: nothing heard", "lldpd: not running", ...]
        self.others = others      # frames of other chassis on the rail
        self.refused = refused    # a frame a source gave that did not decode


def _live(neighbours: list) -> list:
    return [n for n in neighbours if n.age is None or n.age <= n.ttl or n.source == "dcbnl"]


# -- 1. the resident agent's store --------------------------------------------------


def from_store(rails: dict, ifname: str, now: float) -> list:
    """Neighbours (newest first) of the frames STORE_FILE keeps for ifname."""
    out = []
    entries = rails.get(ifname)
    if not isinstance(entries, list):
        return out
    for entry in entries[:8]:
        if not isinstance(entry, dict) or not isinstance(entry.get("frame"), str):
            continue
        received = entry.get("received")
        if isinstance(received, bool) or not isinstance(received, (int, float)):
            continue
        try:
            frame = bytes.fromhex(entry["frame"][:2 * lldp.MAX_FRAME + 2])
            out.append(lldp.decode(frame, rail=ifname, source="listener", age=max(0.0, now - received)))
        except (ValueError, lldp.LldpError):
            continue
    return out


# -- 2. lldpd, through lldpcli -------------------------------------------------------

_LLDPD_ID_TYPES = {"mac": 4, "ifname": 5, "ifalias": 1, "local": 7, "ip": 5}
_LLDPD_CHASSIS_TYPES = {"mac": 4, "ifname": 6, "ifalias": 2, "local": 7, "ip": 5}


def _lldpd_tlvs(port: dict, chassis: dict) -> bytes:
    """An LLDPDU rebuilt from lldpcli's json0 view of one neighbour, so
    that the same decoder (and its bounds) reads it."""
    def ident(node: dict, types: dict, kind: int) -> bytes:
        ident_node = (node.get("id") or [{}])[0]
        subtype = types.get(ident_node.get("type"), 7)
        value = str(ident_node.get("value", ""))
        body = bytes.fromhex(value.replace(":", "")) if subtype == 4 else value.encode()
        return lldp.tlv(kind, bytes([subtype]) + body[:255])

    def text(node: dict, key: str) -> str:
        items = node.get(key) or [{}]
        return str(items[0].get("value", "")) if isinstance(items, list) and items else ""

    ttl = text(port, "ttl")
    ttl_value = int(ttl) if ttl.isdigit() else 0
    parts = [ident(chassis, _LLDPD_CHASSIS_TYPES, lldp.T_CHASSIS), ident(port, _LLDPD_ID_TYPES, lldp.T_PORT),
             lldp.tlv(lldp.T_TTL, struct.pack("!H", min(ttl_value, 0xFFFF)))]
    descr, name = text(port, "descr"), text(chassis, "name")
    if descr:
        parts.append(lldp.tlv(lldp.T_PORT_DESC, descr.encode()[:255]))
    if name:
        parts.append(lldp.tlv(lldp.T_SYS_NAME, name.encode()[:255]))
    mfs = text(port, "mfs")
    if mfs.isdigit():
        parts.append(lldp.org_tlv(lldp.OUI_8023, 4, struct.pack("!H", min(int(mfs), 0xFFFF))))
    return b"".join(parts)


def _lldpd_unknown(node: dict) -> bytes:
    """The 802.1Qaz and 802.3 TLVs lldpd kept as unknown TLVs, re-encoded."""
    out = b""
    for group in node.get("unknown-tlvs") or []:
        for item in (group.get("unknown-tlv") or [])[:32]:
            oui = bytes.fromhex(str(item.get("oui", "")).replace(",", ""))
            info = bytes.fromhex(str(item.get("value", "")).replace(",", ""))
            subtype = int(item.get("subtype", 0))
            if len(oui) == 3 and 0 <= subtype <= 255 and len(info) <= 507:
                out += lldp.org_tlv(oui, subtype, info)
    return out


def parse_lldpcli(text: str, ifname: str) -> list:
    """Neighbours on ifname in `lldpcli -f json0 show neighbors details`."""
    doc = json.loads(text)
    out = []
    for block in (doc.get("lldp") or [{}])[:1]:
        for iface in (block.get("interface") or [])[:64]:
            if iface.get("name") != ifname:
                continue
            chassis = (iface.get("chassis") or [{}])[0]
            port = (iface.get("port") or [{}])[0]
            age = _lldpd_age(iface.get("age"))
            pdu = _lldpd_tlvs(port, chassis) + _lldpd_unknown(iface) + _lldpd_unknown(port)
            out.append(lldp.decode_lldpdu(pdu, rail=ifname, source="lldpd", age=age))
    return out


def _lldpd_age(text) -> "Optional[float]":
    """lldpd's age ("0 day, 00:00:12") in seconds."""
    try:
        days, clock = str(text).split(",", 1)
        h, m, s = (int(p) for p in clock.strip().split(":"))
        return int(days.split()[0]) * 86400 + h * 3600 + m * 60 + s
    except (ValueError, IndexError):
        return None


def from_lldpd(ifname: str) -> "Tuple[list, str]":
    tool = next((p for p in LLDPCLI if os.access(p, os.X_OK)), None)
    if tool is None:
        return [], "lldpd: lldpcli not installed"
    import subprocess  # only here: a profile without switch: checks never starts a tool

    where = os.environ.get("NICTUNE_LLDPD_SOCKET")  # an lldpd not on its default socket (tests)
    argv = [tool] + (["-u", where] if where else []) + ["-f", "json0", "show", "neighbors", "details"]
    try:
        run = subprocess.run(argv, capture_output=True,
                             timeout=LLDPCLI_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"lldpd: lldpcli failed ({type(e).__name__})"
    if run.returncode != 0:
        return [], "lldpd: not running"
    if len(run.stdout) > MAX_TOOL_OUTPUT:
        return [], "lldpd: lldpcli's answer is too large"
    try:
        found = parse_lldpcli(run.stdout.decode("utf-8", "replace"), ifname)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, lldp.LldpError) as e:
        return [], f"lldpd: unreadable answer ({str(e)[:80]})"
    return found, "lldpd: " + ("a neighbour" if found else "no neighbour")


# -- 3. lldpad, through its client socket -----------------------------------------------


def lldpad_request(ifname: str) -> str:
    """lldptool's "get all neighbour TLVs" message (clif: module 1, request,
    version 3, cmd_gettlv, op_neighbor, nearest bridge, every TLV)."""
    name = ifname.encode().decode("ascii")
    return f"M00000001C301{2:08x}{len(name):02x}{name}00{127:08x}"


def parse_lldpad(reply: str, ifname: str) -> list:
    """The neighbour in lldpad's reply (R, status, the request echoed, then
    the TLVs as hex); [] when it has none."""
    head = f"R00C301{2:08x}{len(ifname):02x}{ifname}{127:08x}"
    if not reply.startswith(head):
        if reply.startswith("R") and reply[1:3] != "00":
            return []
        raise ValueError(f"unexpected lldpad reply {reply[:40]!r}")
    body = bytes.fromhex(reply[len(head):].strip("\0\n")[:4 * lldp.MAX_FRAME])
    if not body:
        return []
    return [lldp.decode_lldpdu(body, rail=ifname, source="lldpad")]


def from_lldpad(ifname: str) -> "Tuple[list, str]":
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(LLDPAD_TIMEOUT)
        sock.bind(f"\0/com/intel/lldpad/nictune-{os.getpid()}")
        sock.connect(LLDPAD_SOCKET)
        sock.send(lldpad_request(ifname).encode())
        reply = sock.recv(65536).decode("ascii", "replace")
    except OSError:
        return [], "lldpad: not running"
    finally:
        sock.close()
    try:
        found = parse_lldpad(reply, ifname)
    except (ValueError, lldp.LldpError) as e:
        return [], f"lldpad: unreadable answer ({str(e)[:80]})"
    return found, "lldpad: " + ("a neighbour" if found else "no neighbour")


# -- 4. the driver's DCBX peer (dcbnl) ---------------------------------------------------


def from_dcbnl(state, ifname: str) -> "Tuple[list, str]":
    """A neighbour of what the driver's DCBX agent keeps of its peer."""
    ets, pfc, apps = (getattr(state, a, None) for a in ("peer_ets", "peer_pfc", "peer_apps"))
    if ets is None and pfc is None and apps is None:
        return [], "dcbnl: no peer data"
    from nictune.host.transports.netlink.dcb import TSA

    names = {v: k for k, v in TSA.items()}
    ets_tlv = None if ets is None else lldp.EtsTlv(
        tuple(ets.prio_tc), tuple(ets.tc_tx_bw), tuple(names.get(t, f"tsa-{t}") for t in ets.tc_tsa),
        willing=bool(ets.willing), cbs=bool(ets.cbs), max_tcs=ets.ets_cap)
    pfc_tlv = None if pfc is None else lldp.PfcTlv(
        tuple(p for p in range(8) if pfc.pfc_en & (1 << p)), willing=False, mbc=bool(pfc.mbc),
        pfc_cap=pfc.pfc_cap)
    app_entries = None if apps is None else tuple(
        lldp.AppEntry(a.selector, a.protocol, a.priority) for a in apps if 1 <= a.selector <= 5)
    n = lldp.Neighbour(chassis_id="", chassis_subtype="unknown", port_id="", port_subtype="unknown",
                       ttl=0, ets=ets_tlv, pfc=pfc_tlv, apps=app_entries, rail=ifname, source="dcbnl")
    return [n], "dcbnl: the driver's DCBX peer"


# -- all of them ---------------------------------------------------------------------------


def find(ifname: str, store: dict, now: float, dcb_state=None, waited: "Optional[dict]" = None,
         daemons: bool = True) -> Found:
    """The rail's neighbour from the first source that has one."""
    tried = []
    steps = [("listener", lambda: (from_store(store, ifname, now), None))]
    if daemons:
        steps += [("lldpd", lambda: from_lldpd(ifname)), ("lldpad", lambda: from_lldpad(ifname))]
    steps.append(("dcbnl", lambda: from_dcbnl(dcb_state, ifname) if dcb_state is not None
                  else ([], "dcbnl: no DCB on this device")))
    if waited is not None:
        steps.append(("wait", lambda: ([replace_source(n, "wait") for n in from_store(waited, ifname, now)],
                                       None)))
    for name, step in steps:
        found, said = step()
        live = _live(found)
        if live:
            merged = lldp.merge(sorted(live, key=lambda n: n.age if n.age is not None else 0.0))
            others = len({n.chassis_id for n in live} - {merged.chassis_id})
            return Found(merged, tried, others)
        tried.append(said or f"{name}: {'expired frames only' if found else 'nothing heard'}")
    return Found(None, tried)


def replace_source(n: "lldp.Neighbour", source: str) -> "lldp.Neighbour":
    from dataclasses import replace

    return replace(n, source=source)
