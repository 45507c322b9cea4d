"""NETLINK_XFRM decoding (host/transports/netlink/xfrm.py) and which SAs concern an
interface (host/facts/ipsec.py), on recorded bytes.

The host kernel here has xfrm but no ESP/AH/IPcomp type (CONFIG_INET_ESP
unset: `ip xfrm state add` answers "Requested type not found"), so no SA
can be dumped from it.  The bytes are the XFRM_MSG_NEWSA messages iproute2
6.1's `ip xfrm state add` sent (tests/fixtures/xfrm/record.py, under
strace): the same message type, struct xfrm_usersa_info and attributes a
dump reply carries.  newsa-offload-in.hex is iproute2's own encoding of
`offload dev ntv0 dir in` (XFRMA_OFFLOAD_DEV); packet offload, which
iproute2 6.1 cannot ask for, is CONSTRUCTED by setting XFRM_OFFLOAD_PACKET
in that attribute's flags, per struct xfrm_user_offload.  Live dumps on a
real kernel: tests/netns/test_ipsec_expect.py (policies, no SA) and
tests/vm/guest/test_ipsec.py (SAs, software and offloaded to netdevsim).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import struct

import pytest

from nictune.host.facts import ipsec
from nictune.host.knobs.expect import ExpectFamily
from nictune.host.transports.netlink import xfrm

pytestmark = pytest.mark.recorded

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "xfrm")


def _recorder():
    """tests/fixtures/xfrm/record.py, for the key constants it recorded with."""
    spec = importlib.util.spec_from_file_location("xfrm_record", os.path.join(HERE, "record.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record = _recorder()

KEYS = (record.ENC_KEY, record.AUTH_KEY)
LABEL = "198.18.0.1 > 198.18.0.2 esp spi 0x00001000"


def fixture(name: str) -> bytes:
    with open(os.path.join(HERE, name + ".hex")) as f:
        return bytes.fromhex(f.read().strip())


def with_offload_flags(raw: bytes, flags: int) -> bytes:
    """CONSTRUCTED: raw with the flags of its XFRMA_OFFLOAD_DEV replaced."""
    off = 16 + 224
    while off < len(raw):
        length, kind = struct.unpack_from("=HH", raw, off)
        if kind == 28:
            return raw[:off + 8] + bytes([flags]) + raw[off + 9:]
        off += (length + 3) & ~3
    raise AssertionError("no XFRMA_OFFLOAD_DEV")


def test_the_recorded_bytes_hold_the_keys_the_decoder_must_not_copy():
    raw = fixture("newsa-software")
    assert all(bytes.fromhex(k) in raw for k in KEYS)  # else the key tests below prove nothing


def test_software_sa_decodes_as_iproute2_was_asked():
    sa = xfrm.decode_sa(fixture("newsa-software"))
    assert (sa.src, sa.dst, sa.spi, sa.proto, sa.mode, sa.reqid) == (
        "198.18.0.1", "198.18.0.2", 0x1000, "esp", "transport", 7)
    assert sa.offload is None and sa.dir is None
    assert sa.algs == (xfrm.Alg("enc", "cbc(aes)", 128), xfrm.Alg("auth", "hmac(sha256)", 256, 128))
    assert sa.label() == LABEL


def test_offload_attribute_as_iproute2_encodes_it():
    sa = xfrm.decode_sa(fixture("newsa-offload-in"))
    assert sa.offload is not None and sa.offload.inbound and not sa.offload.packet
    assert sa.offload.ifindex > 0 and sa.offload.mode == "crypto" and sa.dir == "in"


def test_packet_offload_constructed_per_the_uapi_struct():
    raw = with_offload_flags(fixture("newsa-offload-in"), xfrm.XFRM_OFFLOAD_PACKET)
    sa = xfrm.decode_sa(raw)
    assert sa.offload.packet and not sa.offload.inbound
    assert (sa.offload.mode, sa.dir) == ("packet", "out")


@pytest.mark.parametrize("name", ["newsa-software", "newsa-offload-in"])
def test_no_key_byte_reaches_the_decoded_message_or_the_record(name):
    raw = fixture(name)
    m = xfrm.xfrm_usersa_info(raw)
    m.decode()
    for attr in ("XFRMA_ALG_CRYPT", "XFRMA_ALG_AUTH_TRUNC"):
        decoded = m.get_attr(attr)
        assert set(dict(decoded)) <= {"alg_name", "alg_key_len", "alg_icv_len"}, dict(decoded)
    record_text = json.dumps(dataclasses.asdict(xfrm.sa_of(m))) + repr(xfrm.sa_of(m))
    for key in KEYS:
        assert key not in record_text.lower()
        assert bytes.fromhex(key).decode("latin-1") not in record_text


# -- which SAs concern an interface ---------------------------------------------

NAMES = {2: "ntv0", 3: "ntv1"}
MINE = {"198.18.0.1"}


def sa(offload=None, direction="out", spi=0x1000):
    return xfrm.Sa("198.18.0.1", "198.18.0.2", spi, "esp", "transport", 7, direction, offload)


def usage(sas, policies=()):
    return ipsec.usage(list(sas), list(policies), 2, "ntv0", MINE, NAMES)


def verdict(u, want):
    return ipsec.met(want, u.current(want)), u.problems(want, "ntv0")


def test_software_sa_on_the_interface_is_drift_for_crypto_and_met_for_none():
    u = usage([xfrm.decode_sa(fixture("newsa-software"))])
    assert u.current("crypto") == "none" and u.counts() == {"ipsec_sa_offloaded": 0,
                                                            "ipsec_sa_software": 1}
    ok, why = verdict(u, "crypto")
    assert not ok and why == [f"SA {LABEL}: in software (no XFRMA_OFFLOAD_DEV)"]
    assert verdict(u, "none") == (True, [])


def test_sa_offloaded_to_another_device_is_named():
    u = usage([sa(xfrm.Offload(3, False, False))])
    ok, why = verdict(u, "crypto")
    assert not ok and why == [f"SA {LABEL} out: offloaded to ntv1, not ntv0"]


def test_sa_of_other_addresses_does_not_concern_the_interface():
    other = xfrm.Sa("198.18.1.1", "198.18.1.2", 1, "esp", "transport", 0, None, None)
    inbound = sa(direction="in")  # its local address is dst 198.18.0.2, not ours
    u = usage([other, inbound])
    assert u.sas == [] and u.current("crypto") is None
    assert verdict(u, "crypto") == (False, ["no IPsec SA uses ntv0"])
    assert verdict(u, "none") == (True, [])


def test_crypto_where_packet_is_expected_and_packet_where_crypto_is():
    crypto = usage([sa(xfrm.Offload(2, False, False))])
    assert verdict(crypto, "crypto") == (True, [])
    ok, why = verdict(crypto, "packet")
    assert not ok and why == [f"SA {LABEL} out: crypto offload on ntv0, not packet offload"]
    packet = usage([sa(xfrm.Offload(2, False, True))])
    assert verdict(packet, "crypto") == (True, [])  # packet offload does the crypto too
    assert verdict(packet, "packet") == (True, [])
    ok, why = verdict(packet, "none")
    assert not ok and why == [f"SA {LABEL} out: packet offload on ntv0, the profile expects none"]


def test_packet_offload_needs_the_policies_offloaded_too():
    tmpl = xfrm.Template("198.18.0.1", "198.18.0.2", "esp", 0, "transport", 7)
    soft = xfrm.Policy("198.18.0.1/32", "198.18.0.2/32", "out", 0, 1, None, (tmpl,))
    u = usage([sa(xfrm.Offload(2, False, True))], [soft])
    assert u.current("packet") == "packet+software-policy"
    ok, why = verdict(u, "packet")
    assert not ok and why == ["policy 198.18.0.1/32 > 198.18.0.2/32 dir out: in software (no "
                              "XFRMA_OFFLOAD_DEV): packet offload needs the policy offloaded too"]
    assert verdict(u, "crypto") == (True, [])  # crypto offload leaves policies in software
    hw = dataclasses.replace(soft, offload=xfrm.Offload(2, False, True))
    assert verdict(usage([sa(xfrm.Offload(2, False, True))], [hw]), "packet") == (True, [])


def test_a_mix_is_drift_naming_only_the_sas_at_fault():
    u = usage([sa(xfrm.Offload(2, False, False)), sa(None, spi=0x2000)])
    assert u.current("crypto") == "none+crypto"
    ok, why = verdict(u, "crypto")
    assert not ok and why == ["SA 198.18.0.1 > 198.18.0.2 esp spi 0x00002000 out: "
                              "in software (no XFRMA_OFFLOAD_DEV)"]


def test_nic_support_is_said_before_anything_is_written():
    assert ExpectFamily.nic_support("mlx5_core", "expect.ipsec_offload") == \
        "crypto and packet offload (xfrmdev_ops)"
    assert ExpectFamily.nic_support("mana", "expect.ipsec_offload").startswith(
        "not supported by mana")
    assert ExpectFamily.nic_support("veth", "expect.ipsec_offload") is None
