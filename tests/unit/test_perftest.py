"""perftest for the traffic gate (nictune.control.rollout.perftest): argv lists for
server and client, the traffic class from a profile and the RoCE endpoint
from a host's GID tables (tests/fixtures/ibauto-host stands in for ConnectX
ports), and the parsers on reports recorded over soft-RoCE in the test VM
(tests/fixtures/perftest, see its SOURCE.md), then on hostile and broken
outputs."""

from __future__ import annotations

import os

import pytest

from fakes import FakeHost
from nictune.control.rollout import perftest
from nictune.control.rollout.perftest import Endpoint, Perftest, PerftestError
from nictune.host.errors import InvalidInput
from nictune.host.facts.ibauto import AutoUnresolved

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "perftest")
RAIL0, RAIL1, STORAGE, FRONT = "enp23s0f0np0", "enp23s0f1np1", "enp41s0f0np0", "enp65s0f0np0"


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


# -- argv ------------------------------------------------------------------------------

def test_bandwidth_argv_of_server_and_client():
    test = Perftest("ib_write_bw", size=65536, duration=10, tclass=106, tcp_port=18600)
    assert perftest.server_argv(test, Endpoint("mlx5_0", 1, 3)) == [
        "ib_write_bw", "-d", "mlx5_0", "-i", "1", "-x", "3", "-s", "65536", "-D", "10",
        "--report_gbits", "--tclass=106", "-F", "-p", "18600"]
    assert perftest.client_argv(test, Endpoint("mlx5_1", 2, 5), "198.18.0.1") == [
        "ib_write_bw", "-d", "mlx5_1", "-i", "2", "-x", "5", "-s", "65536", "-D", "10",
        "--report_gbits", "--tclass=106", "-F", "-p", "18600", "198.18.0.1"]
    assert perftest.time_limit(test) == perftest.START_SLACK + 10


def test_latency_argv_runs_by_iterations_and_without_a_tclass_leaves_it_out():
    test = Perftest("ib_send_lat", size=2, iterations=5000)
    assert perftest.client_argv(test, Endpoint("mlx5_0"), "2001:db8::1") == [
        "ib_send_lat", "-d", "mlx5_0", "-i", "1", "-s", "2", "-n", "5000", "-F", "-p", "18515",
        "2001:db8::1"]
    assert perftest.client_argv(test, Endpoint("mlx5_0"), "node-7.rail0")[-1] == "node-7.rail0"
    assert perftest.time_limit(test) == perftest.START_SLACK + 5


@pytest.mark.parametrize("test, end, server", [
    (Perftest(tool="ib_write_bw; reboot"), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(tool="iperf3"), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(size=0), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(size=perftest.MAX_SIZE + 1), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(duration=0), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(duration=3600), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest("ib_send_lat", iterations=4), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(tclass=256), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(tclass=True), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(tclass="106"), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(tcp_port=0), Endpoint("mlx5_0"), "198.18.0.1"),
    (Perftest(), Endpoint("../mlx5_0"), "198.18.0.1"),
    (Perftest(), Endpoint("-d"), "198.18.0.1"),
    (Perftest(), Endpoint("mlx5_0", 0), "198.18.0.1"),
    (Perftest(), Endpoint("mlx5_0", 1, 65), "198.18.0.1"),
    (Perftest(), Endpoint("mlx5_0", 1, -1), "198.18.0.1"),
    (Perftest(), Endpoint("mlx5_0"), "-R"),
    (Perftest(), Endpoint("mlx5_0"), "198.18.0.1 --run_infinitely"),
    (Perftest(), Endpoint("mlx5_0"), ""),
    (Perftest(), Endpoint("mlx5_0"), None),
])
def test_argv_refuses_what_must_not_reach_a_host(test, end, server):
    with pytest.raises(InvalidInput):
        perftest.client_argv(test, end, server)


# -- what the profile and the host say --------------------------------------------------

def profile(tc=None, **entries) -> dict:
    doc = {"nictune": 1, "interfaces": {name: {"match": {"name": name}, "roce": roce}
                                         for name, roce in entries.items()}}
    if tc is not None:
        doc["host"] = {"nccl": {"env": {"NCCL_IB_TC": tc, "NCCL_IB_HCA": "auto"}}}
    return doc


def test_traffic_class_order_verbs_tos_then_nccl_ib_tc_then_roce_tos():
    assert perftest.traffic_class(profile("106", rail={"tos": 96, "verbs_tos": 104}), "rail") == (
        104, "roce.verbs_tos of rail")
    assert perftest.traffic_class(profile("106", rail={"tos": 96}), "rail") == (
        106, "host.nccl.env.NCCL_IB_TC")
    assert perftest.traffic_class(profile(None, rail={"tos": 96}), "rail") == (96, "roce.tos of rail")
    assert perftest.traffic_class(profile(None, a={"tos": 96}, b={"tos": 96})) == (
        96, "roce.tos of a, b")
    assert perftest.traffic_class(profile(None, rail={"mode": "v2"}), "rail") == (
        None, "the profile sets no roce.verbs_tos, NCCL_IB_TC or roce.tos")
    assert perftest.traffic_class({}) == (
        None, "the profile sets no roce.verbs_tos, NCCL_IB_TC or roce.tos")


def test_traffic_class_refuses_an_unknown_entry_and_disagreeing_entries():
    with pytest.raises(InvalidInput, match="no interface entry 'storage'"):
        perftest.traffic_class(profile(None, rail={"tos": 96}), "storage")
    with pytest.raises(InvalidInput, match="different roce.tos: a 96, b 104: name the entry"):
        perftest.traffic_class(profile(None, a={"tos": 96}, b={"tos": 104}))
    assert perftest.traffic_class(profile(None, a={"tos": 96}, b={"tos": 104}), "b")[0] == 104


def _link(index: int, name: str) -> dict:
    return {"index": index, "name": name, "mtu": 9000, "min_mtu": 68, "max_mtu": 9978,
            "txqlen": 1000, "up": True, "operstate": "UP", "mac": f"0c:42:a1:5e:10:{index:02x}",
            "kind": None, "num_rx_queues": 8, "num_tx_queues": 8}


@pytest.fixture
def host(tmp_path):
    names = ["lo", "eth0", RAIL0, RAIL1, STORAGE, FRONT]
    return FakeHost({"tree": "ibauto-host", "links": [_link(i + 1, n) for i, n in enumerate(names)]},
                    tmp_path / "root")


def test_roce_endpoint_takes_the_gid_nccl_would_select_on_the_rails_port(host):
    """ibauto-host README: rail 0 has 198.18.0.1 at 2/3 (v1/v2); the
    front-end port has its IPv6 address first, so its IPv4 v2 GID is 5."""
    assert perftest.roce_endpoint(host, RAIL0) == (Endpoint("mlx5_0", 1, 3), "198.18.0.1")
    assert perftest.roce_endpoint(host, RAIL1) == (Endpoint("mlx5_1", 1, 3), "198.18.0.5")
    assert perftest.roce_endpoint(host, FRONT) == (Endpoint("mlx5_3", 1, 5), "198.18.1.1")
    v6 = perftest.roce_endpoint(host, FRONT, {"NCCL_IB_ADDR_FAMILY": "AF_INET6"})
    assert v6 == (Endpoint("mlx5_3", 1, 3), "2001:db8:0:9::1")
    with pytest.raises(AutoUnresolved, match="the RDMA port of eth0"):
        perftest.roce_endpoint(host, "eth0")


# -- reports recorded over rxe -----------------------------------------------------------

def test_ib_write_bw_report_recorded_over_rxe():
    result = perftest.parse_bw(fixture("ib_write_bw-rxe-client.txt"))
    expected = fixture_numbers("ib_write_bw-rxe-client.txt", "#bytes")
    assert (result.size, result.iterations) == (int(expected[0]), int(expected[1]))
    assert (result.peak_gbps, result.average_gbps, result.msg_rate_mpps) == tuple(
        float(x) for x in expected[2:5])
    assert result.average_gbps > 0 and result.gid_index == 1


def test_ib_send_lat_report_recorded_over_rxe():
    result = perftest.parse_lat(fixture("ib_send_lat-rxe-client.txt"))
    expected = fixture_numbers("ib_send_lat-rxe-client.txt", "#bytes")
    assert (result.size, result.iterations) == (int(expected[0]), int(expected[1]))
    assert (result.t_min, result.t_max, result.t_typical, result.t_avg, result.t_stdev,
            result.p99, result.p999) == tuple(float(x) for x in expected[2:9])
    assert result.gid_index == 1 and result.tps is None


def fixture_numbers(name: str, header: str) -> list:
    """The numbers of the line after the table header, split here by hand."""
    lines = fixture(name).splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(header))
    return lines[at + 1].split()


def test_both_sides_report_in_duration_mode_and_the_server_header_is_read_too():
    """The server's output starts with its "Waiting for client" banner."""
    server = perftest.parse_bw(fixture("ib_write_bw-rxe-server.txt"))
    assert (server.size, server.iterations, server.peak_gbps, server.average_gbps,
            server.msg_rate_mpps, server.gid_index) == (65536, 403, 0.0, 0.11, 0.000201, 1)
    lat = perftest.parse_lat(fixture("ib_send_lat-rxe-server.txt"))
    assert (lat.t_min, lat.t_typical, lat.t_avg, lat.p99, lat.p999, lat.gid_index) == (
        35.82, 39.87, 578.67, 8084.25, 8733.96, 1)


def test_mib_reports_of_old_and_new_perftest_are_converted_to_gbits():
    """Without --report_gbits: MiB/s (perftest 24.07 and later) and "MB/sec"
    (the same unit before), format_factor 0x100000 in print_report_bw."""
    text = fixture("ib_write_bw-rxe-client.txt")
    gbits = perftest.parse_bw(text)
    row = fixture_numbers("ib_write_bw-rxe-client.txt", "#bytes")
    mib = " ".join(row[:2] + ["1000.00", "500.00"] + row[4:5])
    for unit in ("MiB", "MB"):
        changed = text.replace("BW peak[Gb/sec]", f"BW peak[{unit}/sec]").replace(
            "BW average[Gb/sec]", f"BW average[{unit}/sec]").replace(
            fixture_line(text, row), " " + mib)
        result = perftest.parse_bw(changed)
        assert result.peak_gbps == pytest.approx(1000 * 1048576 * 8 / 1e9)
        assert result.average_gbps == pytest.approx(500 * 1048576 * 8 / 1e9)
        assert result.msg_rate_mpps == gbits.msg_rate_mpps


def fixture_line(text: str, words: list) -> str:
    return next(line for line in text.splitlines() if line.split() == words)


def test_a_duration_latency_report_has_only_the_average_and_the_rate():
    text = fixture("ib_send_lat-rxe-client.txt")
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("#bytes"))
    lines[at] = " #bytes        #iterations       t_avg[usec]    tps average"
    lines[at + 1] = " 2             112734            35.37          28245.62"
    result = perftest.parse_lat("\n".join(lines))
    assert (result.size, result.iterations, result.t_avg, result.tps) == (2, 112734, 35.37, 28245.62)
    assert result.p99 is None and result.t_typical is None


# -- broken and hostile outputs --------------------------------------------------------

BW = fixture("ib_write_bw-rxe-client.txt")
BW_ROW = " ".join(fixture_numbers("ib_write_bw-rxe-client.txt", "#bytes"))


def with_row(row: str) -> str:
    lines = BW.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("#bytes"))
    lines[at + 1] = row
    return "\n".join(lines)


@pytest.mark.parametrize("make, message", [
    (lambda: "", "no bandwidth table"),
    (lambda: None, "no output"),
    (lambda: "\x1b[2J Couldn't connect to 198.18.0.1:18515\n", "last line: \"\\x1b[2J Couldn't connect"),
    (lambda: with_row(" 65536 100 1.0 nan 0.1"), "does not have the 5 numbers"),
    (lambda: with_row(" 65536 100 1.0 -2.0 0.1"), "does not have the 5 numbers"),
    (lambda: with_row(" 65536 100 1.0 1e999 0.1"), "out of range"),
    (lambda: with_row(" 65536 100.5 1.0 2.0 0.1"), "is not a count"),
    (lambda: with_row(" 65536 100 1.0"), "does not have the 5 numbers"),
    (lambda: with_row(" 65536 100 \x1b[31m 2.0 0.1"), "\\x1b[31m"),
    (lambda: BW + "\n" + BW, "2 bandwidth tables"),
    (lambda: with_row(" " + BW_ROW + "\n " + BW_ROW), "2 result lines"),
    (lambda: BW.replace(" GID index       : 1", " GID index       : 1\n GID index       : 2"),
     "GID indexes [1, 2]"),
    (lambda: "x" * (perftest.MAX_OUTPUT + 1), "characters of output"),
])
def test_broken_bandwidth_outputs_are_clear_errors(make, message):
    with pytest.raises(PerftestError) as info:
        perftest.parse_bw(make())
    assert message in info.value.message
    assert "\x1b" not in info.value.message


def test_broken_latency_outputs_and_unknown_tools():
    lat = fixture("ib_send_lat-rxe-client.txt")
    with pytest.raises(PerftestError, match="no latency table"):
        perftest.parse_lat(BW)
    cut = lat[:lat.index("#bytes")] + lat[lat.index("#bytes"):].split("\n", 1)[0]
    with pytest.raises(PerftestError, match="the latency table has no result line"):
        perftest.parse_lat(cut)
    with pytest.raises(PerftestError, match="no perftest report reader for 'iperf3'"):
        perftest.parse("iperf3", lat)
    assert perftest.parse("ib_send_lat", lat.encode()) == perftest.parse_lat(lat)
