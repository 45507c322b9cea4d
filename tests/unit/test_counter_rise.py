"""expect: counters compares how much a counter rose over an interval, not
its total since boot (issue 11 item 6).

FAKE COUNTERS: the host is the recorded ConnectX-7 state on the fake kernel
(tests/fakes.py FakeHost), whose FakeCounters serve ethtool -S values that
change between the two reads: a list in "ethtool_stats" is the value at
each instant of the fake clock, and a wait moves the clock and the counters
without sleeping.  RDMA hw_counters are sysfs files of the fixture tree
(tests/fixtures/mlx5-host); one test changes one between the reads with a
counter source of its own.  The real kernel's counters rising under real
traffic: tests/netns/test_counter_rise.py.
"""

from __future__ import annotations

import os

import pytest

from fakes import FakeHost
from nictune.host import model as m
from nictune.host.transaction.engine import Engine, Families
from nictune.host.errors import InvalidInput
from nictune.host.facts.health import _ETHTOOL_COUNTERS, GAUGES, RDMA_COUNTERS, ROCE_HEALTH, Health
from nictune.host.knobs.expect import ExpectFamily
from nictune.profile import check as profile_check
from nictune.profile import schema as s
from nictune.profile.errors import ProfileError
from nictune.profile.yamlpos import parse_text

pytestmark = pytest.mark.recorded

P0, P1 = "enp23s0f0np0", "enp23s0f1np1"
HW = ("sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/infiniband/mlx5_0/ports/1/"
      "hw_counters")  # mlx5_0 port 1: P0's RDMA port in the fixture tree


def cx7(tmp_path, **stats) -> FakeHost:
    """cx7-host with its sysfs tree and these ethtool -S values per rail."""
    host = FakeHost({"base": "cx7-host", "tree": "mlx5-host", "ethtool_stats": stats},
                    tmp_path / "root")
    host.state_dir = str(tmp_path / "state")
    return host


def doc(**entries) -> dict:
    return {"nictune": 1, "interfaces": {
        name: {"match": {"name": ifname}, "expect": expect, **more}
        for name, (ifname, expect, more) in entries.items()}}


def plan(host, document, command="plan") -> dict:
    out = Engine(host, host.state_dir).plan(document, {}, command)
    return {(c.key.target, c.key.name): c for c in out.changes if c.key.family == "expect"}


def test_a_rise_during_the_interval_is_drift_and_an_old_total_is_not(tmp_path):
    host = cx7(tmp_path, **{P0: {"rx_discards_phy": [100, 112], "link_down_events_phy": [4, 4]}})
    got = plan(host, doc(a=(P0, {"counters": {"rx_discards_phy": {"max": 0},
                                              "link_down_events_phy": {"max": 0}}}, {})))
    rose, old = got[(P0, "counters.rx_discards_phy")], got[(P0, "counters.link_down_events_phy")]
    assert (rose.status, rose.before, rose.after, rose.bound) == (m.DRIFT, 12, 0, "max")
    assert rose.note == "rx_discards_phy rose by 12 in 5 s (100 -> 112)"
    # Four link-downs since boot, none now: not drift (it was, forever, before).
    assert (old.status, old.before) == (m.OK, 0)
    assert old.note == "link_down_events_phy did not rise in 5 s (at 4)"
    assert host.counter_source.waits == [5]


def test_one_wait_per_command_for_every_interface_and_counter(tmp_path):
    host = cx7(tmp_path, **{P0: {"rx_discards_phy": [0, 0], "rx_prio3_discards": [0, 1]},
                            P1: {"rx_discards_phy": [7, 7], "tx_pause_storm_error_events": [0, 2]}})
    want = {"counters": {"rx_discards_phy": {"max": 0}, "rx_prio3_discards": {"max": 0},
                         "tx_pause_storm_error_events": {"max": 0}, "out_of_sequence": {"max": 0}}}
    got = plan(host, doc(a=(P0, want, {}), b=(P1, want, {})), "verify")
    assert host.counter_source.waits == [5]  # not one per key, nor per interface
    assert {k: (c.status, c.before) for k, c in got.items()} == {
        (P0, "counters.rx_discards_phy"): (m.OK, 0),
        (P0, "counters.rx_prio3_discards"): (m.DRIFT, 1),
        (P0, "counters.tx_pause_storm_error_events"): (m.DRIFT, None),  # P0 has none
        (P0, "counters.out_of_sequence"): (m.OK, 0),     # mlx5_0's hw_counters file
        (P1, "counters.rx_discards_phy"): (m.OK, 0),
        (P1, "counters.rx_prio3_discards"): (m.DRIFT, None),
        (P1, "counters.tx_pause_storm_error_events"): (m.DRIFT, 2),
        (P1, "counters.out_of_sequence"): (m.OK, 0),     # mlx5_1's
    }
    assert got[(P0, "counters.tx_pause_storm_error_events")].note == (
        f"{P0} has no counter tx_pause_storm_error_events (ethtool -S, RDMA hw_counters, "
        f"/sys/class/net/{P0}/statistics)")


def test_entries_with_their_own_intervals_share_one_wait(tmp_path):
    host = cx7(tmp_path, **{P0: {"rx_discards_phy": [0, 3, 9]}, P1: {"rx_discards_phy": [0, 3, 9]}})
    got = plan(host, doc(a=(P0, {"counters_interval": 2, "counters": {"rx_discards_phy": 0}}, {}),
                         b=(P1, {"counters_interval": 5, "counters": {"rx_discards_phy": 0}}, {})))
    # Read at 0; P0 again at 2 s; P1 again at 5 s: 5 s in all.
    assert host.counter_source.waits == [2, 3]
    assert got[(P0, "counters.rx_discards_phy")].note == "rx_discards_phy rose by 3 in 2 s (0 -> 3)"
    assert got[(P1, "counters.rx_discards_phy")].note == "rx_discards_phy rose by 9 in 5 s (0 -> 9)"


def test_a_counter_that_fell_has_no_known_increase(tmp_path):
    host = cx7(tmp_path, **{P0: {"local_ack_timeout_err": [4294967290, 3]}})
    c = plan(host, doc(a=(P0, {"counters": {"local_ack_timeout_err": {"max": 0}}}, {})))[
        (P0, "counters.local_ack_timeout_err")]
    assert (c.status, c.before) == (m.DRIFT, None)
    assert "fell from 4294967290 to 3 in 5 s" in c.note and "wrapped" in c.note


def test_totals_are_asked_for_by_name_and_never_wait(tmp_path):
    host = cx7(tmp_path, **{P0: {"rx_discards_phy": [100, 112]}})
    got = plan(host, doc(a=(P0, {"counter_totals": {"rx_discards_phy": {"max": 0},
                                                    "rx_out_of_buffer": {"max": 0}}}, {})))
    total = got[(P0, "counter_totals.rx_discards_phy")]
    assert (total.status, total.before) == (m.DRIFT, 100)
    assert total.note.startswith("rx_discards_phy as it reads: a total since")
    absent = got[(P0, "counter_totals.rx_out_of_buffer")]
    assert (absent.status, absent.before) == (m.DRIFT, None) and "has no counter" in absent.note
    assert host.counter_source.waits == []


def test_gauges_are_compared_as_they_read_without_a_wait(tmp_path):
    host = cx7(tmp_path, **{P0: {"peer_ifindex": [7, 9]}})
    c = plan(host, doc(a=(P0, {"counters": {"peer_ifindex": 7}}, {})))[(P0, "counters.peer_ifindex")]
    assert (c.status, c.before) == (m.OK, 7)
    assert host.counter_source.waits == []
    assert GAUGES.match("TlsCurrTxDevice") and not GAUGES.match("TlsTxDevice")


def test_apply_samples_before_writing_and_writes_no_expectation(tmp_path):
    host = cx7(tmp_path, **{P1: {"rx_discards_phy": [0, 5]}})
    out = Engine(host, host.state_dir).apply(
        doc(a=(P1, {"counters": {"rx_discards_phy": {"max": 0}}}, {"mtu": 9000})), {}, "p.yaml")
    assert out.error is None
    statuses = {(c.key.family, c.key.name): (c.status, c.before) for c in out.changes}
    assert statuses == {("link", "mtu"): (m.APPLIED, 1500),
                        ("expect", "counters.rx_discards_phy"): (m.DRIFT, 5)}
    assert host.counter_source.waits == [5]
    assert [op for op, _, _ in host.kernel.writes] == ["set_link"]


class MovingHwCounter:
    """FAKE COUNTER SOURCE: the real one's interface, with a clock of its
    own; its wait rewrites one file of the fixture tree (a hw_counters file,
    /proc/net/tls_stat), as the driver's counter would move under loss."""

    def __init__(self, path: str, after: str):
        self.path, self.after, self.clock, self.waits = path, after, 0.0, []

    def ethtool_stats(self, ifname):
        return {}

    def now(self):
        return self.clock

    def sleep(self, seconds):
        self.waits.append(seconds)
        self.clock += seconds
        with open(self.path, "w") as f:
            f.write(self.after)


def test_rdma_hw_counters_are_read_again_after_the_wait(tmp_path):
    host = cx7(tmp_path)
    path = host.path(HW, "out_of_sequence")
    host.counter_source = MovingHwCounter(path, "17\n")
    c = plan(host, doc(a=(P0, {"counters": {"out_of_sequence": {"max": 0}}}, {})))[
        (P0, "counters.out_of_sequence")]
    assert (c.status, c.before, c.note) == (m.DRIFT, 17, "out_of_sequence rose by 17 in 5 s (0 -> 17)")


def test_ktls_counters_rise_too_and_their_sockets_are_gauges(tmp_path):
    host = cx7(tmp_path)
    path = host.path("proc/net/tls_stat")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("TlsCurrTxDevice\t2\nTlsDecryptError\t7\n")
    # The tls module's counters after the wait: one more decrypt error.
    host.counter_source = MovingHwCounter(path, "TlsCurrTxDevice\t2\nTlsDecryptError\t8\n")
    got = plan(host, doc(a=(P0, {"counters": {"TlsDecryptError": 0, "TlsCurrTxDevice": {"min": 1}}},
                                 {})))
    error, sockets = got[(P0, "counters.TlsDecryptError")], got[(P0, "counters.TlsCurrTxDevice")]
    assert (error.status, error.before, error.note) == (
        m.DRIFT, 1, "TlsDecryptError rose by 1 in 5 s (7 -> 8)")
    assert (sockets.status, sockets.before) == (m.OK, 2)


def test_a_counter_at_one_read_only_has_no_increase(tmp_path):
    host = cx7(tmp_path)
    host.counter_source = MovingHwCounter(host.path(HW, "rx_icrc_encapsulated"), "0\n")
    c = plan(host, doc(a=(P0, {"counters": {"rx_icrc_encapsulated": {"max": 0}}}, {})))[
        (P0, "counters.rx_icrc_encapsulated")]
    assert (c.status, c.before) == (m.DRIFT, None)
    assert c.note == "rx_icrc_encapsulated was there at only one of two reads 5 s apart: no increase to tell"


def test_netdev_statistics_are_counters_too(tmp_path):
    host = cx7(tmp_path)
    stats = host.path("sys/class/net", P0, "statistics")
    os.makedirs(stats, exist_ok=True)
    with open(os.path.join(stats, "rx_dropped"), "w") as f:
        f.write("3\n")
    assert Health(host).counters(P0)["rx_dropped"] == 3
    assert "rx_dropped" not in Health(host).counters(P0, roce_only=True)


def test_the_roce_health_set_is_what_health_facts_show():
    assert ROCE_HEALTH
    for name, source, meaning in ROCE_HEALTH:
        concrete = name.replace("<N>", "3")
        assert _ETHTOOL_COUNTERS.match(concrete) or concrete in RDMA_COUNTERS, name
        assert source.startswith(("en_stats.c: ", "counters.c: ")) and meaning


@pytest.mark.parametrize("bad", [0, 61, "5", True, 2.5])
def test_an_interval_outside_whole_seconds_1_to_60_is_refused(tmp_path, bad):
    host = cx7(tmp_path)
    with pytest.raises(InvalidInput, match="counters_interval"):
        ExpectFamily(host).expand(P0, {"expect": {"counters_interval": bad, "counters": {"x": 0}}},
                                  lambda *a: "")


def _check(text: str) -> None:
    parsed = parse_text(text, "p.yaml")
    profile_check.check(parsed.doc, parsed.positions, parsed.plain, schema=s.SCHEMA)


def test_the_schema_takes_the_interval_and_totals_and_refuses_a_bad_interval():
    head = "nictune: 1\ninterfaces:\n  rail:\n    match: {driver: mlx5_core}\n    expect:\n"
    _check(head + "      counters_interval: 10\n      counters: {rx_discards_phy: {max: 0}}\n"
                  "      counter_totals: {TlsTxDevice: {min: 1}}\n")
    with pytest.raises(ProfileError) as e:
        _check(head + "      counters_interval: 0\n")
    assert "p.yaml:6" in str(e.value)


def test_families_read_all_keys_in_one_batch(tmp_path):
    # The engine's Families.read hands the family every key at once; a
    # second command on the same host waits again (instants move on).
    host = cx7(tmp_path, **{P0: {"rx_discards_phy": [1, 2, 2]}})
    want = doc(a=(P0, {"counters": {"rx_discards_phy": {"max": 0}}}, {}))
    assert plan(host, want)[(P0, "counters.rx_discards_phy")].status == m.DRIFT
    assert plan(host, want)[(P0, "counters.rx_discards_phy")].status == m.OK
    assert host.counter_source.waits == [5, 5]
    assert isinstance(Families(host)["expect"], ExpectFamily)
