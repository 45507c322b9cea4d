"""The legacy SIOCETHTOOL ioctl, for what ethtool netlink lacks (driver
info) or where the kernel has no ethtool netlink at all (< 5.6)."""

from __future__ import annotations

import array
import fcntl
import socket
import struct

from nictune.netlink.names import validate_ifname
from nictune.netlink.netns import in_netns

SIOCETHTOOL = 0x8946
_IFREQ = struct.Struct("16sP")  # ifr_name, ifr_data (pointer)
_IFREQ_SIZE = 40  # sizeof(struct ifreq) on 64-bit; the union is 24 bytes


def inet_socket(netns: str | None = None) -> socket.socket:
    """The socket ioctls go through; it resolves names in its namespace."""
    with in_netns(netns):
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)


def siocethtool(sock: socket.socket, ifname: str, buf: array.array) -> int:
    """SIOCETHTOOL on `ifname` with ifr_data -> `buf`, which the kernel reads
    and writes in place (an array's buffer address stays valid while we
    hold it).  Returns the non-negative ioctl result; raises OSError."""
    validate_ifname(ifname)
    ifreq = bytearray(_IFREQ.pack(ifname.encode(), buf.buffer_info()[0]).ljust(_IFREQ_SIZE, b"\0"))
    # A mutable ifreq makes fcntl.ioctl return the syscall's result
    # (SFEATURES reports through it) instead of a copy of the buffer.
    return fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq, True)
