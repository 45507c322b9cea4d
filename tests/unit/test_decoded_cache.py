"""host/replay/decoded.py: netlink messages the controller's replays share.

A message decoded for one host's replay is shared with every other host
that answered the same bytes: each host still gets its own header (its
sequence number and port id), different bytes never share a record, and
a shared record cannot be changed through one host's view."""

from __future__ import annotations

import pytest

from nictune.host.replay import decoded, probe_reads
from nictune.host.transports.netlink import _nlmsg, ethtool
from nictune.host.transports.netlink.socket import NetlinkSocket


def features_message(ifname: str, seq: int, pid: int, active: bytes = b"\x05\0\0\0") -> bytes:
    """A FEATURES_GET reply as the kernel sends it: a nested header, a bitset."""
    msg = ethtool.features_msg()
    msg["cmd"], msg["version"] = ethtool.FEATURES_GET, 1
    msg["attrs"] = [("ETHTOOL_A_FEATURES_HEADER", {"attrs": [("ETHTOOL_A_HEADER_DEV_NAME", ifname)]}),
                    ("ETHTOOL_A_FEATURES_ACTIVE", {"attrs": [("ETHTOOL_A_BITSET_SIZE", 32),
                                                             ("ETHTOOL_A_BITSET_VALUE", active)]})]
    msg["header"] = {"type": 20, "flags": 2, "sequence_number": seq, "pid": pid}
    msg.encode()
    return bytes(msg.data)


def plain(raw: bytes):
    m = ethtool.features_msg(raw)
    m.decode()
    return m


def test_the_same_bytes_are_decoded_once_and_each_host_keeps_its_header(monkeypatch):
    cache = decoded.DecodedCache()
    calls = []
    real = _nlmsg.nlmsg.decode
    monkeypatch.setattr(_nlmsg.nlmsg, "decode", lambda self: (calls.append(1), real(self))[1])
    first = cache.decoded(ethtool.features_msg, features_message("rail0", 1, 111))
    assert len(calls) == 1 and not cache._items  # met once: decoded, not kept
    host_a = cache.decoded(ethtool.features_msg, features_message("rail0", 2, 112))
    assert len(calls) == 2 and len(cache._items) == 1  # met again: kept
    host_b = cache.decoded(ethtool.features_msg, features_message("rail0", 7, 222))
    host_c = cache.decoded(ethtool.features_msg, features_message("rail0", 9, 333))
    assert len(calls) == 2 and (cache.hits, cache.misses) == (2, 2)
    assert host_a["header"]["sequence_number"] == 2 and host_a["header"]["pid"] == 112
    assert host_b["header"]["sequence_number"] == 7 and host_b["header"]["pid"] == 222
    assert host_c["header"]["sequence_number"] == 9 and host_c["header"]["pid"] == 333
    for got in (first, host_a, host_b, host_c):  # what a family reads is what a plain decode gives
        want = plain(features_message("rail0", 1, 111))
        assert got.get_attr("ETHTOOL_A_FEATURES_HEADER").get_attr("ETHTOOL_A_HEADER_DEV_NAME") == "rail0"
        assert (got.get_attr("ETHTOOL_A_FEATURES_ACTIVE").get_attr("ETHTOOL_A_BITSET_VALUE")
                == want.get_attr("ETHTOOL_A_FEATURES_ACTIVE").get_attr("ETHTOOL_A_BITSET_VALUE"))
        assert type(got) is ethtool.features_msg and got["cmd"] == want["cmd"]


def test_different_answers_never_share_a_record():
    cache = decoded.DecodedCache()
    answers = [("rail0", b"\x05\0\0\0"), ("rail0", b"\x07\0\0\0"), ("rail1", b"\x05\0\0\0")]
    for _ in range(2):  # each met twice: each kept
        got = [cache.decoded(ethtool.features_msg, features_message(name, 1, 1, active=active))
               for name, active in answers]
    assert len(cache._items) == 3
    got = [cache.decoded(ethtool.features_msg, features_message(name, 1, 1, active=active))
           for name, active in answers]
    values = [m.get_attr("ETHTOOL_A_FEATURES_ACTIVE").get_attr("ETHTOOL_A_BITSET_VALUE") for m in got]
    assert values == [b"\x05\0\0\0", b"\x07\0\0\0", b"\x05\0\0\0"]
    assert got[2].get_attr("ETHTOOL_A_FEATURES_HEADER").get_attr("ETHTOOL_A_HEADER_DEV_NAME") == "rail1"
    assert cache.hits == 3 and cache.misses == 6


def test_a_shared_record_cannot_be_changed_through_one_hosts_view():
    cache = decoded.DecodedCache()
    cache.decoded(ethtool.features_msg, features_message("rail0", 9, 9))  # met once: not kept
    host_a = cache.decoded(ethtool.features_msg, features_message("rail0", 1, 1))
    host_b = cache.decoded(ethtool.features_msg, features_message("rail0", 2, 2))
    nested = host_a.get_attr("ETHTOOL_A_FEATURES_HEADER")
    with pytest.raises(decoded.SharedRecordError):
        nested["attrs"] = []
    with pytest.raises(decoded.SharedRecordError):
        nested.update(attrs=[])
    with pytest.raises(decoded.SharedRecordError):
        nested.pop("attrs")
    with pytest.raises(AttributeError):  # a tuple: nothing to append to
        host_a["attrs"].append(("ETHTOOL_A_FEATURES_HW", None))
    assert isinstance(nested.data, bytes)
    # A host's own view is its own: changing it leaves the other's alone.
    host_a["cmd"] = 99
    host_a["header"]["pid"] = 99
    assert host_b["cmd"] == ethtool.FEATURES_GET and host_b["header"]["pid"] == 2
    again = cache.decoded(ethtool.features_msg, features_message("rail0", 3, 3))
    assert again["cmd"] == ethtool.FEATURES_GET


def test_the_cache_stays_within_its_bound():
    cache = decoded.DecodedCache(max_bytes=3 * len(features_message("rail0", 1, 1)))
    for i in range(10):
        for _ in range(2):
            cache.decoded(ethtool.features_msg, features_message(f"rail{i}", 1, 1))
    assert len(cache._items) == 3 and cache._size <= cache.max_bytes


def test_what_one_host_alone_answers_is_never_kept():
    cache = decoded.DecodedCache()
    for i in range(50):  # 50 hosts, each its own link: decoded as ever
        m = cache.decoded(ethtool.features_msg, features_message(f"rail{i}", 1, 1))
        assert not m.shared
    assert not cache._items and len(cache._seen) == 50


def test_only_the_replays_sockets_share_and_pyroute2_messages_are_never_shared():
    class KernelLike:  # a socket without a cache: the agent's on a host
        def setsockopt(self, *a):
            pass

        def bind(self, *a):
            pass

    assert NetlinkSocket(16, opener=lambda proto: KernelLike())._decoded is None
    assert probe_reads._ReplaySocket(16, {}).decoded is decoded.SHARED

    class Foreign(dict):  # stands in for a pyroute2 class: not one of _nlmsg's
        def __init__(self, data=None):
            super().__init__()
            self.data = data

        def decode(self):
            self["decoded"] = True

    cache = decoded.DecodedCache()
    first, second = (cache.decoded(Foreign, b"x" * 20) for _ in range(2))
    assert first is not second and first["decoded"] and not cache._items


def strset_message(names: list, pid: int) -> bytes:
    """A STRSET_GET reply: the feature names' string set."""
    strings = [("ETHTOOL_A_STRINGS_STRING", {"attrs": [("ETHTOOL_A_STRING_INDEX", i),
                                                        ("ETHTOOL_A_STRING_VALUE", n)]})
               for i, n in enumerate(names)]
    sset = {"attrs": [("ETHTOOL_A_STRINGSET_ID", 0), ("ETHTOOL_A_STRINGSET_COUNT", len(names)),
                      ("ETHTOOL_A_STRINGSET_STRINGS", {"attrs": strings})]}
    msg = ethtool.strset_msg()
    msg["cmd"], msg["version"] = 1, 1
    msg["attrs"] = [("ETHTOOL_A_STRSET_STRINGSETS", {"attrs": [("ETHTOOL_A_STRINGSETS_STRINGSET", sset)]})]
    msg["header"] = {"type": 20, "flags": 0, "sequence_number": 1, "pid": pid}
    msg.encode()
    return bytes(msg.data)


def test_feature_names_of_a_shared_string_set_are_worked_out_once_and_each_host_has_its_own_list(monkeypatch):
    cache = decoded.DecodedCache()

    class Replies:  # a replay's netlink socket: the answer, through the shared cache
        def __init__(self, raw: bytes):
            self.raw = raw

        def request(self, *args):
            return [cache.decoded(ethtool.strset_msg, self.raw)]

    def host(raw: bytes) -> ethtool.Ethtool:
        e = ethtool.Ethtool.__new__(ethtool.Ethtool)
        e._nl, e._family, e._feature_names = Replies(raw), 20, None
        return e

    calls = []
    real = ethtool._feature_names
    monkeypatch.setattr(ethtool, "_feature_names", lambda sset: (calls.append(1), real(sset))[1])
    host(strset_message(["sg", "", "tso"], pid=0)).feature_names()  # met once: not kept
    host(strset_message(["sg", "gro"], pid=0)).feature_names()
    calls.clear()
    a = host(strset_message(["sg", "", "tso"], pid=1)).feature_names()
    b = host(strset_message(["sg", "", "tso"], pid=2)).feature_names()
    other = host(strset_message(["sg", "gro"], pid=3)).feature_names()
    assert a == b == ["sg", "", "tso"] and other == ["sg", "gro"]
    assert len(calls) == 2  # once per distinct string set
    a.append("mine")
    assert host(strset_message(["sg", "", "tso"], pid=4)).feature_names() == ["sg", "", "tso"]
    assert b == ["sg", "", "tso"]
