"""NETLINK_XFRM, read-only: the IPsec SAs (XFRM_MSG_GETSA dump) and
policies (XFRM_MSG_GETPOLICY dump) of the namespace, and where each runs.

nictune runs no IKE: it only reads what an IKE daemon (or `ip xfrm`)
installed, to tell whether an SA is offloaded (XFRMA_OFFLOAD_DEV: the
device, and XFRM_OFFLOAD_PACKET for packet offload vs crypto offload) or
runs in software.  pyroute2 has no xfrm messages; these are written on its
nlmsg/nla classes from the kernel's include/uapi/linux/xfrm.h:

    xfrm_usersa_info      224 bytes: selector, xfrm_id (daddr, spi, proto),
                          saddr, lifetimes, stats, seq, reqid, family,
                          mode, replay_window, flags
    xfrm_userpolicy_info  168 bytes: selector, lifetimes, priority, index,
                          dir, action, flags, share
    xfrm_user_tmpl        64 bytes each in XFRMA_TMPL
    xfrm_user_offload     XFRMA_OFFLOAD_DEV: int ifindex, u8 flags
                          (XFRM_OFFLOAD_INBOUND 2, XFRM_OFFLOAD_PACKET 4)
    XFRMA_SA_DIR          u8, 1 in / 2 out (kernel 6.10+; absent before)

Keys.  XFRMA_ALG_AUTH / _AUTH_TRUNC / _CRYPT / _AEAD / _COMP carry the
algorithm's key after its name and lengths.  Their nla classes declare
only the name and the length fields, so the key bytes are never decoded
into any field; the records this module returns (Sa, Policy) hold the
algorithm names and key lengths in bits, nothing else of them.  The raw
datagram still passes through the socket's receive buffer and the message
object's undecoded data while one reply is decoded; both are dropped (the
buffer overwritten) before dump_sas() returns, and nothing of them is
returned, logged or reported.

Writes (the `ipsec:` section, knobs/ipsec.py): XFRM_MSG_NEWSA / DELSA /
NEWPOLICY / DELPOLICY laid out as iproute2's `ip xfrm state add ... aead
rfc4106(gcm(aes)) <key> <icv> offload dev X dir out|in` and `ip xfrm
policy add ... tmpl ...` send them (tests/fixtures/xfrm/record.py records
those; tests/unit/test_xfrm_write.py compares byte for byte), with
`replay-window W [flag esn] limit packet-soft|packet-hard|byte-soft|
byte-hard N`: the window in XFRMA_REPLAY_ESN_VAL (bitmap mode) with ESN or
above 32 packets, else in the header, as iproute2 puts it; the limits in
xfrm_usersa_info.lft.  The decoder reads them back (Sa.replay_window,
.esn, .limits).  The key
goes in as the caller's bytearray into XFRMA_ALG_AEAD; add_sa() overwrites
the encoded datagram and drops the attribute right after the kernel
answered, whatever it answered, and never formats the message.

Dumping needs CAP_NET_ADMIN in the namespace (xfrm_user checks it for
every message): without it the dump raises NetlinkError(EPERM).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import List, Optional, Tuple

from nictune.host.transports.netlink._pyroute2 import nla, nlmsg
from nictune.host.transports.netlink.socket import NetlinkSocket

NETLINK_XFRM = 6
XFRM_MSG_NEWSA, XFRM_MSG_DELSA, XFRM_MSG_GETSA = 0x10, 0x11, 0x12
XFRM_MSG_NEWPOLICY, XFRM_MSG_DELPOLICY, XFRM_MSG_GETPOLICY = 0x13, 0x14, 0x15
XFRM_INF = 0xFFFFFFFFFFFFFFFF

XFRM_STATE_ESN = 128  # xfrm_usersa_info.flags
XFRM_OFFLOAD_INBOUND = 2
XFRM_OFFLOAD_PACKET = 4
XFRM_SA_DIR = {1: "in", 2: "out"}
POLICY_DIR = {0: "in", 1: "out", 2: "fwd"}
PROTOS = {50: "esp", 51: "ah", 108: "comp", 43: "route2", 60: "hao"}
MODES = {0: "transport", 1: "tunnel", 2: "ro", 3: "in_trigger", 4: "beet", 5: "iptfs"}

# struct xfrm_selector (56 bytes), field by field.
_SELECTOR = (
    ("sel_daddr", "16s"), ("sel_saddr", "16s"),
    ("sel_dport", ">H"), ("sel_dport_mask", ">H"), ("sel_sport", ">H"), ("sel_sport_mask", ">H"),
    ("sel_family", "H"), ("sel_prefixlen_d", "B"), ("sel_prefixlen_s", "B"), ("sel_proto", "B"),
    ("__pad_sel", "3x"), ("sel_ifindex", "i"), ("sel_user", "I"),
)
_LIFETIMES = (  # struct xfrm_lifetime_cfg + struct xfrm_lifetime_cur (96 bytes)
    ("lft", "64s"), ("curlft", "32s"),
)
# xfrm_lifetime_cfg's first four: soft/hard byte limits, soft/hard packet limits.
_LFT_LIMITS = struct.Struct("=QQQQ")


class _alg(nla):
    """struct xfrm_algo: the name and key length only, never the key."""

    fields = (("alg_name", "64s"), ("alg_key_len", "I"))


class _alg_sized(nla):
    """struct xfrm_algo_auth / xfrm_algo_aead: name, key length, truncation
    or ICV length; never the key."""

    fields = (("alg_name", "64s"), ("alg_key_len", "I"), ("alg_icv_len", "I"))


class _offload(nla):
    fields = (("ifindex", "i"), ("flags", "B"), ("__pad", "3x"))


class _replay_esn(nla):
    """struct xfrm_replay_state_esn without its bitmap: the kernel allocates
    bmp_len zeroed 32-bit words (xfrm_user.c xfrm_alloc_replay_state_esn)
    when the attribute is exactly this long, as iproute2 sends it."""

    fields = (("bmp_len", "I"), ("oseq", "I"), ("seq", "I"), ("oseq_hi", "I"), ("seq_hi", "I"),
              ("replay_window", "I"))


_ATTRS = (
    (1, "XFRMA_ALG_AUTH", "_alg"),
    (2, "XFRMA_ALG_CRYPT", "_alg"),
    (3, "XFRMA_ALG_COMP", "_alg"),
    (5, "XFRMA_TMPL", "cdata"),  # an array of struct xfrm_user_tmpl, unpacked below
    (18, "XFRMA_ALG_AEAD", "_alg_sized"),
    (20, "XFRMA_ALG_AUTH_TRUNC", "_alg_sized"),
    (23, "XFRMA_REPLAY_ESN_VAL", "_replay_esn"),
    (28, "XFRMA_OFFLOAD_DEV", "_offload"),
    (31, "XFRMA_IF_ID", "uint32"),
    (33, "XFRMA_SA_DIR", "uint8"),  # uapi xfrm.h: after IF_ID (31), MTIMER_THRESH (32)
)
_ALGS = ("XFRMA_ALG_AEAD", "XFRMA_ALG_CRYPT", "XFRMA_ALG_AUTH_TRUNC", "XFRMA_ALG_AUTH",
         "XFRMA_ALG_COMP")


class xfrm_usersa_info(nlmsg):
    fields = _SELECTOR + (
        ("daddr", "16s"), ("spi", ">I"), ("proto", "B"), ("__pad_id", "3x"),
        ("saddr", "16s"),
    ) + _LIFETIMES + (
        ("stats", "12s"), ("seq", "I"), ("reqid", "I"), ("family", "H"), ("mode", "B"),
        ("replay_window", "B"), ("flags", "B"), ("__pad", "7x"),
    )
    nla_map = _ATTRS
    _alg, _alg_sized, _offload, _replay_esn = _alg, _alg_sized, _offload, _replay_esn


class xfrm_userpolicy_info(nlmsg):
    fields = _SELECTOR + _LIFETIMES + (
        ("priority", "I"), ("index", "I"), ("dir", "B"), ("action", "B"), ("flags", "B"),
        ("share", "B"), ("__pad", "4x"),
    )
    nla_map = _ATTRS
    _alg, _alg_sized, _offload, _replay_esn = _alg, _alg_sized, _offload, _replay_esn


class _dump_request(nlmsg):
    """A bare header: xfrm dumps read no body (iproute2 sends none either)."""

    fields = ()


# struct xfrm_user_tmpl: xfrm_id (daddr, spi, proto), family, saddr, reqid,
# mode, share, optional, aalgos, ealgos, calgos.
_TMPL = struct.Struct("=16s4sB3xH2x16sIBBBxIII")
assert _TMPL.size == 64


def address(raw: bytes, family: int) -> str:
    if family == socket.AF_INET6:
        return str(ipaddress.IPv6Address(raw[:16]))
    return str(ipaddress.IPv4Address(raw[:4]))


@dataclass(frozen=True)
class Offload:
    ifindex: int
    inbound: bool
    packet: bool

    @property
    def mode(self) -> str:
        return "packet" if self.packet else "crypto"


@dataclass(frozen=True)
class Alg:
    """An SA's algorithm: kind (aead, enc, auth, comp), name, key length
    in bits, ICV/truncation length in bits (aead and auth-trunc).  No key."""

    kind: str
    name: str
    key_bits: int
    icv_bits: Optional[int] = None


@dataclass(frozen=True)
class Limits:
    """An SA's soft and hard limits (struct xfrm_lifetime_cfg), XFRM_INF for
    none: at a soft limit the kernel tells key managers (XFRM_MSG_EXPIRE),
    at a hard one it deletes the SA."""

    soft_bytes: int = XFRM_INF
    hard_bytes: int = XFRM_INF
    soft_packets: int = XFRM_INF
    hard_packets: int = XFRM_INF


@dataclass(frozen=True)
class Sa:
    src: str
    dst: str
    spi: int
    proto: str
    mode: str
    reqid: int
    dir: Optional[str]  # "in" / "out" when the SA says (XFRMA_SA_DIR or offload flags)
    offload: Optional[Offload]
    algs: Tuple[Alg, ...] = ()
    replay_window: int = 0  # packets; 0: no anti-replay
    esn: bool = False       # XFRM_STATE_ESN: 64-bit sequence numbers
    # xfrm_lifetime_cfg's soft/hard byte and packet limits, XFRM_INF for none.
    limits: Limits = Limits()

    def label(self) -> str:
        """How reports name the SA: "198.18.0.1 > 198.18.0.2 esp spi 0x00001000 out"."""
        text = f"{self.src} > {self.dst} {self.proto} spi 0x{self.spi:08x}"
        return f"{text} {self.dir}" if self.dir else text


@dataclass(frozen=True)
class Template:
    src: str
    dst: str
    proto: str
    spi: int
    mode: str
    reqid: int


@dataclass(frozen=True)
class Policy:
    src: str  # selector, "198.18.0.1/32"
    dst: str
    dir: str
    priority: int
    index: int
    offload: Optional[Offload]
    templates: Tuple[Template, ...] = ()

    def label(self) -> str:
        return f"policy {self.src} > {self.dst} dir {self.dir}"


def _proto(number: int) -> str:
    return PROTOS.get(number, str(number))


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def _offload_of(m: nlmsg) -> Optional[Offload]:
    off = m.get_attr("XFRMA_OFFLOAD_DEV")
    if off is None:
        return None
    return Offload(off["ifindex"], bool(off["flags"] & XFRM_OFFLOAD_INBOUND),
                   bool(off["flags"] & XFRM_OFFLOAD_PACKET))


def sa_of(m: xfrm_usersa_info) -> Sa:
    """The record of one decoded NEWSA message (algorithm names, no keys)."""
    family = m["family"]
    algs = []
    for attr in _ALGS:
        alg = m.get_attr(attr)
        if alg is None:
            continue
        kind = {"XFRMA_ALG_AEAD": "aead", "XFRMA_ALG_CRYPT": "enc",
                "XFRMA_ALG_COMP": "comp"}.get(attr, "auth")
        algs.append(Alg(kind, _name(alg["alg_name"]), alg["alg_key_len"],
                        alg.get("alg_icv_len") if attr in ("XFRMA_ALG_AEAD", "XFRMA_ALG_AUTH_TRUNC")
                        else None))
    offload = _offload_of(m)
    direction = XFRM_SA_DIR.get(m.get_attr("XFRMA_SA_DIR"))
    if direction is None and offload is not None:
        direction = "in" if offload.inbound else "out"
    esn = m.get_attr("XFRMA_REPLAY_ESN_VAL")
    return Sa(src=address(m["saddr"], family), dst=address(m["daddr"], family),
              spi=m["spi"], proto=_proto(m["proto"]), mode=MODES.get(m["mode"], str(m["mode"])),
              reqid=m["reqid"], dir=direction, offload=offload, algs=tuple(algs),
              replay_window=esn["replay_window"] if esn is not None else m["replay_window"],
              esn=bool(m["flags"] & XFRM_STATE_ESN),
              limits=Limits(*_LFT_LIMITS.unpack_from(m["lft"])))


def decode_sa(raw: bytes) -> Sa:
    """An Sa from the bytes of one XFRM_MSG_NEWSA message."""
    m = xfrm_usersa_info(raw)
    m.decode()
    return sa_of(m)


def _templates(raw: Optional[bytes]) -> Tuple[Template, ...]:
    out = []
    for off in range(0, len(raw or b"") - _TMPL.size + 1, _TMPL.size):
        (daddr, spi, proto, family, saddr, reqid, mode, _share, _optional,
         _a, _e, _c) = _TMPL.unpack_from(raw, off)
        out.append(Template(address(saddr, family), address(daddr, family), _proto(proto),
                            struct.unpack(">I", spi)[0], MODES.get(mode, str(mode)), reqid))
    return tuple(out)


def policy_of(m: xfrm_userpolicy_info) -> Policy:
    family = m["sel_family"]
    return Policy(src=f"{address(m['sel_saddr'], family)}/{m['sel_prefixlen_s']}",
                  dst=f"{address(m['sel_daddr'], family)}/{m['sel_prefixlen_d']}",
                  dir=POLICY_DIR.get(m["dir"], str(m["dir"])), priority=m["priority"],
                  index=m["index"], offload=_offload_of(m),
                  templates=_templates(m.get_attr("XFRMA_TMPL")))


class Xfrm:
    """One NETLINK_XFRM socket, bound to the caller's namespace."""

    def __init__(self, opener=None):
        self._nl = NetlinkSocket(NETLINK_XFRM, opener=opener)

    def close(self) -> None:
        self._nl.close()

    def __enter__(self) -> "Xfrm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _scrub(self) -> None:
        # The last datagrams read (key bytes included) stay in the socket's
        # receive buffer until the next read: overwrite them now.
        buf = getattr(self._nl, "_buf", None)
        if isinstance(buf, bytearray):
            buf[:] = bytes(len(buf))

    def sas(self) -> List[Sa]:
        """Every SA of the namespace (XFRM_MSG_GETSA dump)."""
        try:
            replies = self._nl.dump(_dump_request(), XFRM_MSG_GETSA,
                                    {XFRM_MSG_NEWSA: xfrm_usersa_info})
            return [sa_of(m) for m in replies]
        finally:
            replies = None
            self._scrub()

    def policies(self) -> List[Policy]:
        """Every policy of the namespace (XFRM_MSG_GETPOLICY dump)."""
        replies = self._nl.dump(_dump_request(), XFRM_MSG_GETPOLICY,
                                {XFRM_MSG_NEWPOLICY: xfrm_userpolicy_info})
        return [policy_of(m) for m in replies]

    # -- writes (knobs/ipsec.py) --
    def add_sa(self, msg: xfrm_usersa_new) -> None:
        try:
            self._nl.request(msg, XFRM_MSG_NEWSA, NLM_F_REQUEST | NLM_F_ACK)
        finally:
            scrub(msg)
            self._scrub()

    def del_sa(self, src: str, dst: str, spi: int, proto: str = "esp") -> None:
        self._nl.request(delsa_message(src, dst, spi, proto), XFRM_MSG_DELSA,
                         NLM_F_REQUEST | NLM_F_ACK)

    def add_policy(self, msg: xfrm_userpolicy_new) -> None:
        self._nl.request(msg, XFRM_MSG_NEWPOLICY, NLM_F_REQUEST | NLM_F_ACK)

    def del_policy(self, src: str, dst: str, direction: str) -> None:
        self._nl.request(delpolicy_message(src, dst, direction), XFRM_MSG_DELPOLICY,
                         NLM_F_REQUEST | NLM_F_ACK)


# -- writes ------------------------------------------------------------------

# As iproute2: no CREATE/EXCL; a NEWSA / NEWPOLICY (not UPDSA / UPDPOLICY)
# is refused with EEXIST when the SA or policy exists.
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
SA_DIRS = {"in": 1, "out": 2}
_MODE_NUMBERS = {"transport": 0, "tunnel": 1}
_PROTO_NUMBERS = {"esp": 50}
_POLICY_DIRS = {v: k for k, v in POLICY_DIR.items()}
# struct xfrm_lifetime_cfg as iproute2 leaves it: byte and packet limits
# XFRM_INF, no expiry times; then a zero xfrm_lifetime_cur.
_LFT_INF = struct.pack("=QQQQQQQQ", XFRM_INF, XFRM_INF, XFRM_INF, XFRM_INF, 0, 0, 0, 0)
_LEGACY_WINDOW = 32  # bits of struct xfrm_replay_state's bitmap


def _lifetime_cfg(limits: Limits) -> bytes:
    """struct xfrm_lifetime_cfg with these limits and no expiry times."""
    return _LFT_LIMITS.pack(limits.soft_bytes, limits.hard_bytes, limits.soft_packets,
                            limits.hard_packets) + bytes(32)
_AEAD_HEAD = struct.Struct("=64sII")  # struct xfrm_algo_aead before alg_key[]
# NEWSA message id -> the bytearray its XFRMA_ALG_AEAD holds (key included),
# for scrub() to overwrite.
_KEY_BUFFERS: dict = {}


def _family_of(*texts: str) -> int:
    versions = {ipaddress.ip_address(t.split("/")[0]).version for t in texts}
    if len(versions) != 1:
        raise ValueError(f"addresses of two families: {', '.join(texts)}")
    return socket.AF_INET6 if versions == {6} else socket.AF_INET


def _packed(text: str) -> bytes:
    return ipaddress.ip_address(text).packed.ljust(16, b"\0")


class xfrm_usersa_new(nlmsg):
    """XFRM_MSG_NEWSA as written: the algorithm attribute is raw (its key
    included), unlike xfrm_usersa_info's decoder, which maps no key."""

    fields = xfrm_usersa_info.fields
    nla_map = (
        (18, "XFRMA_ALG_AEAD", "cdata"),
        (23, "XFRMA_REPLAY_ESN_VAL", "_replay_esn"),
        (28, "XFRMA_OFFLOAD_DEV", "_offload"),
        (33, "XFRMA_SA_DIR", "uint8"),  # uapi xfrm.h: after IF_ID (31), MTIMER_THRESH (32)
    )
    _offload, _replay_esn = _offload, _replay_esn


class xfrm_usersa_id(nlmsg):
    """XFRM_MSG_DELSA: daddr, spi, family, proto (struct xfrm_usersa_id)."""

    fields = (("daddr", "16s"), ("spi", ">I"), ("family", "H"), ("proto", "B"), ("__pad", "x"))
    nla_map = ((13, "XFRMA_SRCADDR", "cdata"),)


class xfrm_userpolicy_new(nlmsg):
    fields = xfrm_userpolicy_info.fields
    nla_map = (
        (5, "XFRMA_TMPL", "cdata"),
        (28, "XFRMA_OFFLOAD_DEV", "_offload"),
    )
    _offload = _offload


class xfrm_userpolicy_id(nlmsg):
    """XFRM_MSG_DELPOLICY: selector, index, dir (struct xfrm_userpolicy_id)."""

    fields = _SELECTOR + (("index", "I"), ("dir", "B"), ("__pad", "3x"))
    nla_map = ()


def _selector(src: str, dst: str) -> dict:
    """Selector fields of "198.18.0.1/32" > "198.18.0.2/32" (any proto, port)."""
    s, d = ipaddress.ip_network(src, strict=True), ipaddress.ip_network(dst, strict=True)
    return {"sel_saddr": _packed(str(s.network_address)), "sel_prefixlen_s": s.prefixlen,
            "sel_daddr": _packed(str(d.network_address)), "sel_prefixlen_d": d.prefixlen,
            "sel_family": _family_of(src, dst), "sel_dport": 0, "sel_dport_mask": 0,
            "sel_sport": 0, "sel_sport_mask": 0, "sel_proto": 0, "sel_ifindex": 0,
            "sel_user": 0}


_EMPTY_SELECTOR = {"sel_saddr": bytes(16), "sel_daddr": bytes(16), "sel_prefixlen_s": 0,
                   "sel_prefixlen_d": 0, "sel_family": 0, "sel_dport": 0, "sel_dport_mask": 0,
                   "sel_sport": 0, "sel_sport_mask": 0, "sel_proto": 0, "sel_ifindex": 0,
                   "sel_user": 0}


def newsa_message(src: str, dst: str, spi: int, reqid: int, mode: str, aead: str,
                  icv_bits: int, key: bytearray, offload: Optional[Tuple[int, str, bool]] = None,
                  proto: str = "esp", replay_window: int = 0, esn: bool = False,
                  limits: Optional[Limits] = None) -> xfrm_usersa_new:
    """XFRM_MSG_NEWSA, as `ip xfrm state add src S dst D proto esp spi N
    reqid R mode M aead NAME KEY ICV [replay-window W] [flag esn] [limit
    byte-soft|byte-hard|packet-soft|packet-hard N ...] [offload [packet] dev
    X dir out|in]`.  offload: (ifindex, "out"|"in", packet).  The replay
    window goes where iproute2 puts it: in XFRMA_REPLAY_ESN_VAL (bitmap
    mode, bmp_len words) with ESN or above 32 packets, else in the header's
    replay_window.  `key` is the caller's; the returned message holds a
    copy of it until scrub()."""
    esn_attr = esn or replay_window > _LEGACY_WINDOW
    msg = xfrm_usersa_new()
    msg.update({**_EMPTY_SELECTOR, "daddr": _packed(dst), "spi": spi,
                "proto": _PROTO_NUMBERS[proto], "saddr": _packed(src),
                "lft": _lifetime_cfg(limits or Limits()), "curlft": bytes(32),
                "stats": bytes(12), "seq": 0,
                "reqid": reqid, "family": _family_of(src, dst), "mode": _MODE_NUMBERS[mode],
                "replay_window": 0 if esn_attr else replay_window,
                "flags": XFRM_STATE_ESN if esn else 0})
    alg = bytearray(_AEAD_HEAD.pack(aead.encode("ascii"), len(key) * 8, icv_bits))
    alg += key
    _KEY_BUFFERS[id(msg)] = alg
    attrs: list = [("XFRMA_ALG_AEAD", alg)]
    if esn_attr:
        attrs.append(("XFRMA_REPLAY_ESN_VAL", {
            "bmp_len": (replay_window + 31) // 32, "oseq": 0, "seq": 0, "oseq_hi": 0,
            "seq_hi": 0, "replay_window": replay_window}))
    if offload is not None:
        ifindex, direction, packet = offload
        flags = (XFRM_OFFLOAD_INBOUND if direction == "in" else 0) | (
            XFRM_OFFLOAD_PACKET if packet else 0)
        attrs.append(("XFRMA_OFFLOAD_DEV", {"ifindex": ifindex, "flags": flags}))
    msg["attrs"] = attrs
    return msg


def delsa_message(src: str, dst: str, spi: int, proto: str = "esp") -> xfrm_usersa_id:
    """XFRM_MSG_DELSA, as `ip xfrm state delete src S dst D proto esp spi N`
    (the kernel finds an ESP SA by dst, spi and proto; iproute2 sends the
    source too)."""
    msg = xfrm_usersa_id()
    msg.update({"daddr": _packed(dst), "spi": spi, "family": _family_of(dst),
                "proto": _PROTO_NUMBERS[proto]})
    msg["attrs"] = [("XFRMA_SRCADDR", _packed(src))]
    return msg


def template_bytes(src: str, dst: str, reqid: int, mode: str, proto: str = "esp") -> bytes:
    """One struct xfrm_user_tmpl as `tmpl src S dst D proto esp reqid R mode
    M` lays it out (spi 0: any; every algorithm allowed)."""
    return _TMPL.pack(_packed(dst), bytes(4), _PROTO_NUMBERS[proto], _family_of(src, dst),
                      _packed(src), reqid, _MODE_NUMBERS[mode], 0, 0,
                      0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


def newpolicy_message(src: str, dst: str, direction: str, templates: List[bytes],
                      priority: int = 0, offload: Optional[int] = None) -> xfrm_userpolicy_new:
    """XFRM_MSG_NEWPOLICY, as `ip xfrm policy add src S dst D dir X tmpl
    ...` (action allow); offload: the ifindex for `offload packet dev X`."""
    msg = xfrm_userpolicy_new()
    msg.update({**_selector(src, dst), "lft": _LFT_INF, "curlft": bytes(32),
                "priority": priority, "index": 0, "dir": _POLICY_DIRS[direction],
                "action": 0, "flags": 0, "share": 0})
    attrs: list = [("XFRMA_TMPL", b"".join(templates))]
    if offload is not None:
        flags = XFRM_OFFLOAD_PACKET | (XFRM_OFFLOAD_INBOUND if direction != "out" else 0)
        attrs.append(("XFRMA_OFFLOAD_DEV", {"ifindex": offload, "flags": flags}))
    msg["attrs"] = attrs
    return msg


def delpolicy_message(src: str, dst: str, direction: str) -> xfrm_userpolicy_id:
    """XFRM_MSG_DELPOLICY, as `ip xfrm policy delete src S dst D dir X`."""
    msg = xfrm_userpolicy_id()
    msg.update({**_selector(src, dst), "index": 0, "dir": _POLICY_DIRS[direction]})
    msg["attrs"] = []
    return msg


def scrub(msg) -> None:
    """Overwrite the encoded datagram and the key-carrying attribute of a
    NEWSA message (add_sa() calls it whatever happened)."""
    data = getattr(msg, "data", None)
    if isinstance(data, bytearray):
        data[:] = bytes(len(data))
    alg = _KEY_BUFFERS.pop(id(msg), None)
    if alg is not None:
        alg[:] = bytes(len(alg))
    try:
        msg["attrs"] = []
    except Exception:  # noqa: BLE001 - best effort on a message being dropped
        pass
