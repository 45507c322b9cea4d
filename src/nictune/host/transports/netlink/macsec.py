"""MACsec: the rtnetlink link kind `macsec` and the `macsec` generic
netlink family (SAs, RX SCs, offload), written on pyroute2's nla/genlmsg.

pyroute2 has neither.  Ids are from include/uapi/linux/if_link.h
(IFLA_MACSEC_*, enum macsec_offload) and include/uapi/linux/if_macsec.h
(MACSEC_ATTR_*, MACSEC_SECY_ATTR_*, MACSEC_RXSC_ATTR_*, MACSEC_SA_ATTR_*,
MACSEC_OFFLOAD_ATTR_*, enum macsec_nl_commands).  Layouts follow
iproute2 6.1 (ip/ipmacsec.c), and tests/recorded/test_macsec.py checks them
byte for byte against what `ip link add ... type macsec` and `ip macsec
add/offload/show` sent (tests/recorded/macsec/requests.json):

- RTM_NEWLINK (REQUEST|ACK|CREATE|EXCL): IFLA_LINK, IFLA_IFNAME, then
  IFLA_LINKINFO { INFO_KIND "macsec", INFO_DATA { SCI (8 bytes: MAC then
  port, both network order) or PORT (be16), ENCRYPT (u8), OFFLOAD (u8),
  CIPHER_SUITE (u64), ICV_LEN (u8) } }, nests without NLA_F_NESTED;
- genl (version 1): MACSEC_ATTR_IFINDEX first, then RXSC_CONFIG { SCI },
  then SA_CONFIG { AN u8, PN u32, KEYID 16 bytes, KEY, ACTIVE u8 }, or
  OFFLOAD { TYPE u8 }.  The extended-packet-number suites (gcm-aes-xpn-128,
  gcm-aes-xpn-256: MACSEC_CIPHER_ID_GCM_AES_XPN_128/256) take a 64-bit PN
  (MACSEC_XPN_PN_LEN) and need SSCI (u32) and SALT (12 bytes) in every SA
  (drivers/net/macsec.c macsec_add_txsa/macsec_add_rxsa: EINVAL without
  them); SA_CONFIG is then { AN, PN u64, SSCI, SALT, KEYID, KEY, ACTIVE }.
  SSCI is big-endian (ssci_t goes into the nonce as it is; iproute2 reads
  it with get_be32 and prints ntohl of it): 1 given to `ip macsec ... ssci
  1` and 1 given here are the same SSCI.
  A dump's PN is 4 or 8 bytes (dump_secy: pn_len by secy->xpn), read by
  its length.

Keys.  The only attribute that carries key bytes is MACSEC_SA_ATTR_KEY in
an ADD_TXSA / ADD_RXSA request.  The encoder takes the key as a bytearray
the caller owns; send_sa() overwrites the encoded datagram and the
message's attribute list right after the kernel answered, and never
formats the message (no repr, no log).  The kernel never returns keys
(macsec's dump_secy puts AN, PN, KEYID, ACTIVE and stats per SA), and the
decoder's SA class maps only those: nothing here reads a key back.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from nictune.host.transports.netlink._pyroute2 import genlmsg, nla, nlmsg
from nictune.host.transports.netlink.genl import resolve_family
from nictune.host.transports.netlink.socket import (
    NETLINK_GENERIC,
    NETLINK_ROUTE,
    NLM_F_ACK,
    NLM_F_REQUEST,
    NetlinkSocket,
)

MACSEC_GENL_VERSION = 1

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400

# enum macsec_nl_commands
CMD_GET_TXSC, CMD_ADD_RXSC, CMD_DEL_RXSC, CMD_UPD_RXSC = 0, 1, 2, 3
CMD_ADD_TXSA, CMD_DEL_TXSA, CMD_UPD_TXSA = 4, 5, 6
CMD_ADD_RXSA, CMD_DEL_RXSA, CMD_UPD_RXSA = 7, 8, 9
CMD_UPD_OFFLOAD = 10

# include/uapi/linux/if_macsec.h MACSEC_CIPHER_ID_*
CIPHERS = {"gcm-aes-128": 0x0080C20001000001, "gcm-aes-256": 0x0080C20001000002,
           "gcm-aes-xpn-128": 0x0080C20001000003, "gcm-aes-xpn-256": 0x0080C20001000004}
XPN = ("gcm-aes-xpn-128", "gcm-aes-xpn-256")
SALT_LEN = 12  # MACSEC_SALT_LEN
PN_MAX = {False: 0xFFFFFFFF, True: 0xFFFFFFFFFFFFFFFF}  # by XPN
# What the kernel reports (macsec_fill_info, dump_secy): gcm-aes-128 as the
# deprecated MACSEC_DEFAULT_CIPHER_ID, whatever was asked (seen on 6.12).
SUITE_NAMES = {**{v: k for k, v in CIPHERS.items()}, 0x0080020001000001: "gcm-aes-128"}
KEY_LENGTHS = {"gcm-aes-128": 16, "gcm-aes-256": 32, "gcm-aes-xpn-128": 16, "gcm-aes-xpn-256": 32}
OFFLOAD = {"off": 0, "phy": 1, "mac": 2}  # enum macsec_offload
VALIDATE = {0: "disabled", 1: "check", 2: "strict"}
KEYID_LEN = 16
MAX_RXSC_DUMP = 64  # list items decoded per RXSC/SA list (the kernel numbers them 1..n)

_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


def sci_bytes(mac: str, port: int) -> bytes:
    """The 64-bit SCI as it goes on the wire: the MAC, then the port (be16)."""
    if not isinstance(mac, str) or not _MAC.match(mac):
        raise ValueError(f"not a MAC address: {mac!r}")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 0xFFFF:
        raise ValueError(f"MACsec port must be 1..65535, got {port!r}")
    return bytes.fromhex(mac.replace(":", "")) + port.to_bytes(2, "big")


def sci_text(raw: bytes) -> str:
    """8 SCI bytes as `ip macsec show` prints them (hex, MAC first)."""
    return bytes(raw).hex()


# -- rtnetlink: the macsec link -------------------------------------------------


class macsec_data(nla):
    """IFLA_INFO_DATA of kind macsec (if_link.h, IFLA_MACSEC_*)."""

    nla_map = (
        (1, "IFLA_MACSEC_SCI", "cdata"),
        (2, "IFLA_MACSEC_PORT", "be16"),
        (3, "IFLA_MACSEC_ICV_LEN", "uint8"),
        (4, "IFLA_MACSEC_CIPHER_SUITE", "uint64"),
        (5, "IFLA_MACSEC_WINDOW", "uint32"),
        (6, "IFLA_MACSEC_ENCODING_SA", "uint8"),
        (7, "IFLA_MACSEC_ENCRYPT", "uint8"),
        (8, "IFLA_MACSEC_PROTECT", "uint8"),
        (9, "IFLA_MACSEC_INC_SCI", "uint8"),
        (10, "IFLA_MACSEC_ES", "uint8"),
        (11, "IFLA_MACSEC_SCB", "uint8"),
        (12, "IFLA_MACSEC_REPLAY_PROTECT", "uint8"),
        (13, "IFLA_MACSEC_VALIDATION", "uint8"),
        (15, "IFLA_MACSEC_OFFLOAD", "uint8"),
    )


class macseclinkmsg(nlmsg):
    """struct ifinfomsg with the attributes a macsec link needs."""

    fields = (
        ("family", "B"),
        ("__align", "x"),
        ("ifi_type", "H"),
        ("index", "i"),
        ("flags", "I"),
        ("change", "I"),
    )
    nla_map = (
        (1, "IFLA_ADDRESS", "cdata"),
        (3, "IFLA_IFNAME", "asciiz"),
        (4, "IFLA_MTU", "uint32"),
        (5, "IFLA_LINK", "uint32"),
        (18, "IFLA_LINKINFO", "linkinfo"),
        (29, "IFLA_EXT_MASK", "uint32"),
    )

    class linkinfo(nla):
        # iproute2 sends the nest without NLA_F_NESTED (the kernel takes
        # both) and the kind without its NUL (addattr_l(strlen)); the
        # kernel's replies carry the NUL, which decode_link strips.
        nla_map = (
            (1, "IFLA_INFO_KIND", "string"),
            (2, "IFLA_INFO_DATA", "macsec_data"),
        )

        macsec_data = macsec_data


def link_add_message(link_index: int, name: str, *, port: Optional[int] = None,
                     sci: Optional[bytes] = None, encrypt: Optional[bool] = None,
                     offload: Optional[str] = None, cipher: Optional[str] = None,
                     icv_len: Optional[int] = None) -> macseclinkmsg:
    """RTM_NEWLINK for `ip link add link <link> <name> type macsec ...`,
    attributes in the order iproute2 lays them out (see the module text)."""
    data: list = []
    if sci is not None:
        data.append(("IFLA_MACSEC_SCI", bytes(sci)))
    elif port is not None:
        data.append(("IFLA_MACSEC_PORT", int(port)))
    if encrypt is not None:
        data.append(("IFLA_MACSEC_ENCRYPT", int(bool(encrypt))))
    if offload is not None:
        data.append(("IFLA_MACSEC_OFFLOAD", OFFLOAD[offload]))
    if cipher is not None:
        data.append(("IFLA_MACSEC_CIPHER_SUITE", CIPHERS[cipher]))
    if icv_len is not None:
        data.append(("IFLA_MACSEC_ICV_LEN", int(icv_len)))
    msg = macseclinkmsg()
    msg["attrs"] = [
        ("IFLA_LINK", int(link_index)),
        ("IFLA_IFNAME", name),
        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "macsec"),
                                     ("IFLA_INFO_DATA", {"attrs": data})]}),
    ]
    return msg


@dataclass
class MacsecLink:
    index: int
    name: str
    link: Optional[int]          # IFLA_LINK: the ifindex of the real device
    up: bool
    mtu: Optional[int]
    sci: Optional[str]           # hex, as ip macsec show prints it
    port: Optional[int]
    cipher: Optional[str]
    icv_len: Optional[int]
    encrypt: Optional[bool]
    offload: Optional[str]


def _suite(suite: Optional[int]) -> Optional[str]:
    return None if suite is None else SUITE_NAMES.get(suite, f"{suite:#x}")


def _bool(value) -> Optional[bool]:
    return None if value is None else bool(value)


def decode_link(msg) -> Optional[MacsecLink]:
    """A MacsecLink from an RTM_NEWLINK reply, or None for another kind."""
    info = msg.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    if kind is None or kind.rstrip("\0") != "macsec":
        return None
    data = info.get_attr("IFLA_INFO_DATA")
    get = data.get_attr if data is not None else (lambda _name: None)
    sci = get("IFLA_MACSEC_SCI")
    suite = get("IFLA_MACSEC_CIPHER_SUITE")
    offload = get("IFLA_MACSEC_OFFLOAD")
    return MacsecLink(
        index=msg["index"],
        name=msg.get_attr("IFLA_IFNAME"),
        link=msg.get_attr("IFLA_LINK"),
        up=bool(msg["flags"] & 1),
        mtu=msg.get_attr("IFLA_MTU"),
        sci=sci_text(sci) if sci else None,
        port=int.from_bytes(sci[6:8], "big") if sci and len(sci) == 8 else None,
        cipher=_suite(suite),
        icv_len=get("IFLA_MACSEC_ICV_LEN"),
        encrypt=_bool(get("IFLA_MACSEC_ENCRYPT")),
        offload=next((k for k, v in OFFLOAD.items() if v == offload), None if offload is None
                     else str(offload)),
    )


# -- generic netlink: SAs, RX SCs, offload ---------------------------------------


class macsecmsg(genlmsg):
    """MACSEC_ATTR_* of if_macsec.h.  SA classes map AN, ACTIVE, PN and
    KEYID (and KEY for requests); dump replies never carry a key."""

    nla_map = (
        (1, "MACSEC_ATTR_IFINDEX", "uint32"),
        (2, "MACSEC_ATTR_RXSC_CONFIG", "rxsc"),
        (3, "MACSEC_ATTR_SA_CONFIG", "sa"),
        (4, "MACSEC_ATTR_SECY", "secy"),
        (5, "MACSEC_ATTR_TXSA_LIST", "sa_list"),
        (6, "MACSEC_ATTR_RXSC_LIST", "rxsc_list"),
        (9, "MACSEC_ATTR_OFFLOAD", "offload"),
    )

    class sa(nla):
        # PN goes as bytes in host order: 4 (u32), or 8 (u64) on an XPN link.
        nla_map = (
            (1, "MACSEC_SA_ATTR_AN", "uint8"),
            (2, "MACSEC_SA_ATTR_ACTIVE", "uint8"),
            (3, "MACSEC_SA_ATTR_PN", "cdata"),
            (4, "MACSEC_SA_ATTR_KEY", "cdata"),
            (5, "MACSEC_SA_ATTR_KEYID", "cdata"),
            (8, "MACSEC_SA_ATTR_SSCI", "be32"),
            (9, "MACSEC_SA_ATTR_SALT", "cdata"),
        )

    class sa_dumped(nla):
        # What a dump carries; no KEY or SALT entry, so nothing could decode
        # one.  PN is 4 bytes, or 8 on an XPN link: cdata, read by length.
        nla_map = (
            (1, "MACSEC_SA_ATTR_AN", "uint8"),
            (2, "MACSEC_SA_ATTR_ACTIVE", "uint8"),
            (3, "MACSEC_SA_ATTR_PN", "cdata"),
            (5, "MACSEC_SA_ATTR_KEYID", "cdata"),
            (8, "MACSEC_SA_ATTR_SSCI", "be32"),
        )

    class sa_list(nla):
        pass

    class rxsc(nla):
        nla_map = (
            (1, "MACSEC_RXSC_ATTR_SCI", "cdata"),
            (2, "MACSEC_RXSC_ATTR_ACTIVE", "uint8"),
            (3, "MACSEC_RXSC_ATTR_SA_LIST", "sa_list"),
        )

    class rxsc_list(nla):
        pass

    class secy(nla):
        nla_map = (
            (1, "MACSEC_SECY_ATTR_SCI", "cdata"),
            (2, "MACSEC_SECY_ATTR_ENCODING_SA", "uint8"),
            (3, "MACSEC_SECY_ATTR_WINDOW", "uint32"),
            (4, "MACSEC_SECY_ATTR_CIPHER_SUITE", "uint64"),
            (5, "MACSEC_SECY_ATTR_ICV_LEN", "uint8"),
            (6, "MACSEC_SECY_ATTR_PROTECT", "uint8"),
            (7, "MACSEC_SECY_ATTR_REPLAY", "uint8"),
            (8, "MACSEC_SECY_ATTR_OPER", "uint8"),
            (9, "MACSEC_SECY_ATTR_VALIDATE", "uint8"),
            (10, "MACSEC_SECY_ATTR_ENCRYPT", "uint8"),
            (11, "MACSEC_SECY_ATTR_INC_SCI", "uint8"),
            (12, "MACSEC_SECY_ATTR_ES", "uint8"),
            (13, "MACSEC_SECY_ATTR_SCB", "uint8"),
        )

    class offload(nla):
        nla_map = ((1, "MACSEC_OFFLOAD_ATTR_TYPE", "uint8"),)


# List nests number their items 1..n (dump_secy: nla_nest_start(skb, j++)).
macsecmsg.sa_list.nla_map = tuple((i, "SA", "sa_dumped") for i in range(1, MAX_RXSC_DUMP + 1))
macsecmsg.sa_list.sa_dumped = macsecmsg.sa_dumped
macsecmsg.rxsc_list.nla_map = tuple((i, "RXSC", "rxsc") for i in range(1, MAX_RXSC_DUMP + 1))
macsecmsg.rxsc_list.rxsc = macsecmsg.rxsc
macsecmsg.rxsc.sa_list = macsecmsg.sa_list


def _genl(cmd: int, attrs: list) -> macsecmsg:
    msg = macsecmsg()
    msg["cmd"] = cmd
    msg["version"] = MACSEC_GENL_VERSION
    msg["attrs"] = attrs
    return msg


def key_id(raw: bytes) -> bytes:
    """A KEYID attribute: up to 16 bytes, zero-padded on the right as
    iproute2 pads `key <id> <key>`."""
    if len(raw) > KEYID_LEN:
        raise ValueError("a MACsec key id is at most 16 bytes")
    return bytes(raw) + bytes(KEYID_LEN - len(raw))


def sa_message(cmd: int, ifindex: int, an: int, pn: int, keyid: bytes, key: bytearray,
               rx_sci: Optional[bytes] = None, active: bool = True,
               xpn: Optional[tuple] = None) -> macsecmsg:
    """ADD_TXSA (rx_sci None) or ADD_RXSA, as `ip macsec add <if> tx sa <an>
    pn <pn> on key <id> <key>` / `... rx sci <sci> sa <an> ...` lay it out.
    On an XPN link `xpn` is (ssci, salt): the PN goes as 64 bits, then SSCI
    and SALT (`... xpn <pn> ssci <ssci> salt <salt> on key ...`)."""
    if not 0 <= an <= 3:
        raise ValueError(f"MACsec association number must be 0..3, got {an!r}")
    most = PN_MAX[xpn is not None]
    if not isinstance(pn, int) or not 1 <= pn <= most:
        raise ValueError(f"MACsec packet number must be 1..{most}, got {pn!r}")
    sa: list = [("MACSEC_SA_ATTR_AN", an),
                ("MACSEC_SA_ATTR_PN", pn.to_bytes(8 if xpn else 4, sys.byteorder))]
    if xpn is not None:
        ssci, salt = xpn
        if not isinstance(ssci, int) or not 0 <= ssci <= 0xFFFFFFFF:
            raise ValueError(f"MACsec SSCI must be a 32-bit number, got {ssci!r}")
        if len(salt) != SALT_LEN:
            raise ValueError(f"a MACsec XPN salt is {SALT_LEN} bytes, got {len(salt)}")
        sa += [("MACSEC_SA_ATTR_SSCI", ssci), ("MACSEC_SA_ATTR_SALT", bytes(salt))]
    sa += [("MACSEC_SA_ATTR_KEYID", key_id(keyid)),
           ("MACSEC_SA_ATTR_KEY", key),
           ("MACSEC_SA_ATTR_ACTIVE", int(active))]
    attrs: list = [("MACSEC_ATTR_IFINDEX", ifindex)]
    if rx_sci is not None:
        attrs.append(("MACSEC_ATTR_RXSC_CONFIG", {"attrs": [("MACSEC_RXSC_ATTR_SCI", rx_sci)]}))
    attrs.append(("MACSEC_ATTR_SA_CONFIG", {"attrs": sa}))
    return _genl(cmd, attrs)


def rxsc_message(ifindex: int, sci: bytes, active: Optional[bool] = None) -> macsecmsg:
    """ADD_RXSC, as `ip macsec add <if> rx port <p> address <mac>`."""
    rx: list = [("MACSEC_RXSC_ATTR_SCI", sci)]
    if active is not None:
        rx.append(("MACSEC_RXSC_ATTR_ACTIVE", int(active)))
    return _genl(CMD_ADD_RXSC, [("MACSEC_ATTR_IFINDEX", ifindex),
                                ("MACSEC_ATTR_RXSC_CONFIG", {"attrs": rx})])


def offload_message(ifindex: int, mode: str) -> macsecmsg:
    """UPD_OFFLOAD, as `ip macsec offload <if> off|phy|mac`."""
    return _genl(CMD_UPD_OFFLOAD, [("MACSEC_ATTR_IFINDEX", ifindex),
                                   ("MACSEC_ATTR_OFFLOAD", {"attrs": [
                                       ("MACSEC_OFFLOAD_ATTR_TYPE", OFFLOAD[mode])]})])


def dump_message() -> macsecmsg:
    """GET_TXSC dump of every SecY, as `ip macsec show` asks it."""
    return _genl(CMD_GET_TXSC, [])


@dataclass
class Sa:
    an: int
    active: bool
    pn: Optional[int]
    keyid: str  # hex, never the key
    ssci: Optional[int] = None  # XPN links only


@dataclass
class RxSc:
    sci: str
    active: bool
    sas: List[Sa] = field(default_factory=list)


@dataclass
class SecY:
    ifindex: int
    sci: Optional[str]
    cipher: Optional[str]
    icv_len: Optional[int]
    encrypt: Optional[bool]
    validate: Optional[str]
    encoding_sa: Optional[int]
    offload: Optional[str]
    tx_sas: List[Sa] = field(default_factory=list)
    rx_scs: List[RxSc] = field(default_factory=list)


def _sas(nest) -> List[Sa]:
    out = []
    if nest is None:
        return out
    for item in nest.get_attrs("SA"):
        kid = item.get_attr("MACSEC_SA_ATTR_KEYID")
        pn = item.get_attr("MACSEC_SA_ATTR_PN")
        out.append(Sa(an=item.get_attr("MACSEC_SA_ATTR_AN"),
                      active=bool(item.get_attr("MACSEC_SA_ATTR_ACTIVE")),
                      pn=int.from_bytes(bytes(pn), sys.byteorder) if pn else None,
                      keyid=bytes(kid).hex() if kid else "",
                      ssci=item.get_attr("MACSEC_SA_ATTR_SSCI")))
    return out


def decode_secy(msg) -> SecY:
    secy = msg.get_attr("MACSEC_ATTR_SECY")
    get = secy.get_attr if secy is not None else (lambda _n: None)
    off = msg.get_attr("MACSEC_ATTR_OFFLOAD")
    off_type = off.get_attr("MACSEC_OFFLOAD_ATTR_TYPE") if off is not None else None
    suite = get("MACSEC_SECY_ATTR_CIPHER_SUITE")
    sci = get("MACSEC_SECY_ATTR_SCI")
    rx_list = msg.get_attr("MACSEC_ATTR_RXSC_LIST")
    rx = []
    for item in (rx_list.get_attrs("RXSC") if rx_list is not None else []):
        rsci = item.get_attr("MACSEC_RXSC_ATTR_SCI")
        rx.append(RxSc(sci=sci_text(rsci) if rsci else "",
                       active=bool(item.get_attr("MACSEC_RXSC_ATTR_ACTIVE")),
                       sas=_sas(item.get_attr("MACSEC_RXSC_ATTR_SA_LIST"))))
    validate = get("MACSEC_SECY_ATTR_VALIDATE")
    return SecY(
        ifindex=msg.get_attr("MACSEC_ATTR_IFINDEX"),
        sci=sci_text(sci) if sci else None,
        cipher=_suite(suite),
        icv_len=get("MACSEC_SECY_ATTR_ICV_LEN"),
        encrypt=_bool(get("MACSEC_SECY_ATTR_ENCRYPT")),
        validate=VALIDATE.get(validate) if validate is not None else None,
        encoding_sa=get("MACSEC_SECY_ATTR_ENCODING_SA"),
        offload=next((k for k, v in OFFLOAD.items() if v == off_type),
                     None if off_type is None else str(off_type)),
        tx_sas=_sas(msg.get_attr("MACSEC_ATTR_TXSA_LIST")),
        rx_scs=rx,
    )


def scrub(msg) -> None:
    """Overwrite the encoded datagram and drop the attribute values of a
    message that carried a key (send_sa calls it whatever happened)."""
    data = getattr(msg, "data", None)
    if isinstance(data, bytearray):
        data[:] = bytes(len(data))
    try:
        msg["attrs"] = []
    except Exception:  # noqa: BLE001 - best effort on a message being dropped
        pass


class Macsec:
    """One generic netlink socket bound to the macsec family, and one
    rtnetlink socket for the link.  Resolving the family fails with ENOENT
    (a NetlinkError) when the macsec module is not loaded and cannot be:
    adding a macsec link loads it (rtnl-link-macsec alias)."""

    def __init__(self, opener=None):
        self._opener = opener
        self._rt = NetlinkSocket(NETLINK_ROUTE, {RTM_NEWLINK: macseclinkmsg}, opener)
        self._nl: Optional[NetlinkSocket] = None
        self._family: Optional[int] = None

    def close(self) -> None:
        self._rt.close()
        if self._nl is not None:
            self._nl.close()

    def __enter__(self) -> "Macsec":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _genl(self) -> NetlinkSocket:
        if self._nl is None:
            nl = NetlinkSocket(NETLINK_GENERIC, opener=self._opener)
            try:
                self._family = resolve_family(nl, "macsec")
            except BaseException:
                nl.close()
                raise
            self._nl = nl
        return self._nl

    def _send(self, msg) -> None:
        nl = self._genl()
        nl.request(msg, self._family, NLM_F_REQUEST | NLM_F_ACK, {self._family: macsecmsg})

    # -- links
    def links(self) -> List[MacsecLink]:
        msg = macseclinkmsg()
        msg["attrs"] = [("IFLA_EXT_MASK", 1 << 3)]  # RTEXT_FILTER_SKIP_STATS
        out = []
        for m in self._rt.dump(msg, RTM_GETLINK):
            link = decode_link(m)
            if link is not None:
                out.append(link)
        return out

    def add_link(self, link_index: int, name: str, **kw) -> None:
        msg = link_add_message(link_index, name, **kw)
        self._rt.request(msg, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)

    def del_link(self, index: int) -> None:
        msg = macseclinkmsg()
        msg["index"] = index
        msg["attrs"] = []
        self._rt.request(msg, RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK)

    def set_up(self, index: int) -> None:
        msg = macseclinkmsg()
        msg["index"] = index
        msg["flags"] = 1
        msg["change"] = 1
        msg["attrs"] = []
        self._rt.request(msg, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK)

    # -- SecY state
    def secys(self) -> Dict[int, SecY]:
        nl = self._genl()
        replies = nl.dump(dump_message(), self._family, {self._family: macsecmsg})
        return {s.ifindex: s for s in map(decode_secy, replies)}

    def set_offload(self, ifindex: int, mode: str) -> None:
        self._send(offload_message(ifindex, mode))

    def add_rxsc(self, ifindex: int, sci: bytes) -> None:
        self._send(rxsc_message(ifindex, sci))

    def add_sa(self, ifindex: int, an: int, pn: int, keyid: bytes, key: bytearray,
               rx_sci: Optional[bytes] = None, xpn: Optional[tuple] = None) -> None:
        """ADD_TXSA, or ADD_RXSA when rx_sci is given; xpn: (ssci, salt) on
        an XPN link.  The key buffer is the caller's; the datagram that
        carried it is overwritten here."""
        msg = sa_message(CMD_ADD_RXSA if rx_sci is not None else CMD_ADD_TXSA,
                         ifindex, an, pn, keyid, key, rx_sci, xpn=xpn)
        try:
            self._send(msg)
        finally:
            scrub(msg)
