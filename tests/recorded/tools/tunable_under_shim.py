"""Runs nictune's Tunables over its real ioctl socket inside a process
started with LD_PRELOAD=ioctlshim.so, so the shim logs the bytes nictune
hands the kernel and answers GETs (test helper).

stdin: {"ifname", "calls": [{"method": "get"} | {"method": "set", "value": N}]};
stdout: a JSON list of results {"value": N} / {"ok": true} / {"errno": N}.
"""

from __future__ import annotations

import json
import sys

from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.ethtool_ioctl import ETHTOOL_PFC_PREVENTION_TOUT, Tunables


def main() -> int:
    job = json.load(sys.stdin)
    out = []
    with Tunables() as tunables:
        for call in job["calls"]:
            try:
                if call["method"] == "get":
                    out.append({"value": tunables.get(job["ifname"], ETHTOOL_PFC_PREVENTION_TOUT)})
                else:
                    tunables.set(job["ifname"], ETHTOOL_PFC_PREVENTION_TOUT, call["value"])
                    out.append({"ok": True})
            except NetlinkError as e:
                out.append({"errno": e.errno})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
