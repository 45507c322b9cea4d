"""SR-IOV VF attributes over rtnetlink: IFLA_VFINFO_LIST.

Read: an RTM_GETLINK dump with IFLA_EXT_MASK = RTEXT_FILTER_VF (without
it the kernel leaves the VF list out, net/core/rtnetlink.c
rtnl_vfinfo_size), one IFLA_VF_INFO nest per VF with fixed structs from
include/uapi/linux/if_link.h.  Write: RTM_NEWLINK on the PF's index with
IFLA_VFINFO_LIST > IFLA_VF_INFO > the attributes to change, as
`ip link set PF vf N ...` does; do_setvfinfo() calls the driver's
ndo_set_vf_* for each attribute present, in the order MAC, VLAN, ...,
RATE, SPOOFCHK, LINK_STATE, TRUST.

A driver that does not report a setting leaves the kernel's default in the
struct: spoofchk and trust then read as 0xffffffff (-1 in the kernel's
int), which is decoded as None (unknown).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Dict, Optional

from nictune.host.transports.netlink._pyroute2 import nla, nlmsg
from nictune.host.transports.netlink.socket import NETLINK_ROUTE, NLM_F_ACK, NLM_F_REQUEST, NetlinkSocket
from nictune.host.transports.netlink.uapi import VF_LINK_STATES

RTM_NEWLINK, RTM_GETLINK = 16, 18
RTEXT_FILTER_VF = 1
RTEXT_FILTER_SKIP_STATS = 1 << 3
LINK_STATES = VF_LINK_STATES
_U32_NONE = 0xFFFFFFFF

_MAC = struct.Struct("=I32s")     # struct ifla_vf_mac
_VLAN = struct.Struct("=III")     # struct ifla_vf_vlan: vf, vlan, qos
_RATE = struct.Struct("=III")     # struct ifla_vf_rate: vf, min_tx_rate, max_tx_rate
_SETTING = struct.Struct("=II")   # ifla_vf_spoofchk / _trust / _link_state: vf, value


class vfmsg(nlmsg):
    """ifinfmsg with the VF attributes only."""

    fields = (("family", "B"), ("__align", "x"), ("ifi_type", "H"), ("index", "i"),
              ("flags", "I"), ("change", "I"))
    nla_map = (
        (3, "IFLA_IFNAME", "asciiz"),
        (21, "IFLA_NUM_VF", "uint32"),
        (22, "IFLA_VFINFO_LIST", "vfinfo_list"),
        (29, "IFLA_EXT_MASK", "uint32"),
    )

    class vfinfo_list(nla):
        nla_map = ((1, "IFLA_VF_INFO", "vfinfo"),)

        class vfinfo(nla):
            nla_map = (
                (1, "IFLA_VF_MAC", "cdata"),
                (2, "IFLA_VF_VLAN", "cdata"),
                (4, "IFLA_VF_SPOOFCHK", "cdata"),
                (5, "IFLA_VF_LINK_STATE", "cdata"),
                (6, "IFLA_VF_RATE", "cdata"),
                (9, "IFLA_VF_TRUST", "cdata"),
            )


@dataclass
class VfConfig:
    mac: Optional[str] = None
    vlan: Optional[int] = None
    qos: Optional[int] = None
    spoofchk: Optional[bool] = None
    trust: Optional[bool] = None
    link_state: Optional[str] = None
    min_tx_rate: Optional[int] = None  # Mbit/s
    max_tx_rate: Optional[int] = None


def _bool(value: int) -> Optional[bool]:
    return None if value == _U32_NONE else bool(value)


def decode_vfs(msg) -> Dict[int, VfConfig]:
    out: Dict[int, VfConfig] = {}
    vflist = msg.get_attr("IFLA_VFINFO_LIST")
    if vflist is None:
        return out
    for info in vflist.get_attrs("IFLA_VF_INFO"):
        cfg = VfConfig()
        vf = None
        raw = info.get_attr("IFLA_VF_MAC")
        if raw is not None:
            vf, mac = _MAC.unpack(raw[: _MAC.size])
            cfg.mac = ":".join(f"{b:02x}" for b in mac[:6])
        raw = info.get_attr("IFLA_VF_VLAN")
        if raw is not None:
            vf, cfg.vlan, cfg.qos = _VLAN.unpack(raw[: _VLAN.size])
        raw = info.get_attr("IFLA_VF_RATE")
        if raw is not None:
            vf, cfg.min_tx_rate, cfg.max_tx_rate = _RATE.unpack(raw[: _RATE.size])
        for attr, name in (("IFLA_VF_SPOOFCHK", "spoofchk"), ("IFLA_VF_TRUST", "trust")):
            raw = info.get_attr(attr)
            if raw is not None:
                vf, value = _SETTING.unpack(raw[: _SETTING.size])
                setattr(cfg, name, _bool(value))
        raw = info.get_attr("IFLA_VF_LINK_STATE")
        if raw is not None:
            vf, state = _SETTING.unpack(raw[: _SETTING.size])
            cfg.link_state = next((k for k, v in LINK_STATES.items() if v == state), str(state))
        if vf is not None:
            out[vf] = cfg
    return out


def _mac_bytes(mac: str) -> bytes:
    parts = mac.split(":")
    if len(parts) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return bytes(int(p, 16) for p in parts).ljust(32, b"\0")


def vf_attrs(vf: int, cfg: VfConfig) -> list:
    """The IFLA_VF_INFO attributes that set what `cfg` gives (None: leave).
    vlan and qos go together (IFLA_VF_VLAN), and so do the two rates.  The
    order and layout are `ip link set PF vf N mac .. vlan .. qos .. spoofchk
    .. state .. trust .. min_tx_rate .. max_tx_rate ..`'s (iproute2 6.1,
    tests/recorded/vf): argv order, IFLA_VF_RATE last, nests without
    NLA_F_NESTED."""
    attrs = []
    if cfg.mac is not None:
        attrs.append(("IFLA_VF_MAC", _MAC.pack(vf, _mac_bytes(cfg.mac))))
    if cfg.vlan is not None or cfg.qos is not None:
        attrs.append(("IFLA_VF_VLAN", _VLAN.pack(vf, cfg.vlan or 0, cfg.qos or 0)))
    if cfg.spoofchk is not None:
        attrs.append(("IFLA_VF_SPOOFCHK", _SETTING.pack(vf, int(cfg.spoofchk))))
    if cfg.link_state is not None:
        attrs.append(("IFLA_VF_LINK_STATE", _SETTING.pack(vf, LINK_STATES[cfg.link_state])))
    if cfg.trust is not None:
        attrs.append(("IFLA_VF_TRUST", _SETTING.pack(vf, int(cfg.trust))))
    if cfg.min_tx_rate is not None or cfg.max_tx_rate is not None:
        attrs.append(("IFLA_VF_RATE", _RATE.pack(vf, cfg.min_tx_rate or 0, cfg.max_tx_rate or 0)))
    return attrs


def set_message(index: int, vf: int, cfg: VfConfig) -> vfmsg:
    msg = vfmsg()
    msg["index"] = index
    msg["attrs"] = [("IFLA_VFINFO_LIST", {"attrs": [("IFLA_VF_INFO", {"attrs": vf_attrs(vf, cfg)})]})]
    return msg


class Vfs:
    def __init__(self, opener=None):
        self._nl = NetlinkSocket(NETLINK_ROUTE, {RTM_NEWLINK: vfmsg}, opener)

    def close(self) -> None:
        self._nl.close()

    def all(self) -> Dict[str, Dict[int, VfConfig]]:
        """ifname -> {vf: config} for every link that reports VFs."""
        msg = vfmsg()
        msg["attrs"] = [("IFLA_EXT_MASK", RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)]
        out = {}
        for m in self._nl.dump(msg, RTM_GETLINK):
            vfs = decode_vfs(m)
            if vfs:
                out[m.get_attr("IFLA_IFNAME")] = vfs
        return out

    def set(self, index: int, vf: int, cfg: VfConfig) -> None:
        self._nl.request(set_message(index, vf, cfg), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK)
