"""The driver's DCBX peer (DCB_ATTR_IEEE_PEER_ETS / _PFC / _APP): a reply
packed after the kernel's dcbnl_ieee_fill() and dcbnl_build_peer_app() by
tools/dcb_recorder.py's packers (independently of nictune), decoded by
nictune and made into the rail's neighbour (facts/neighbours.py, source
"dcbnl"), which the switch checks then compare with the profile."""

from __future__ import annotations

import struct

from nictune.host.facts import neighbours
from recorded.tools import dcb_calls as calls
from recorded.tools import dcb_recorder as rec

PEER_ETS, PEER_PFC, PEER_APP = 4, 5, 6


def _reply(with_peer: bool) -> bytes:
    ets = struct.pack("=59B", 0, 8, 0, *([50, 0, 0, 50, 0, 0, 0, 0] * 2), *[2, 0, 0, 2, 0, 0, 0, 0],
                      *[0, 0, 0, 3, 0, 0, 0, 0], *([0] * 24))
    pfc = struct.pack("=BBBxH2x8Q8Q", 8, 0x18, 0, 0, *([0] * 16))  # the peer: PFC on 3 and 4
    apps = b"".join(rec._nla(rec.APP_IEEE, struct.pack("=BBH", 5, prio, dscp)) for dscp, prio in ((26, 3), (48, 5)))
    ieee = rec._nla(rec.IEEE_ETS, ets)
    if with_peer:
        ieee += rec._nla(PEER_ETS, ets) + rec._nla(PEER_PFC, pfc) + rec._nla(PEER_APP, apps)
    attrs = rec._nla(rec.ATTR_IFNAME, b"eth2\0") + rec._nla(rec.ATTR_IEEE, ieee) + rec._nla(rec.ATTR_DCBX, b"\x05")
    return rec._message(rec.RTM_GETDCB, rec.CMD_IEEE_GET, attrs)


def test_the_peer_attributes_become_the_rails_neighbour():
    state = calls.decode_reply(_reply(True))
    assert state.peer_pfc.pfc_en == 0x18 and state.peer_ets.prio_tc[3] == 3
    assert [(a.selector, a.protocol, a.priority) for a in state.peer_apps] == [(5, 26, 3), (5, 48, 5)]
    (n,), said = neighbours.from_dcbnl(state, "eth2")
    assert said == "dcbnl: the driver's DCBX peer"
    assert (n.source, n.rail, n.pfc.enabled, n.dscp_map()) == ("dcbnl", "eth2", (3, 4), {26: 3, 48: 5})
    assert n.ets.tc_tsa[:4] == ("ets", "strict", "strict", "ets") and n.ets.tc_bw[0] == 50


def test_a_driver_without_peer_getters_gives_no_neighbour():
    state = calls.decode_reply(_reply(False))
    assert (state.peer_ets, state.peer_pfc, state.peer_apps) == (None, None, None)
    assert neighbours.from_dcbnl(state, "eth2") == ([], "dcbnl: no peer data")
