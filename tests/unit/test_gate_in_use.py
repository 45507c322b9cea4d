"""The gate's "is it in use" checks, with fake sessions: `ipsec_offload:`
(SAs offloaded to each rail exist and the traffic went through them) and
`counters: min:` (a counter that must rise, kTLS's from /proc/net/tls_stat).
An idle host meets expect: {ipsec_offload: {if_present: crypto}}; these are
where "in use" is asked instead.  The real `ip -s xfrm state list nokeys`
output of offloaded SAs is parsed in the VM tier (tests/vm/guest/
test_ipsec_sas.py); the command itself runs on the fleet lab's hosts in
tests/fleet/test_gate_fleet.py."""

from __future__ import annotations


import pytest

from nictune.control.rollout import gate as g
from nictune.control.rollout.gate.ipsec import IPSEC_ARGV, parse_sas
from nictune.control.rollout.traffic import Result
from .test_gate import FakeSession, playbook

# `ip -s xfrm state list nokeys` as iproute2 (ipxfrm.c xfrm_state_print)
# printed nictune's static SAs on netdevsim in the VM tier, trimmed; iproute2
# 6.2 and later end the offload line with " mode crypto|packet" (6.1: none).
STATE = """\
src 198.18.0.{me} dst 198.18.0.{peer}
\tproto esp spi 0x00001001(4097) reqid 1853095937(0x6e740001) mode transport
\treplay-window 0 seq 0x00000000 flag  (0x00000000)
\taead rfc4106(gcm(aes)) <<Keys hidden>> 128
\tlastused 2026-12-04 19:28:11
\tanti-replay esn context:
\t seq-hi 0x0, seq 0x0, oseq-hi 0x0, oseq 0x3
\t replay_window 64, bitmap-length 2
\t 00000000 00000000 
\tcrypto offload parameters: dev eth2 dir out mode {mode}
\tsel src 0.0.0.0/0 dst 0.0.0.0/0 uid 0
\tlifetime config:
\t  limit: soft (INF)(bytes), hard (INF)(bytes)
\t  limit: soft 3000000000(packets), hard 4000000000(packets)
\t  expire add: soft 0(sec), hard 0(sec)
\t  expire use: soft 0(sec), hard 0(sec)
\tlifetime current:
\t  {bytes}(bytes), {out}(packets)
\t  add 2026-12-04 19:28:01 use 2026-12-04 19:28:11
\tstats:
\t  replay-window 0 replay 0 failed 0
src 198.18.0.{peer} dst 198.18.0.{me}
\tproto esp spi 0x00001002(4098) reqid 1853095938(0x6e740002) mode transport
\tcrypto offload parameters: dev eth2 dir in mode {mode}
\tlifetime current:
\t  0(bytes), {in_}(packets)
"""
SOFTWARE = """\
src 198.18.0.{me} dst 198.18.0.9
\tproto esp spi 0x00002001(8193) reqid 1(0x00000001) mode transport
\tlifetime current:
\t  0(bytes), 0(packets)
"""


class Host(FakeSession):
    """A fake host whose SA packet counts grow by `step` per read (the
    traffic runs between the reads), and whose /proc/net/tls_stat grows too;
    addresses, routes, the rail's facts and iperf3 as test_gate's hosts."""

    def __init__(self, name, log, mode="crypto", step=5, software=False, tls_step=2):
        super().__init__(name, log)
        self.mode, self.step = mode, step
        self.software, self.tls_step, self.reads, self.tls_reads = software, tls_step, 0, 0

    def run(self, argv, seconds):
        me = self.name[-1]
        if argv == IPSEC_ARGV:
            self.log.append((self.name, argv))
            n = self.reads * self.step
            self.reads += 1
            text = STATE.format(me=me, peer="9", bytes=n * 100, out=n, in_=n, mode=self.mode)
            return Result(argv, 0, text + (SOFTWARE.format(me=me) if self.software else ""), "")
        if argv[:2] == ["sh", "-c"] and "tls_stat" in argv[2]:
            self.log.append((self.name, argv))
            n = self.tls_reads * self.tls_step
            self.tls_reads += 1
            return Result(argv, 0, f"== ethtool\n     rx_discards_phy: 0\n== tls\nTlsCurrTxDevice  1\n"
                                   f"TlsTxDevice   {n}\nTlsTxSw 0\n", "")
        return super().run(argv, seconds)


def spec(**kw):
    return g.GateSpec(rails=["eth2"], source="pb.yaml:5", iperf3=g.Iperf3Spec(seconds=1), **kw)


def test_the_ip_output_is_parsed_to_addresses_spi_offload_and_packets():
    sas = parse_sas(STATE.format(me=1, peer=2, bytes=700, out=7, in_=3, mode="packet")
                    + SOFTWARE.format(me=1))
    assert [(s.src, s.dst, s.spi, s.dev, s.mode, s.packets) for s in sas] == [
        ("198.18.0.1", "198.18.0.2", "0x00001001", "eth2", "packet", 7),
        ("198.18.0.2", "198.18.0.1", "0x00001002", "eth2", "packet", 3),
        ("198.18.0.1", "198.18.0.9", "0x00002001", None, "none", 0)]
    assert parse_sas("") == [] and parse_sas("junk\n\tlifetime current:\n\t 1(bytes), 2(packets)\n") == []
    assert "nokeys" in IPSEC_ARGV  # keys never leave the host


def test_offloaded_sas_that_carried_the_traffic_pass():
    log: list = []
    result = g.Gate(spec(ipsec_offload="crypto"), lambda h: Host(h, log))(1, ["h1", "h2"])
    assert result["passed"], result
    rows = [r for r in result["results"] if r["tool"] == "ipsec-offload"]
    assert len(rows) == 2
    assert [(r["client"], r["rail"], r["figures"]) for r in rows] == [
        ("h1", "eth2", {"sas_offloaded": 2, "sa_packets": 10}),
        ("h2", "eth2", {"sas_offloaded": 2, "sa_packets": 10})]
    assert sum(1 for _, argv in log if argv == IPSEC_ARGV) == 4  # before and after, each host


@pytest.mark.parametrize("host,why", [
    (dict(mode="packet", step=0), "counted no packet during the traffic"),
    (dict(mode="crypto"), "no IPsec SA is packet-offloaded to eth2 (2 offloaded in another mode)"),
    (dict(mode="packet", software=True),
     "SA 198.18.0.1 > 198.18.0.9 spi 0x00002001 of eth2's addresses runs in software"),
])
def test_sas_missing_unused_or_in_software_fail_the_gate(host, why):
    result = g.Gate(spec(ipsec_offload="packet"), lambda h: Host(h, [], **host))(3, ["h1", "h2"])
    assert not result["passed"], result
    assert why in result["message"], result["message"]


def test_packet_offload_counts_for_a_crypto_gate():
    result = g.Gate(spec(ipsec_offload="crypto"), lambda h: Host(h, [], mode="packet"))(1, ["h1", "h2"])
    assert result["passed"], result


def test_a_counter_that_must_rise_and_did_not_fails_and_tls_counters_are_read():
    ok = g.Gate(spec(counters_min={"TlsTxDevice": 2}), lambda h: Host(h, []))(1, ["h1", "h2"])
    assert ok["passed"], ok
    assert {r["figures"].get("TlsTxDevice") for r in ok["results"] if r["tool"] == "counters"} == {2}
    idle = g.Gate(spec(counters_min={"TlsTxDevice": 1}), lambda h: Host(h, [], tls_step=0))(2, ["h1", "h2"])
    assert not idle["passed"]
    assert ("TlsTxDevice rose by 0 during the traffic, less than its minimum 1: what it counts was not "
            "in use") in idle["message"]
    gone = g.Gate(spec(counters_min={"TlsRxDevice": 1}), lambda h: Host(h, []))(3, ["h1", "h2"])
    assert "has no counter TlsRxDevice on eth2 (no /proc/net/tls_stat" in gone["message"]


def test_tls_stat_lines_are_counters_and_the_nic_wins_a_name_clash():
    text = ("== ethtool\n     tx_packets: 4\n== tls\nTlsCurrTxSw                     \t0\n"
            "TlsTxDevice 12\nTlsDecryptError x\ntx_packets 99\n")
    assert g.parse_counters(text) == {"tx_packets": 4, "TlsCurrTxSw": 0, "TlsTxDevice": 12}


def test_the_spec_loads_min_counters_and_ipsec_and_refuses_nonsense(tmp_path):
    path = playbook(tmp_path, """
        rails: [eth2]
        iperf3: {seconds: 1}
        counters: {min: {TlsTxDevice: 1}}
        ipsec_offload: packet
    """)
    (gate,) = g.load_play_gates(path)
    assert (gate.counters, gate.counters_min, gate.ipsec_offload) == ({}, {"TlsTxDevice": 1}, "packet")
    for bad in ("counters: {min: {TlsTxDevice: 0}}", "counters: {}", "ipsec_offload: none"):
        path = playbook(tmp_path, f"rails: [eth2]\niperf3: {{seconds: 1}}\n{bad}\n")
        with pytest.raises(g.NictuneError, match=r"pb.yaml:\d+"):
            g.load_play_gates(path)


def test_iproute2_before_6_2_prints_no_offload_mode_enough_for_crypto_not_for_packet():
    old = STATE.replace(" mode {mode}", "")
    (sa, _in) = parse_sas(old.format(me=1, peer=2, bytes=0, out=0, in_=0))
    assert (sa.dev, sa.mode) == ("eth2", "offload of an unknown mode")
    after = parse_sas(old.format(me=1, peer=2, bytes=500, out=5, in_=5))
    before = parse_sas(old.format(me=1, peer=2, bytes=0, out=0, in_=0))
    (ok,) = _rows("crypto", before, after)
    assert ok["passed"], ok
    (no,) = _rows("packet", before, after)
    assert not no["passed"] and "does not print the offload mode: 6.2 and later do" in no["why"]


def _rows(mode, before, after):
    from nictune.control.rollout.gate.ipsec import ipsec_rows
    return ipsec_rows(mode, ["eth2"], {"h": before}, {"h": after}, {})
