"""Health facts from a sysfs tree shaped like a ConnectX-7 host's
(tests/fixtures/health/mlx5-host): PCIe link, link speed, RDMA port and
counters; missing sources are absent, never errors."""

from __future__ import annotations

import json
import os

import pytest
from fakes import FixtureHost

from nictune.host.facts.health import Health, _gts
from nictune.host.machine import Interface

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "fixtures", "health", "mlx5-host")
# Driver and firmware as `ethtool -i` printed them on real mlx5 hosts
# (../shared/reference/real-world/cmd-outputs/mlx5/ beside the repository).
P0 = Interface("enp23s0f0np0", 3, "mlx5_core", None, "15b3:1021", "0000:17:00.0", "14.23.1020 (MT_2420110034)")
P1 = Interface("enp23s0f1np1", 4, "mlx5_core", None, "15b3:1021", "0000:17:00.1", "14.29.1016 (HP_2420110034)")
MGMT = Interface("eth0", 2, "igb", None, None, None, None)
GONE = Interface("ens9", 9, None, None, None, None, None)


@pytest.fixture
def health():
    with open(os.path.join(FIXTURE, "ethtool-stats.json")) as f:
        stats = json.load(f)
    return Health(FixtureHost(FIXTURE, [MGMT, P0, P1, GONE]), stats=lambda ifname: stats.get(ifname, {}))


def test_a_healthy_rail(health):
    assert health.of(P0) == {
        "driver": "mlx5_core",
        "firmware": "14.23.1020 (MT_2420110034)",
        "link_speed_mbps": 400000,
        "pcie_speed_gts": 32, "pcie_width": 16, "pcie_max_speed_gts": 32, "pcie_max_width": 16,
        "rdma_device": "mlx5_0", "rdma_port": 1,
        # The port's GIDs as NCCL tells them apart (types/<n>, the GID's text).
        "roce_gids": {"0": "RoCE v1 IPv6 link-local", "1": "RoCE v2 IPv6 link-local",
                      "2": "RoCE v1 IPv4", "3": "RoCE v2 IPv4"},
        # ethtool -S: only the RoCE-relevant ones; hw_counters: the four that matter
        "counters": {"np_cnp_sent": 567, "np_ecn_marked_roce_packets": 1234, "out_of_sequence": 0,
                     "rp_cnp_handled": 89, "rx_out_of_buffer": 7, "rx_prio0_pause": 0,
                     "rx_prio3_pause": 1200, "tx_prio3_pause": 45},
    }


def test_a_port_down_and_trained_below_its_maximum(health):
    facts = health.of(P1)
    assert "link_speed_mbps" not in facts  # -1: unknown while down
    assert (facts["pcie_speed_gts"], facts["pcie_width"]) == (16, 8)
    assert (facts["pcie_max_speed_gts"], facts["pcie_max_width"]) == (32, 16)
    assert facts["rdma_device"] == "mlx5_1"
    assert "roce_gids" not in facts  # entries name the netdev, but no gids/<n> to read
    assert facts["counters"]["np_cnp_sent"] == 0 and "rp_cnp_handled" not in facts["counters"]


def test_missing_sources_are_absent(health):
    assert health.of(MGMT) == {"driver": "igb", "link_speed_mbps": 1000}
    assert health.of(GONE) == {}


def test_all_counters_for_expectations(health):
    counters = health.counters("enp23s0f0np0")
    assert counters["rx_packets"] == 912345678  # not RoCE-specific, still there for expect:
    assert counters["rp_cnp_ignored"] == 3


def all_facts(health) -> dict:
    """{ifname: facts} for every interface of the host (the agent asks per interface)."""
    return {iface.name: health.of(iface) for iface in health.host.interfaces()}


def test_all_covers_every_interface(health):
    assert sorted(all_facts(health)) == ["enp23s0f0np0", "enp23s0f1np1", "ens9", "eth0"]


def test_a_fixture_root_never_asks_the_running_kernel():
    # Without a stats reader, a Host rooted elsewhere must not read the
    # ioctl of this machine's same-named devices.
    assert Health(FixtureHost(FIXTURE, [P0])).counters("enp23s0f0np0") == {
        "np_cnp_sent": 567, "np_ecn_marked_roce_packets": 1234, "out_of_sequence": 0,
        "rp_cnp_handled": 89, "rp_cnp_ignored": 3}


@pytest.mark.parametrize("text,gts", [("32.0 GT/s PCIe", 32), ("8 GT/s", 8), ("2.5 GT/s PCIe", 2.5),
                                      ("Unknown", None), ("", None), (None, None)])
def test_pcie_speed_text(text, gts):
    assert _gts(text) == gts
