"""The legacy SIOCETHTOOL ioctl, for what ethtool netlink lacks (driver
info) or where the kernel has no ethtool netlink at all (< 5.6)."""

from __future__ import annotations

import array
import errno
import fcntl
import socket
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Callable, Optional

from nictune.host.transports.netlink.names import validate_ifname

SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSSET_INFO = 0x37
ETH_GSTRING_LEN = 32
_IFREQ = struct.Struct("16sP")  # ifr_name, ifr_data (pointer)
_IFREQ_SIZE = 40  # sizeof(struct ifreq) on 64-bit; the union is 24 bytes
# struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; }
# with room for the one count we ask for.
_SSET_INFO = struct.Struct("=IIQI")
# struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[]; }
_GSTRINGS = struct.Struct("=III")
# The most strings a set may claim before a buffer is sized from it.  The
# largest real set is a driver's statistics (mlx5 with hundreds of channels:
# some tens of thousands); the count is the host's answer, and on the
# controller (host/replay/probe_reads.py replays a probe's answers) a host that lies
# must not make it allocate gigabytes.
MAX_STRINGS = 1 << 16


def inet_socket() -> socket.socket:
    """The socket ioctls go through; it resolves device names in the
    namespace it was created in."""
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)


def siocethtool(sock: socket.socket, ifname: str, buf: array.array) -> int:
    """SIOCETHTOOL on `ifname` with ifr_data -> `buf`, which the kernel reads
    and writes in place (an array's buffer address stays valid while we
    hold it).  Returns the non-negative ioctl result; raises OSError."""
    validate_ifname(ifname)
    if hasattr(sock, "siocethtool"):  # the host's port made it (host/transports/io.py IoctlSocket)
        return sock.siocethtool(ifname, buf)
    return kernel_siocethtool(sock, ifname, buf)


def kernel_siocethtool(sock: socket.socket, ifname: str, buf: array.array) -> int:
    ifreq = bytearray(_IFREQ.pack(ifname.encode(), buf.buffer_info()[0]).ljust(_IFREQ_SIZE, b"\0"))
    # A mutable ifreq makes fcntl.ioctl return the syscall's result
    # (SFEATURES reports through it) instead of a copy of the buffer.
    return fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq, True)


def string_set(sock: socket.socket, ifname: str, sset: int,
               room: Optional[Callable[[int], int]] = None) -> list[str]:
    """The names of ethtool string set `sset` (ETH_SS_*) of `ifname`:
    GSSET_INFO for its size, then GSTRINGS.

    GSTRINGS ignores the length we pass and writes as many strings as the
    set has when it runs, so the buffer must be big enough for that:
    `room(count)` gives the number of strings to leave room for (default:
    the count GSSET_INFO reported, right for a set that cannot change).
    Raises OSError: EOPNOTSUPP when the device has no such set, EOVERFLOW
    when the set outgrew the room, EPROTO when it claims more than
    MAX_STRINGS; others from the ioctl."""
    info = array.array("B", _SSET_INFO.pack(ETHTOOL_GSSET_INFO, 0, 1 << sset, 0))
    siocethtool(sock, ifname, info)
    _cmd, _reserved, mask, count = _SSET_INFO.unpack(info.tobytes())
    if not mask & (1 << sset):
        raise OSError(errno.EOPNOTSUPP, f"no ethtool string set {sset} on {ifname}")
    if count == 0:
        return []
    if count > MAX_STRINGS:
        raise OSError(errno.EPROTO, f"ethtool string set {sset} of {ifname} claims {count} strings, "
                      f"more than the {MAX_STRINGS} nictune reads")
    size = room(count) if room is not None else count
    buf = array.array("B", _GSTRINGS.pack(ETHTOOL_GSTRINGS, sset, count))
    buf.extend(bytes(size * ETH_GSTRING_LEN))
    siocethtool(sock, ifname, buf)
    raw = buf.tobytes()
    written = _GSTRINGS.unpack_from(raw)[2]
    if written > size:
        raise OSError(errno.EOVERFLOW, f"ethtool string set {sset} of {ifname} grew to "
                      f"{written} strings, past the {size} there was room for")
    base = _GSTRINGS.size
    return [raw[base + i * ETH_GSTRING_LEN:base + (i + 1) * ETH_GSTRING_LEN]
            .split(b"\0", 1)[0].decode("utf-8", "replace")
            for i in range(written)]
