"""The traffic gate's parts that need no host (control/rollout/gate/, traffic.py):
the gate: spec and its errors (file:line:key, no traceback), hostile
iperf3 / ip / counter output, pairing, baselines, and the Gate's
decisions with fake sessions.  The real runs are tests/fleet/test_gate_fleet.py.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.rollout import gate as g
from nictune.control.rollout.gate import iperf3 as iperf3_gate
from nictune.control.rollout.traffic import Result, bounded
from nictune.profile.errors import ProfileError


def playbook(tmp_path, gate_yaml: str) -> str:
    (tmp_path / "p.yaml").write_text("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n")
    path = tmp_path / "pb.yaml"
    body = textwrap.indent(textwrap.dedent(gate_yaml).strip(), "    ")
    path.write_text(f"- name: rails\n  hosts: all\n  profile: p.yaml\n  gate:\n{body}\n")
    return str(path)


def gate_error(tmp_path, gate_yaml: str) -> str:
    path = playbook(tmp_path, gate_yaml)
    with pytest.raises(ProfileError) as info:
        g.load_play_gates(path)
    return str(info.value)


# -- the spec ------------------------------------------------------------------------

def test_a_full_gate_loads(tmp_path):
    path = playbook(tmp_path, """
        rails: [eth2, eth3]
        peers: "traffic_peers"
        timeout: 30
        port: 5301
        iperf3: {seconds: 5, min_gbps: 150, max_retransmits: 1000, udp: {gbps: 10, max_loss: "0.1%"}}
        counters: {max: {rx_discards_phy: 0, tx_pause_storm_error_events: 0}}
        baseline: base/gate.json
        max_regression: "10%"
    """)
    [spec] = g.load_play_gates(path)
    assert spec.rails == ["eth2", "eth3"] and spec.peers == "traffic_peers" and spec.port == 5301
    assert (spec.iperf3.seconds, spec.iperf3.min_gbps, spec.iperf3.max_retransmits) == (5, 150, 1000)
    assert (spec.iperf3.udp_gbps, spec.iperf3.max_loss) == (10, 0.1)
    assert spec.counters == {"rx_discards_phy": 0, "tx_pause_storm_error_events": 0}
    assert spec.baseline == str(tmp_path / "base" / "gate.json") and spec.max_regression == 10.0
    assert spec.source == f"{path}:4" and spec.run_timeout() == 30


@pytest.mark.parametrize("gate_yaml, line, key, words", [
    ("rails: [eth2]\niperf3: {min_gbps: fast}", 6, "[0].gate.iperf3.min_gbps", "expected a number from 0 to 100000"),
    ("rails: [-eth2]\niperf3: {}", 5, "[0].gate.rails[0]", "not starting with '-'"),
    ("rails: ['eth2; reboot']\niperf3: {}", 5, "[0].gate.rails[0]", "interface name"),
    ("rails: [eth2]\niperf3: {udp: {gbps: 1, max_loss: lots}}", 6, "[0].gate.iperf3.udp.max_loss", "percentage"),
    ("rails: [eth2]\niperf3: {seconds: 10}\ntimeout: 5", 7, "[0].gate.timeout", "longer than iperf3.seconds"),
    ("rails: [eth2]\niperf3: {}\nbaseline: b.json", 7, "[0].gate.baseline", "goes with max_regression"),
    ("rails: [eth2]\niperf3: {}\ncounters: {max: {'rx discards': 0}}", 7, "[0].gate.counters.max", "counter name"),
    ("rails: [eth2]\niperf3: {}\nib_send_lat: {}", 7, "[0].gate.ib_send_lat", "not supported"),
    ("rails: [eth2]\nib_write_bw: {tclass: 256}", 6, "[0].gate.ib_write_bw.tclass", "from 0 to 255"),
    ("rails: [eth2]\nib_write_bw: {seconds: 9}\ntimeout: 9", 7, "[0].gate.timeout", "longer than ib_write_bw.seconds"),
    ("rails: [eth2]\nipref3: {}", 6, "[0].gate", "unknown key 'ipref3' (did you mean 'iperf3'?)"),
    ("rails: [eth2]", 4, "[0].gate", "add iperf3:"),
])
def test_spec_errors_name_file_line_and_key(tmp_path, gate_yaml, line, key, words):
    message = gate_error(tmp_path, gate_yaml)
    assert message.startswith(f"{tmp_path / 'pb.yaml'}:{line}: {key}: "), message
    assert words in message and "\n" not in message


def test_gate_record_reports_a_bad_gate_in_one_line_without_traceback(tmp_path):
    path = playbook(tmp_path, "rails: [eth2]\niperf3: {min_gbps: -1}")
    inventory = tmp_path / "inv.ini"
    inventory.write_text("h1 ansible_host=198.18.0.1\n")
    result = CliRunner().invoke(app, ["gate", "record", path, "-i", str(inventory)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert f"{path}:6: [0].gate.iperf3.min_gbps: " in result.output


def test_gate_record_measures_between_the_plays_hooks_with_one_rollout_name(tmp_path):
    """A batch is measured where a rollout would measure it: inside what
    before_batch set up (a reservation its launcher names), cleanup after."""
    import sys
    from types import SimpleNamespace

    from nictune.cli.gate_cmds import _measure
    from nictune.control.rollout.playbook import load_playbook

    log = tmp_path / "log"
    logger = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n'); "
                                    "sys.exit(int(sys.argv[2] == 'fail'))", str(log)]
    hooks = {"before_batch": [logger + ["reserve", "r-{rollout}-{batch}"], logger + ["{hosts}"]],
             "after_batch": [logger + ["after"]], "cleanup": [logger + ["unreserve", "r-{rollout}-{batch}"]]}
    (tmp_path / "p.yaml").write_text("nictune: 1\nhost: {sysctl: {net.ipv4.tcp_ecn: 1}}\n")
    (tmp_path / "pb.yaml").write_text(f"- hosts: all\n  profile: p.yaml\n  hooks: {json.dumps(hooks)}\n")
    [play] = load_playbook(str(tmp_path / "pb.yaml"))

    def runner(number, batch):
        log.open("a").write(f"measure {number}\n")
        return {"passed": True, "message": "measured", "results": [{"tool": "nccl-tests"}]}

    batch = [SimpleNamespace(name="h1"), SimpleNamespace(name="h2")]
    result = _measure(play, runner, 2, batch, "R")
    assert log.read_text().splitlines() == ["reserve r-R-2", "h1,h2", "measure 2", "after", "unreserve r-R-2"]
    assert result["results"] == [{"tool": "nccl-tests"}] and not result.get("hook_failed")
    # A before_batch that fails: nothing measured, cleanup still runs, the record fails.
    log.write_text("")
    batch = [SimpleNamespace(name="fail")]
    result = _measure(play, runner, 1, batch, "R")
    assert log.read_text().splitlines() == ["reserve r-R-1", "fail", "unreserve r-R-1"]
    assert result["hook_failed"] and result["results"] == [] and "before_batch hook" in result["message"]


# -- hostile output ---------------------------------------------------------------------

TCP = {"start": {}, "end": {"sum_sent": {"bits_per_second": 9.9e9, "retransmits": 12},
                            "sum_received": {"bits_per_second": 9.4e9}}}
UDP = {"end": {"sum": {"bits_per_second": 1e9, "lost_percent": 0.5},
               "sum_received": {"bits_per_second": 0.99e9, "lost_percent": 0.25}}}


def test_iperf3_figures_come_from_the_documented_fields():
    assert g.parse_iperf3(json.dumps(TCP)) == {"gbps": 9.4, "retransmits": 12}
    assert g.parse_iperf3(json.dumps(UDP), udp=True) == {"gbps": 0.99, "lost_percent": 0.25}
    older = {"end": {"sum": {"bits_per_second": 1e9, "lost_percent": 2.0}}}  # no sum_received
    assert g.parse_iperf3(json.dumps(older), udp=True) == {"gbps": 1.0, "lost_percent": 2.0}


@pytest.mark.parametrize("text, words", [
    ("", "not JSON"),
    ("Connecting to host 198.18.0.2", "not JSON"),
    ("[" * 100000 + "]" * 100000, "not JSON"),  # RecursionError inside json
    ("[1, 2]", "not a JSON object"),
    ('{"error": "unable to connect to server: Connection refused\\n\\u001b[2J"}', "iperf3: unable to connect"),
    ('{"end": []}', "no end mapping"),
    ('{"end": {"sum_sent": {}}}', "no sum_received"),
    ('{"end": {"sum_received": {"bits_per_second": "9e9"}}}', "bits_per_second is not a number"),
    ('{"end": {"sum_received": {"bits_per_second": true}}}', "bits_per_second is not a number"),
    ('{"end": {"sum_received": {"bits_per_second": NaN}}}', "bits_per_second is not a number"),
    ('{"end": {"sum_received": {"bits_per_second": 1e999}}}', "bits_per_second is not a number"),
    ('{"end": {"sum_received": {"bits_per_second": -5}}}', "bits_per_second is not a number"),
    ('{"end": {"sum_received": {"bits_per_second": 1e300}}}', "bits_per_second is not a number"),
    ('{"end": {"sum_received": {"bits_per_second": 1}, "sum_sent": {"retransmits": -1}}}', "retransmits"),
    ('{"end": {"sum_received": {"bits_per_second": 1}, "sum_sent": {"retransmits": 1e30}}}', "retransmits"),
    ("x" * (g.MAX_JSON + 1), "longer than"),
])
def test_hostile_iperf3_output_is_refused_in_words(text, words):
    with pytest.raises(g.BadOutput) as info:
        g.parse_iperf3(text)
    assert words in str(info.value)
    assert "\x1b" not in str(info.value) and "\n" not in str(info.value)


def test_hostile_udp_loss_is_refused():
    for loss in (101, -1, "0", None):
        doc = {"end": {"sum_received": {"bits_per_second": 1e9, "lost_percent": loss}}}
        with pytest.raises(g.BadOutput):
            g.parse_iperf3(json.dumps(doc), udp=True)


def addr(ifname, *infos):
    return json.dumps([{"ifname": ifname, "addr_info": list(infos)}])


def test_the_rail_address_is_a_checked_global_address():
    v4 = {"family": "inet", "local": "198.18.0.2", "scope": "global"}
    v6 = {"family": "inet6", "local": "2001:db8::2", "scope": "global"}
    link = {"family": "inet6", "local": "fe80::1", "scope": "link"}
    evil = {"family": "inet", "local": "198.18.0.9 -e ls", "scope": "global"}
    assert g.parse_rail_address(addr("eth2", link, evil, v6, v4), "eth2") == "198.18.0.2"
    assert g.parse_rail_address(addr("eth2", link, v6), "eth2") == "2001:db8::2"
    for text, words in ((addr("eth2", link, evil), "no global IP address"), (addr("eth3", v4), "no interface eth2"),
                        ('{"ifname": "eth2"}', "no interface"), ("nope", "not JSON"),
                        (json.dumps([{"ifname": "eth2", "addr_info": "x"}]), "no global")):
        with pytest.raises(g.BadOutput) as info:
            g.parse_rail_address(text, "eth2")
        assert words in str(info.value)


def test_a_rail_address_scope_id_is_an_interface_name_or_number():
    def v6(local):
        return {"family": "inet6", "local": local, "scope": "global"}
    # Python's ipaddress takes any text after "%": such addresses are skipped.
    for scope in ("$(reboot)", "eth2 -e ls", "-oProxyCommand=x", "a/b", ".", "..", "x" * 16,
                  "99999999999", "eth2\n", "١"):
        text = addr("eth2", v6(f"2001:db8::9%{scope}"), v6("2001:db8::2"))
        assert g.parse_rail_address(text, "eth2") == "2001:db8::2", scope
        with pytest.raises(g.BadOutput, match="no global IP address"):
            g.parse_rail_address(addr("eth2", v6(f"2001:db8::9%{scope}")), "eth2")
    for scope in ("eth2", "rail0.100", "ib0@x", "3", "4294967295"):
        text = addr("eth2", v6(f"2001:db8::9%{scope}"), v6("2001:db8::2"))
        assert g.parse_rail_address(text, "eth2") == f"2001:db8::9%{scope}"


def test_counters_take_ethtool_over_rdma_over_netdev_and_skip_junk():
    text = ("== ethtool\nNIC statistics:\n     rx_discards_phy: 7\n     tx_packets: 100\n"
            "     rx_prio3_pause: 18446744073709551616\n     junk line\n     neg: -4\n"
            "== rdma\n/sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent:5\n"
            "/sys/class/infiniband/mlx5_0/ports/1/hw_counters/tx_packets:1\n"
            "== netdev\n/sys/class/net/eth2/statistics/rx_dropped:3\n"
            "/sys/class/net/eth2/statistics/tx_packets:2\n/sys/class/net/eth2/statistics/rx_errors:x\n")
    assert g.parse_counters(text) == {"rx_discards_phy": 7, "tx_packets": 100, "np_cnp_sent": 5,
                                      "rx_dropped": 3}


# -- pairing -------------------------------------------------------------------------

def test_pairs():
    assert g.pair_up(["a", "b", "c"], [], []) == [("a", "b"), ("b", "c"), ("c", "a")]
    assert g.pair_up(["a", "b"], [], []) == [("a", "b"), ("b", "a")]
    assert g.pair_up(["a"], [], ["x", "y"]) == [("a", "y"), ("y", "a")]
    assert g.pair_up(["a"], [], []) == []
    assert g.pair_up(["a", "b", "c"], ["p", "a"], []) == [
        ("a", "p"), ("p", "a"), ("b", "a"), ("a", "b"), ("c", "p"), ("p", "c")]


def test_rounds_never_give_a_host_two_streams_the_same_way():
    pairs = [("a", "p"), ("p", "a"), ("b", "p"), ("p", "b"), ("c", "d")]
    out = g.rounds(pairs)
    assert sorted(p for r in out for p in r) == sorted(pairs)
    for r in out:
        assert len({c for c, _ in r}) == len(r) and len({s for _, s in r}) == len(r)
    assert g.rounds([("a", "b"), ("b", "c"), ("c", "a")]) == [[("a", "b"), ("b", "c"), ("c", "a")]]


# -- baselines ---------------------------------------------------------------------------

def tcp_row(client, server, gbps):
    return {**g.row(client, server, "eth2", "iperf3-tcp"), "figures": {"gbps": gbps, "retransmits": 0}}


def test_a_baseline_is_merged_atomically_and_compared(tmp_path):
    path = str(tmp_path / "base.json")
    assert g.write_baseline(path, [tcp_row("a", "b", 100.0), tcp_row("b", "a", 90.0)]) == 2
    assert g.write_baseline(path, [tcp_row("a", "b", 98.0), {**g.row("a", None, "eth2", "counters"),
                                                             "figures": {"x": 1}}]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["base.json"]  # no temporary file left
    baseline = g.read_baseline(path)
    assert baseline == {("a", "b", "eth2", "iperf3-tcp"): {"gbps": 98.0, "retransmits": 0.0},
                        ("b", "a", "eth2", "iperf3-tcp"): {"gbps": 90.0, "retransmits": 0.0}}
    rows = [tcp_row("a", "b", 90.0), tcp_row("b", "a", 70.0), tcp_row("c", "a", 70.0)]
    g.compare(rows, baseline, 10.0, path)
    assert rows[0]["passed"] and rows[0]["baseline"] == {"gbps": 98.0}
    assert not rows[1]["passed"] and "gbps regressed 22.2% from the baseline (baseline 90, now 70; " \
                                     "max_regression 10%)" in rows[1]["why"]
    assert not rows[2]["passed"] and "no baseline for this pair" in rows[2]["why"]


def test_a_baseline_that_is_not_ours_is_refused(tmp_path):
    for text in ("[]", "{", '{"nictune_gate_baseline": 1, "entries": [{"client": "a"}]}',
                 '{"nictune_gate_baseline": 1, "entries": [{"client": "a", "server": "b", "rail": "e", '
                 '"tool": "t", "figures": {"gbps": "fast"}}]}'):
        (tmp_path / "b.json").write_text(text)
        with pytest.raises(g.NictuneError):
            g.read_baseline(str(tmp_path / "b.json"))


# -- the Gate with fake hosts ------------------------------------------------------------

# RAIL_SCRIPT's output on a host with Debian 12's iperf3 (its --version's
# three lines joined) and a NIC on NUMA node 1.
RAIL_FACTS_312 = ("iperf3 iperf 3.12 (cJSON 1.7.15) Linux h1 6.1.0-18-amd64 #1 SMP x86_64 Optional features "
                  "available: CPU affinity setting, IPv6 flow label, SCTP, TCP congestion algorithm setting, "
                  "sendfile / zerocopy, socket pacing, authentication, bind to device, support IPv4 don't "
                  "fragment \nnuma_node 1\nlocal_cpulist 16-31,48-63\n")
# ... and with iperf3 3.17 (a thread per stream), on a virtual device.
RAIL_FACTS_317 = ("iperf3 iperf 3.17.1 (cJSON 1.7.15) Linux h1 6.8.0-31-generic Optional features available: "
                  "CPU affinity setting, bind to device, support IPv4 don't fragment, POSIX threads \n"
                  "numa_node \nlocal_cpulist \n")


class FakeSession:
    """Stands in for traffic.Session: answers `ip -j addr`, `ip -j route
    get` (by `routes`: own address -> device, else the rail), RAIL_SCRIPT
    (`facts`) and iperf3."""

    def __init__(self, name, log, routes=None, facts=RAIL_FACTS_317):
        self.name, self.log, self.routes, self.facts = getattr(name, "name", name), log, routes or {}, facts

    def run(self, argv, seconds):
        self.log.append((self.name, argv))
        if argv[:4] == ["ip", "-j", "route", "get"]:
            own = argv[-1]
            return Result(argv, 0, json.dumps([{"dst": argv[4], "from": own, "dev": self.routes.get(own, "eth2")}]),
                          "")
        if argv[:2] == ["ip", "-j"]:
            return Result(argv, 0, addr(argv[-1], {"family": "inet", "local": "198.18.0." + self.name[-1],
                                                   "scope": "global"}), "")
        # getattr: the fake also answers a nictune without these scripts
        # (the one before them), so that these tests fail there on what it runs.
        if argv[:3] == ["sh", "-c", getattr(g, "RAIL_SCRIPT", None)]:
            return Result(argv, 0, self.facts, "")
        if argv[:3] == ["sh", "-c", getattr(iperf3_gate, "CLIENTS_SCRIPT", None)]:  # argv[5]: processes
            return Result(argv, 0, "".join(f"\n==nictune-iperf3 {i}\n{json.dumps(TCP)}" for i in range(int(argv[5]))),
                          "")
        return Result(argv, 0, json.dumps(UDP if "-u" in argv else TCP), "")

    def start(self, argv, seconds):
        self.log.append((self.name, argv))
        return FakeServer()

    def close(self):
        self.log.append((self.name, "close"))


class FakeChannel:
    def exit_status_ready(self):
        return False  # the server runs until stopped


class FakeServer:
    stopped = 0
    chan = FakeChannel()

    def wait_for(self, text, seconds):
        return True

    def output(self):
        return ""

    def stop(self):
        FakeServer.stopped += 1


def spec(**kw):
    return g.GateSpec(rails=["eth2"], source="pb.yaml:5", iperf3=g.Iperf3Spec(seconds=1, **kw))


def test_the_gate_runs_quoted_argv_and_stops_every_server():
    log: list = []
    FakeServer.stopped = 0
    gate = g.Gate(spec(min_gbps=5), lambda h: FakeSession(h, log))
    result = gate(1, ["h1", "h2"])
    assert result["passed"] and gate.kept == ["h1", "h2"], result
    assert [(r["client"], r["server"], r["figures"]["gbps"]) for r in result["results"]] == [
        ("h1", "h2", 9.4), ("h2", "h1", 9.4)]
    assert ("h2", ["iperf3", "-s", "-1", "-B", "198.18.0.2", "--bind-dev", "eth2", "-p", "5201",
                   "--forceflush"]) in log
    assert ("h1", ["iperf3", "-c", "198.18.0.2", "-B", "198.18.0.1", "--bind-dev", "eth2", "-p", "5201",
                   "-t", "1", "-P", "8", "--connect-timeout", "5000", "--json"]) in log
    assert FakeServer.stopped == 2 and sum(1 for _, a in log if a == "close") == 2
    # A later batch of one pairs with a host kept before it.
    assert [(r["client"], r["server"]) for r in gate(2, ["h3"])["results"]] == [("h3", "h2"), ("h2", "h3")]


def test_the_gate_fails_below_the_floor_and_with_nothing_to_measure_against():
    gate = g.Gate(spec(min_gbps=10, max_retransmits=5), lambda h: FakeSession(h, []))
    result = gate(4, ["h1", "h2"])
    assert not result["passed"] and gate.kept == []
    assert result["message"].startswith("batch 4: the traffic gate failed: h1 > h2 on eth2 (iperf3-tcp): "
                                        "9.4 Gbit/s over 8 streams, less than min_gbps 10; 12 retransmits, "
                                        "more than max_retransmits 5")
    alone = g.Gate(spec(), lambda h: FakeSession(h, []))(1, ["h1"])
    assert not alone["passed"] and "name peers:" in alone["message"]


def test_commands_are_bounded_in_time():
    assert bounded(["iperf3", "-c", "x"], 7.2) == ["timeout", "-k", "2", "8", "iperf3", "-c", "x"]


# -- ib_write_bw (perftest: no RDMA device here, the hosts are fakes) -------------------------

# GIDS_SCRIPT's output for a ConnectX port: a link-local v1/v2 pair, then
# the IPv4-mapped v1/v2 pair (index 3 is what NCCL picks).
GIDS = ("gid mlx5_0/ports/1 0 fe80:0000:0000:0000:0e42:a1ff:fe2b:0001 IB/RoCE v1\n"
        "gid mlx5_0/ports/1 1 fe80:0000:0000:0000:0e42:a1ff:fe2b:0001 RoCE v2\n"
        "gid mlx5_0/ports/1 2 0000:0000:0000:0000:0000:ffff:c612:0001 IB/RoCE v1\n"
        "gid mlx5_0/ports/1 3 0000:0000:0000:0000:0000:ffff:c612:0001 RoCE v2\n"
        "gid -evil/ports/1 3 0000:0000:0000:0000:0000:ffff:c612:0009 RoCE v2\n")
# A report in the layout of perftest's print_report_bw with --report_gbits
# (see control/rollout/perftest.py), figures made up.
BW_REPORT = """
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 GID index       : 3
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      3484             391.50             388.20               0.740433
---------------------------------------------------------------------------------------
"""


def test_the_rail_rdma_endpoint_is_the_gid_nccl_would_pick():
    end, address = g.rdma_endpoint(GIDS, "eth2")
    assert (end.device, end.port, end.gid_index, address) == ("mlx5_0", 1, 3, "198.18.0.1")
    with pytest.raises(g.BadOutput, match="no RDMA port with a RoCE v2 IPv4 GID"):
        g.rdma_endpoint(GIDS.splitlines()[1] + "\n", "eth2")
    with pytest.raises(g.BadOutput, match="eth2 has no RDMA port"):
        g.rdma_endpoint("gid ../x/ports/1 3 ::1 RoCE v2\n", "eth2")


class RdmaSession(FakeSession):
    def run(self, argv, seconds):
        if argv[:2] == ["sh", "-c"] and argv[2] == g.GIDS_SCRIPT:
            self.log.append((self.name, argv))
            return Result(argv, 0, GIDS, "")
        if argv[0] == "ib_write_bw":
            self.log.append((self.name, argv))
            return Result(argv, 0, BW_REPORT, "")
        return super().run(argv, seconds)


def test_ib_write_bw_runs_with_the_gid_and_traffic_class_and_judges_the_average():
    log: list = []
    FakeServer.stopped = 0
    ib_spec = g.GateSpec(rails=["eth2"], source="pb.yaml:4", ib_write_bw=g.IbWriteBwSpec(seconds=2, min_gbps=390))
    result = g.Gate(ib_spec, lambda h: RdmaSession(h, log), tclass=106)(1, ["h1", "h2"])
    [first, _] = result["results"]
    assert (first["client"], first["server"], first["tool"]) == ("h1", "h2", "ib_write_bw")
    assert first["figures"] == {"gbps": 388.2, "peak_gbps": 391.5} and first["gid_index"] == 3
    assert not first["passed"] and first["why"] == "388 Gbit/s, less than min_gbps 390"
    common = ["-d", "mlx5_0", "-i", "1", "-x", "3", "-s", "65536", "-D", "2", "--report_gbits",
              "--tclass=106", "-F", "-p", "18515"]
    assert ("h2", ["ib_write_bw", *common]) in log  # the server, started first
    assert ("h1", ["ib_write_bw", *common, "198.18.0.2"]) in log  # to the server's rail address
    assert FakeServer.stopped == 2


def test_a_gate_that_breaks_fails_its_batch_and_closes_what_it_opened():
    log: list = []

    def connect(host):
        if host == "h2":
            raise RuntimeError("boom")
        return FakeSession(host, log)

    result = g.Gate(spec(), connect)(1, ["h1", "h2"])
    assert not result["passed"]
    assert [(r["client"], r["tool"], r["why"]) for r in result["results"]][:1] == [
        ("h2", "ssh", "cannot connect: RuntimeError: boom")]
    assert ("h1", "close") in log

    class Broken(FakeSession):
        def run(self, argv, seconds):
            raise ZeroDivisionError("bug")

    broken = g.Gate(spec(), lambda h: Broken(h, []))(2, ["h1", "h2"])
    assert not broken["passed"] and "internal error ZeroDivisionError: bug" in broken["message"]


class ScriptedChannel:
    """A paramiko channel's reading side, over a byte string."""

    def __init__(self, data: bytes):
        self.data, self.closed, self.timeout, self.exited = data, False, None, False

    def settimeout(self, t):
        self.timeout = t

    def recv(self, n):
        chunk, self.data = self.data[:3], self.data[3:]  # a few bytes at a time
        return chunk

    def recv_ready(self):
        return bool(self.data)

    def exit_status_ready(self):
        return self.exited

    def close(self):
        self.closed = True


def test_a_background_command_is_killed_by_the_pid_its_first_line_gives():
    from nictune.control.rollout.traffic import Background

    killed = []

    class Session:
        def run(self, argv, seconds):
            killed.append(argv)
            chan.exited = True  # the kill ended it

    chan = ScriptedChannel(b"nictune-pid 4242\nServer listening on 5201\n")
    started = Background(Session(), chan, ["iperf3", "-s"], deadline=1e18)
    started.stop()
    assert killed == [["kill", "-TERM", "4242"]] and chan.closed
    # A first line that is not ours names no process: nothing is killed.
    killed.clear()
    Background(Session(), ScriptedChannel(b"nictune-pid 42; rm\n"), ["x"], 1e18).stop()
    assert killed == []


# -- streams, binding, pinning, routes, floors ------------------------------------------------

# The end of Debian 12's iperf3 3.12 --json with -P 3 on loopback (figures
# as it printed them; the streams' other fields left out).
TCP_P3 = {"end": {
    "streams": [{"sender": {"bits_per_second": 5.45e9, "retransmits": 10}, "receiver": {"bits_per_second": 5.4e9}},
                {"sender": {"bits_per_second": 5.45e9, "retransmits": 9}, "receiver": {"bits_per_second": 5.5e9}},
                {"sender": {"bits_per_second": 5.45e9, "retransmits": 10}, "receiver": {"bits_per_second": 5.45e9}}],
    "sum_sent": {"bits_per_second": 16352342152.6411, "retransmits": 29},
    "sum_received": {"bits_per_second": 16351198609.362825}}}


def test_tcp_figures_are_of_all_streams_and_a_missing_stream_is_refused():
    assert g.parse_iperf3(json.dumps(TCP_P3), streams=3) == {"gbps": 16.351199, "retransmits": 29}
    # Output that lists the streams without their sum: the streams summed.
    streams_only = {"end": {"streams": TCP_P3["end"]["streams"]}}
    assert g.parse_iperf3(json.dumps(streams_only), streams=3) == {"gbps": 16.35, "retransmits": 29}
    with pytest.raises(g.BadOutput, match="iperf3 reported 3 streams, not the 8 asked for"):
        g.parse_iperf3(json.dumps(TCP_P3), streams=8)
    with pytest.raises(g.BadOutput, match="stream 1 has no receiver mapping"):
        g.parse_iperf3(json.dumps({"end": {"streams": [TCP_P3["end"]["streams"][0], {"sender": {}}]}}))


def test_the_host_facts_say_what_its_iperf3_can_do_and_where_the_nic_sits():
    debian = g.parse_rail_facts(RAIL_FACTS_312)
    assert debian == g.RailFacts(version=(3, 12), bind_dev=True, numa_node=1, local_cpus="16-31,48-63")
    assert not debian.threaded and debian.cpus("numa") == "16-31,48-63" and debian.cpus("any") is None
    assert debian.cpus("0-3") == "0-3"
    threaded = g.parse_rail_facts("iperf3 iperf 3.17.1 (cJSON 1.7.15) Optional features available: bind to device\n"
                                  "numa_node -1\nlocal_cpulist \n")
    assert threaded.threaded and threaded.bind_dev and threaded.numa_node is None and threaded.cpus("numa") is None
    # 3.10 had --bind-dev, broken for TCP until 3.11; Ubuntu 22.04's 3.9 has none.
    for version in ("3.10.1", "3.9"):
        assert not g.parse_rail_facts(f"iperf3 iperf {version} Optional features available: bind to device\n").bind_dev
    hostile = g.parse_rail_facts("iperf3 \nnuma_node 1; reboot\nlocal_cpulist 0-3 && reboot\n")
    assert hostile == g.RailFacts()


def test_a_threaded_iperf3_runs_the_streams_in_one_process_bound_to_the_rail():
    log: list = []
    FakeServer.stopped = 0
    gate = g.Gate(spec(min_gbps=5, streams=16, zerocopy=True, udp_gbps=1, max_loss=1.0),
                  lambda h: FakeSession(h, log))
    result = gate(1, ["h1", "h2"])
    assert result["passed"], result
    assert ("h1", ["iperf3", "-c", "198.18.0.2", "-B", "198.18.0.1", "--bind-dev", "eth2", "-p", "5201",
                   "-t", "1", "-P", "16", "-Z", "--connect-timeout", "5000", "--json"]) in log
    # UDP keeps one stream: -b is a per-stream rate.
    assert ("h1", ["iperf3", "-c", "198.18.0.2", "-B", "198.18.0.1", "--bind-dev", "eth2", "-p", "5201",
                   "-t", "1", "-P", "1", "-u", "-b", "1G", "--connect-timeout", "5000", "--json"]) in log
    [tcp, _, _, _] = result["results"]
    assert (tcp["streams"], tcp["processes"], tcp["bind_dev"], tcp["cpus"]) == (16, 1, True, {"h1": "any", "h2": "any"})
    # Both ends asked their kernel how the rail reaches the other first.
    assert ("h1", ["ip", "-j", "route", "get", "198.18.0.2", "from", "198.18.0.1"]) in log
    assert ("h2", ["ip", "-j", "route", "get", "198.18.0.1", "from", "198.18.0.2"]) in log


def test_an_older_iperf3_runs_a_process_per_stream_pinned_to_the_rails_numa_cpus():
    """Debian 12's iperf3 3.12 runs every stream in one thread: four
    one-stream processes on ports 5201-5204 each side, their figures summed."""
    log: list = []
    FakeServer.stopped = 0
    gate = g.Gate(spec(min_gbps=30, streams=4), lambda h: FakeSession(h, log, facts=RAIL_FACTS_312))
    result = gate(1, ["h1", "h2"])
    assert result["passed"], result
    pinned = ["taskset", "-c", "16-31,48-63"]
    servers, clients = iperf3_gate.SERVERS_SCRIPT, iperf3_gate.CLIENTS_SCRIPT
    assert ("h2", ["sh", "-c", servers, "sh", "5201", "4", *pinned, "iperf3", "-s", "-1", "-B", "198.18.0.2",
                   "--bind-dev", "eth2", "--forceflush"]) in log
    assert ("h1", ["sh", "-c", clients, "sh", "5201", "4", *pinned, "iperf3", "-c", "198.18.0.2", "-B",
                   "198.18.0.1", "--bind-dev", "eth2", "-t", "1", "-P", "1", "--connect-timeout", "5000",
                   "--json"]) in log
    [tcp, _] = result["results"]
    assert tcp["figures"] == {"gbps": 37.6, "retransmits": 48}  # 4 x 9.4 Gbit/s, 4 x 12
    assert (tcp["streams"], tcp["processes"], tcp["cpus"]) == (4, 4, {"h1": "16-31,48-63", "h2": "16-31,48-63"})
    assert FakeServer.stopped == 2


def test_the_processes_reports_are_summed_and_a_missing_one_is_refused():
    parse_iperf3_processes = iperf3_gate.parse_iperf3_processes
    one = json.dumps(TCP)
    assert parse_iperf3_processes(f"\n==nictune-iperf3 0\n{one}\n==nictune-iperf3 1\n{one}", 2) == {
        "gbps": 18.8, "retransmits": 24}
    with pytest.raises(g.BadOutput, match="does not hold the 3 processes' reports"):
        parse_iperf3_processes(f"\n==nictune-iperf3 0\n{one}\n==nictune-iperf3 1\n{one}", 3)
    refused = '{"error": "unable to connect to server: Connection refused"}'
    with pytest.raises(g.BadOutput, match="iperf3 process 2 of 2: iperf3: unable to connect"):
        parse_iperf3_processes(f"\n==nictune-iperf3 0\n{one}\n==nictune-iperf3 1\n{refused}", 2)


def test_an_iperf3_without_bind_dev_runs_unbound_and_any_runs_unpinned():
    log: list = []
    facts = "iperf3 iperf 3.9\nlocal_cpulist 0-7\n"  # Ubuntu 22.04's: no --bind-dev, one thread
    gate = g.Gate(spec(cpus="any", streams=1), lambda h: FakeSession(h, log, facts=facts))
    assert gate(1, ["h1", "h2"])["passed"]
    clients = [argv for _, argv in log if "-c" in argv and argv[0] != "sh"]
    assert clients == [["iperf3", "-c", "198.18.0.2", "-B", "198.18.0.1", "-p", "5201", "-t", "1", "-P", "1",
                        "--connect-timeout", "5000", "--json"],
                       ["iperf3", "-c", "198.18.0.1", "-B", "198.18.0.2", "-p", "5201", "-t", "1", "-P", "1",
                        "--connect-timeout", "5000", "--json"]]


def test_a_rail_whose_traffic_would_leave_by_another_nic_is_refused_not_measured():
    """h2's eth2 address routes out of eth1 (two rails in one subnet, no
    policy rule): both directions of the pair are refused, naming the
    host, the rail and the NIC, and no iperf3 runs at all."""
    log: list = []
    sessions = {"h1": lambda: FakeSession("h1", log), "h2": lambda: FakeSession("h2", log, {"198.18.0.2": "eth1"})}
    result = g.Gate(spec(udp_gbps=1, max_loss=1.0), lambda h: sessions[h]())(1, ["h1", "h2"])
    assert not result["passed"]
    rows = result["results"]
    assert len(rows) == 4 and not any(r["passed"] or r["figures"] for r in rows)
    assert all("h2: eth2's traffic to 198.18.0.1 would leave by eth1 (ip route get 198.18.0.1 from 198.18.0.2)"
               in r["why"] for r in rows), rows
    assert rows[0]["why"].endswith("would leave by eth1 (ip route get 198.18.0.1 from 198.18.0.2): so iperf3 would "
                                   "measure another NIC than the rail: give each rail's address a route of its own "
                                   "(`ip rule add from ADDRESS table N` and the subnet's route on the rail in table "
                                   "N), and arp_ignore=1 and arp_announce=2, so each NIC answers for its own address "
                                   "only")
    assert not [argv for _, argv in log if argv != "close" and "iperf3" in argv]


def test_a_route_that_cannot_be_read_is_not_a_pass():
    class Mute(FakeSession):
        def run(self, argv, seconds):
            if argv[:4] == ["ip", "-j", "route", "get"]:
                return Result(argv, 2, "", "RTNETLINK answers: Network is unreachable")
            return super().run(argv, seconds)

    result = g.Gate(spec(), lambda h: Mute(h, []))(1, ["h1", "h2"])
    assert not result["passed"]
    assert "h1: cannot tell how eth2's traffic to 198.18.0.2 leaves (ip exited 2: RTNETLINK answers: Network is " \
           "unreachable)" in result["results"][0]["why"]
    for text in ("", "[]", '[{"dst": "x"}]', "{", '[{"dev": 5}]'):
        with pytest.raises(g.BadOutput):
            g.parse_route_dev(text)


def test_the_floor_is_per_host_from_the_inventory_and_a_pair_takes_the_lower(tmp_path):
    from nictune.inventory import load_inventory

    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[rails]\nh1 nictune_gate_min_gbps=5\nh2\nh3 nictune_gate_min_gbps=9.5\n")
    hosts = [load_inventory(str(inventory)).hosts[n] for n in ("h1", "h2", "h3")]
    result = g.Gate(spec(min_gbps=10), lambda h: FakeSession(h, []))(1, hosts)
    verdicts = {(r["client"], r["server"]): (r["passed"], r["why"]) for r in result["results"]}
    # The ring h1>h2, h2>h3, h3>h1 at 9.4 Gbit/s: h2 has the gate's 10, h3 its own 9.5, h1 its own 5.
    assert verdicts[("h1", "h2")] == (True, "") and verdicts[("h3", "h1")] == (True, "")
    assert verdicts[("h2", "h3")] == (False, f"9.4 Gbit/s over 8 streams, less than h3's nictune_gate_min_gbps 9.5 "
                                             f"({inventory}:4)")

    inventory.write_text("[rails]\nh1 nictune_gate_min_gbps=fast\nh2\n")
    hosts = [load_inventory(str(inventory)).hosts[n] for n in ("h1", "h2")]
    bad = g.Gate(spec(min_gbps=10), lambda h: FakeSession(h, []))(1, hosts)
    assert not bad["passed"] and bad["results"] == []
    assert f"{inventory}:2: nictune_gate_min_gbps of host 'h1' is 'fast'; give the least Gbit/s" in bad["message"]


def test_streams_zerocopy_and_cpus_load_and_refuse_nonsense(tmp_path):
    [spec_] = g.load_play_gates(playbook(tmp_path, 'rails: [eth2]\niperf3: {streams: 16, zerocopy: true, '
                                                   'cpus: "0-15,32-47"}'))
    assert (spec_.iperf3.streams, spec_.iperf3.zerocopy, spec_.iperf3.cpus) == (16, True, "0-15,32-47")
    [default] = g.load_play_gates(playbook(tmp_path, "rails: [eth2]\niperf3: {}"))
    assert (default.iperf3.streams, default.iperf3.zerocopy, default.iperf3.cpus) == (8, False, "numa")
    assert "[0].gate.iperf3.streams" in gate_error(tmp_path, "rails: [eth2]\niperf3: {streams: 129}")
    assert "8 streams from port 65530 run past port 65535" in gate_error(tmp_path, "rails: [eth2]\nport: 65530\n"
                                                                                  "iperf3: {streams: 8}")
    error = gate_error(tmp_path, 'rails: [eth2]\niperf3: {cpus: "0-3; reboot"}')
    assert ":6: [0].gate.iperf3.cpus" in error and "taskset -c" in error


def test_the_shipped_400g_gate_runs_parallel_streams_against_its_floor():
    """One TCP stream does not carry 150 Gbit/s: the ConnectX-7 playbook's
    iperf3 runs several, its floor of all of them together."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "playbooks", "connectx7-fleet.yaml")
    [gate] = g.load_play_gates(path)
    assert gate.iperf3.min_gbps == 150 and gate.iperf3.streams >= 8 and gate.iperf3.cpus == "numa"
    assert gate.port + gate.iperf3.streams - 1 <= 65535
