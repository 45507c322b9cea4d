"""Runs iproute2's `devlink` against genlshim.c, for tests/recorded/test_devlink.py.

The host kernel has no devlink family, so `devlink` runs under an LD_PRELOAD
shim (genlshim.c, compiled into a temp dir) that answers CTRL_GETFAMILY for
"devlink" with a made-up family id, logs every devlink request instead of
sending it, and answers it with replies written here.  The replies are
packed with struct from include/uapi/linux/devlink.h and laid out as
net/devlink/ (devlink_nl_eswitch_fill, devlink_nl_port_fill,
devlink_nl_info_fill + devlink_info_version_put) lays them out --
independently of nictune.host.transports.netlink.devlink, so the same bytes check
nictune's decoder against what `devlink -j` makes of them.

    python tests/recorded/tools/devlink_record.py          # record, print
    python tests/recorded/tools/devlink_record.py --write  # rewrite tests/recorded/devlink/requests.json

A test tool: never shipped.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import recording  # noqa: E402
from recording import FAMILY_ID  # noqa: E402

RECORDINGS = HERE.parent / "devlink"

CMD_GET, CMD_PORT_GET, CMD_ESWITCH_GET, CMD_ESWITCH_SET, CMD_INFO_GET = 1, 5, 29, 30, 51
A_BUS, A_DEV, A_PORT_INDEX, A_PORT_TYPE, A_NETDEV_IFINDEX, A_NETDEV_NAME = 1, 2, 3, 4, 6, 7
A_ESW_MODE, A_ESW_INLINE, A_ESW_ENCAP = 25, 26, 62
A_FLAVOUR, A_PORT_NUMBER = 77, 78
A_INFO_DRIVER, A_INFO_SERIAL = 98, 99
A_VER_FIXED, A_VER_RUNNING, A_VER_STORED, A_VER_NAME, A_VER_VALUE = 100, 101, 102, 103, 104
A_PF, A_VF = 127, 128
A_CONTROLLER = 150

# What the recordings ask `devlink` to send.
REQUESTS: List[Tuple[str, List[str]]] = [
    ("mode-switchdev", ["dev", "eswitch", "set", "pci/0000:03:00.0", "mode", "switchdev"]),
    ("mode-legacy", ["dev", "eswitch", "set", "pci/0000:03:00.0", "mode", "legacy"]),
    ("inline-transport", ["dev", "eswitch", "set", "pci/0000:03:00.0", "inline-mode", "transport"]),
    ("encap-basic-netdevsim", ["dev", "eswitch", "set", "netdevsim/netdevsim1", "encap-mode", "basic"]),
    ("all-three", ["dev", "eswitch", "set", "pci/0000:03:00.0", "mode", "legacy",
                   "inline-mode", "none", "encap-mode", "none"]),
    ("eswitch-show", ["dev", "eswitch", "show", "pci/0000:03:00.0"]),
    ("info", ["dev", "info", "pci/0000:03:00.0"]),
]


_attr = recording.attr


def _str(kind: int, text: str) -> bytes:
    return _attr(kind, text.encode() + b"\0")


def _message(cmd: int, attrs: List[bytes]) -> bytes:
    body = struct.pack("=BBH", cmd, 1, 0) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), FAMILY_ID, 0, 0, 0) + body


def eswitch_reply(handle: str, mode: int, inline: Optional[int], encap: Optional[int]) -> bytes:
    bus, dev = handle.split("/", 1)
    attrs = [_str(A_BUS, bus), _str(A_DEV, dev), _attr(A_ESW_MODE, struct.pack("=H", mode))]
    if inline is not None:
        attrs.append(_attr(A_ESW_INLINE, struct.pack("=B", inline)))
    if encap is not None:
        attrs.append(_attr(A_ESW_ENCAP, struct.pack("=B", encap)))
    return _message(CMD_ESWITCH_GET, attrs)


def port_reply(handle: str, index: int, flavour: int, netdev: Optional[str],
               number: Optional[int] = None, pf: Optional[int] = None,
               vf: Optional[int] = None) -> bytes:
    bus, dev = handle.split("/", 1)
    attrs = [_str(A_BUS, bus), _str(A_DEV, dev), _attr(A_PORT_INDEX, struct.pack("=I", index)),
             _attr(A_PORT_TYPE, struct.pack("=H", 2))]  # DEVLINK_PORT_TYPE_ETH
    if netdev is not None:
        attrs += [_attr(A_NETDEV_IFINDEX, struct.pack("=I", 10 + index)), _str(A_NETDEV_NAME, netdev)]
    attrs.append(_attr(A_FLAVOUR, struct.pack("=H", flavour)))
    if number is not None:
        attrs.append(_attr(A_PORT_NUMBER, struct.pack("=I", number)))
    if pf is not None:
        attrs += [_attr(A_CONTROLLER, struct.pack("=I", 0)), _attr(A_PF, struct.pack("=H", pf))]
    if vf is not None:
        attrs.append(_attr(A_VF, struct.pack("=H", vf)))
    return _message(CMD_PORT_GET, attrs)


def info_reply(handle: str, driver: str, serial: str, fixed: Dict[str, str],
               running: Dict[str, str], stored: Dict[str, str]) -> bytes:
    bus, dev = handle.split("/", 1)
    attrs = [_str(A_BUS, bus), _str(A_DEV, dev), _str(A_INFO_DRIVER, driver),
             _str(A_INFO_SERIAL, serial)]
    for kind, versions in ((A_VER_FIXED, fixed), (A_VER_RUNNING, running), (A_VER_STORED, stored)):
        for name, value in versions.items():
            # devlink_info_version_put: nla_nest_start_noflag, no NLA_F_NESTED
            attrs.append(_attr(kind, _str(A_VER_NAME, name) + _str(A_VER_VALUE, value)))
    return _message(CMD_INFO_GET, attrs)


def unavailable() -> Optional[str]:
    if shutil.which("gcc") is None:
        return "gcc is not installed (needed to build the LD_PRELOAD shim)"
    if shutil.which("devlink") is None:
        return "iproute2's devlink is not installed"
    return None


def run(shim: Path, workdir: Path, args: List[str], replies: Optional[Dict[int, bytes]] = None,
        json_out: bool = False) -> Tuple[str, List[str]]:
    """Run `devlink [-j] args` under the shim; (stdout, hex of each request)."""
    argv = ["devlink"] + (["-j"] if json_out else []) + args
    return recording.run_genl(shim, workdir, "devlink", argv, replies)


def devlink_version() -> str:
    return subprocess.run(["devlink", "-V"], capture_output=True, text=True).stdout.strip()


def record() -> dict:
    return {"tool": devlink_version(), "requests": recording.record_genl(run, REQUESTS, ["devlink"])}


if __name__ == "__main__":
    sys.exit(recording.main(unavailable, record, RECORDINGS))
