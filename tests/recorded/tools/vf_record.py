"""Records what `ip link set PF vf N ...` sends, for tests/recorded/test_vf.py.

No device here has VFs, but the request is built before the kernel sees
it: `ip` runs in a throwaway network namespace on a veth (which answers
EOPNOTSUPP) under `strace -e write=3`, and the last RTM_NEWLINK it writes
to its netlink socket is kept, as hex.

    python tests/recorded/tools/vf_record.py          # record, print
    python tests/recorded/tools/vf_record.py --write  # rewrite tests/recorded/vf/requests.json

Needs root (a namespace), strace and iproute2.  A test tool: never shipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import recording  # noqa: E402

RECORDINGS = HERE.parent / "vf"
NETNS = "ntvfrec"
IFNAME = "ntv0"

REQUESTS = {
    "all": ["vf", "2", "mac", "02:00:00:00:00:12", "vlan", "100", "qos", "3", "spoofchk", "off",
            "state", "disable", "trust", "on", "min_tx_rate", "10", "max_tx_rate", "100"],
    "mac": ["vf", "0", "mac", "02:00:00:00:00:10"],
    "vlan-trust": ["vf", "1", "vlan", "101", "trust", "off"],
    "state-auto-spoofchk-on": ["vf", "3", "spoofchk", "on", "state", "auto"],
}

def unavailable() -> Optional[str]:
    for tool in ("strace", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def record_one(args: List[str]) -> dict:
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(["ip", "-n", NETNS, "link", "add", IFNAME, "type", "veth", "peer", "name",
                        "ntv1"], check=True)
        index = int(subprocess.run(
            ["ip", "netns", "exec", NETNS, "cat", f"/sys/class/net/{IFNAME}/ifindex"],
            capture_output=True, text=True, check=True).stdout)
        done = subprocess.run(["ip", "netns", "exec", NETNS, "strace", "-e", "trace=sendmsg",
                               "-e", "write=3", "ip", "link", "set", "dev", IFNAME, *args],
                              capture_output=True, text=True)
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=False)
    return {"argv": ["ip", "link", "set", "dev", "PF", *args], "ifindex": index,
            "sent": recording.last_newlink(done.stderr).hex()}


def record() -> dict:
    version = subprocess.run(["ip", "-V"], capture_output=True, text=True).stdout.strip()
    return {"tool": version, "requests": {name: record_one(args) for name, args in REQUESTS.items()}}


if __name__ == "__main__":
    sys.exit(recording.main(unavailable, record, RECORDINGS))
