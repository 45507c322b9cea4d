"""devlink messages against iproute2's `devlink` (tests/recorded/devlink).

The host kernel has no devlink family, so both `devlink` and nictune run
under tests/recorded/tools/genlshim.c, an LD_PRELOAD shim that answers
CTRL_GETFAMILY("devlink") and logs each request instead of sending it:
- requests: what nictune encodes is, byte for byte (the sequence number
  aside), what `devlink dev eswitch set/show` and `dev info` sent when
  recorded (requests.json, iproute2 6.1), and what the installed devlink
  sends now; nictune's own socket code, run under the same shim, sends the
  same bytes;
- replies: built from the uapi (tools/devlink_record.py, not by nictune),
  decoded by nictune and by `devlink -j`; both must read the same values.
The real kernel's answers are in tests/vm/guest/test_asap2.py (netdevsim).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nictune.host.transports.netlink import devlink as dl
from nictune.host.validate import InvalidInput

from .genl_helpers import recorded, run_nictune, shim_in_tmp, wire

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import devlink_record as rec  # noqa: E402

RECORDED = recorded("devlink")
REQUEST, ACK, DUMP = 0x1, 0x4, 0x300
HANDLE = "pci/0000:03:00.0"


def _wire(msg, flags: int) -> str:
    return wire(msg, rec.FAMILY_ID, flags)


def _no_seq(hexline: str) -> str:
    """The request without its sequence number and with attribute padding
    zeroed: libmnl 1.0.4 leaves what the buffer held before in the padding
    after a u8 attribute (seen: 05 00 after ESWITCH_ENCAP_MODE), which the
    kernel never reads (nla_len excludes it)."""
    raw = bytearray.fromhex(hexline)
    raw[8:12] = bytes(4)
    off = 20  # nlmsghdr + genlmsghdr; devlink requests have flat attributes
    while off + 4 <= len(raw):
        length = int.from_bytes(raw[off:off + 2], "little")
        if length < 4:
            break
        end = off + ((length + 3) & ~3)
        raw[off + length:end] = bytes(end - off - length)
        off = end
    return raw.hex()


OURS = {
    "mode-switchdev": lambda: _wire(dl.eswitch_set_message(HANDLE, mode="switchdev"), REQUEST | ACK),
    "mode-legacy": lambda: _wire(dl.eswitch_set_message(HANDLE, mode="legacy"), REQUEST | ACK),
    "inline-transport": lambda: _wire(dl.eswitch_set_message(HANDLE, inline_mode="transport"), REQUEST | ACK),
    "encap-basic-netdevsim": lambda: _wire(
        dl.eswitch_set_message("netdevsim/netdevsim1", encap="basic"), REQUEST | ACK),
    "all-three": lambda: _wire(dl.eswitch_set_message(HANDLE, "legacy", "none", "none"), REQUEST | ACK),
    "eswitch-show": lambda: _wire(dl.handle_message(dl.DEVLINK_CMD_ESWITCH_GET, HANDLE), REQUEST | ACK),
    "info": lambda: _wire(dl.handle_message(dl.DEVLINK_CMD_INFO_GET, HANDLE), REQUEST | ACK),
}


@pytest.mark.parametrize("name", sorted(OURS))
def test_requests_are_what_devlink_sent(name):
    sent = RECORDED["requests"][name]["sent"]
    assert len(sent) == 1
    assert OURS[name]() == _no_seq(sent[0])


def test_bad_values_never_reach_a_message():
    with pytest.raises(InvalidInput):
        dl.eswitch_set_message(HANDLE, mode="offloads")
    with pytest.raises(InvalidInput):
        dl.eswitch_set_message("pci", mode="legacy")
    with pytest.raises(InvalidInput):
        dl.eswitch_set_message("pci/0000:03:00.0; reboot", mode="legacy")


@pytest.fixture(scope="module")
def shim():
    yield from shim_in_tmp(rec.unavailable)


def test_the_installed_devlink_still_sends_the_recorded_bytes(shim):
    so, work = shim
    assert rec.REQUESTS
    for name, args in rec.REQUESTS:
        _, sent = rec.run(so, work, args)
        assert [_no_seq(s) for s in sent] == [_no_seq(s) for s in RECORDED["requests"][name]["sent"]], name


_SOCKET_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from nictune.host.transports.netlink.devlink import Devlink
d = Devlink()
d.set_eswitch("pci/0000:03:00.0", mode="switchdev")
d.set_eswitch("pci/0000:03:00.0", inline_mode="transport")
d.set_eswitch("netdevsim/netdevsim1", encap="basic")
print(json.dumps(vars(d.eswitch("pci/0000:03:00.0"))))
"""


def test_nictunes_socket_sends_the_same_bytes_as_devlink(shim):
    """Devlink() itself (family lookup, one request per attribute, ACKs)
    under the shim: its log holds exactly devlink's requests."""
    so, work = shim
    log, replies = work / "ours.hex", work / "ours-replies"
    replies.mkdir(exist_ok=True)
    (replies / f"{rec.CMD_ESWITCH_GET}.bin").write_bytes(rec.eswitch_reply(HANDLE, 1, 3, 1))
    done = run_nictune(so, "devlink", log, replies, _SOCKET_SCRIPT, [], timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"mode": "switchdev", "inline_mode": "transport", "encap": "basic"}
    want = [RECORDED["requests"][n]["sent"][0] for n in
            ("mode-switchdev", "inline-transport", "encap-basic-netdevsim", "eswitch-show")]
    assert [_no_seq(s) for s in log.read_text().split()] == [_no_seq(s) for s in want]


def _decode(data: bytes):
    msg = dl.devlinkmsg(data)
    msg.decode()
    return msg


@pytest.mark.parametrize("mode,inline,encap", [(1, 3, 1), (0, 0, 0), (1, None, None)])
def test_eswitch_replies_read_as_devlink_reads_them(shim, mode, inline, encap):
    so, work = shim
    reply = rec.eswitch_reply(HANDLE, mode, inline, encap)
    out, _ = rec.run(so, work, ["dev", "eswitch", "show", HANDLE], {rec.CMD_ESWITCH_GET: reply}, True)
    theirs = json.loads(out)["dev"][HANDLE]
    ours = dl.decode_eswitch(_decode(reply))
    assert ours.mode == theirs["mode"]
    assert ours.inline_mode == theirs.get("inline-mode")
    assert ours.encap == theirs.get("encap-mode", theirs.get("encap"))


def test_port_dumps_read_as_devlink_reads_them(shim):
    so, work = shim
    ports = (rec.port_reply(HANDLE, 65535, 0, "ens1f0np0", number=0)
             + rec.port_reply(HANDLE, 1, 4, "ens1f0npf0vf3", pf=0, vf=3)
             + rec.port_reply(HANDLE, 2, 3, "ens1f0npf0", pf=0)
             + rec.port_reply("netdevsim/netdevsim1", 0, 0, None, number=0))
    out, _ = rec.run(so, work, ["port", "show"], {rec.CMD_PORT_GET: ports}, True)
    theirs = json.loads(out)["port"]
    ours = []
    off = 0
    while off < len(ports):
        length = int.from_bytes(ports[off:off + 4], "little")
        ours.append(dl.decode_port(_decode(ports[off:off + length])))
        off += length
    assert len(ours) == len(theirs) == 4
    for port in ours:
        t = theirs[f"{port.handle}/{port.index}"]
        assert port.flavour == t["flavour"]
        assert port.netdev == t.get("netdev")
        assert port.pf == t.get("pfnum")
        assert port.vf == t.get("vfnum")
        assert port.number == t.get("port")
    assert [p.flavour for p in ours] == ["physical", "pcivf", "pcipf", "physical"]


def test_dev_info_reads_as_devlink_reads_it_and_says_a_reset_is_pending(shim):
    so, work = shim
    reply = rec.info_reply(HANDLE, "mlx5_core", "MT2232X00001",
                           {"fw.psid": "MT_0000000834"},
                           {"fw.version": "28.39.1002", "fw": "28.39.1002"},
                           {"fw.version": "28.41.1000", "fw": "28.41.1000"})
    out, _ = rec.run(so, work, ["dev", "info", HANDLE], {rec.CMD_INFO_GET: reply}, True)
    theirs = json.loads(out)["info"][HANDLE]
    ours = dl.decode_info(_decode(reply))
    assert ours.driver == theirs["driver"] == "mlx5_core"
    assert ours.serial == theirs["serial_number"]
    assert ours.fixed == theirs["versions"]["fixed"]
    assert ours.running == theirs["versions"]["running"]
    assert ours.stored == theirs["versions"]["stored"]
    assert ours.pending_firmware() == ["fw", "fw.version"]
    same = rec.info_reply(HANDLE, "mlx5_core", "x", {}, {"fw": "1"}, {"fw": "1"})
    assert dl.decode_info(_decode(same)).pending_firmware() == []
