"""Driver name/version/firmware/bus of a device (ethtool -i).

ethtool netlink has no drvinfo message, so this is the legacy SIOCETHTOOL
ioctl (ETHTOOL_GDRVINFO) on a throw-away AF_INET socket.
"""

from __future__ import annotations

import array
import errno
import struct
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune.host.transports.netlink.ioctl import inet_socket, siocethtool

ETHTOOL_GDRVINFO = 0x3
# struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32],
# bus_info[32], erom_version[32], reserved2[12], 5 x u32 counts.
_DRVINFO = struct.Struct("=I32s32s32s32s32s12s5I")


@dataclass
class DrvInfo:
    driver: str
    version: str
    fw_version: str
    bus_info: str


def _str(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def drvinfo(ifname: str, sock=None) -> Optional[DrvInfo]:
    """None when the device has no ethtool driver info (or does not exist).

    `sock`: an inet_socket() to reuse when asking about many devices."""
    buf = array.array("B", _DRVINFO.pack(ETHTOOL_GDRVINFO, *([b""] * 6), 0, 0, 0, 0, 0))
    own = sock is None
    if own:
        sock = inet_socket()
    try:
        siocethtool(sock, ifname, buf)
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.EOPNOTSUPP):
            return None
        raise
    finally:
        if own:
            sock.close()
    fields = _DRVINFO.unpack(buf.tobytes())
    return DrvInfo(*(_str(f) for f in fields[1:5]))
