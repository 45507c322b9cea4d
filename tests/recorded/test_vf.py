"""VF attribute messages against iproute2's `ip link set PF vf N ...`
(tests/recorded/vf, recorded with tools/vf_record.py: `ip` on a veth in a
throwaway namespace under strace, iproute2 6.1), and the VF list decoder.

The kernel's side (netdevsim takes them, `ip -j -d link` reads them back)
is tests/vm/guest/test_asap2.py.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from nictune.host.transports.netlink import vf as nlvf

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import vf_record as rec  # noqa: E402

RECORDED = json.loads((Path(__file__).resolve().parent / "vf" / "requests.json").read_text())

CONFIGS = {
    "all": (2, nlvf.VfConfig(mac="02:00:00:00:00:12", vlan=100, qos=3, spoofchk=False,
                             link_state="disable", trust=True, min_tx_rate=10, max_tx_rate=100)),
    "mac": (0, nlvf.VfConfig(mac="02:00:00:00:00:10")),
    "vlan-trust": (1, nlvf.VfConfig(vlan=101, qos=0, trust=False)),
    "state-auto-spoofchk-on": (3, nlvf.VfConfig(spoofchk=True, link_state="auto")),
}


def _ours(index: int, vf: int, cfg) -> str:
    msg = nlvf.set_message(index, vf, cfg)
    msg["header"]["type"] = nlvf.RTM_NEWLINK
    msg["header"]["flags"] = 0x5  # REQUEST | ACK, as the socket sends it
    msg["header"]["sequence_number"] = 0
    msg.encode()
    return bytes(msg.data).hex()


def _no_seq(hexline: str) -> str:
    return hexline[:16] + "00000000" + hexline[24:]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_vf_requests_are_what_ip_sends(name):
    recorded = RECORDED["requests"][name]
    vf, cfg = CONFIGS[name]
    assert _ours(recorded["ifindex"], vf, cfg) == _no_seq(recorded["sent"])


def test_the_installed_ip_still_sends_the_recorded_bytes():
    why = rec.unavailable()
    if why:
        pytest.skip(why)
    assert rec.REQUESTS
    for name, args in rec.REQUESTS.items():
        now = rec.record_one(args)
        assert _no_seq(now["sent"]) == _no_seq(RECORDED["requests"][name]["sent"]), name


def _attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def _vfinfo(vf: int, mac: bytes, vlan: int, qos: int, rate: tuple, spoof: int, link: int,
            trust: int) -> bytes:
    """One IFLA_VF_INFO as rtnl_fill_vfinfo() lays it out (uapi structs)."""
    return _attr(1, b"".join([
        _attr(1, struct.pack("=I32s", vf, mac)),
        _attr(2, struct.pack("=III", vf, vlan, qos)),
        _attr(3, struct.pack("=II", vf, rate[1])),
        _attr(6, struct.pack("=III", vf, *rate)),
        _attr(4, struct.pack("=II", vf, spoof)),
        _attr(5, struct.pack("=II", vf, link)),
        _attr(9, struct.pack("=II", vf, trust)),
    ]))


def test_the_vf_list_decodes_with_unknown_settings_as_none():
    body = struct.pack("=BxHiII", 0, 1, 7, 0, 0)
    body += _attr(3, b"eth0\0") + _attr(21, struct.pack("=I", 2))
    body += _attr(22, _vfinfo(0, bytes.fromhex("020000000010"), 100, 3, (10, 100), 1, 2, 1)
                  + _vfinfo(1, bytes(6), 0, 0, (0, 0), 0xFFFFFFFF, 0, 0xFFFFFFFF))
    data = struct.pack("=IHHII", 16 + len(body), nlvf.RTM_NEWLINK, 0, 0, 0) + body
    msg = nlvf.vfmsg(data)
    msg.decode()
    vfs = nlvf.decode_vfs(msg)
    assert vfs[0] == nlvf.VfConfig(mac="02:00:00:00:00:10", vlan=100, qos=3, spoofchk=True,
                                   trust=True, link_state="disable", min_tx_rate=10,
                                   max_tx_rate=100)
    # A driver without spoofchk/trust leaves the kernel's -1: unknown.
    assert vfs[1].spoofchk is None and vfs[1].trust is None
    assert vfs[1].link_state == "auto" and vfs[1].mac == "00:00:00:00:00:00"
