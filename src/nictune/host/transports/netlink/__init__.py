"""Minimal synchronous netlink layer for the host agent.

The socket, the request/ACK loop and the rtnl/ethtool/devlink calls are
ours, to keep the agent's import time and CPU cost small.  Their message
classes are ours too (_nlmsg.py: pyroute2's API, none of its imports);
pyroute2 supplies only those of dcb, inet, vf, xfrm and macsec (see
_pyroute2).  Importing this package itself stays cheap.
"""

from __future__ import annotations

from nictune.host.transports.netlink.errors import NetlinkError

__all__ = ["NetlinkError"]
