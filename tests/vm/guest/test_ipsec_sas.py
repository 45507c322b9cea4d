"""The `ipsec:` section on netdevsim: nictune installs two static ESP SAs
(offload dev <port> dir out / in) and their policies from key files over
NETLINK_XFRM, and a rollback removes exactly those.

An SA and a policy are first added by hand with `ip xfrm` (reqid 1, as an
IKE daemon such as strongSwan numbers them; its key: the test constant
KEY_IKE, in `ip`'s argv only: that side is not nictune).  nictune plans
(fingerprints in the notes, never keys), applies, verifies with
expect: {ipsec_offload: crypto}, is refused an SA with the hand SA's
(dst, spi, esp), and rolls back; every step is read back with `ip xfrm
state` / `ip xfrm policy`.  nictune's key bytes (hex either case, raw) are
in no report, no file under the state directory, nor the JUnit XML and
Prometheus text the fleet audit renders from the plan and verify
reports (control/review/audit_formats.py).  The CLI runs in-process.
"""

from __future__ import annotations

import json
import socket
from typing import Iterator

import pytest

from netdevsim import esp_port
from nictune_cli import assert_no_key, audited, fingerprint, key_file, nictune
from rxe import sh

LOCAL, PEER = "198.18.9.1", "198.18.9.2"
SW_SRC, SW_DST = "198.18.9.5", "198.18.9.6"  # no address of the port: concerns no expectation
# Test keys for rfc4106(gcm(aes)): a 128-bit AES key then the 4-byte salt.
KEY_OUT = "5a6b7c8d9eafb0c1d2e3f405162738495a6b7c8d"
KEY_IN = "d8c7b6a5f4e3d2c1b0a9988776655443322110ff"
KEY_IKE = "00ff11ee22dd33cc44bb55aa6699778800112233"


@pytest.fixture(scope="module")
def port(nsim) -> Iterator[str]:
    with esp_port(nsim.ifnames[0], LOCAL) as ifname:
        yield ifname


def _ipsec(report: dict) -> dict:
    (host,) = report["hosts"]
    return {c["key"]["name"]: c for c in host["changes"] if c["key"]["family"] == "ipsec"}


def _expect(report: dict) -> dict:
    (host,) = report["hosts"]
    (change,) = [c for c in host["changes"] if c["key"]["name"] == "ipsec_offload"]
    return change


def _states(*options) -> list:
    """`ip xfrm state` split per SA (a block starts at a line "src ...",
    its other lines are indented)."""
    text = sh("ip", *options, "xfrm", "state").stdout
    return ["src " + b for b in ("\n" + text).split("\nsrc ")[1:]]


def gate_reads_what_the_traffic_used(port: str, outputs: list) -> None:
    """The gate's IPsec check (control/rollout/gate/ipsec.py) on the real
    `ip -s xfrm state list nokeys` of these SAs: offloaded to the port,
    and the outbound one's packets rising with traffic sent through it (a
    permanent neighbour for the peer, which does not answer; UDP datagrams:
    this host has no ping)."""
    from nictune.control.rollout.gate.ipsec import IPSEC_ARGV, ipsec_rows, parse_sas

    def read():
        text = sh(*IPSEC_ARGV).stdout
        outputs.append(text)
        return parse_sas(text)

    before = read()
    mine = {(sa.spi, sa.dev) for sa in before if sa.dev == port}
    assert mine == {("0x00001001", port), ("0x00001002", port), ("0x00002001", port)}, outputs[-1]
    assert {sa.spi for sa in before if sa.dev is None} == {"0x00001003"}, outputs[-1]
    assert KEY_OUT not in outputs[-1] and KEY_IKE not in outputs[-1]  # nokeys
    sh("ip", "neigh", "replace", PEER, "lladdr", "02:00:00:00:09:02", "dev", port, "nud", "permanent")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:  # no ping on this host
        udp.bind((LOCAL, 0))
        for _ in range(3):
            udp.sendto(b"nictune", (PEER, 9))
    after = read()
    (row,) = ipsec_rows("crypto", [port], {"h": before}, {"h": after}, {("h", port): {LOCAL}})
    assert row["passed"] and row["figures"]["sa_packets"] >= 3, row
    (idle,) = ipsec_rows("crypto", [port], {"h": after}, {"h": after}, {("h", port): {LOCAL}})
    assert not idle["passed"] and "counted no packet" in idle["why"], idle
    (packet,) = ipsec_rows("packet", [port], {"h": before}, {"h": after}, {("h", port): {LOCAL}})
    assert not packet["passed"] and "no IPsec SA is packet-offloaded" in packet["why"], packet


def test_esn_crypto_offload_is_refused_by_the_kernel_as_the_driver_rule_says(port, tmp_path):
    # net/xfrm/xfrm_device.c xfrm_dev_state_add: netdevsim has no
    # xdo_dev_state_advance_esn.  The kernel refuses; nictune's plan says so
    # first, from the rule (host/facts/nicclass.py), and writes nothing.
    from nictune.host.facts.nicclass import IPSEC_ESN_NO_ADVANCE

    refused = sh("ip", "xfrm", "state", "add", "src", LOCAL, "dst", PEER, "proto", "esp", "spi",
                 "0x3001", "reqid", "7", "mode", "transport", "aead", "rfc4106(gcm(aes))",
                 "0x" + KEY_IKE, "128", "replay-window", "128", "flag", "esn", "offload", "dev",
                 port, "dir", "out", check=False)
    assert refused.returncode != 0, refused
    assert "Device doesn't support offload with ESN" in refused.stderr, refused.stderr
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    profile = tmp_path / "esn.yaml"
    profile.write_text(
        f"nictune: 1\ninterfaces:\n  rail:\n    match: {{name: {port}}}\n"
        "    ipsec:\n      lab: true\n      sas:\n"
        f"        - {{src: {LOCAL}, dst: {PEER}, spi: 0x3001, reqid: 7,"
        f" key_file: {key_file(keys / 'k', KEY_OUT)}, offload: crypto, dir: out}}\n")
    code, report, out = nictune("apply", str(profile), "--state-dir", str(tmp_path / "s"))
    (change,) = _ipsec(report).values()
    assert change["status"] == "unsupported" and code != 0, change
    assert IPSEC_ESN_NO_ADVANCE.why in change["note"], change
    assert "0x00003001" not in sh("ip", "xfrm", "state").stdout


def test_static_sas_and_policies_with_crypto_offload_from_key_files(port, tmp_path):
    # The "IKE daemon's" SA and policy, added by hand before nictune runs.
    sh("ip", "xfrm", "state", "add", "src", PEER, "dst", LOCAL, "proto", "esp", "spi", "0x2001",
       "reqid", "1", "mode", "transport", "aead", "rfc4106(gcm(aes))", "0x" + KEY_IKE, "128",
       "offload", "dev", port, "dir", "in")
    sh("ip", "xfrm", "policy", "add", "src", "198.18.9.3/32", "dst", f"{LOCAL}/32", "dir", "in",
       "tmpl", "src", "198.18.9.3", "dst", LOCAL, "proto", "esp", "reqid", "1", "mode",
       "transport")
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    out_file, in_file = key_file(keys / "out", KEY_OUT), key_file(keys / "in", KEY_IN)
    profile = tmp_path / "ipsec.yaml"
    profile.write_text(
        "nictune: 1\ninterfaces:\n  rail:\n"
        f"    match: {{name: {port}}}\n"
        "    ipsec:\n      lab: true\n      sas:\n"
        f"        - {{src: {LOCAL}, dst: {PEER}, spi: 0x1001, reqid: 1, mode: transport,"
        f" aead: rfc4106(gcm(aes)), icv: 128, key_file: {out_file}, offload: crypto, dir: out,"
        "  esn: false, replay_window: 64}\n"
        f"        - {{src: {PEER}, dst: {LOCAL}, spi: 0x1002, reqid: 2,"
        f" key_file: {in_file}, offload: crypto, dir: in, esn: false,"
        "  lifetime: {soft_packets: 1000, hard_packets: 2000}}\n"
        # In software, with the defaults: ESN, a 128-packet window, packet lifetimes.
        f"        - {{src: {SW_SRC}, dst: {SW_DST}, spi: 0x1003, reqid: 3, key_file: {out_file}}}\n"
        "      policies:\n"
        f"        - {{src: {LOCAL}/32, dst: {PEER}/32, dir: out,"
        f" tmpl: {{src: {LOCAL}, dst: {PEER}, reqid: 1}}}}\n"
        f"        - {{src: {PEER}/32, dst: {LOCAL}/32, dir: in,"
        f" tmpl: {{src: {PEER}, dst: {LOCAL}, reqid: 2}}}}\n"
        "    expect: {ipsec_offload: crypto}\n")
    state = ["--state-dir", str(tmp_path / "state")]
    sa_out, sa_in = f"sa {PEER} esp 0x00001001", f"sa {LOCAL} esp 0x00001002"
    sa_sw = f"sa {SW_DST} esp 0x00001003"
    pol_out = f"policy {LOCAL}/32 > {PEER}/32 dir out"
    pol_in = f"policy {PEER}/32 > {LOCAL}/32 dir in"
    outputs = []

    code, report, out = nictune("plan", str(profile), *state)
    outputs.append(out)
    assert code == 2, report
    ch = _ipsec(report)
    assert set(ch) == {sa_out, sa_in, sa_sw, pol_out, pol_in}, ch
    assert all(c["status"] == "pending" and c["before"] is None for c in ch.values()), ch
    assert ch[sa_out]["after"] == (f"{LOCAL} > {PEER} reqid 1 transport rfc4106(gcm(aes)) "
                                   "160 bits icv 128 offload crypto dir out replay 64 no-esn "
                                   "lifetime packets 3000000000/4000000000"), ch
    assert f"fingerprint {fingerprint(KEY_OUT)}" in ch[sa_out]["note"], ch
    assert f"fingerprint {fingerprint(KEY_IN)}" in ch[sa_in]["note"], ch
    outputs += audited(report, {sa_out, sa_in, sa_sw, pol_out, pol_in})

    code, report, out = nictune("apply", str(profile), *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    assert all(c["status"] == "applied" for c in _ipsec(report).values()), report
    assert _expect(report)["status"] == "ok", _expect(report)

    # Read back without nictune.
    blocks = _states()
    assert len(blocks) == 4, blocks
    mine = {b.split("spi ")[1].split()[0]: b for b in blocks}
    for spi, src, dst, reqid, direction in (("0x00001001", LOCAL, PEER, 0x6E740001, "out"),
                                            ("0x00001002", PEER, LOCAL, 0x6E740002, "in")):
        b = mine[spi]
        assert b.startswith(f"src {src} dst {dst}"), b
        assert f"reqid {reqid} mode transport" in b, b
        assert "aead rfc4106(gcm(aes))" in b and " 128" in b, b
        assert f"offload parameters: dev {port} dir {direction}" in b, b
    assert "reqid 1 mode transport" in mine["0x00002001"], mine
    # The anti-replay window, ESN and lifetimes, as `ip -s xfrm state` prints them.
    stats = {b.split("spi ")[1].split()[0].split("(")[0]: b for b in _states("-s")}  # "0x..(4097)"
    assert "replay_window 64" in stats["0x00001001"], stats["0x00001001"]
    assert "flag esn" not in stats["0x00001001"], stats["0x00001001"]
    assert "1000(packets)" in stats["0x00001002"] and "2000(packets)" in stats["0x00001002"]
    assert "replay_window 128" in stats["0x00001002"], stats["0x00001002"]  # the default
    assert "flag esn" not in stats["0x00001002"], stats["0x00001002"]
    sw = stats["0x00001003"]
    assert "flag esn" in sw and "replay_window 128" in sw, sw
    assert "3000000000(packets)" in sw and "4000000000(packets)" in sw, sw
    assert "offload" not in sw, sw
    policies = sh("ip", "xfrm", "policy").stdout
    assert f"src {LOCAL}/32 dst {PEER}/32" in policies, policies
    assert f"src {PEER}/32 dst {LOCAL}/32" in policies, policies
    assert policies.count("reqid 1853095937") == 1 and policies.count("reqid 1853095938") == 1

    code, report, out = nictune("verify", str(profile), *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    assert all(c["status"] == "ok" for c in _ipsec(report).values()), report
    facts = report["hosts"][0]["facts"][port]
    assert (facts["ipsec_sa_offloaded"], facts["ipsec_sa_software"]) == (3, 0), facts
    gate_reads_what_the_traffic_used(port, outputs)
    outputs += audited(report, set())

    # An SA with the hand SA's (dst, spi, esp) is someone else's: never replaced.
    clash = tmp_path / "clash.yaml"
    clash.write_text(
        "nictune: 1\ninterfaces:\n  rail:\n"
        f"    match: {{name: {port}}}\n"
        "    ipsec:\n      lab: true\n      sas:\n"
        f"        - {{src: {PEER}, dst: {LOCAL}, spi: 0x2001, reqid: 3,"
        f" key_file: {in_file}, offload: crypto, dir: in}}\n")
    code, report, out = nictune("apply", str(clash), "--state-dir", str(tmp_path / "clash"))
    outputs.append(out)
    (c,) = _ipsec(report).values()
    assert c["status"] in ("unsupported", "failed"), c
    assert "not installed by nictune (reqid 0x1" in out, out
    assert "reqid 1 mode transport" in [b for b in _states() if "0x00002001" in b][0]

    code, report, out = nictune("rollback", *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    (left,) = _states()
    assert "spi 0x00002001 reqid 1 mode transport" in left, left
    assert f"offload parameters: dev {port} dir in" in left, left
    policies = sh("ip", "xfrm", "policy").stdout
    assert "1853095937" not in policies and "1853095938" not in policies, policies
    assert "src 198.18.9.3/32" in policies, policies
    assert_no_key([KEY_OUT, KEY_IN], outputs, str(tmp_path / "state"))
