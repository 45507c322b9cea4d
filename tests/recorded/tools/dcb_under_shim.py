"""Runs nictune's Dcb (as RecordedDcb) over its real NetlinkSocket inside a
process started with LD_PRELOAD=nlshim.so, so the shim logs the bytes Dcb
sends and answers with the crafted kernel replies (test helper).

stdin: a JSON list of jobs {"log", "replies", "ifname", "spec" | "get": true};
stdout: a JSON list of results {"state": {...}} / {"ok": true} / {"errno": N}.
The shim reads NT_NLSHIM_LOG / NT_NLSHIM_REPLIES on every message, so one
process can run every job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from dcb_calls import RecordedDcb, call_for

from nictune.host.transports.netlink import dcb as nd
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.socket import NETLINK_ROUTE, NetlinkSocket


def run(job: dict, dcb: nd.Dcb) -> dict:
    os.environ["NT_NLSHIM_LOG"] = job["log"]
    os.environ["NT_NLSHIM_REPLIES"] = job["replies"]
    try:
        if job.get("get"):
            return {"state": dataclasses.asdict(dcb.get(job["ifname"]))}
        # set_ets/set_pfc start from what Dcb.get reads, as `dcb` does.
        state = dcb.get(job["ifname"]) if job["spec"]["method"] in ("set_ets", "set_pfc", "set_buffer") else None
        method, arg = call_for(job["spec"], state)
        getattr(dcb, method)(job["ifname"], arg)
        return {"ok": True}
    except NetlinkError as e:
        return {"errno": e.errno}


def main() -> int:
    jobs = json.load(sys.stdin)
    with NetlinkSocket(NETLINK_ROUTE) as sock:
        dcb = RecordedDcb(sock)
        json.dump([run(job, dcb) for job in jobs], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
