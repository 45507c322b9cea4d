"""A small synchronous netlink socket.

pyroute2's own sockets import asyncio and their sync wrapper breaks on
custom messages in 0.9.7, so this is the whole transport: send one request,
read datagrams until the ACK / NLMSG_DONE that carries our sequence number,
decode replies with pyroute2 message classes, turn errors into NetlinkError
with the kernel's extended-ack text.  A message is any class with
pyroute2's message API: _nlmsg.py's (the agent's everyday reads) or
pyroute2's own (_pyroute2.py); the socket imports neither.
"""

from __future__ import annotations

import socket
import struct
from nictune.host.transports.netlink.errors import NetlinkError

NETLINK_ROUTE = 0
NETLINK_GENERIC = 16

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_DUMP_INTR = 0x10  # the dumped table changed while the dump ran
NLM_F_CAPPED = 0x100  # in an NLMSG_ERROR: the request was not echoed back
NLM_F_ACK_TLVS = 0x200  # in an NLMSG_ERROR/DONE: extack attributes follow

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4

SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
NLMSGERR_ATTR_MSG = 1
NLMSGERR_ATTR_MISS_TYPE = 5

_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_ERR = struct.Struct("=i")
_NLA = struct.Struct("=HH")
# Kernel dump skbs are at most ~32 KiB; single replies (a link with many VFs)
# can be bigger, which the MSG_PEEK|MSG_TRUNC probe in _recv handles.
_BUFSIZE = 65536
_DUMP_TRIES = 3

# A msg_map is {netlink message type: the message class that decodes it}.
MsgMap = dict


def _align(n: int) -> int:
    return (n + 3) & ~3


def _extack(buf: memoryview, off: int, end: int) -> str | None:
    """The extack text from the TLVs between off and end.

    Policy violations often carry no text, only MISS_TYPE (the id of a
    missing mandatory attribute); we turn that into a message too.
    """
    text = None
    while off + 4 <= end:
        length, kind = _NLA.unpack_from(buf, off)
        if length < 4:
            break
        kind &= 0x3FFF
        if kind == NLMSGERR_ATTR_MSG:
            raw = bytes(buf[off + 4 : off + length]).split(b"\0", 1)[0]
            return raw.decode("utf-8", "replace")
        if kind == NLMSGERR_ATTR_MISS_TYPE and length >= 8:
            text = f"missing attribute type {_ERR.unpack_from(buf, off + 4)[0]}"
        off += _align(length)
    return text


def _kernel_socket(protocol: int):
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)


class NetlinkSocket:
    """One netlink socket, one request at a time (not thread-safe)."""

    def __init__(self, protocol: int, msg_map: MsgMap | None = None, opener=None):
        # Bound for good to the namespace of the thread creating it: the
        # agent's own, as it runs inside the namespace it tunes.  opener:
        # the host's port (Host.io.netlink) the raw socket comes from.
        self._sock = (opener or _kernel_socket)(protocol)
        try:
            # Ask for extack messages, and for errors without our request
            # echoed back (CAP_ACK), so error datagrams stay small.
            self._sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            self._sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            self._sock.bind((0, 0))
        except BaseException:
            self._sock.close()
            raise
        self.msg_map: MsgMap = dict(msg_map or {})
        # A replay's socket (host/replay/probe_reads.py) shares its decoded
        # messages between hosts (host/replay/decoded.py); a kernel's has none.
        self._decoded = getattr(self._sock, "decoded", None)
        self._seq = 0
        self._buf = bytearray(_BUFSIZE)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "NetlinkSocket":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def dump(self, msg, msg_type: int, msg_map: MsgMap | None = None) -> list:
        return self.request(msg, msg_type, NLM_F_REQUEST | NLM_F_DUMP, msg_map)

    def request(
        self, msg, msg_type: int, flags: int, msg_map: MsgMap | None = None
    ) -> list:
        """Send `msg`; return the decoded replies (types found in the map).

        Non-dump requests always get NLM_F_ACK added: the ACK is what tells
        us the kernel is done, whether or not it sent a reply before it.
        """
        if not flags & NLM_F_DUMP:
            flags |= NLM_F_ACK
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = flags
        msg["header"]["pid"] = 0
        msg_map = msg_map if msg_map is not None else self.msg_map
        # A dump that raced with a change (a link added, a feature flipped)
        # is marked NLM_F_DUMP_INTR and may be incomplete: run it again.
        for _ in range(_DUMP_TRIES):
            self._seq = (self._seq % 0x7FFFFFFF) + 1
            msg["header"]["sequence_number"] = self._seq
            msg.encode()
            self._sock.send(msg.data)
            replies, interrupted = self._collect(self._seq, msg_map)
            if not interrupted:
                return replies
        raise NetlinkError(4, "dump kept being interrupted by concurrent changes")  # EINTR

    def _recv(self) -> memoryview:
        # Peek at the real datagram size first so nothing is ever truncated.
        size = self._sock.recv_into(
            self._buf, len(self._buf), socket.MSG_PEEK | socket.MSG_TRUNC
        )
        if size > len(self._buf):
            self._buf = bytearray(size)
        size = self._sock.recv_into(self._buf)
        return memoryview(self._buf)[:size]

    def _collect(self, seq: int, msg_map: MsgMap) -> tuple:
        replies = []
        interrupted = False
        while True:
            buf = self._recv()
            off = 0
            while off + _HDR.size <= len(buf):
                length, kind, flags, mseq, _pid = _HDR.unpack_from(buf, off)
                if length < _HDR.size or off + length > len(buf):
                    raise NetlinkError(71, "malformed netlink message")  # EPROTO
                end = off + length
                if mseq != seq:  # stale answer to an earlier request
                    off += _align(length)
                    continue
                interrupted |= bool(flags & NLM_F_DUMP_INTR)
                if kind in (NLMSG_ERROR, NLMSG_DONE):
                    # Both carry an int error (0 = ACK / clean end of dump),
                    # and extack TLVs when NLM_F_ACK_TLVS is set.
                    code = _ERR.unpack_from(buf, off + 16)[0] if length >= 20 else 0
                    if code:
                        tlv = off + 20
                        if kind == NLMSG_ERROR:
                            if flags & NLM_F_CAPPED:
                                tlv += _HDR.size
                            else:  # the whole request was echoed back
                                tlv += _align(_HDR.unpack_from(buf, tlv)[0])
                        text = _extack(buf, tlv, end) if flags & NLM_F_ACK_TLVS else None
                        raise NetlinkError(code, text)
                    return replies, interrupted
                if kind not in (NLMSG_NOOP, NLMSG_OVERRUN):
                    cls = msg_map.get(kind)
                    if cls is not None and self._decoded is not None:
                        replies.append(self._decoded.decoded(cls, bytes(buf[off:end])))
                    elif cls is not None:
                        m = cls(bytes(buf[off:end]))
                        m.decode()
                        replies.append(m)
                off += _align(length)
