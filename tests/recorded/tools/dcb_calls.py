"""The nictune side of a recorded case: which Dcb call makes the request
that `dcb` sent, and with what argument (test helper).

One recorded request is one the agent never makes, as no profile key sets
the APP trust order: its encoder lives here, and RecordedDcb is nictune's
Dcb plus set_trust.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Sequence, Tuple

from nictune.host.transports.netlink import dcb as nd
from nictune.host.transports.netlink.socket import NLM_F_ACK, NLM_F_REQUEST
from nictune.host.validate import InvalidInput

from nictune.host.transports.netlink.dcb import (  # noqa: F401  (the tests import them from here)
    DCB_CMD_SDCBX,
    DCBX_HOST,
    DCBX_LLD_MANAGED,
    DCBX_STATIC,
    DCBX_VER_CEE,
    DCBX_VER_IEEE,
)


# --- the bytes of a request and the state in a reply (the agent sends and
# decodes through its socket; the recordings compare these) ----------------


def encode_request(
    cmd: int,
    ifname: str,
    attrs: list,
    seq: int = 0,
    pid: int = 0,
    flags: int = NLM_F_REQUEST | NLM_F_ACK,
) -> bytes:
    """The bytes of one dcbnl request, as Dcb sends them.

    attrs: the attributes after DCB_ATTR_IFNAME, from ets_attrs(),
    pfc_attrs() or app_attrs().
    """
    if cmd not in nd._MSG_TYPE:
        raise InvalidInput(f"unsupported DCB command: {cmd!r}")
    msg = nd._message(cmd, ifname, attrs)
    msg["header"]["type"] = nd._MSG_TYPE[cmd]
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = pid
    msg.encode()
    return bytes(msg.data)


def decode_reply(data: bytes) -> nd.DcbState:
    """The state in one kernel reply to DCB_CMD_IEEE_GET (a whole message)."""
    msg = nd.dcbmsg(bytes(data))
    msg.decode()
    return nd._state(msg)


# --- the requests the agent never makes ----------------------------------------


def trust_attrs(selectors: Sequence[int]) -> list:
    # The selectors and their entry attribute types are the APP table's.
    entries, seen = [], set()
    for sel in selectors:
        if isinstance(sel, bool) or sel not in nd._APP_PROTOCOL_MAX:
            raise InvalidInput(f"not a DCB APP selector: {sel!r}")
        if sel in seen:  # the kernel refuses duplicates with EINVAL
            raise InvalidInput(f"APP trust order names selector {sel} twice")
        seen.add(sel)
        entries.append((nd._selector_attr(sel), bytes([sel])))
    # An empty order is valid: trust nothing.
    table = ("DCB_ATTR_DCB_APP_TRUST_TABLE", {"attrs": entries})
    return [("DCB_ATTR_IEEE", {"attrs": [table]})]


class RecordedDcb(nd.Dcb):
    """nictune's Dcb plus the call only the recordings make."""

    def set_trust(self, ifname: str, selectors: List[int]) -> None:
        """The APP trust order (kernel 6.3+; drivers with dcbnl_setapptrust)."""
        self._set(nd.DCB_CMD_IEEE_SET, ifname, trust_attrs(selectors))


# --- recorded case -> call --------------------------------------------------------


def call_for(spec: dict, state: nd.DcbState) -> Tuple[str, Any]:
    """(RecordedDcb method name, its argument) for a case's "nictune" entry.

    set_ets / set_pfc start from the device's current ETS / PFC (as
    `dcb ets set` and `dcb pfc set` do) and change only the named fields.
    """
    method = spec["method"]
    if method == "set_ets":
        return method, dataclasses.replace(state.ets, **spec["change"])
    if method == "set_pfc":
        return method, dataclasses.replace(state.pfc, **spec["change"])
    if method == "set_buffer":
        return method, dataclasses.replace(state.buffer, **spec["change"])
    if method in ("add_apps", "del_apps"):
        return method, [nd.App(*entry) for entry in spec["apps"]]
    if method == "set_trust":
        return method, list(spec["selectors"])
    if method == "set_dcbx":
        return method, spec["mode"]
    raise ValueError(f"unknown method in recording: {method}")


_ENCODERS = {
    "set_ets": (nd.DCB_CMD_IEEE_SET, nd.ets_attrs),
    "set_pfc": (nd.DCB_CMD_IEEE_SET, nd.pfc_attrs),
    "add_apps": (nd.DCB_CMD_IEEE_SET, nd.app_attrs),
    "del_apps": (nd.DCB_CMD_IEEE_DEL, nd.app_attrs),
    "set_trust": (nd.DCB_CMD_IEEE_SET, trust_attrs),
    "set_buffer": (nd.DCB_CMD_IEEE_SET, nd.buffer_attrs),
    "set_dcbx": (nd.DCB_CMD_SDCBX, nd.dcbx_attrs),
}


def encode_call(method: str, arg: Any, ifname: str) -> bytes:
    """encode_request() for the message the RecordedDcb method sends (seq, pid 0)."""
    cmd, attrs = _ENCODERS[method]
    return encode_request(cmd, ifname, attrs(arg))
