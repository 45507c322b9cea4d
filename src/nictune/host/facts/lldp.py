"""The switch port's view of a rail: one LLDP frame decoded into a Neighbour.

A Neighbour is what the switch port at the other end of a rail says about
itself (chassis and port identity, port description, system name, the
802.3 maximum frame size) and about the DCB it runs (the IEEE 802.1Qaz
TLVs: ETS configuration and recommendation, PFC configuration with the
willing bit and MBC, the application priority table), with where it was
read (`source`) and how old the frame was (`age`, seconds).

Every byte of a frame is the sender's: anyone on the wire can send one.
decode() is strict and bounded: the frame is at most MAX_FRAME bytes, each
TLV's length is checked against what is left and against the length its
type must have, strings are capped and made printable, the three mandatory
TLVs come first and once, the singleton TLVs come at most once.  Anything
else raises LldpError with one sentence naming the TLV; nothing else
escapes (tests/unit/test_fuzz_lldp.py).

Frame layout (IEEE 802.1AB-2016 8.4, 802.1Q-2018 annex D, 802.3 annex 79):
a TLV header is 16 bits, 7 bits of type and 9 of length.  Organizationally
specific TLVs (type 127) start with a 3-byte OUI and a subtype byte:
00-80-C2 (IEEE 802.1) subtypes 9 ETS configuration, 10 ETS recommendation,
11 PFC configuration, 12 application priority; 00-12-0F (IEEE 802.3)
subtype 4 maximum frame size.

Pure Python, no I/O: the controller imports it to read neighbours back out
of reports (from_dict), and the agent's listener (host/resident) feeds it.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, replace

from nictune.host.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Dict, Iterator, Optional, Tuple

ETH_P_LLDP = 0x88CC
# The three LLDP destination addresses (802.1AB 7.1); a rail's switch port
# sends to the nearest bridge one.
NEAREST_BRIDGE = bytes.fromhex("0180c200000e")
LLDP_MULTICAST = (NEAREST_BRIDGE, bytes.fromhex("0180c2000003"), bytes.fromhex("0180c2000000"))

# An LLDPDU fits one untagged frame of the standard size (802.1AB 8.1):
# 14 bytes of header, 1500 of payload, one 802.1Q tag of slack.
MAX_FRAME = 1518
MAX_TEXT = 255  # every LLDP string TLV's own maximum (chassis/port id: 255)
MAX_APPS = 168  # (511 - 5) / 3: what one application priority TLV can hold
PRIOS = 8

SOURCES = ("listener", "lldpd", "lldpad", "dcbnl", "wait")

OUI_8021 = b"\x00\x80\xc2"
OUI_8023 = b"\x00\x12\x0f"

# Basic TLV types (802.1AB 8.4.1).
T_END, T_CHASSIS, T_PORT, T_TTL, T_PORT_DESC, T_SYS_NAME = 0, 1, 2, 3, 4, 5
T_ORG = 127
TLV_NAMES = {T_END: "End of LLDPDU", T_CHASSIS: "Chassis ID", T_PORT: "Port ID", T_TTL: "Time To Live",
             T_PORT_DESC: "Port Description", T_SYS_NAME: "System Name", 6: "System Description",
             7: "System Capabilities", 8: "Management Address", T_ORG: "Organizationally Specific"}

# (OUI, subtype) -> (name, exact info length after OUI and subtype, or None
# for the application priority table's variable length).
ORG_TLVS = {
    (OUI_8021, 9): ("ETS Configuration", 21),
    (OUI_8021, 10): ("ETS Recommendation", 21),
    (OUI_8021, 11): ("PFC Configuration", 2),
    (OUI_8021, 12): ("Application Priority", None),
    (OUI_8023, 4): ("Maximum Frame Size", 2),
}

CHASSIS_SUBTYPES = {1: "chassis-component", 2: "interface-alias", 3: "port-component",
                    4: "mac", 5: "network-address", 6: "interface-name", 7: "local"}
PORT_SUBTYPES = {1: "interface-alias", 2: "port-component", 3: "mac", 4: "network-address",
                 5: "interface-name", 6: "agent-circuit-id", 7: "local"}
# 802.1Q-2018 table 8-6 (TSA) and D-9 (APP selectors).
TSA_NAMES = {0: "strict", 1: "cbs", 2: "ets", 255: "vendor"}
SEL_ETHERTYPE, SEL_STREAM, SEL_DGRAM, SEL_ANY, SEL_DSCP = 1, 2, 3, 4, 5
SELECTOR_NAMES = {SEL_ETHERTYPE: "ethertype", SEL_STREAM: "tcp-sctp", SEL_DGRAM: "udp-dccp",
                  SEL_ANY: "tcp-sctp-udp-dccp", SEL_DSCP: "dscp"}


class LldpError(ValueError):
    """A frame (or a stored neighbour) that is not a valid LLDPDU; the
    message names the TLV and is printable."""


@dataclass(frozen=True)
class EtsTlv:
    """An ETS configuration or recommendation TLV.  willing, cbs and max_tcs
    are only in the configuration TLV (False/False/0 in a recommendation).
    max_tcs 0 on the wire means 8 and is given as 8."""

    prio_tc: Tuple[int, ...]      # priority -> traffic class
    tc_bw: Tuple[int, ...]        # per traffic class, percent
    tc_tsa: Tuple[str, ...]       # per traffic class: strict, cbs, ets, vendor or "tsa-N"
    willing: bool = False
    cbs: bool = False
    max_tcs: int = 0


@dataclass(frozen=True)
class PfcTlv:
    """The PFC configuration TLV: the priorities with PFC on, the willing
    bit, MBC (MACsec bypass capability) and how many priorities the port
    can run PFC on at once (pfc_cap, 0-8)."""

    enabled: Tuple[int, ...]
    willing: bool
    mbc: bool
    pfc_cap: int


@dataclass(frozen=True)
class AppEntry:
    """One application priority table entry: selector 5 is DSCP, protocol
    then the DSCP value."""

    selector: int
    protocol: int
    priority: int


@dataclass(frozen=True)
class Neighbour:
    """The switch port at the other end of one rail, as one frame said it.
    Optional TLVs the frame did not carry are None (apps: None = no
    application priority TLV; () = one that lists nothing)."""

    chassis_id: str
    chassis_subtype: str
    port_id: str
    port_subtype: str
    ttl: int
    port_description: Optional[str] = None
    system_name: Optional[str] = None
    max_frame_size: Optional[int] = None
    ets: Optional[EtsTlv] = None
    ets_recommendation: Optional[EtsTlv] = None
    pfc: Optional[PfcTlv] = None
    apps: Optional[Tuple[AppEntry, ...]] = None
    rail: str = ""                # the host netdev the frame came in on
    source: str = "listener"      # one of SOURCES
    age: Optional[float] = None   # seconds since the frame arrived (None: unknown)

    def dscp_map(self) -> Optional[Dict[int, int]]:
        """DSCP -> priority from the APP table's DSCP entries, None without
        the TLV.  A DSCP listed twice keeps its first entry (a switch that
        does that is reported by the lint, not guessed at here)."""
        if self.apps is None:
            return None
        out: Dict[int, int] = {}
        for app in self.apps:
            if app.selector == SEL_DSCP:
                out.setdefault(app.protocol, app.priority)
        return out

    def label(self) -> str:
        """The neighbour as a person names it: system name (or chassis id) and port."""
        return f"{self.system_name or self.chassis_id} port {self.port_id}"

    def to_dict(self) -> dict:
        return _neighbour_dict(self)


_MERGED = ("port_description", "system_name", "max_frame_size", "ets", "ets_recommendation", "pfc", "apps")


def merge(neighbours: list) -> Optional[Neighbour]:
    """One rail's view from the frames of its live LLDP agents, newest first.

    A switch port may speak through more than one LLDP agent (a Linux
    switch running lldpd for identity and lldpad for DCBX: same chassis,
    a port id each).  The port's identity is the newest frame that names
    its system (the agent that speaks for the port), else the newest; a TLV
    that frame lacks is taken from the next newest frame of the same
    chassis.  Frames of another chassis are a second neighbour on the rail,
    not merged (the lint names them)."""
    if not neighbours:
        return None
    first = next((n for n in neighbours if n.system_name is not None), neighbours[0])
    filled = {}
    for other in neighbours:
        if other is first or other.chassis_id != first.chassis_id:
            continue
        for name in _MERGED:
            if getattr(first, name) is None and name not in filled and getattr(other, name) is not None:
                filled[name] = getattr(other, name)
    return replace(first, **filled) if filled else first


# --- decoding -----------------------------------------------------------------


def _tlvs(pdu: bytes) -> Iterator[Tuple[int, bytes, int]]:
    """(type, value, offset) of each TLV up to End (or the end of the data).
    Bytes after End are padding to the minimum frame size and are ignored."""
    offset = 0
    while offset < len(pdu):
        if len(pdu) - offset < 2:
            raise LldpError(f"a TLV header cut short at byte {offset}")
        header = struct.unpack_from("!H", pdu, offset)[0]
        kind, length = header >> 9, header & 0x1FF
        start = offset + 2
        if start + length > len(pdu):
            raise LldpError(f"{_name(kind)} TLV at byte {offset} claims {length} bytes, "
                            f"{len(pdu) - start} left")
        if kind == T_END:
            if length:
                raise LldpError(f"End of LLDPDU TLV with length {length}, expected 0")
            return
        yield kind, pdu[start:start + length], offset
        offset = start + length


def _name(kind: int) -> str:
    return TLV_NAMES.get(kind, f"type {kind}")


def _text(value: bytes, what: str, low: int = 0) -> str:
    if not low <= len(value) <= MAX_TEXT:
        raise LldpError(f"{what} of {len(value)} bytes, expected {low}-{MAX_TEXT}")
    return printable(value.decode("utf-8", "backslashreplace"))


def _mac(value: bytes) -> str:
    return ":".join(f"{b:02x}" for b in value)


def _identity(value: bytes, subtypes: Dict[int, str], what: str) -> Tuple[str, str]:
    """(id, subtype name) of a chassis or port id TLV: subtype byte, 1-255 bytes."""
    if not 2 <= len(value) <= 256:
        raise LldpError(f"{what} TLV of {len(value)} bytes, expected 2-256")
    subtype, body = value[0], value[1:]
    name = subtypes.get(subtype, f"reserved-{subtype}")
    if name == "mac" and len(body) == 6:
        return _mac(body), name
    if name == "network-address":
        return _network_address(body), name
    if name in ("mac", "agent-circuit-id") or name.startswith("reserved"):
        return body.hex(), name  # binary: hex keeps it exact and printable
    return _text(body, f"{what} TLV id", 1), name


def _network_address(body: bytes) -> str:
    """An IANA address family byte then the address (IPv4 and IPv6 as text)."""
    family, address = (body[0], body[1:]) if body else (0, b"")
    if family == 1 and len(address) == 4:
        return ".".join(str(b) for b in address)
    if family == 2 and len(address) == 16:
        return socket.inet_ntop(socket.AF_INET6, address)
    return body.hex()


def _nibbles(four: bytes) -> Tuple[int, ...]:
    """The priority assignment table: priority 0 in the high nibble of byte 0."""
    return tuple(n for b in four for n in (b >> 4, b & 0x0F))


def _tsa_names(codes: bytes) -> Tuple[str, ...]:
    return tuple(TSA_NAMES.get(c, f"tsa-{c}") for c in codes)


def _ets(info: bytes, recommendation: bool, what: str) -> EtsTlv:
    flags, pat, bw, tsa = info[0], info[1:5], info[5:13], info[13:21]
    prio_tc = _nibbles(pat)
    for prio, tc in enumerate(prio_tc):
        if tc >= PRIOS:  # 8-14 are reserved, 15 is "no TC" in 802.1Q D.2.9.6
            raise LldpError(f"{what} TLV maps priority {prio} to traffic class {tc}, expected 0-7")
    for tc, pct in enumerate(bw):
        if pct > 100:
            raise LldpError(f"{what} TLV gives traffic class {tc} {pct}% of the bandwidth")
    if recommendation:
        return EtsTlv(prio_tc, tuple(bw), _tsa_names(tsa))
    max_tcs = flags & 0x07
    return EtsTlv(prio_tc, tuple(bw), _tsa_names(tsa), willing=bool(flags & 0x80),
                  cbs=bool(flags & 0x40), max_tcs=max_tcs or 8)


def _pfc(info: bytes) -> PfcTlv:
    flags, enabled = info[0], info[1]
    cap = flags & 0x0F
    if cap > PRIOS:
        raise LldpError(f"PFC Configuration TLV with PFC capability {cap}, expected 0-8")
    return PfcTlv(tuple(p for p in range(PRIOS) if enabled & (1 << p)),
                  willing=bool(flags & 0x80), mbc=bool(flags & 0x40), pfc_cap=cap)


def _apps(info: bytes) -> Tuple[AppEntry, ...]:
    # One reserved byte, then 3-byte entries: priority (3 bits), 2 reserved,
    # selector (3 bits); a 16-bit protocol id.
    if not info or (len(info) - 1) % 3:
        raise LldpError(f"Application Priority TLV of {len(info)} bytes after its OUI, "
                        "expected 1 + 3 per entry")
    entries = []
    for offset in range(1, len(info), 3):
        byte, protocol = info[offset], struct.unpack_from("!H", info, offset + 1)[0]
        selector = byte & 0x07
        if selector not in SELECTOR_NAMES:
            raise LldpError(f"Application Priority TLV entry with selector {selector}, expected 1-5")
        if selector == SEL_DSCP and protocol > 63:
            raise LldpError(f"Application Priority TLV maps DSCP {protocol}, expected 0-63")
        entries.append(AppEntry(selector, protocol, byte >> 5))
    return tuple(entries)


def _org(value: bytes, fields: dict) -> None:
    """An organizationally specific TLV into fields; unknown ones are skipped."""
    if len(value) < 4:
        raise LldpError(f"Organizationally Specific TLV of {len(value)} bytes, expected at least 4")
    oui, subtype, info = value[:3], value[3], value[4:]
    known = ORG_TLVS.get((oui, subtype))
    if known is None:
        return
    name, size = known
    if size is not None and len(info) != size:
        raise LldpError(f"{name} TLV of {len(value)} bytes, expected {size + 4}")
    key = {9: "ets", 10: "ets_recommendation", 11: "pfc", 12: "apps", 4: "max_frame_size"}[subtype]
    if key in fields:
        raise LldpError(f"a second {name} TLV")
    if key == "max_frame_size":
        fields[key] = struct.unpack("!H", info)[0]
    elif key == "pfc":
        fields[key] = _pfc(info)
    elif key == "apps":
        fields[key] = _apps(info)
    else:
        fields[key] = _ets(info, key == "ets_recommendation", name)


def _mandatory(tlvs: list) -> dict:
    """Chassis ID, Port ID and TTL: first, in this order (802.1AB 8.2)."""
    want = (T_CHASSIS, T_PORT, T_TTL)
    got = [kind for kind, _, _ in tlvs[:3]]
    if got != list(want):
        seen = ", ".join(_name(k) for k in got) or "nothing"
        raise LldpError(f"an LLDPDU starts with Chassis ID, Port ID and Time To Live TLVs, this one with {seen}")
    chassis, port, ttl = (value for _, value, _ in tlvs[:3])
    if len(ttl) != 2:
        raise LldpError(f"Time To Live TLV of {len(ttl)} bytes, expected 2")
    chassis_id, chassis_subtype = _identity(chassis, CHASSIS_SUBTYPES, "Chassis ID")
    port_id, port_subtype = _identity(port, PORT_SUBTYPES, "Port ID")
    return {"chassis_id": chassis_id, "chassis_subtype": chassis_subtype, "port_id": port_id,
            "port_subtype": port_subtype, "ttl": struct.unpack("!H", ttl)[0]}


def decode_lldpdu(pdu: bytes, *, rail: str = "", source: str = "listener",
                  age: Optional[float] = None) -> Neighbour:
    """The Neighbour an LLDPDU (the frame's payload) describes."""
    if not isinstance(pdu, (bytes, bytearray, memoryview)):
        raise LldpError(f"an LLDPDU is bytes, not {type(pdu).__name__}")
    if len(pdu) > MAX_FRAME:  # before bytes(): a huge buffer is not copied
        raise LldpError(f"an LLDPDU of {len(pdu)} bytes, more than one frame holds ({MAX_FRAME})")
    pdu = bytes(pdu)
    tlvs = list(_tlvs(pdu))
    fields = _mandatory(tlvs)
    for kind, value, offset in tlvs[3:]:
        if kind in (T_CHASSIS, T_PORT, T_TTL):
            raise LldpError(f"a second {_name(kind)} TLV at byte {offset}")
        if kind in (T_PORT_DESC, T_SYS_NAME):
            key = "port_description" if kind == T_PORT_DESC else "system_name"
            if key in fields:
                raise LldpError(f"a second {_name(kind)} TLV at byte {offset}")
            fields[key] = _text(value, f"{_name(kind)} TLV")
        elif kind == T_ORG:
            _org(value, fields)
    return Neighbour(**fields, rail=_check_rail(rail), source=_check_source(source), age=_check_age(age))


def decode(frame: bytes, *, rail: str = "", source: str = "listener",
           age: Optional[float] = None) -> Neighbour:
    """The Neighbour an Ethernet frame carrying an LLDPDU describes: the
    frame as an AF_PACKET SOCK_RAW socket reads it, destination and source
    MAC then ethertype 0x88cc (an 802.1Q tag before it is allowed)."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise LldpError(f"a frame is bytes, not {type(frame).__name__}")
    if len(frame) > MAX_FRAME:
        raise LldpError(f"a frame of {len(frame)} bytes, more than an LLDP frame may be ({MAX_FRAME})")
    frame = bytes(frame)
    if len(frame) < 14:
        raise LldpError(f"a frame of {len(frame)} bytes, shorter than an Ethernet header")
    offset = 12
    ethertype = struct.unpack_from("!H", frame, offset)[0]
    if ethertype == 0x8100 and len(frame) >= 18:
        offset += 4
        ethertype = struct.unpack_from("!H", frame, offset)[0]
    if ethertype != ETH_P_LLDP:
        raise LldpError(f"ethertype 0x{ethertype:04x}, not LLDP (0x88cc)")
    return decode_lldpdu(frame[offset + 2:], rail=rail, source=source, age=age)


def _check_rail(rail: object) -> str:
    if not isinstance(rail, str) or len(rail) > 15:  # IFNAMSIZ - 1
        raise LldpError(f"a rail is an interface name of at most 15 characters, got {printable(repr(rail))[:40]}")
    return printable(rail)


def _check_source(source: object) -> str:
    if source not in SOURCES:
        raise LldpError(f"a neighbour's source is one of {', '.join(SOURCES)}, got {printable(repr(source))[:40]}")
    return source  # type: ignore[return-value]


def _check_age(age: object) -> Optional[float]:
    if age is None:
        return None
    if isinstance(age, bool) or not isinstance(age, (int, float)) or not 0 <= age < 10 ** 9:
        raise LldpError(f"a frame's age is seconds (0 or more), got {printable(repr(age))[:40]}")
    return float(age)


# --- reports: to and from plain data ------------------------------------------------


def _ets_dict(ets: Optional[EtsTlv]) -> Optional[dict]:
    if ets is None:
        return None
    return {"prio_tc": list(ets.prio_tc), "tc_bw": list(ets.tc_bw), "tc_tsa": list(ets.tc_tsa),
            "willing": ets.willing, "cbs": ets.cbs, "max_tcs": ets.max_tcs}


def _neighbour_dict(n: Neighbour) -> dict:
    pfc = None if n.pfc is None else {"enabled": list(n.pfc.enabled), "willing": n.pfc.willing,
                                      "mbc": n.pfc.mbc, "pfc_cap": n.pfc.pfc_cap}
    apps = None if n.apps is None else [
        {"selector": a.selector, "protocol": a.protocol, "priority": a.priority} for a in n.apps]
    return {"chassis_id": n.chassis_id, "chassis_subtype": n.chassis_subtype, "port_id": n.port_id,
            "port_subtype": n.port_subtype, "ttl": n.ttl, "port_description": n.port_description,
            "system_name": n.system_name, "max_frame_size": n.max_frame_size, "ets": _ets_dict(n.ets),
            "ets_recommendation": _ets_dict(n.ets_recommendation), "pfc": pfc, "apps": apps,
            "rail": n.rail, "source": n.source, "age": n.age}


def _get(data: dict, key: str, kinds: tuple, optional: bool = False):
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise LldpError(f"neighbour field {key!r} is {type(value).__name__}, expected "
                        + " or ".join(k.__name__ for k in kinds))
    if isinstance(value, str) and len(value) > 4 * MAX_TEXT + 8:  # printable() may quadruple a byte
        raise LldpError(f"neighbour field {key!r} of {len(value)} characters")
    return value


def _ints(values: object, lo: int, hi: int, key: str, count: Optional[int] = PRIOS) -> Tuple[int, ...]:
    if not isinstance(values, list) or (count is not None and len(values) != count) or len(values) > PRIOS:
        raise LldpError(f"neighbour field {key!r} is not a list of {count or 'up to 8'} integers")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise LldpError(f"neighbour field {key!r} holds {printable(repr(v))[:40]}, expected {lo}-{hi}")
    return tuple(values)


def _ets_from(data: object, key: str) -> Optional[EtsTlv]:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise LldpError(f"neighbour field {key!r} is not a mapping")
    tsa = data.get("tc_tsa")
    if not isinstance(tsa, list) or len(tsa) != PRIOS or not all(
            isinstance(t, str) and (t in TSA_NAMES.values() or t.startswith("tsa-")) and len(t) <= 7
            for t in tsa):
        raise LldpError(f"neighbour field {key!r}.tc_tsa is not 8 scheduler names")
    return EtsTlv(_ints(data.get("prio_tc"), 0, 7, f"{key}.prio_tc"),
                  _ints(data.get("tc_bw"), 0, 100, f"{key}.tc_bw"), tuple(tsa),
                  willing=_get(data, "willing", (bool,)), cbs=_get(data, "cbs", (bool,)),
                  max_tcs=_ints([_get(data, "max_tcs", (int,))], 0, 8, f"{key}.max_tcs", 1)[0])


def _apps_from(data: object) -> Optional[Tuple[AppEntry, ...]]:
    if data is None:
        return None
    if not isinstance(data, list) or len(data) > MAX_APPS:
        raise LldpError(f"neighbour field 'apps' is not a list of at most {MAX_APPS} entries")
    out = []
    for entry in data:
        if not isinstance(entry, dict):
            raise LldpError("neighbour field 'apps' holds an entry that is not a mapping")
        selector, protocol, priority = (_get(entry, k, (int,)) for k in ("selector", "protocol", "priority"))
        _ints([selector], 1, 5, "apps.selector", 1)
        _ints([protocol], 0, 63 if selector == SEL_DSCP else 0xFFFF, "apps.protocol", 1)
        _ints([priority], 0, 7, "apps.priority", 1)
        out.append(AppEntry(selector, protocol, priority))
    return tuple(out)


def from_dict(data: object) -> Neighbour:
    """A Neighbour back from to_dict()'s data, as strict as decode(): it
    arrives in a host's report, which the controller does not trust."""
    if not isinstance(data, dict):
        raise LldpError(f"a neighbour is a mapping, not {type(data).__name__}")
    pfc_data = data.get("pfc")
    pfc = None
    if pfc_data is not None:
        if not isinstance(pfc_data, dict):
            raise LldpError("neighbour field 'pfc' is not a mapping")
        pfc = PfcTlv(_ints(pfc_data.get("enabled"), 0, 7, "pfc.enabled", None),
                     willing=_get(pfc_data, "willing", (bool,)), mbc=_get(pfc_data, "mbc", (bool,)),
                     pfc_cap=_ints([_get(pfc_data, "pfc_cap", (int,))], 0, 8, "pfc.pfc_cap", 1)[0])
    max_frame = _get(data, "max_frame_size", (int,), optional=True)
    ttl = _get(data, "ttl", (int,))
    _ints([ttl], 0, 0xFFFF, "ttl", 1)
    if max_frame is not None:
        _ints([max_frame], 0, 0xFFFF, "max_frame_size", 1)
    return Neighbour(
        chassis_id=printable(_get(data, "chassis_id", (str,))),
        chassis_subtype=printable(_get(data, "chassis_subtype", (str,))),
        port_id=printable(_get(data, "port_id", (str,))),
        port_subtype=printable(_get(data, "port_subtype", (str,))),
        ttl=ttl,
        port_description=_opt_text(data, "port_description"),
        system_name=_opt_text(data, "system_name"),
        max_frame_size=max_frame,
        ets=_ets_from(data.get("ets"), "ets"),
        ets_recommendation=_ets_from(data.get("ets_recommendation"), "ets_recommendation"),
        pfc=pfc, apps=_apps_from(data.get("apps")),
        rail=_check_rail(data.get("rail", "")), source=_check_source(data.get("source")),
        age=_check_age(data.get("age")))


def _opt_text(data: dict, key: str) -> Optional[str]:
    value = _get(data, key, (str,), optional=True)
    return None if value is None else printable(value)


# --- encoding (tests, the lab's fake switch, the fuzzer's seeds) -------------------


def tlv(kind: int, value: bytes) -> bytes:
    """One TLV: header (7-bit type, 9-bit length) then value."""
    if not 0 <= kind <= 127 or len(value) > 511:
        raise ValueError(f"TLV type {kind} with {len(value)} bytes cannot be encoded")
    return struct.pack("!H", kind << 9 | len(value)) + value


def org_tlv(oui: bytes, subtype: int, info: bytes) -> bytes:
    return tlv(T_ORG, oui + bytes([subtype]) + info)


def encode_ets(ets: EtsTlv, recommendation: bool = False) -> bytes:
    codes = {v: k for k, v in TSA_NAMES.items()}
    flags = 0 if recommendation else (
        (0x80 if ets.willing else 0) | (0x40 if ets.cbs else 0) | (ets.max_tcs & 0x07))
    pat = bytes(ets.prio_tc[i] << 4 | ets.prio_tc[i + 1] for i in range(0, PRIOS, 2))
    tsa = bytes(codes.get(t, int(t[4:]) if t.startswith("tsa-") else 0) for t in ets.tc_tsa)
    return org_tlv(OUI_8021, 10 if recommendation else 9, bytes([flags]) + pat + bytes(ets.tc_bw) + tsa)


def encode_pfc(pfc: PfcTlv) -> bytes:
    flags = (0x80 if pfc.willing else 0) | (0x40 if pfc.mbc else 0) | pfc.pfc_cap
    return org_tlv(OUI_8021, 11, bytes([flags, sum(1 << p for p in set(pfc.enabled))]))


def encode_apps(apps: Tuple[AppEntry, ...]) -> bytes:
    body = b"".join(bytes([a.priority << 5 | a.selector]) + struct.pack("!H", a.protocol) for a in apps)
    return org_tlv(OUI_8021, 12, b"\x00" + body)


def encode(n: Neighbour, src_mac: bytes = b"\x02\x00\x00\x00\x00\x01") -> bytes:
    """An Ethernet frame that decode() reads back as n (source, rail and age
    aside): chassis and port ids are sent as locally assigned text unless
    their subtype is mac."""
    def ident(value: str, subtype: str, table: Dict[int, str]) -> bytes:
        code = {v: k for k, v in table.items()}[subtype]
        return bytes([code]) + (bytes.fromhex(value.replace(":", "")) if subtype == "mac" else value.encode())
    parts = [tlv(T_CHASSIS, ident(n.chassis_id, n.chassis_subtype, CHASSIS_SUBTYPES)),
             tlv(T_PORT, ident(n.port_id, n.port_subtype, PORT_SUBTYPES)),
             tlv(T_TTL, struct.pack("!H", n.ttl))]
    if n.port_description is not None:
        parts.append(tlv(T_PORT_DESC, n.port_description.encode()))
    if n.system_name is not None:
        parts.append(tlv(T_SYS_NAME, n.system_name.encode()))
    if n.max_frame_size is not None:
        parts.append(org_tlv(OUI_8023, 4, struct.pack("!H", n.max_frame_size)))
    if n.ets is not None:
        parts.append(encode_ets(n.ets))
    if n.ets_recommendation is not None:
        parts.append(encode_ets(n.ets_recommendation, recommendation=True))
    if n.pfc is not None:
        parts.append(encode_pfc(n.pfc))
    if n.apps is not None:
        parts.append(encode_apps(n.apps))
    parts.append(tlv(T_END, b""))
    return NEAREST_BRIDGE + src_mac + struct.pack("!H", ETH_P_LLDP) + b"".join(parts)
