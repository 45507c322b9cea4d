"""Driver name/version/firmware/bus of a device (ethtool -i).

ethtool netlink has no drvinfo message, so this is the legacy SIOCETHTOOL
ioctl (ETHTOOL_GDRVINFO) on a throw-away AF_INET socket.
"""

from __future__ import annotations

import array
import errno
import fcntl
import socket
import struct
from dataclasses import dataclass
from typing import Optional

from nictune.netlink.names import validate_ifname
from nictune.netlink.netns import in_netns

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x3
# struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32],
# bus_info[32], erom_version[32], reserved2[12], 5 x u32 counts.
_DRVINFO = struct.Struct("=I32s32s32s32s32s12s5I")
_IFREQ = struct.Struct("16sP")  # ifr_name, ifr_data (pointer)
_IFREQ_SIZE = 40  # sizeof(struct ifreq) on 64-bit; the union is 24 bytes


@dataclass
class DrvInfo:
    driver: str
    version: str
    fw_version: str
    bus_info: str


def _str(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def drvinfo(ifname: str, netns: str | None = None) -> Optional[DrvInfo]:
    """None when the device has no ethtool driver info (or does not exist)."""
    validate_ifname(ifname)
    # The kernel writes the answer through ifr_data, so it must point at a
    # buffer we own: an array's address stays valid while we hold it.
    buf = array.array("B", _DRVINFO.pack(ETHTOOL_GDRVINFO, *([b""] * 6), 0, 0, 0, 0, 0))
    ifreq = _IFREQ.pack(ifname.encode(), buf.buffer_info()[0]).ljust(_IFREQ_SIZE, b"\0")
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.EOPNOTSUPP):
            return None
        raise
    finally:
        sock.close()
    fields = _DRVINFO.unpack(buf.tobytes())
    return DrvInfo(*(_str(f) for f in fields[1:5]))
