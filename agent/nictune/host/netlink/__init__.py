"""Minimal synchronous netlink layer for the host agent.

pyroute2 supplies only the message classes (see _pyroute2); the socket, the
request/ACK loop and the rtnl/ethtool calls are ours, to keep the agent's
import time and CPU cost small.  Importing this package itself stays cheap:
the pyroute2 parts load only with the rtnl/ethtool/socket modules.
"""

from __future__ import annotations

from nictune.host.netlink.errors import NetlinkError

__all__ = ["NetlinkError"]
