"""netlink/ethmonitor.py's parsing of what the ethtool monitor group sends,
on bytes laid out as net/ethtool/netlink.c ethnl_default_notify builds them
(generic netlink header, then the message's header nest, attribute 1, with
ETHTOOL_A_HEADER_DEV_INDEX and _DEV_NAME).  The kernel's own notifications
are tested in tests/netns/test_resident_ethtool_monitor.py."""

from __future__ import annotations

import struct

from nictune.host.transports.netlink.ethmonitor import parse_notifications
from nictune.host.resident.daemon import Resident

FAMILY = 21


def _nla(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _ntf(family: int, cmd: int, index: int, name: str, extra: bytes = b"") -> bytes:
    header = _nla(1, struct.pack("=I", index)) + _nla(2, name.encode() + b"\0")
    body = struct.pack("=BBH", cmd, 1, 0) + _nla(1 | 0x8000, header) + extra
    return struct.pack("=IHHII", 16 + len(body), family, 0, 0, 0) + body


def test_each_notification_names_its_device():
    rings = _ntf(FAMILY, 17, 7, "rail0", _nla(2, struct.pack("=I", 1024)))
    channels = _ntf(FAMILY, 19, 9, "rail1")
    other_family = _ntf(FAMILY + 1, 17, 3, "eth0")
    assert parse_notifications(rings + other_family + channels, FAMILY) == [
        ("ethtool", 7, "rail0"), ("ethtool", 9, "rail1")]


def test_a_truncated_datagram_stops_the_parse():
    data = _ntf(FAMILY, 13, 7, "rail0")
    assert parse_notifications(data + data[:20], FAMILY) == [("ethtool", 7, "rail0")]


def test_an_ethtool_event_asks_for_a_verify_and_is_no_new_link(tmp_path):
    agent = Resident(str(tmp_path / "state"), listen=False, log=lambda line: None)
    agent.ifindex = {"rail0": 7}
    assert agent.on_links([("ethtool", 7, "rail0")]) == (set(), True)
    assert agent.on_links([("ethtool", 8, "rail9")]) == (set(), True)
    assert agent.ifindex == {"rail0": 7}
