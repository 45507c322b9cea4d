"""dcbnl over rtnetlink: ETS, PFC, the port buffers, the APP table and the
DCBX mode (a read also gives the APP trust order).

The kernel side is net/dcb/dcbnl.c: requests are RTM_GETDCB / RTM_SETDCB
with a `struct dcbmsg` header and a DCB_CMD_* command; the device is named
by DCB_ATTR_IFNAME, not by index.  Only the IEEE 802.1Qaz commands are
spoken here (the CEE ones are legacy).

What the kernel answers (dcb_doit):
- a device without dcbnl_ops (veth, lo, most virtual devices): EOPNOTSUPP
  in the ACK; an unknown name: ENODEV.
- DCB_CMD_IEEE_GET: one RTM_GETDCB message laid out by dcbnl_ieee_fill():
  IFNAME, a DCB_ATTR_IEEE nest (ETS, MAXRATE, PFC, DCB_BUFFER, APP_TABLE,
  REWR_TABLE, APP_TRUST_TABLE, peer data), then DCB_ATTR_DCBX when the
  driver has getdcbx -- so one request also gives the DCBX mode.
- DCB_CMD_IEEE_SET / IEEE_DEL: the driver's error does NOT come back in
  the ACK (that says 0) but as a u8 DCB_ATTR_IEEE in an RTM_SETDCB reply,
  holding the negative errno.
- DCB_CMD_SDCBX (dcbnl_setdcbx): the driver's u8 answer comes back as
  DCB_ATTR_DCBX in the RTM_SETDCB reply; non-zero means it refused the mode.

Encodings follow iproute2's `dcb` byte for byte (tests/recorded/dcb):
whole `struct ieee_ets` / `struct ieee_pfc` blobs in host byte order,
nests flagged NLA_F_NESTED as libmnl does.  ETS, PFC and the buffers are
written whole, so callers start from what get() read and change only what
they mean to, as `dcb ets set` / `dcb pfc set` / `dcb buffer set` do.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from nictune.host.transports.netlink._pyroute2 import NLA_F_NESTED, nla, nlmsg
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.names import validate_ifname
from nictune.host.transports.netlink.socket import NLM_F_ACK, NLM_F_REQUEST, NetlinkSocket
from nictune.host.transports.netlink.uapi import (DCBX_HOST, DCBX_LLD_MANAGED, DCBX_STATIC, DCBX_VER_CEE,
                                       DCBX_VER_IEEE)
from nictune.host.validate import InvalidInput

RTM_GETDCB, RTM_SETDCB = 78, 79
DCB_CMD_IEEE_SET, DCB_CMD_IEEE_GET = 20, 21
DCB_CMD_SDCBX = 23
DCB_CMD_IEEE_DEL = 27
_MSG_TYPE = {
    DCB_CMD_IEEE_SET: RTM_SETDCB,
    DCB_CMD_IEEE_GET: RTM_GETDCB,
    DCB_CMD_SDCBX: RTM_SETDCB,
    DCB_CMD_IEEE_DEL: RTM_SETDCB,
}
# DCB_CAP_DCBX_* (include/uapi/linux/dcbnl.h, netlink/uapi.py): DcbState.dcbx and SDCBX modes.
DCBX_ALL = DCBX_HOST | DCBX_LLD_MANAGED | DCBX_VER_CEE | DCBX_VER_IEEE | DCBX_STATIC

PRIOS = 8  # IEEE_8021QAZ_MAX_TCS: 8 priorities, 8 traffic classes
TSA = {"strict": 0, "cbs": 1, "ets": 2, "vendor": 255}
SEL_ETHERTYPE, SEL_STREAM, SEL_DGRAM, SEL_ANY, SEL_DSCP = 1, 2, 3, 4, 5
SEL_PCP = 255  # DCB_APP_SEL_PCP, the kernel's pseudo-selector (not IEEE)

# struct ieee_ets: willing, ets_cap, cbs, then seven u8[8] arrays (59 bytes).
_ETS = struct.Struct("=3B56B")
# struct ieee_pfc: pfc_cap, pfc_en, mbc, (pad), u16 delay, (pad),
# u64 requests[8], u64 indications[8] (136 bytes).
_PFC = struct.Struct("=3BxH2x8Q8Q")
_APP = struct.Struct("=BBH")  # struct dcb_app: selector, priority, protocol
_MAXRATE = struct.Struct("=8Q")  # struct ieee_maxrate: u64 tc_maxrate[8], kbit/s
# struct dcbnl_buffer: u8 prio2buffer[8], u32 buffer_size[8] (bytes),
# u32 total_size (read only) -- 44 bytes.
_BUFFER = struct.Struct("=8B8II")
BUFFERS = 8  # DCBX_MAX_BUFFERS


# --- values ---------------------------------------------------------------


def _zeros() -> List[int]:
    return [0] * PRIOS


@dataclass
class Ets:
    """struct ieee_ets.  tc_tsa holds TSA values, prio_tc maps priority -> TC."""

    willing: int = 0
    ets_cap: int = 0
    cbs: int = 0
    tc_tx_bw: List[int] = field(default_factory=_zeros)
    tc_rx_bw: List[int] = field(default_factory=_zeros)
    tc_tsa: List[int] = field(default_factory=_zeros)
    prio_tc: List[int] = field(default_factory=_zeros)
    tc_reco_bw: List[int] = field(default_factory=_zeros)
    tc_reco_tsa: List[int] = field(default_factory=_zeros)
    reco_prio_tc: List[int] = field(default_factory=_zeros)


_ETS_ARRAYS = ("tc_tx_bw", "tc_rx_bw", "tc_tsa", "prio_tc", "tc_reco_bw", "tc_reco_tsa", "reco_prio_tc")


@dataclass
class Pfc:
    """struct ieee_pfc.  pfc_en: bit p set = PFC on for priority p.
    requests/indications are the driver's per-priority pause counters."""

    pfc_cap: int = 0
    pfc_en: int = 0
    mbc: int = 0
    delay: int = 0
    requests: List[int] = field(default_factory=_zeros)
    indications: List[int] = field(default_factory=_zeros)


@dataclass
class Buffer:
    """struct dcbnl_buffer: which port buffer each priority's traffic goes
    to, each buffer's size in bytes, and what all buffers take (read only)."""

    prio2buffer: List[int] = field(default_factory=_zeros)
    buffer_size: List[int] = field(default_factory=_zeros)
    total_size: int = 0


@dataclass(frozen=True)
class App:
    """struct dcb_app: for SEL_DSCP the protocol is the DSCP (0-63)."""

    selector: int
    priority: int
    protocol: int


@dataclass
class DcbState:
    """One device's IEEE DCB state; None where the driver has no getter."""

    ets: Optional[Ets] = None
    pfc: Optional[Pfc] = None
    apps: List[App] = field(default_factory=list)
    maxrate: Optional[List[int]] = None
    trust: Optional[List[int]] = None  # APP_TRUST_TABLE selectors, in order
    dcbx: Optional[int] = None  # DCB_CAP_DCBX_* bits (include/uapi/linux/dcbnl.h)
    buffer: Optional[Buffer] = None  # DCB_ATTR_DCB_BUFFER (drivers with dcbnl_getbuffer)
    # What the driver's own DCBX agent keeps of its peer (the switch port):
    # DCB_ATTR_IEEE_PEER_ETS / _PFC / _APP, from drivers with ieee_peer_getets,
    # ieee_peer_getpfc and peer_getapptable (knobs/switch.py reads them).
    peer_ets: Optional[Ets] = None
    peer_pfc: Optional[Pfc] = None
    peer_apps: Optional[List[App]] = None


# --- messages -------------------------------------------------------------


class _selector_list(nla):
    """APP_TABLE / APP_TRUST_TABLE / REWR_TABLE entries: the attribute type
    says which selector family the entry belongs to (dcbnl_app_attr_type_get:
    IEEE selectors 1-5 -> DCB_ATTR_IEEE_APP, the PCP pseudo-selector ->
    DCB_ATTR_DCB_APP)."""

    nla_flags = NLA_F_NESTED
    nla_map = ((1, "DCB_ATTR_IEEE_APP", "cdata"), (2, "DCB_ATTR_DCB_APP", "cdata"))


class dcbmsg(nlmsg):
    """struct dcbmsg: requests, and the RTM_GETDCB reply to IEEE_GET."""

    fields = (("family", "B"), ("cmd", "B"), ("pad", "H"))
    nla_map = (
        (1, "DCB_ATTR_IFNAME", "asciiz"),
        (13, "DCB_ATTR_IEEE", "ieee"),
        (14, "DCB_ATTR_DCBX", "uint8"),
    )

    class ieee(nla):
        nla_flags = NLA_F_NESTED
        nla_map = (
            (1, "DCB_ATTR_IEEE_ETS", "cdata"),
            (2, "DCB_ATTR_IEEE_PFC", "cdata"),
            (3, "DCB_ATTR_IEEE_APP_TABLE", "app_table"),
            (4, "DCB_ATTR_IEEE_PEER_ETS", "cdata"),
            (5, "DCB_ATTR_IEEE_PEER_PFC", "cdata"),
            (6, "DCB_ATTR_IEEE_PEER_APP", "app_table"),
            (7, "DCB_ATTR_IEEE_MAXRATE", "cdata"),
            (10, "DCB_ATTR_DCB_BUFFER", "cdata"),
            (11, "DCB_ATTR_DCB_APP_TRUST_TABLE", "app_table"),
        )
        app_table = _selector_list


class dcb_set_reply(nlmsg):
    """The RTM_SETDCB reply to IEEE_SET / IEEE_DEL / SDCBX: a u8 status
    (DCB_ATTR_IEEE: the driver's negative errno; DCB_ATTR_DCBX: setdcbx's
    answer, non-zero for a refusal)."""

    fields = dcbmsg.fields
    nla_map = ((13, "DCB_ATTR_IEEE", "uint8"), (14, "DCB_ATTR_DCBX", "uint8"))


def _message(cmd: int, ifname: str, attrs: list) -> dcbmsg:
    msg = dcbmsg()
    msg["family"] = 0  # AF_UNSPEC
    msg["cmd"] = cmd
    msg["attrs"] = [("DCB_ATTR_IFNAME", validate_ifname(ifname)), *attrs]
    return msg


# --- input checks and attribute builders ----------------------------------


def _int(value: object, lo: int, hi: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidInput(f"{what} must be an integer {lo}-{hi}, got {value!r}")
    return value


def _array(values: object, lo: int, hi: int, what: str) -> List[int]:
    if not isinstance(values, (list, tuple)) or len(values) != PRIOS:
        raise InvalidInput(f"{what} must list {PRIOS} values, got {values!r}")
    return [_int(v, lo, hi, f"{what}[{i}]") for i, v in enumerate(values)]


def _tsa(values: object, what: str) -> List[int]:
    tsa = _array(values, 0, 255, what)
    known = set(TSA.values())
    for i, v in enumerate(tsa):
        if v not in known:
            raise InvalidInput(f"{what}[{i}] = {v} is not a known TSA {sorted(known)}")
    return tsa


def _check_bw(bw: List[int], tsa: List[int], what: str) -> None:
    # 802.1Q-2018: the percentages sum to 100; a config with no ETS class may
    # leave them all at 0 (the rule `dcb ets set` applies too).
    total = sum(bw)
    has_ets = TSA["ets"] in tsa
    if total != 100 and (has_ets or total != 0):
        raise InvalidInput(
            f"{what} sums to {total}%, expected {100 if has_ets else '0 or 100'}%"
        )


def ets_attrs(ets: Ets) -> list:
    packed = [
        _int(ets.willing, 0, 1, "ets willing"),
        _int(ets.ets_cap, 0, PRIOS, "ets ets_cap"),
        _int(ets.cbs, 0, 1, "ets cbs"),
    ]
    tx_bw = _array(ets.tc_tx_bw, 0, 100, "ets tc_tx_bw")
    rx_bw = _array(ets.tc_rx_bw, 0, 100, "ets tc_rx_bw")
    tsa = _tsa(ets.tc_tsa, "ets tc_tsa")
    prio_tc = _array(ets.prio_tc, 0, PRIOS - 1, "ets prio_tc")
    reco_bw = _array(ets.tc_reco_bw, 0, 100, "ets tc_reco_bw")
    reco_tsa = _tsa(ets.tc_reco_tsa, "ets tc_reco_tsa")
    reco_prio_tc = _array(ets.reco_prio_tc, 0, PRIOS - 1, "ets reco_prio_tc")
    _check_bw(tx_bw, tsa, "ets tc_tx_bw")
    _check_bw(reco_bw, reco_tsa, "ets tc_reco_bw")
    for part in (tx_bw, rx_bw, tsa, prio_tc, reco_bw, reco_tsa, reco_prio_tc):
        packed += part
    blob = _ETS.pack(*packed)
    return [("DCB_ATTR_IEEE", {"attrs": [("DCB_ATTR_IEEE_ETS", blob)]})]


def pfc_attrs(pfc: Pfc) -> list:
    blob = _PFC.pack(
        _int(pfc.pfc_cap, 0, PRIOS, "pfc pfc_cap"),
        _int(pfc.pfc_en, 0, 0xFF, "pfc pfc_en"),
        _int(pfc.mbc, 0, 1, "pfc mbc"),
        _int(pfc.delay, 0, 0xFFFF, "pfc delay"),
        *_array(pfc.requests, 0, 2**64 - 1, "pfc requests"),
        *_array(pfc.indications, 0, 2**64 - 1, "pfc indications"),
    )
    return [("DCB_ATTR_IEEE", {"attrs": [("DCB_ATTR_IEEE_PFC", blob)]})]


def buffer_attrs(buffer: Buffer) -> list:
    """`dcb buffer set`'s message: the whole struct dcbnl_buffer, total_size
    as read (dcbnl_setbuffer drivers ignore it; mlx5e_dcbnl_setbuffer does)."""
    blob = _BUFFER.pack(
        *_array(buffer.prio2buffer, 0, BUFFERS - 1, "buffer prio2buffer"),
        *_array(buffer.buffer_size, 0, 2**32 - 1, "buffer buffer_size"),
        _int(buffer.total_size, 0, 2**32 - 1, "buffer total_size"),
    )
    return [("DCB_ATTR_IEEE", {"attrs": [("DCB_ATTR_DCB_BUFFER", blob)]})]


def dcbx_attrs(mode: int) -> list:
    # Bits above DCB_CAP_DCBX_STATIC are undefined; 0 is a mode (mlx5: hand
    # DCBX back to the firmware, mlx5e_dcbnl_setdcbx).
    return [("DCB_ATTR_DCBX", _int(mode, 0, DCBX_ALL, "DCBX mode"))]


# protocol ranges per selector: ethertype and ports are u16, a DSCP has 6
# bits, PCP entries hold pcp | dei << 3.
_APP_PROTOCOL_MAX = {
    SEL_ETHERTYPE: 0xFFFF,
    SEL_STREAM: 0xFFFF,
    SEL_DGRAM: 0xFFFF,
    SEL_ANY: 0xFFFF,
    SEL_DSCP: 63,
    SEL_PCP: 15,
}


def _selector_attr(selector: int) -> str:
    return "DCB_ATTR_DCB_APP" if selector == SEL_PCP else "DCB_ATTR_IEEE_APP"


def app_attrs(apps: Sequence[App]) -> list:
    entries = []
    for app in apps:
        if not isinstance(app, App) or app.selector not in _APP_PROTOCOL_MAX:
            raise InvalidInput(f"not a valid DCB APP entry: {app!r}")
        priority = _int(app.priority, 0, PRIOS - 1, "app priority")
        protocol = _int(app.protocol, 0, _APP_PROTOCOL_MAX[app.selector], "app protocol")
        entries.append((_selector_attr(app.selector), _APP.pack(app.selector, priority, protocol)))
    if not entries:
        raise InvalidInput("no DCB APP entries given")
    return [("DCB_ATTR_IEEE", {"attrs": [("DCB_ATTR_IEEE_APP_TABLE", {"attrs": entries})]})]


# --- replies --------------------------------------------------------------


def _blob(attr: object, size: int, name: str) -> bytes:
    data = bytes(attr)  # type: ignore[arg-type]
    if len(data) < size:
        raise NetlinkError(71, f"{name} is {len(data)} bytes, expected {size}")  # EPROTO
    return data


def _ets(data: bytes) -> Ets:
    values = _ETS.unpack_from(_blob(data, _ETS.size, "DCB_ATTR_IEEE_ETS"))
    arrays = {name: list(values[3 + i * PRIOS : 3 + (i + 1) * PRIOS]) for i, name in enumerate(_ETS_ARRAYS)}
    return Ets(willing=values[0], ets_cap=values[1], cbs=values[2], **arrays)


def _pfc(data: bytes) -> Pfc:
    v = _PFC.unpack_from(_blob(data, _PFC.size, "DCB_ATTR_IEEE_PFC"))
    return Pfc(v[0], v[1], v[2], v[3], list(v[4:12]), list(v[12:20]))


def _state(msg: dcbmsg) -> DcbState:
    state = DcbState(dcbx=msg.get_attr("DCB_ATTR_DCBX"))
    ieee = msg.get_attr("DCB_ATTR_IEEE")
    if ieee is None:
        return state
    ets = ieee.get_attr("DCB_ATTR_IEEE_ETS")
    pfc = ieee.get_attr("DCB_ATTR_IEEE_PFC")
    maxrate = ieee.get_attr("DCB_ATTR_IEEE_MAXRATE")
    apps = ieee.get_attr("DCB_ATTR_IEEE_APP_TABLE")
    trust = ieee.get_attr("DCB_ATTR_DCB_APP_TRUST_TABLE")
    buffer = ieee.get_attr("DCB_ATTR_DCB_BUFFER")
    if ets is not None:
        state.ets = _ets(ets)
    if pfc is not None:
        state.pfc = _pfc(pfc)
    if maxrate is not None:
        state.maxrate = list(_MAXRATE.unpack_from(_blob(maxrate, _MAXRATE.size, "DCB_ATTR_IEEE_MAXRATE")))
    if apps is not None:
        # Entries keep the kernel's order; both attribute types hold a dcb_app.
        state.apps = [App(*_APP.unpack_from(_blob(a[1], _APP.size, "DCB APP entry"))) for a in apps["attrs"]]
    if trust is not None:
        state.trust = [_blob(a[1], 1, "DCB trust entry")[0] for a in trust["attrs"]]
    if buffer is not None:
        v = _BUFFER.unpack_from(_blob(buffer, _BUFFER.size, "DCB_ATTR_DCB_BUFFER"))
        state.buffer = Buffer(list(v[:8]), list(v[8:16]), v[16])
    _peer(ieee, state)
    return state


def _peer(ieee, state: DcbState) -> None:
    """The DCBX peer's ETS, PFC and APP table (dcbnl_ieee_fill: PEER_APP is a
    nest of DCB_ATTR_IEEE_APP entries, dcbnl_build_peer_app)."""
    ets = ieee.get_attr("DCB_ATTR_IEEE_PEER_ETS")
    pfc = ieee.get_attr("DCB_ATTR_IEEE_PEER_PFC")
    apps = ieee.get_attr("DCB_ATTR_IEEE_PEER_APP")
    if ets is not None:
        state.peer_ets = _ets(ets)
    if pfc is not None:
        state.peer_pfc = _pfc(pfc)
    if apps is not None:
        state.peer_apps = [App(*_APP.unpack_from(_blob(a[1], _APP.size, "DCB peer APP entry")))
                           for a in apps["attrs"] if a[0] == "DCB_ATTR_IEEE_APP"]


# --- the device API ---------------------------------------------------------


class Dcb:
    """IEEE DCB of one network namespace, over a NETLINK_ROUTE socket."""

    def __init__(self, sock: NetlinkSocket):
        self._sock = sock

    def _send(self, cmd: int, ifname: str, attrs: list) -> list:
        msg_type = _MSG_TYPE[cmd]
        reply_cls = dcbmsg if msg_type == RTM_GETDCB else dcb_set_reply
        msg = _message(cmd, ifname, attrs)
        return self._sock.request(msg, msg_type, NLM_F_REQUEST | NLM_F_ACK, {msg_type: reply_cls})

    def get(self, ifname: str) -> DcbState:
        """ETS, PFC, APP table, maxrate, trust order and DCBX mode in one
        DCB_CMD_IEEE_GET (dcbnl_ieee_fill appends DCB_ATTR_DCBX itself)."""
        replies = self._send(DCB_CMD_IEEE_GET, ifname, [])
        if len(replies) != 1:
            raise NetlinkError(71, f"expected one DCB reply for {ifname}, got {len(replies)}")
        return _state(replies[0])

    def _set(self, cmd: int, ifname: str, attrs: list) -> None:
        for reply in self._send(cmd, ifname, attrs):
            status = reply.get_attr("DCB_ATTR_IEEE")
            if status:
                # A u8 holding the driver's negative errno.
                raise NetlinkError(256 - status if status > 127 else status)
            if reply.get_attr("DCB_ATTR_DCBX"):
                # setdcbx answers 1 for a mode it does not take, no errno.
                raise NetlinkError(22, "the driver refused the DCBX mode")  # EINVAL

    def set_ets(self, ifname: str, ets: Ets) -> None:
        self._set(DCB_CMD_IEEE_SET, ifname, ets_attrs(ets))

    def set_pfc(self, ifname: str, pfc: Pfc) -> None:
        self._set(DCB_CMD_IEEE_SET, ifname, pfc_attrs(pfc))

    def set_buffer(self, ifname: str, buffer: Buffer) -> None:
        self._set(DCB_CMD_IEEE_SET, ifname, buffer_attrs(buffer))

    def set_dcbx(self, ifname: str, mode: int) -> None:
        """DCB_CAP_DCBX_* bits, as `dcb dcbx set` sends them."""
        self._set(DCB_CMD_SDCBX, ifname, dcbx_attrs(mode))

    def add_apps(self, ifname: str, apps: List[App]) -> None:
        """Adds entries; mlx5 turns trust to DSCP with the first DSCP entry."""
        if apps:  # nothing to send, as `dcb app add` with no entries
            self._set(DCB_CMD_IEEE_SET, ifname, app_attrs(apps))

    def del_apps(self, ifname: str, apps: List[App]) -> None:
        """Deletes entries (each must match selector, priority and protocol)."""
        if apps:
            self._set(DCB_CMD_IEEE_DEL, ifname, app_attrs(apps))
