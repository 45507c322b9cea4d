"""How many IPsec SAs the network namespace holds: one XFRM_MSG_GETSADINFO
(what `ip xfrm state count` asks, iproute2 ip/xfrm_state.c
xfrm_sad_getinfo), not a dump of them.

The kernel answers XFRM_MSG_NEWSADINFO: a u32 of flags, then XFRMA_SAD_CNT
(u32, the namespace's SA count) and XFRMA_SAD_HINFO (net/xfrm/xfrm_user.c
build_sadinfo; enum xfrm_sadattr_type_t in include/uapi/linux/xfrm.h).
Health facts (health.py) read the SAs only when there are any: an SA dump
and its message classes (netlink/xfrm.py, on pyroute2) cost every verify
some 10 ms of CPU on the many hosts that have none.
"""

from __future__ import annotations

from nictune.host.transports.netlink._nlmsg import nlmsg
from nictune.host.transports.netlink.socket import NLM_F_REQUEST, NetlinkSocket

NETLINK_XFRM = 6
XFRM_MSG_NEWSADINFO = 34
XFRM_MSG_GETSADINFO = 35


class sadinfo_msg(nlmsg):
    fields = (("flags", "I"),)
    nla_map = ((1, "XFRMA_SAD_CNT", "uint32"),)


def sa_count(opener=None) -> int:
    """The number of SAs in this network namespace (OSError: NETLINK_XFRM
    cannot be asked, e.g. without xfrm_user or CAP_NET_ADMIN)."""
    with NetlinkSocket(NETLINK_XFRM, opener=opener) as nl:
        reply = nl.request(sadinfo_msg(), XFRM_MSG_GETSADINFO, NLM_F_REQUEST,
                           {XFRM_MSG_NEWSADINFO: sadinfo_msg})
    return reply[0].get_attr("XFRMA_SAD_CNT") or 0 if reply else 0
