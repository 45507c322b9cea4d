"""The ethtool netlink "monitor" multicast group, for the resident agent.

The kernel sends every ethtool settings change, whoever makes it (ethtool
-K/-G/-L/-C/-A over netlink or ioctl, a driver), to the ethtool generic
netlink family's one multicast group, "monitor" (net/ethtool/netlink.c:
ethtool_nl_mcgrps[ETHNL_MCGRP_MONITOR], name ETHTOOL_MCGRP_MONITOR_NAME;
ethnl_default_notify multicasts in the device's namespace with
genlmsg_multicast_netns).  Features changes also come as RTM_NEWLINK
(ethnl_set_features calls netdev_features_change), but rings, channels,
coalesce and pause changes come ONLY here: a channel count change on a
veth that is down, or `ethtool -G` on most drivers, makes no rtnetlink
event at all (seen on 6.18 with `ip monitor link` next to `ethtool
--monitor`).

The group's id is chosen at registration, like the family's: it is read
from CTRL_CMD_GETFAMILY's CTRL_ATTR_MCAST_GROUPS (include/uapi/linux/
genetlink.h), as iproute2's mnlg.c and ethtool's netlink/monitor.c do.
A kernel without the family (before 5.6) or without the group raises
Unavailable, and the agent polls instead.

Every notification names its device in its header, the nested attribute
1 of every ethtool message (ETHTOOL_A_*_HEADER; net/ethtool/netlink.c
ethnl_fill_reply_header puts ETHTOOL_A_HEADER_DEV_INDEX and _DEV_NAME in).
Not imported by a verify (tests/unit/test_agent_imports.py): only by
host/resident/daemon.py, when the resident agent runs.
"""

from __future__ import annotations

import errno
import socket
import struct

from nictune.host.transports.netlink._nlmsg import ctrlmsg, nla
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.ethtool import _header
from nictune.host.transports.netlink.genl import CTRL_CMD_GETFAMILY, GENL_ID_CTRL
from nictune.host.transports.netlink.socket import NETLINK_GENERIC, NLM_F_REQUEST, SOL_NETLINK, NetlinkSocket

FAMILY = "ethtool"      # include/uapi/linux/ethtool_netlink.h ETHTOOL_GENL_NAME
GROUP = "monitor"       # ETHTOOL_MCGRP_MONITOR_NAME
NETLINK_ADD_MEMBERSHIP = 1  # include/uapi/linux/netlink.h
_HDR = struct.Struct("=IHHII")
_GENL = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")
_NLA_TYPE = 0x3FFF



class Unavailable(Exception):
    """This kernel has no ethtool monitor group (the message says why)."""


class _groups(nla):
    """CTRL_ATTR_MCAST_GROUPS: an array whose entries are numbered 1, 2...
    (net/netlink/genetlink.c ctrl_fill_info), each a nest of name and id."""

    class group(nla):
        nla_map = (
            (1, "CTRL_ATTR_MCAST_GRP_NAME", "asciiz"),
            (2, "CTRL_ATTR_MCAST_GRP_ID", "uint32"),
        )

    # A family has a handful of groups; ethtool has one.
    nla_map = tuple((n, "group", "group") for n in range(1, 65))


class _family_msg(ctrlmsg):
    nla_map = ctrlmsg.nla_map + ((7, "CTRL_ATTR_MCAST_GROUPS", "groups"),)
    groups = _groups


def resolve_group(family: str | None = None, group: str | None = None) -> tuple:
    """(family id, group id) of `group` of `family` (FAMILY and GROUP by
    default); Unavailable when the kernel has either not."""
    family, group = family or FAMILY, group or GROUP
    msg = _family_msg()
    msg["cmd"] = CTRL_CMD_GETFAMILY
    msg["version"] = 1
    msg["attrs"] = [("CTRL_ATTR_FAMILY_NAME", family)]
    try:
        with NetlinkSocket(NETLINK_GENERIC) as nl:
            reply = nl.request(msg, GENL_ID_CTRL, NLM_F_REQUEST, {GENL_ID_CTRL: _family_msg})
    except NetlinkError as e:
        if e.errno == errno.ENOENT:
            raise Unavailable(f"no {family} generic netlink family on this kernel") from None
        raise
    groups = reply[0].get_attr("CTRL_ATTR_MCAST_GROUPS")
    for entry in groups.get_attrs("group") if groups else ():
        if entry.get_attr("CTRL_ATTR_MCAST_GRP_NAME") == group:
            return reply[0].get_attr("CTRL_ATTR_FAMILY_ID"), entry.get_attr("CTRL_ATTR_MCAST_GRP_ID")
    raise Unavailable(f"the {family} generic netlink family has no {group!r} multicast group")


class Subscription:
    """A non-blocking netlink socket in multicast groups; read() drains it:
    what parse() makes of each datagram, and ("resync", 0, "") for each
    overrun the kernel reported (ENOBUFS: notifications were dropped)."""

    def __init__(self, protocol: int, groups: int = 0, membership: int | None = None):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC
                                  | socket.SOCK_NONBLOCK, protocol)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self.sock.bind((0, groups))
            if membership is not None:
                self.sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, membership)
        except BaseException:
            self.sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def parse(self, data: bytes) -> list:
        raise NotImplementedError

    def read(self) -> list:
        events = []
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return events
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                events.append(("resync", 0, ""))
                continue
            events.extend(self.parse(data))


class EthtoolMonitor(Subscription):
    """The ethtool family's monitor group: ("ethtool", ifindex, name) per
    notification."""

    def __init__(self, family: str | None = None, group: str | None = None):
        self.family, self.group = resolve_group(family, group)
        super().__init__(NETLINK_GENERIC, membership=self.group)

    def parse(self, data: bytes) -> list:
        return parse_notifications(data, self.family)


def parse_notifications(data: bytes, family: int) -> list:
    """("ethtool", ifindex, name) per message of `family` in a datagram;
    ifindex 0 / name "" when its header lacks one.  Every message of the
    group counts, whatever its command (ETHTOOL_MSG_FEATURES_NTF, _RINGS_NTF,
    _CHANNELS_NTF, _COALESCE_NTF, _PAUSE_NTF, but also EEE, link modes...):
    each names a device whose settings may have changed."""
    events = []
    off = 0
    while off + _HDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _HDR.unpack_from(data, off)
        if length < _HDR.size or off + length > len(data):
            break
        if kind == family and length >= _HDR.size + _GENL.size:
            index, name = _device(data, off + _HDR.size + _GENL.size, off + length)
            events.append(("ethtool", index, name))
        off += (length + 3) & ~3
    return events


def _device(data: bytes, off: int, end: int) -> tuple:
    """(ifindex, name) from the message's header attribute (type 1)."""
    while off + _NLA.size <= end:
        length, kind = _NLA.unpack_from(data, off)
        if length < _NLA.size or off + length > end:
            break
        if kind & _NLA_TYPE == 1:
            header = _header()
            header.data = bytearray(data)
            header._decode_attrs(off + _NLA.size, off + length)
            return (header.get_attr("ETHTOOL_A_HEADER_DEV_INDEX") or 0,
                    header.get_attr("ETHTOOL_A_HEADER_DEV_NAME") or "")
        off += (length + 3) & ~3
    return 0, ""
