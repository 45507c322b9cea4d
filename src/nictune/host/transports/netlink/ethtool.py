"""ethtool over generic netlink: features, rings, channels, coalesce, pause.

Message classes are defined here on _nlmsg.py's genlmsg/nla (pyroute2's own
ethtool module imports its asyncio socket, and has no features, channels,
coalesce or pause messages).  Attribute ids follow the kernel uapi header
include/uapi/linux/ethtool_netlink_generated.h: nla_map entries are listed
in enum order, so their position *is* the attribute id.

Keys of the returned/accepted dicts are the ethtool CLI parameter names
(`ethtool -G rx-jumbo`, `-C rx-usecs`, ...), so profiles can use them as is.

Dumps and devices without the operation: the kernel's dump loop skips a
device whose driver lacks the callback (-EOPNOTSUPP from prepare_data is
not propagated; net/ethtool/netlink.c ethnl_default_dumpit, since 5.7).
Tested on 6.18: a RINGS/COALESCE/PAUSE dump of a namespace holding only lo
and a veth ends with a clean NLMSG_DONE and no message, a CHANNELS dump
lists the veth but not lo.  So a device missing from a dump result does not
support that operation; a single-device GET/SET on it gives EOPNOTSUPP.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Dict, List, Set, Tuple

    _Spec = Dict[str, Tuple[str, bool, bool]]

from nictune.host.transports.netlink._nlmsg import NLA_F_NESTED, genlmsg, nla
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.genl import GenlFamily
from nictune.host.transports.netlink.names import param_value, validate_features, validate_ifname
from nictune.host.transports.netlink.socket import NLM_F_ACK, NLM_F_REQUEST

ETHTOOL_GENL_VERSION = 1

STRSET_GET = 1
FEATURES_GET, FEATURES_SET = 11, 12
RINGS_GET, RINGS_SET = 15, 16
CHANNELS_GET, CHANNELS_SET = 17, 18
COALESCE_GET, COALESCE_SET = 19, 20
PAUSE_GET, PAUSE_SET = 21, 22

ETHTOOL_FLAG_COMPACT_BITSETS = 1
ETH_SS_FEATURES = 4
# The kernel's feature set is NETDEV_FEATURE_COUNT bits (a u64 mask today):
# a count or bitset beyond this is a host's answer not to be trusted with a
# list or set that size (host/replay/probe_reads.py replays answers on the controller).
MAX_FEATURE_BITS = 1024


# --- message classes -------------------------------------------------------


class _header(nla):
    nla_flags = NLA_F_NESTED  # ethtool validates strictly: nests must say so
    nla_map = (
        ("ETHTOOL_A_HEADER_UNSPEC", "none"),
        ("ETHTOOL_A_HEADER_DEV_INDEX", "uint32"),
        ("ETHTOOL_A_HEADER_DEV_NAME", "asciiz"),
        ("ETHTOOL_A_HEADER_FLAGS", "uint32"),
        ("ETHTOOL_A_HEADER_PHY_INDEX", "uint32"),
    )


class _bitset(nla):
    nla_flags = NLA_F_NESTED
    nla_map = (
        ("ETHTOOL_A_BITSET_UNSPEC", "none"),
        ("ETHTOOL_A_BITSET_NOMASK", "flag"),
        ("ETHTOOL_A_BITSET_SIZE", "uint32"),
        ("ETHTOOL_A_BITSET_BITS", "bits"),
        ("ETHTOOL_A_BITSET_VALUE", "cdata"),
        ("ETHTOOL_A_BITSET_MASK", "cdata"),
    )

    class bits(nla):
        nla_flags = NLA_F_NESTED
        nla_map = (
            ("ETHTOOL_A_BITSET_BITS_UNSPEC", "none"),
            ("ETHTOOL_A_BITSET_BITS_BIT", "bit"),
        )

        class bit(nla):
            nla_flags = NLA_F_NESTED
            nla_map = (
                ("ETHTOOL_A_BITSET_BIT_UNSPEC", "none"),
                ("ETHTOOL_A_BITSET_BIT_INDEX", "uint32"),
                ("ETHTOOL_A_BITSET_BIT_NAME", "asciiz"),
                ("ETHTOOL_A_BITSET_BIT_VALUE", "flag"),
            )


class strset_msg(genlmsg):
    nla_map = (
        ("ETHTOOL_A_STRSET_UNSPEC", "none"),
        ("ETHTOOL_A_STRSET_HEADER", "dev_header"),
        ("ETHTOOL_A_STRSET_STRINGSETS", "stringsets"),
        ("ETHTOOL_A_STRSET_COUNTS_ONLY", "flag"),
    )
    dev_header = _header

    class stringsets(nla):
        nla_flags = NLA_F_NESTED
        nla_map = (
            ("ETHTOOL_A_STRINGSETS_UNSPEC", "none"),
            ("ETHTOOL_A_STRINGSETS_STRINGSET", "stringset"),
        )

        class stringset(nla):
            nla_flags = NLA_F_NESTED
            nla_map = (
                ("ETHTOOL_A_STRINGSET_UNSPEC", "none"),
                ("ETHTOOL_A_STRINGSET_ID", "uint32"),
                ("ETHTOOL_A_STRINGSET_COUNT", "uint32"),
                ("ETHTOOL_A_STRINGSET_STRINGS", "strings"),
            )

            class strings(nla):
                nla_flags = NLA_F_NESTED
                nla_map = (
                    ("ETHTOOL_A_STRINGS_UNSPEC", "none"),
                    ("ETHTOOL_A_STRINGS_STRING", "string_"),
                )

                class string_(nla):
                    nla_flags = NLA_F_NESTED
                    nla_map = (
                        ("ETHTOOL_A_STRING_UNSPEC", "none"),
                        ("ETHTOOL_A_STRING_INDEX", "uint32"),
                        ("ETHTOOL_A_STRING_VALUE", "asciiz"),
                    )


class features_msg(genlmsg):
    nla_map = (
        ("ETHTOOL_A_FEATURES_UNSPEC", "none"),
        ("ETHTOOL_A_FEATURES_HEADER", "dev_header"),
        ("ETHTOOL_A_FEATURES_HW", "bitset"),
        ("ETHTOOL_A_FEATURES_WANTED", "bitset"),
        ("ETHTOOL_A_FEATURES_ACTIVE", "bitset"),
        ("ETHTOOL_A_FEATURES_NOCHANGE", "bitset"),
    )
    dev_header = _header
    bitset = _bitset


class rings_msg(genlmsg):
    nla_map = (
        ("ETHTOOL_A_RINGS_UNSPEC", "none"),
        ("ETHTOOL_A_RINGS_HEADER", "dev_header"),
        ("ETHTOOL_A_RINGS_RX_MAX", "uint32"),
        ("ETHTOOL_A_RINGS_RX_MINI_MAX", "uint32"),
        ("ETHTOOL_A_RINGS_RX_JUMBO_MAX", "uint32"),
        ("ETHTOOL_A_RINGS_TX_MAX", "uint32"),
        ("ETHTOOL_A_RINGS_RX", "uint32"),
        ("ETHTOOL_A_RINGS_RX_MINI", "uint32"),
        ("ETHTOOL_A_RINGS_RX_JUMBO", "uint32"),
        ("ETHTOOL_A_RINGS_TX", "uint32"),
        ("ETHTOOL_A_RINGS_RX_BUF_LEN", "uint32"),
        ("ETHTOOL_A_RINGS_TCP_DATA_SPLIT", "uint8"),
        ("ETHTOOL_A_RINGS_CQE_SIZE", "uint32"),
        ("ETHTOOL_A_RINGS_TX_PUSH", "uint8"),
        ("ETHTOOL_A_RINGS_RX_PUSH", "uint8"),
        ("ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN", "uint32"),
        ("ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN_MAX", "uint32"),
        ("ETHTOOL_A_RINGS_HDS_THRESH", "uint32"),
        ("ETHTOOL_A_RINGS_HDS_THRESH_MAX", "uint32"),
    )
    dev_header = _header


class channels_msg(genlmsg):
    nla_map = (
        ("ETHTOOL_A_CHANNELS_UNSPEC", "none"),
        ("ETHTOOL_A_CHANNELS_HEADER", "dev_header"),
        ("ETHTOOL_A_CHANNELS_RX_MAX", "uint32"),
        ("ETHTOOL_A_CHANNELS_TX_MAX", "uint32"),
        ("ETHTOOL_A_CHANNELS_OTHER_MAX", "uint32"),
        ("ETHTOOL_A_CHANNELS_COMBINED_MAX", "uint32"),
        ("ETHTOOL_A_CHANNELS_RX_COUNT", "uint32"),
        ("ETHTOOL_A_CHANNELS_TX_COUNT", "uint32"),
        ("ETHTOOL_A_CHANNELS_OTHER_COUNT", "uint32"),
        ("ETHTOOL_A_CHANNELS_COMBINED_COUNT", "uint32"),
    )
    dev_header = _header


class coalesce_msg(genlmsg):
    nla_map = (
        ("ETHTOOL_A_COALESCE_UNSPEC", "none"),
        ("ETHTOOL_A_COALESCE_HEADER", "dev_header"),
        ("ETHTOOL_A_COALESCE_RX_USECS", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_MAX_FRAMES", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_USECS_IRQ", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_MAX_FRAMES_IRQ", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_USECS", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_MAX_FRAMES", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_USECS_IRQ", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_MAX_FRAMES_IRQ", "uint32"),
        ("ETHTOOL_A_COALESCE_STATS_BLOCK_USECS", "uint32"),
        ("ETHTOOL_A_COALESCE_USE_ADAPTIVE_RX", "uint8"),
        ("ETHTOOL_A_COALESCE_USE_ADAPTIVE_TX", "uint8"),
        ("ETHTOOL_A_COALESCE_PKT_RATE_LOW", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_USECS_LOW", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_MAX_FRAMES_LOW", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_USECS_LOW", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_MAX_FRAMES_LOW", "uint32"),
        ("ETHTOOL_A_COALESCE_PKT_RATE_HIGH", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_USECS_HIGH", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_MAX_FRAMES_HIGH", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_USECS_HIGH", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_MAX_FRAMES_HIGH", "uint32"),
        ("ETHTOOL_A_COALESCE_RATE_SAMPLE_INTERVAL", "uint32"),
        ("ETHTOOL_A_COALESCE_USE_CQE_MODE_TX", "uint8"),
        ("ETHTOOL_A_COALESCE_USE_CQE_MODE_RX", "uint8"),
        ("ETHTOOL_A_COALESCE_TX_AGGR_MAX_BYTES", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_AGGR_MAX_FRAMES", "uint32"),
        ("ETHTOOL_A_COALESCE_TX_AGGR_TIME_USECS", "uint32"),
        ("ETHTOOL_A_COALESCE_RX_PROFILE", "none"),  # DIM profiles: not used
        ("ETHTOOL_A_COALESCE_TX_PROFILE", "none"),
    )
    dev_header = _header


class pause_msg(genlmsg):
    nla_map = (
        ("ETHTOOL_A_PAUSE_UNSPEC", "none"),
        ("ETHTOOL_A_PAUSE_HEADER", "dev_header"),
        ("ETHTOOL_A_PAUSE_AUTONEG", "uint8"),
        ("ETHTOOL_A_PAUSE_RX", "uint8"),
        ("ETHTOOL_A_PAUSE_TX", "uint8"),
        ("ETHTOOL_A_PAUSE_STATS", "none"),
        ("ETHTOOL_A_PAUSE_STATS_SRC", "uint32"),
    )
    dev_header = _header


# CLI name -> (attribute, is_bool, settable).  Maxima are read-only.


def _spec(prefix: str, rows: List[Tuple[str, str, bool, bool]]) -> _Spec:
    return {cli: (prefix + attr, is_bool, settable) for cli, attr, is_bool, settable in rows}


_RINGS = _spec(
    "ETHTOOL_A_RINGS_",
    [
        ("rx", "RX", False, True),
        ("rx-mini", "RX_MINI", False, True),
        ("rx-jumbo", "RX_JUMBO", False, True),
        ("tx", "TX", False, True),
        ("rx-buf-len", "RX_BUF_LEN", False, True),
        ("cqe-size", "CQE_SIZE", False, True),
        ("tx-push", "TX_PUSH", True, True),
        ("rx-push", "RX_PUSH", True, True),
        ("rx-max", "RX_MAX", False, False),
        ("rx-mini-max", "RX_MINI_MAX", False, False),
        ("rx-jumbo-max", "RX_JUMBO_MAX", False, False),
        ("tx-max", "TX_MAX", False, False),
    ],
)
_CHANNELS = _spec(
    "ETHTOOL_A_CHANNELS_",
    [
        ("rx", "RX_COUNT", False, True),
        ("tx", "TX_COUNT", False, True),
        ("other", "OTHER_COUNT", False, True),
        ("combined", "COMBINED_COUNT", False, True),
        ("rx-max", "RX_MAX", False, False),
        ("tx-max", "TX_MAX", False, False),
        ("other-max", "OTHER_MAX", False, False),
        ("combined-max", "COMBINED_MAX", False, False),
    ],
)
_COALESCE = _spec(
    "ETHTOOL_A_COALESCE_",
    [
        ("rx-usecs", "RX_USECS", False, True),
        ("rx-frames", "RX_MAX_FRAMES", False, True),
        ("rx-usecs-irq", "RX_USECS_IRQ", False, True),
        ("rx-frames-irq", "RX_MAX_FRAMES_IRQ", False, True),
        ("tx-usecs", "TX_USECS", False, True),
        ("tx-frames", "TX_MAX_FRAMES", False, True),
        ("tx-usecs-irq", "TX_USECS_IRQ", False, True),
        ("tx-frames-irq", "TX_MAX_FRAMES_IRQ", False, True),
        ("stats-block-usecs", "STATS_BLOCK_USECS", False, True),
        ("adaptive-rx", "USE_ADAPTIVE_RX", True, True),
        ("adaptive-tx", "USE_ADAPTIVE_TX", True, True),
        ("pkt-rate-low", "PKT_RATE_LOW", False, True),
        ("rx-usecs-low", "RX_USECS_LOW", False, True),
        ("rx-frames-low", "RX_MAX_FRAMES_LOW", False, True),
        ("tx-usecs-low", "TX_USECS_LOW", False, True),
        ("tx-frames-low", "TX_MAX_FRAMES_LOW", False, True),
        ("pkt-rate-high", "PKT_RATE_HIGH", False, True),
        ("rx-usecs-high", "RX_USECS_HIGH", False, True),
        ("rx-frames-high", "RX_MAX_FRAMES_HIGH", False, True),
        ("tx-usecs-high", "TX_USECS_HIGH", False, True),
        ("tx-frames-high", "TX_MAX_FRAMES_HIGH", False, True),
        ("sample-interval", "RATE_SAMPLE_INTERVAL", False, True),
        ("cqe-mode-rx", "USE_CQE_MODE_RX", True, True),
        ("cqe-mode-tx", "USE_CQE_MODE_TX", True, True),
    ],
)
_PAUSE = _spec(
    "ETHTOOL_A_PAUSE_",
    [("autoneg", "AUTONEG", True, True), ("rx", "RX", True, True), ("tx", "TX", True, True)],
)


# --- helpers -----------------------------------------------------------------


def _bits(bitset, attr: str = "ETHTOOL_A_BITSET_VALUE", limit: int = MAX_FEATURE_BITS) -> Set[int]:
    """Indices of the bits set in a compact bitset's VALUE (or MASK) words.

    We request ETHTOOL_FLAG_COMPACT_BITSETS: the default verbose form lists
    set bits by name, which is slow to decode and easy to misread (a NOMASK
    list has no BIT_VALUE flags).  Compact is u32 words in host order.
    """
    data = (bitset.get_attr(attr) if bitset is not None else None) or b""
    data = data[:(limit + 31) // 32 * 4]  # bits past the names are never looked at
    words = struct.unpack(f"={len(data) // 4}I", data[: len(data) // 4 * 4])
    return {w * 32 + b for w, word in enumerate(words) if word for b in range(32) if word >> b & 1}


def _feature_names(sset) -> tuple:
    """The feature bit names by index ('' for unused bits) of a string set."""
    names: Dict[int, str] = {}
    strings = sset.get_attr("ETHTOOL_A_STRINGSET_STRINGS")
    for s in strings.get_attrs("ETHTOOL_A_STRINGS_STRING") if strings else []:
        names[s.get_attr("ETHTOOL_A_STRING_INDEX")] = s.get_attr("ETHTOOL_A_STRING_VALUE") or ""
    count = sset.get_attr("ETHTOOL_A_STRINGSET_COUNT") or 0
    if not isinstance(count, int) or count > MAX_FEATURE_BITS:
        raise NetlinkError(errno.EPROTO, f"the kernel claims {count!r} feature bits, "
                           f"more than the {MAX_FEATURE_BITS} nictune reads")
    return tuple(names.get(i, "") for i in range(count))


@dataclass
class Features:
    # every named feature bit of the device -> on/off (ethtool -k)
    active: Dict[str, bool] = field(default_factory=dict)
    # bits the driver lets userspace change (not "[fixed]" in ethtool -k)
    changeable: Set[str] = field(default_factory=set)


class Ethtool(GenlFamily):
    # Resolving the family fails with ENOENT when the kernel has no ethtool
    # netlink (< 5.6 or CONFIG_ETHTOOL_NETLINK=n).
    FAMILY = "ethtool"

    def __init__(self, opener=None):
        super().__init__(opener)
        self._feature_names: List[str] | None = None

    # -- plumbing --

    def _msg(self, cls, cmd: int, attrs: list, header: dict | None = None):
        msg = cls()
        msg["cmd"] = cmd
        msg["version"] = ETHTOOL_GENL_VERSION
        # Always send the header nest, even empty: 6.18 rejects a request
        # without it (EINVAL, extack MISS_TYPE = the header attribute).
        hdr = (cls.nla_map[1][0], {"attrs": list((header or {}).items())})
        msg["attrs"] = [hdr] + attrs
        return msg

    def _dump(self, cls, cmd: int, header: dict | None = None) -> list:
        return self._nl.dump(self._msg(cls, cmd, [], header), self._family, {self._family: cls})

    def _set(self, cls, cmd: int, ifname: str, attrs: list, flags: int = 0) -> list:
        header = {"ETHTOOL_A_HEADER_DEV_NAME": validate_ifname(ifname)}
        if flags:
            header["ETHTOOL_A_HEADER_FLAGS"] = flags
        msg = self._msg(cls, cmd, attrs, header)
        return self._nl.request(msg, self._family, NLM_F_REQUEST | NLM_F_ACK, {self._family: cls})

    @staticmethod
    def _ifname(msg) -> str:
        return msg.get_attr(msg.nla_map[1][0]).get_attr("ETHTOOL_A_HEADER_DEV_NAME")

    def _get_all(self, cls, cmd: int, spec: _Spec) -> Dict[str, dict]:
        out = {}
        for msg in self._dump(cls, cmd):
            values = {}
            for cli, (attr, is_bool, _settable) in spec.items():
                v = msg.get_attr(attr)
                if v is not None:
                    values[cli] = bool(v) if is_bool else v
            out[self._ifname(msg)] = values
        return out

    def _set_values(self, cls, cmd: int, spec: _Spec, ifname: str, values: dict) -> None:
        attrs = []
        for cli, value in values.items():
            if cli not in spec or not spec[cli][2]:
                raise ValueError(f"not a settable parameter: {cli!r}")
            attr, is_bool, _ = spec[cli]
            attrs.append((attr, param_value(cli, value, is_bool)))
        if not attrs:
            return
        self._set(cls, cmd, ifname, attrs)

    # -- features --

    def feature_names(self) -> List[str]:
        """The kernel's feature bit names by index ('' for unused bits)."""
        if self._feature_names is None:
            # ETH_SS_FEATURES is global: no device in the header.
            stringset = ("ETHTOOL_A_STRINGSETS_STRINGSET", {"attrs": [("ETHTOOL_A_STRINGSET_ID", ETH_SS_FEATURES)]})
            msg = self._msg(strset_msg, STRSET_GET, [("ETHTOOL_A_STRSET_STRINGSETS", {"attrs": [stringset]})])
            reply = self._nl.request(msg, self._family, NLM_F_REQUEST, {self._family: strset_msg})
            sets = reply[0].get_attr("ETHTOOL_A_STRSET_STRINGSETS")
            sset = sets.get_attr("ETHTOOL_A_STRINGSETS_STRINGSET")
            # A record the controller's replays share (host/replay/decoded.py)
            # is read-only: its names are worked out once for every host.
            shared = getattr(sset, "shared", False)
            known = sset.__dict__.get("feature_names") if shared else None
            if known is None:
                known = _feature_names(sset)
                if shared:
                    sset.feature_names = known
            self._feature_names = list(known)
        return self._feature_names

    def features(self) -> Dict[str, Features]:
        """All devices' features from one FEATURES_GET dump (+ one STRSET_GET once)."""
        names = self.feature_names()
        out = {}
        for msg in self._dump(
            features_msg, FEATURES_GET, {"ETHTOOL_A_HEADER_FLAGS": ETHTOOL_FLAG_COMPACT_BITSETS}
        ):
            active = _bits(msg.get_attr("ETHTOOL_A_FEATURES_ACTIVE"))
            hw = _bits(msg.get_attr("ETHTOOL_A_FEATURES_HW"))
            nochange = _bits(msg.get_attr("ETHTOOL_A_FEATURES_NOCHANGE"))
            out[self._ifname(msg)] = Features(
                active={n: i in active for i, n in enumerate(names) if n},
                changeable={n for i, n in enumerate(names) if n and i in hw and i not in nochange},
            )
        return out

    def set_features(self, ifname: str, wanted: Dict[str, bool]) -> Dict[str, bool]:
        """Request feature bits; return {name: requested value} for those not applied.

        The kernel ACKs a FEATURES_SET even when it cannot change a bit (a
        fixed one, or one a driver refuses); only its reply tells: WANTED
        there is masked to the requested bits that still differ from the
        resulting active set.
        """
        validate_features(wanted)
        bits = []
        for name, value in wanted.items():
            bit = [("ETHTOOL_A_BITSET_BIT_NAME", name)]
            if value:
                bit.append(("ETHTOOL_A_BITSET_BIT_VALUE", True))
            bits.append(("ETHTOOL_A_BITSET_BITS_BIT", {"attrs": bit}))
        if not bits:
            return {}
        # No NOMASK: a list without it means "change only the listed bits".
        wanted_attr = ("ETHTOOL_A_FEATURES_WANTED", {"attrs": [("ETHTOOL_A_BITSET_BITS", {"attrs": bits})]})
        replies = self._set(features_msg, FEATURES_SET, ifname, [wanted_attr], ETHTOOL_FLAG_COMPACT_BITSETS)
        names = self.feature_names()
        failed: Dict[str, bool] = {}
        for msg in replies:
            for i in _bits(msg.get_attr("ETHTOOL_A_FEATURES_WANTED"), "ETHTOOL_A_BITSET_MASK"):
                name = names[i] if i < len(names) else ""
                if name in wanted:
                    failed[name] = wanted[name]
        return failed

    # -- rings, channels, coalesce, pause --

    def rings(self) -> Dict[str, dict]:
        return self._get_all(rings_msg, RINGS_GET, _RINGS)

    def set_rings(self, ifname: str, values: dict) -> None:
        self._set_values(rings_msg, RINGS_SET, _RINGS, ifname, values)

    def channels(self) -> Dict[str, dict]:
        return self._get_all(channels_msg, CHANNELS_GET, _CHANNELS)

    def set_channels(self, ifname: str, values: dict) -> None:
        self._set_values(channels_msg, CHANNELS_SET, _CHANNELS, ifname, values)

    def coalesce(self) -> Dict[str, dict]:
        return self._get_all(coalesce_msg, COALESCE_GET, _COALESCE)

    def set_coalesce(self, ifname: str, values: dict) -> None:
        self._set_values(coalesce_msg, COALESCE_SET, _COALESCE, ifname, values)

    def pause(self) -> Dict[str, dict]:
        return self._get_all(pause_msg, PAUSE_GET, _PAUSE)

    def set_pause(self, ifname: str, values: dict) -> None:
        self._set_values(pause_msg, PAUSE_SET, _PAUSE, ifname, values)
