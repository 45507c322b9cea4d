"""nictune's own LLDP decoder (host/facts/lldp.py) on frames written out
byte by byte from IEEE 802.1AB / 802.1Q annex D / 802.3 clause 79, and on
broken ones: each refusal names its TLV, nothing else escapes.  The same
decoder is checked against lldpd and lldpad on their own frames in
tests/netns/test_lldp_switch_netns.py."""

from __future__ import annotations


import pytest

from nictune.host.facts import lldp

HEADER = bytes.fromhex("0180c200000e" "020000000099" "88cc")
CHASSIS = bytes.fromhex("0207" "04" "0c42a1b2c3d4")        # type 1, len 7, MAC subtype
PORT = bytes.fromhex("0408" "05") + b"swp1s0"             # type 2, len 8 (wrong on purpose below)
TTL = bytes.fromhex("0602" "0078")                       # type 3, len 2, 120 s
PORT_DESC = bytes.fromhex("0807") + b"rail0-a"           # type 4
SYS_NAME = bytes.fromhex("0a06") + b"leaf03"             # type 5
MFS = bytes.fromhex("fe06" "00120f04" "2328")            # 802.3 max frame size 9000
# ETS configuration: willing 0, CBS 0, max TCs 8 (0); priorities 0-7 -> TC 0,0,0,3,0,0,6,0;
# TC bandwidth 50 0 0 50 0 0 0 0; TSA ets strict strict ets strict strict strict strict.
ETS_CFG = bytes.fromhex("fe19" "0080c209" "00" "00030060" "3200003200000000" "0200000200000000")
ETS_RECO = bytes.fromhex("fe19" "0080c20a" "00" "00030060" "3200003200000000" "0200000200000000")
PFC = bytes.fromhex("fe06" "0080c20b" "88" "08")           # willing, cap 8, PFC on priority 3
# APP: DSCP 26 -> 3, DSCP 48 -> 6, ethertype 0x8915 (RoCE v1) -> 3.
APP = bytes.fromhex("fe0e" "0080c20c" "00" "65001a" "c50030" "618915")
END = bytes.fromhex("0000")


def frame(*tlvs: bytes) -> bytes:
    return HEADER + b"".join(tlvs)


def good_port() -> bytes:
    return bytes.fromhex("0407" "05") + b"swp1s0"


def full_frame() -> bytes:
    return frame(CHASSIS, good_port(), TTL, PORT_DESC, SYS_NAME, MFS, ETS_CFG, ETS_RECO, PFC, APP, END)


def test_a_frame_written_from_the_standards_decodes_field_by_field():
    n = lldp.decode(full_frame(), rail="eth2", source="listener", age=3.5)
    assert (n.chassis_id, n.chassis_subtype) == ("0c:42:a1:b2:c3:d4", "mac")
    assert (n.port_id, n.port_subtype) == ("swp1s0", "interface-name")
    assert n.ttl == 120
    assert (n.port_description, n.system_name, n.max_frame_size) == ("rail0-a", "leaf03", 9000)
    assert n.ets == lldp.EtsTlv(prio_tc=(0, 0, 0, 3, 0, 0, 6, 0), tc_bw=(50, 0, 0, 50, 0, 0, 0, 0),
                                tc_tsa=("ets", "strict", "strict", "ets", "strict", "strict", "strict",
                                        "strict"), willing=False, cbs=False, max_tcs=8)
    assert n.ets_recommendation.tc_bw == (50, 0, 0, 50, 0, 0, 0, 0)
    assert n.ets_recommendation.willing is False
    assert n.pfc == lldp.PfcTlv(enabled=(3,), willing=True, mbc=False, pfc_cap=8)
    assert n.apps == (lldp.AppEntry(5, 26, 3), lldp.AppEntry(5, 48, 6), lldp.AppEntry(1, 0x8915, 3))
    assert n.dscp_map() == {26: 3, 48: 6}
    assert (n.rail, n.source, n.age) == ("eth2", "listener", 3.5)
    assert n.label() == "leaf03 port swp1s0"


def test_padding_after_end_and_a_frame_without_end_both_decode():
    padded = lldp.decode(frame(CHASSIS, good_port(), TTL, END) + b"\xff" * 30)
    no_end = lldp.decode(frame(CHASSIS, good_port(), TTL))
    assert padded.system_name is None and padded.apps is None and padded.pfc is None
    assert padded == no_end


def test_a_vlan_tagged_frame_decodes():
    tagged = HEADER[:12] + bytes.fromhex("81000005") + HEADER[12:] + b"".join(
        (CHASSIS, good_port(), TTL, SYS_NAME, END))
    assert lldp.decode(tagged).system_name == "leaf03"


def test_the_record_is_immutable_and_round_trips_through_report_data():
    n = lldp.decode(full_frame(), rail="eth2", age=1.0)
    with pytest.raises(Exception):
        n.system_name = "other"  # type: ignore[misc]
    assert lldp.from_dict(n.to_dict()) == n
    # encode() is the inverse of decode() (source, rail, age aside).
    assert lldp.decode(lldp.encode(n), rail="eth2", age=1.0) == n


def test_an_apps_tlv_listing_nothing_is_not_no_tlv():
    empty_app = bytes.fromhex("fe05" "0080c20c" "00")
    assert lldp.decode(frame(CHASSIS, good_port(), TTL, empty_app, END)).dscp_map() == {}
    assert lldp.decode(frame(CHASSIS, good_port(), TTL, END)).dscp_map() is None


def test_control_characters_in_names_are_made_printable():
    hostile = bytes.fromhex("0a0b") + b"leaf\x1b[31m03"
    n = lldp.decode(frame(CHASSIS, good_port(), TTL, hostile, END))
    assert n.system_name == "leaf\\x1b[31m03"


def test_unknown_organizational_and_reserved_tlvs_are_skipped():
    other_oui = bytes.fromhex("fe06" "00120f01" "0303")   # 802.3 MAC/PHY, not read
    cisco = bytes.fromhex("fe05" "00014201" "aa")
    reserved = bytes.fromhex("2202" "abcd")                # type 17
    n = lldp.decode(frame(CHASSIS, good_port(), TTL, other_oui, cisco, reserved, SYS_NAME, END))
    assert n.system_name == "leaf03" and n.max_frame_size is None


REFUSED = {
    "cut header": (frame(CHASSIS, good_port(), TTL) + b"\x0a", "cut short"),
    "length past the end": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("0aff") + b"x"), "claims 255 bytes"),
    "port id first": (frame(good_port(), CHASSIS, TTL, END), "starts with Chassis ID"),
    "no TTL": (frame(CHASSIS, good_port(), END), "starts with Chassis ID"),
    "TTL of 3 bytes": (frame(CHASSIS, good_port(), bytes.fromhex("0603000078"), END), "Time To Live TLV of 3"),
    "second chassis": (frame(CHASSIS, good_port(), TTL, CHASSIS, END), "second Chassis ID"),
    "second system name": (frame(CHASSIS, good_port(), TTL, SYS_NAME, SYS_NAME, END), "second System Name"),
    "second PFC": (frame(CHASSIS, good_port(), TTL, PFC, PFC, END), "second PFC Configuration"),
    "empty chassis id": (frame(bytes.fromhex("020104"), good_port(), TTL, END), "Chassis ID TLV of 1 bytes"),
    "short ETS": (frame(CHASSIS, good_port(), TTL, ETS_CFG[:-1].replace(b"\xfe\x19", b"\xfe\x18"), END),
                  "ETS Configuration TLV of 24 bytes"),
    "ETS TC 9": (frame(CHASSIS, good_port(), TTL, ETS_CFG.replace(bytes.fromhex("00030060"),
                                                                  bytes.fromhex("00090060")), END),
                 "traffic class 9"),
    "ETS 200%": (frame(CHASSIS, good_port(), TTL, ETS_CFG.replace(bytes.fromhex("32000032"),
                                                                  bytes.fromhex("c8000032")), END), "200%"),
    "PFC cap 9": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("fe06" "0080c20b" "09" "08"), END),
                  "PFC capability 9"),
    "APP half entry": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("fe07" "0080c20c" "00" "6500"), END),
                       "1 + 3 per entry"),
    "APP DSCP 64": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("fe08" "0080c20c" "00" "650040"), END),
                    "DSCP 64"),
    "APP selector 0": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("fe08" "0080c20c" "00" "60001a"), END),
                       "selector 0"),
    "max frame size of 3": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("fe07" "00120f04" "232800"), END),
                            "Maximum Frame Size TLV of 7"),
    "end with a length": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("0001ff")), "End of LLDPDU TLV with length 1"),
    "not LLDP": (HEADER[:12] + b"\x08\x00" + b"\x00" * 40, "not LLDP"),
    "runt": (HEADER[:10], "shorter than an Ethernet header"),
    "jumbo": (frame(CHASSIS, good_port(), TTL, END) + b"\x00" * 2000, "more than an LLDP frame"),
    "short org": (frame(CHASSIS, good_port(), TTL, bytes.fromhex("fe02" "0080"), END), "at least 4"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_broken_frame_is_refused_with_the_tlv_named(case):
    data, words = REFUSED[case]
    with pytest.raises(lldp.LldpError) as refused:
        lldp.decode(data)
    assert words in str(refused.value)


def test_the_wrong_length_port_tlv_is_caught_as_a_length_not_misread():
    # PORT above says 8 bytes but carries 7: the TTL's first byte is read
    # into the port id and what follows no longer parses as a TTL.
    with pytest.raises(lldp.LldpError):
        lldp.decode(frame(CHASSIS, PORT, TTL, END))


def test_a_255_byte_name_is_the_limit():
    longest = lldp.tlv(lldp.T_SYS_NAME, b"s" * 255)
    assert len(lldp.decode(frame(CHASSIS, good_port(), TTL, longest, END)).system_name) == 255
    with pytest.raises(lldp.LldpError, match="System Name TLV of 256 bytes"):
        lldp.decode(frame(CHASSIS, good_port(), TTL, lldp.tlv(lldp.T_SYS_NAME, b"s" * 256), END))


FROM_DICT_REFUSED = [
    ("not a mapping", []),
    ("ttl a string", {"ttl": "120"}),
    ("huge name", {"system_name": "x" * 100000}),
    ("pfc priority 8", {"pfc": {"enabled": [8], "willing": False, "mbc": False, "pfc_cap": 8}}),
    ("apps too many", {"apps": [{"selector": 5, "protocol": 1, "priority": 1}] * 1000}),
    ("apps DSCP 99", {"apps": [{"selector": 5, "protocol": 99, "priority": 1}]}),
    ("ets 7 classes", {"ets": {"prio_tc": [0] * 7, "tc_bw": [0] * 8, "tc_tsa": ["ets"] * 8,
                               "willing": False, "cbs": False, "max_tcs": 8}}),
    ("tsa unknown", {"ets": {"prio_tc": [0] * 8, "tc_bw": [0] * 8, "tc_tsa": ["x" * 9] * 8,
                             "willing": False, "cbs": False, "max_tcs": 8}}),
    ("source unknown", {"source": "snmp"}),
    ("age negative", {"age": -1}),
    ("rail too long", {"rail": "r" * 16}),
    ("bool for ttl", {"ttl": True}),
]


@pytest.mark.parametrize("case,change", FROM_DICT_REFUSED, ids=[c for c, _ in FROM_DICT_REFUSED])
def test_a_report_neighbour_is_checked_as_strictly_as_a_frame(case, change):
    good = lldp.decode(full_frame(), rail="eth2").to_dict()
    assert lldp.from_dict(good).system_name == "leaf03"
    bad = change if not isinstance(change, dict) else {**good, **change}
    with pytest.raises(lldp.LldpError):
        lldp.from_dict(bad)


def test_network_address_and_binary_ids_are_shown_exactly():
    ipv4_chassis = lldp.tlv(lldp.T_CHASSIS, bytes([5, 1, 198, 18, 0, 1]))
    circuit_port = lldp.tlv(lldp.T_PORT, bytes([6, 0, 0xff, 0x1b]))
    n = lldp.decode(frame(ipv4_chassis, circuit_port, TTL, END))
    assert (n.chassis_id, n.chassis_subtype) == ("198.18.0.1", "network-address")
    assert (n.port_id, n.port_subtype) == ("00ff1b", "agent-circuit-id")
