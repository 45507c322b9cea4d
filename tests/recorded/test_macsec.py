"""MACsec messages against iproute2's `ip macsec` and `ip link add ... type
macsec` (tests/recorded/macsec, recorded by tools/macsec_record.py).

The host kernel has no macsec module, so:
- requests: what nictune encodes is, byte for byte (the sequence number
  aside), what iproute2 6.1 sent when recorded, and what the installed `ip`
  sends now; nictune's own socket code, run under genlshim.c, sends the
  same bytes and keeps no copy of the key once the kernel has answered;
- replies: a GET_TXSC dump built from the uapi (tools/macsec_record.py,
  not by nictune) is decoded by nictune and by `ip -j macsec show`; both
  read the same values, and the decoder has no field a key could land in.
The real kernel's answers are in tests/vm/guest/test_macsec.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nictune.host.transports.netlink import macsec as ms

from .genl_helpers import recorded, run_nictune, shim_in_tmp, wire as _wire

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import macsec_record as rec  # noqa: E402

RECORDED = recorded("macsec")
REQUEST, ACK, DUMP, CREATE_EXCL = 0x1, 0x4, 0x300, 0x600
PEER = ms.sci_bytes("02:00:00:00:00:02", 1)


def _no_seq(hexline: str) -> str:
    raw = bytearray.fromhex(hexline)
    raw[8:12] = bytes(4)
    return raw.hex()


def _key(hexkey: str) -> bytearray:
    return bytearray.fromhex(hexkey)


def _genl(msg, flags=REQUEST | ACK):
    return _wire(msg, rec.FAMILY_ID, flags)


def _link(**kw):
    return _wire(ms.link_add_message(1, "macsec0", **kw), 16, REQUEST | ACK | CREATE_EXCL)


OURS = {
    "txsa": lambda: _genl(ms.sa_message(ms.CMD_ADD_TXSA, 1, 0, 1, b"\x01", _key(rec.KEY128))),
    "txsa-256-an3": lambda: _genl(ms.sa_message(ms.CMD_ADD_TXSA, 1, 3, 0xFFFFFFFF,
                                                bytes.fromhex("a1b2c3d4"), _key(rec.KEY256))),
    "rxsc": lambda: _genl(ms.rxsc_message(1, PEER)),
    "rxsa": lambda: _genl(ms.sa_message(ms.CMD_ADD_RXSA, 1, 1, 5, b"\x02", _key(rec.KEY128),
                                        rx_sci=PEER)),
    "offload-mac": lambda: _genl(ms.offload_message(1, "mac")),
    "offload-off": lambda: _genl(ms.offload_message(1, "off")),
    "show": lambda: _genl(ms.dump_message(), REQUEST | DUMP),
    "link-port-256-mac": lambda: _link(port=11, encrypt=True, offload="mac",
                                       cipher="gcm-aes-256", icv_len=16),
    "link-sci-128": lambda: _link(sci=bytes.fromhex("0200000000010001"), encrypt=False,
                                  cipher="gcm-aes-128"),
    "link-port-phy": lambda: _link(port=7, encrypt=True, offload="phy"),
}


def test_every_recording_has_an_encoder():
    assert sorted(OURS) == sorted(RECORDED["requests"])


@pytest.mark.parametrize("name", sorted(OURS))
def test_requests_are_what_iproute2_sent(name):
    sent = RECORDED["requests"][name]["sent"]
    assert len(sent) == 1
    assert OURS[name]() == _no_seq(sent[0])


def test_bad_values_never_reach_a_message():
    with pytest.raises(ValueError):
        ms.sci_bytes("02:00:00:00:00", 1)
    with pytest.raises(ValueError):
        ms.sci_bytes("02:00:00:00:00:02", 0)
    with pytest.raises(ValueError):
        ms.sa_message(ms.CMD_ADD_TXSA, 1, 4, 1, b"\x01", _key(rec.KEY128))
    with pytest.raises(ValueError):
        ms.sa_message(ms.CMD_ADD_TXSA, 1, 0, 0, b"\x01", _key(rec.KEY128))
    with pytest.raises(KeyError):
        ms.offload_message(1, "hw")


@pytest.fixture(scope="module")
def shim():
    yield from shim_in_tmp(rec.unavailable)


def test_the_installed_ip_still_sends_the_recorded_bytes(shim):
    so, work = shim
    assert rec.GENL_REQUESTS and rec.LINK_REQUESTS
    for name, args in rec.GENL_REQUESTS:
        _, sent = rec.run_genl(so, work, args)
        assert [_no_seq(s) for s in sent] == [_no_seq(s) for s in RECORDED["requests"][name]["sent"]], name
    for name, args in rec.LINK_REQUESTS:
        assert _no_seq(rec.record_link(args)) == _no_seq(RECORDED["requests"][name]["sent"][0]), name


def test_the_dump_reads_as_ip_macsec_show_reads_it(shim):
    so, work = shim
    reply = rec.secy_reply(ifindex=1)
    out, _ = rec.run_genl(so, work, ["show"], {0: reply}, json_out=True)
    theirs = json.loads(out)[0]
    msg = ms.macsecmsg(reply)
    msg.decode()
    ours = ms.decode_secy(msg)
    assert ours.ifindex == theirs["ifindex"] == 1
    assert ours.offload == theirs["offload"] == "mac"
    assert ours.cipher.upper() == theirs["cipher_suite"] == "GCM-AES-256"
    assert ours.icv_len == theirs["icv_length"] == 16
    assert ours.encrypt is theirs["encrypt"] is True
    assert ours.validate == theirs["validate"] == "strict"
    assert int(ours.sci, 16) == int(theirs["sci"], 16)
    assert [(s.an, s.pn, s.active, s.keyid) for s in ours.tx_sas] == \
        [(s["an"], s["pn"], s["active"], s["key"]) for s in theirs["sa_list"]]
    assert len(ours.rx_scs) == len(theirs["rx_sc"]) == 1
    rx, trx = ours.rx_scs[0], theirs["rx_sc"][0]
    assert int(rx.sci, 16) == int(trx["sci"], 16) and rx.active is trx["active"]
    assert [(s.an, s.pn, s.active, s.keyid) for s in rx.sas] == \
        [(s["an"], s["pn"], s["active"], s["key"]) for s in trx["sa_list"]]


def test_the_decoder_has_no_place_for_a_key():
    # A reply that (wrongly) carried MACSEC_SA_ATTR_KEY in an SA: the
    # decoded records hold no trace of it.
    key = bytes.fromhex(rec.KEY128)
    sa = (rec._u8(1, 0) + rec._u32(3, 1) + rec._attr(5, b"\x01".ljust(16, b"\0"))
          + rec._attr(4, key) + rec._u8(2, 1))
    body = (bytes([0, 1, 0, 0]) + rec._u32(1, 1) + rec._attr(4, rec._u8(5, 16))
            + rec._attr(5, rec._attr(1, sa)))
    raw = (16 + len(body)).to_bytes(4, "little") + bytes(12) + body
    msg = ms.macsecmsg(raw)
    msg.decode()
    secy = ms.decode_secy(msg)
    assert secy.tx_sas[0].keyid == "01" + "00" * 15
    assert rec.KEY128 not in repr(secy) and key not in repr(secy).encode()


_SOCKET_SCRIPT = """
import gc, json, sys
sys.path.insert(0, sys.argv[1])
from nictune.host.transports.netlink.macsec import Macsec, sci_bytes
KEY = bytes.fromhex(sys.argv[2])
m = Macsec()
kept = []  # every SA message add_sa sent, still referenced after it returns
_send = m._send
def stash(msg):
    if msg["cmd"] in (4, 7):  # ADD_TXSA, ADD_RXSA
        kept.append(msg)
    _send(msg)
m._send = stash
key = bytearray(KEY)
m.add_sa(1, 0, 1, b"\\x01", key)
key[:] = bytes(len(key))
key = bytearray(KEY)
m.add_sa(1, 1, 5, b"\\x02", key, rx_sci=sci_bytes("02:00:00:00:00:02", 1))
key[:] = bytes(len(key))
del key
m.add_rxsc(1, sci_bytes("02:00:00:00:00:02", 1))
m.set_offload(1, "mac")
secys = m.secys()
gc.collect()
left = 0
for o in gc.get_objects():
    try:
        if isinstance(o, (bytes, bytearray)) and o is not KEY and KEY in o:
            left += 1
        elif isinstance(o, dict) and any(isinstance(v, (bytes, bytearray)) and v is not KEY
                                          and KEY in v for v in o.values()):
            left += 1
    except Exception:
        pass
for msg in kept:  # the messages themselves: datagram overwritten, attributes dropped
    if KEY in bytes(msg.data) or KEY.hex() in repr(msg["attrs"]) or msg["attrs"]:
        left += 1
print(json.dumps({"left": left, "kept": len(kept), "offload": secys[1].offload, "tx": len(secys[1].tx_sas)}))
"""


def test_nictune_sends_the_same_bytes_and_keeps_no_key(shim):
    so, work = shim
    log = work / "sent.hex"
    rdir = work / "replies"
    rdir.mkdir(exist_ok=True)
    for f in rdir.iterdir():
        f.unlink()
    (rdir / "0.bin").write_bytes(rec.secy_reply(ifindex=1))
    if log.exists():
        log.unlink()
    done = run_nictune(so, "macsec", log, rdir, _SOCKET_SCRIPT, [rec.KEY128], timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"left": 0, "kept": 2, "offload": "mac", "tx": 1}
    sent = [_no_seq(s) for s in log.read_text().split()]
    expect = [_no_seq(RECORDED["requests"][n]["sent"][0])
              for n in ("txsa", "rxsa", "rxsc", "offload-mac", "show")]
    assert sent == expect
