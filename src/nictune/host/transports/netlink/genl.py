"""Generic netlink's controller: the id of a family by its name, and a
socket bound to one family.

Shared by the clients of generic netlink families (ethtool.py, devlink.py,
macsec.py): a family's id is chosen by the kernel when it registers it.
"""

from __future__ import annotations

from nictune.host.transports.netlink._nlmsg import ctrlmsg
from nictune.host.transports.netlink.socket import NETLINK_GENERIC, NLM_F_REQUEST, NetlinkSocket

GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3


def resolve_family(nl: NetlinkSocket, name: str) -> int:
    """The id of the family `name`, asked on the generic netlink socket nl.
    A kernel without the family answers ENOENT (a NetlinkError)."""
    msg = ctrlmsg()
    msg["cmd"] = CTRL_CMD_GETFAMILY
    msg["version"] = 1
    msg["attrs"] = [("CTRL_ATTR_FAMILY_NAME", name)]
    reply = nl.request(msg, GENL_ID_CTRL, NLM_F_REQUEST, {GENL_ID_CTRL: ctrlmsg})
    return reply[0].get_attr("CTRL_ATTR_FAMILY_ID")


class GenlFamily:
    """A generic netlink socket and the id of FAMILY on it (self._nl,
    self._family); a context manager that closes the socket.  Resolving
    the family fails with ENOENT (a NetlinkError) on a kernel without it."""

    FAMILY = ""

    def __init__(self, opener=None):
        self._nl = NetlinkSocket(NETLINK_GENERIC, opener=opener)
        try:
            self._family = self._resolve_family()
        except BaseException:
            self._nl.close()
            raise

    def _resolve_family(self) -> int:
        return resolve_family(self._nl, self.FAMILY)

    def close(self) -> None:
        self._nl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
