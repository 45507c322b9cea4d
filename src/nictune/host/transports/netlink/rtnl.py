"""rtnetlink: list links, set MTU / txqueuelen / admin state."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import List, Optional

from nictune.host.transports.netlink._nlmsg import NLA_F_NESTED, nla, nlmsg
from nictune.host.transports.netlink.socket import NETLINK_ROUTE, NLM_F_ACK, NLM_F_REQUEST, NetlinkSocket

RTM_NEWLINK = 16
RTM_GETLINK = 18
IFF_UP = 0x1
RTEXT_FILTER_SKIP_STATS = 1 << 3
_OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")


class ifinfmsg(nlmsg):
    """Only the IFLA attributes we use, with their kernel ids.

    pyroute2's own ifinfmsg imports every link-kind plugin plus
    multiprocessing via pyroute2.config (~14 ms of the agent's budget);
    attributes not listed here are skipped undecoded.
    """

    fields = (
        ("family", "B"),
        ("__align", "x"),
        ("ifi_type", "H"),
        ("index", "i"),
        ("flags", "I"),
        ("change", "I"),
    )
    nla_map = (
        (1, "IFLA_ADDRESS", "cdata"),
        (3, "IFLA_IFNAME", "asciiz"),
        (4, "IFLA_MTU", "uint32"),
        (13, "IFLA_TXQLEN", "uint32"),
        (16, "IFLA_OPERSTATE", "uint8"),
        (18, "IFLA_LINKINFO", "linkinfo"),
        (29, "IFLA_EXT_MASK", "uint32"),
        (31, "IFLA_NUM_TX_QUEUES", "uint32"),
        (32, "IFLA_NUM_RX_QUEUES", "uint32"),
        (50, "IFLA_MIN_MTU", "uint32"),
        (51, "IFLA_MAX_MTU", "uint32"),
    )

    class linkinfo(nla):
        nla_flags = NLA_F_NESTED
        nla_map = ((1, "IFLA_INFO_KIND", "asciiz"),)


@dataclass
class Link:
    index: int
    name: str
    mtu: int
    min_mtu: Optional[int]
    max_mtu: Optional[int]
    txqlen: int
    up: bool  # the IFF_UP admin flag, not the carrier
    operstate: str
    mac: Optional[str]
    kind: Optional[str]  # IFLA_INFO_KIND ("veth", "bond", ...); None for plain NICs
    num_rx_queues: Optional[int]
    num_tx_queues: Optional[int]


def _link(msg: ifinfmsg) -> Link:
    get = msg.get_attr
    addr = get("IFLA_ADDRESS")
    info = get("IFLA_LINKINFO")
    oper = get("IFLA_OPERSTATE")
    return Link(
        index=msg["index"],
        name=get("IFLA_IFNAME"),
        mtu=get("IFLA_MTU"),
        min_mtu=get("IFLA_MIN_MTU"),
        max_mtu=get("IFLA_MAX_MTU"),
        txqlen=get("IFLA_TXQLEN"),
        up=bool(msg["flags"] & IFF_UP),
        operstate=_OPERSTATES[oper] if oper is not None and oper < len(_OPERSTATES) else "UNKNOWN",
        mac=":".join(f"{b:02x}" for b in addr) if addr else None,
        kind=info.get_attr("IFLA_INFO_KIND") if info is not None else None,
        num_rx_queues=get("IFLA_NUM_RX_QUEUES"),
        num_tx_queues=get("IFLA_NUM_TX_QUEUES"),
    )


class Rtnl:
    def __init__(self, opener=None):
        self._nl = NetlinkSocket(NETLINK_ROUTE, {RTM_NEWLINK: ifinfmsg}, opener)

    def close(self) -> None:
        self._nl.close()

    def __enter__(self) -> "Rtnl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def links(self) -> List[Link]:
        """All links of the namespace, from one RTM_GETLINK dump."""
        msg = ifinfmsg()
        # Skip the per-link statistics blocks: they are most of the dump.
        msg["attrs"] = [("IFLA_EXT_MASK", RTEXT_FILTER_SKIP_STATS)]
        return [_link(m) for m in self._nl.dump(msg, RTM_GETLINK)]

    def set_link(
        self,
        index: int,
        *,
        mtu: int | None = None,
        txqlen: int | None = None,
        up: bool | None = None,
    ) -> None:
        """One RTM_NEWLINK; only what is given changes."""
        if not isinstance(index, int) or isinstance(index, bool) or index <= 0:
            raise ValueError(f"invalid interface index: {index!r}")
        msg = ifinfmsg()
        msg["index"] = index
        attrs = []
        if mtu is not None:
            attrs.append(("IFLA_MTU", int(mtu)))
        if txqlen is not None:
            attrs.append(("IFLA_TXQLEN", int(txqlen)))
        msg["attrs"] = attrs
        if up is not None:
            # ifi_change limits the flag update to IFF_UP; without it the
            # kernel would treat every other flag bit as "set to 0".
            msg["flags"] = IFF_UP if up else 0
            msg["change"] = IFF_UP
        if not attrs and up is None:
            return
        self._nl.request(msg, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK)
