"""Records what iproute2 sends for MACsec, for tests/recorded/test_macsec.py.

The host kernel has no macsec module, but every request is built before
the kernel sees it:
- `ip macsec add/offload/show` (generic netlink) run under genlshim.c
  (built by recording.build_shim) with NT_GENLSHIM_FAMILY=macsec: the
  shim answers CTRL_GETFAMILY("macsec") and logs each request instead of
  sending it.  The device is `lo` (ifindex 1): `ip macsec` only resolves
  the name to an index.
- `ip link add link lo macsec0 type macsec ...` (rtnetlink) runs under
  `strace -e write=3`; the kernel answers "Unknown device type" and the
  RTM_NEWLINK it was sent is kept (recording.last_newlink parses the dump).
A GET_TXSC dump reply is built here from if_macsec.h as drivers/net/
macsec.c (dump_secy) lays it out, independently of nictune, so that the
same bytes check nictune's decoder against what `ip -j macsec show` reads.

    python tests/recorded/tools/macsec_record.py          # record, print
    python tests/recorded/tools/macsec_record.py --write  # rewrite tests/recorded/macsec/requests.json

Keys in the recordings are made-up test keys.  A test tool: never shipped.
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

RECORDINGS = HERE.parent / "macsec"
KEY128 = "00112233445566778899aabbccddeeff"
KEY256 = "f0e1d2c3b4a5968778695a4b3c2d1e0f00112233445566778899aabbccddeeff"

GENL_REQUESTS: List[Tuple[str, List[str]]] = [
    ("txsa", ["add", "lo", "tx", "sa", "0", "pn", "1", "on", "key", "01", KEY128]),
    ("txsa-256-an3", ["add", "lo", "tx", "sa", "3", "pn", "4294967295", "on", "key",
                      "a1b2c3d4", KEY256]),
    ("rxsc", ["add", "lo", "rx", "port", "1", "address", "02:00:00:00:00:02"]),
    ("rxsa", ["add", "lo", "rx", "port", "1", "address", "02:00:00:00:00:02", "sa", "1", "pn",
              "5", "on", "key", "02", KEY128]),
    ("offload-mac", ["offload", "lo", "mac"]),
    ("offload-off", ["offload", "lo", "off"]),
    ("show", ["show"]),
]
LINK_REQUESTS: List[Tuple[str, List[str]]] = [
    ("link-port-256-mac", ["port", "11", "encrypt", "on", "offload", "mac", "cipher",
                           "gcm-aes-256", "icvlen", "16"]),
    ("link-sci-128", ["sci", "0x0200000000010001", "encrypt", "off", "cipher", "gcm-aes-128"]),
    ("link-port-phy", ["port", "7", "encrypt", "on", "offload", "phy"]),
]


def unavailable() -> Optional[str]:
    for tool in ("gcc", "ip", "strace"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def ip_version() -> str:
    return subprocess.run(["ip", "-V"], capture_output=True, text=True).stdout.strip()


def run_genl(shim: Path, workdir: Path, args: List[str], replies: Optional[Dict[int, bytes]] = None,
             json_out: bool = False) -> Tuple[str, List[str]]:
    """`ip [-j] macsec args` under the shim; (stdout, hex of each request)."""
    argv = ["ip"] + (["-j"] if json_out else []) + ["macsec"] + args
    return recording.run_genl(shim, workdir, "macsec", argv, replies)


def record_link(args: List[str]) -> str:
    """The RTM_NEWLINK `ip link add link lo macsec0 type macsec args` sends."""
    done = subprocess.run(["strace", "-e", "trace=sendmsg", "-e", "write=3", "ip", "link", "add",
                           "link", "lo", "macsec0", "type", "macsec", *args],
                          capture_output=True, text=True, timeout=20)
    return recording.last_newlink(done.stderr).hex()


# -- a GET_TXSC reply, from if_macsec.h and dump_secy ---------------------------

_attr = recording.attr


def _u8(kind: int, v: int) -> bytes:
    return _attr(kind, struct.pack("=B", v))


def _u32(kind: int, v: int) -> bytes:
    return _attr(kind, struct.pack("=I", v))


def _u64(kind: int, v: int) -> bytes:
    return _attr(kind, struct.pack("=Q", v))


# dump_secy opens every nest with nla_nest_start_noflag: iproute2 6.1 parses
# with parse_rtattr (no flag masking) and rejects nests flagged NLA_F_NESTED.
NESTED = 0


def _sa(an: int, pn: int, keyid: bytes, active: int) -> bytes:
    # dump_secy per SA: STATS nest, AN, PN, KEYID, ACTIVE (6.x order)
    return (_attr(6 | NESTED, b"") + _u8(1, an) + _u32(3, pn)
            + _attr(5, keyid.ljust(16, b"\0")) + _u8(2, active))


def secy_reply(ifindex: int = 1) -> bytes:
    """One SecY: gcm-aes-256, ICV 16, encrypt on, offload mac, TX SA 0
    (keyid 01), one RX SC 02:00:00:00:00:02 port 1 with SA 1 (keyid 02)."""
    secy = (_attr(1, bytes.fromhex("0200000000010001")) + _u64(4, 0x0080C20001000002)
            + _u8(5, 16) + _u8(8, 1) + _u8(6, 1) + _u8(7, 0) + _u8(9, 2) + _u8(10, 1)
            + _u8(11, 0) + _u8(12, 0) + _u8(13, 0) + _u8(2, 0))
    txsa = _attr(1 | NESTED, _sa(0, 1, b"\x01", 1))
    rxsc = _attr(1 | NESTED, _u8(2, 1) + _attr(1, bytes.fromhex("0200000000020001"))
                 + _attr(4 | NESTED, b"")
                 + _attr(3 | NESTED, _attr(1 | NESTED, _sa(1, 5, b"\x02", 1))))
    attrs = (_u32(1, ifindex) + _attr(9 | NESTED, _u8(1, 2)) + _attr(4 | NESTED, secy)
             + _attr(7 | NESTED, b"") + _attr(8 | NESTED, b"")
             + _attr(5 | NESTED, txsa) + _attr(6 | NESTED, rxsc))
    body = struct.pack("=BBH", 0, 1, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), FAMILY_ID, 0, 0, 0) + body


def record() -> dict:
    out = {"tool": ip_version(), "requests": recording.record_genl(run_genl, GENL_REQUESTS, ["ip", "macsec"])}
    for name, args in LINK_REQUESTS:
        out["requests"][name] = {
            "argv": ["ip", "link", "add", "link", "lo", "macsec0", "type", "macsec", *args],
            "sent": [record_link(args)]}
    return out


if __name__ == "__main__":
    sys.exit(recording.main(unavailable, record, RECORDINGS))
