"""The nictune side of a recorded case: which Dcb call makes the request
that `dcb` sent, and with what argument (test helper)."""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

from nictune.host.netlink import dcb as nd


def call_for(spec: dict, state: nd.DcbState) -> Tuple[str, Any]:
    """(Dcb method name, its argument) for a case's "nictune" entry.

    set_ets / set_pfc start from the device's current ETS / PFC (as
    `dcb ets set` and `dcb pfc set` do) and change only the named fields.
    """
    method = spec["method"]
    if method == "set_ets":
        return method, dataclasses.replace(state.ets, **spec["change"])
    if method == "set_pfc":
        return method, dataclasses.replace(state.pfc, **spec["change"])
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
    "set_trust": (nd.DCB_CMD_IEEE_SET, nd.trust_attrs),
    "set_dcbx": (nd.DCB_CMD_SDCBX, nd.dcbx_attrs),
}


def encode_call(method: str, arg: Any, ifname: str) -> bytes:
    """encode_request() for the message the Dcb method sends (seq, pid 0)."""
    cmd, attrs = _ENCODERS[method]
    return nd.encode_request(cmd, ifname, attrs(arg))
