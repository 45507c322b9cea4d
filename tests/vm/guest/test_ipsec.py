"""expect: {ipsec_offload: ...} against the VM kernel's own xfrm code and
netdevsim's IPsec crypto offload (drivers/net/netdevsim/ipsec.c: ESP with
rfc4106(gcm(aes)), 128-bit ICV, crypto offload only).

SAs are set up the way an IKE daemon would leave them, with `ip xfrm state
add` (keys: the test constants below); nictune only reads them.  Software
SAs are drift for `crypto`, met for `none`; the same SAs offloaded to the
port (`offload dev X dir out|in`) are met for `crypto`, and drift for
`packet`, which netdevsim cannot do.  The keys appear in no report and in
no file under the state directory.  The CLI runs in-process (CliRunner).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from netdevsim import esp_port
from nictune_cli import assert_no_key, nictune
from rxe import sh

LOCAL, PEER = "198.18.0.1", "198.18.0.2"
# Test constants (20 bytes: a 128-bit AES key and the 32-bit rfc4106 salt).
KEY_OUT = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"
KEY_IN = "f9e8d7c6b5a4938271605f4e3d2c1b0a76543210"
AUTH_KEY = "1122334455667788990011223344556677889900aabbccddeeff001122334455"


def sa_argv(src: str, dst: str, spi: str, key: str, offload: list) -> list:
    return ["ip", "xfrm", "state", "add", "src", src, "dst", dst, "proto", "esp", "spi", spi,
            "reqid", "1", "mode", "transport", "aead", "rfc4106(gcm(aes))", "0x" + key, "128",
            *offload]


@contextlib.contextmanager
def sas(ifname: str, offload: bool) -> Iterator[None]:
    """An outbound and an inbound SA between LOCAL and PEER; flushed after."""
    try:
        sh(*sa_argv(LOCAL, PEER, "0x1001", KEY_OUT,
                    ["offload", "dev", ifname, "dir", "out"] if offload else []))
        sh(*sa_argv(PEER, LOCAL, "0x1002", KEY_IN,
                    ["offload", "dev", ifname, "dir", "in"] if offload else []))
        yield
    finally:
        sh("ip", "xfrm", "state", "flush")


@pytest.fixture(scope="module")
def port(nsim) -> Iterator[str]:
    with esp_port(nsim.ifnames[0], LOCAL) as ifname:
        yield ifname


def profile(tmp_path, ifname: str, mode: str, feature: bool = False) -> str:
    """expect: {ipsec_offload: mode}; with feature, hw-tc-offload on too, so
    that an apply writes something and keeps a journal."""
    path = tmp_path / f"ipsec-{mode}-{feature}.yaml"
    path.write_text(f"nictune: 1\ninterfaces:\n  rail:\n    match: {{name: {ifname}}}\n"
                    + ("    features: {hw-tc-offload: true}\n" if feature else "")
                    + f"    expect: {{ipsec_offload: {mode}}}\n")
    return str(path)


def ipsec_change(report: dict) -> dict:
    (host,) = report["hosts"]
    (change,) = [c for c in host["changes"] if c["key"]["name"] == "ipsec_offload"]
    return change


def test_software_sas_are_drift_for_crypto_and_met_for_none(port, tmp_path):
    state = ["--state-dir", str(tmp_path / "state")]
    outputs = []
    with sas(port, offload=False):
        shown = sh("ip", "xfrm", "state").stdout
        assert "offload" not in shown and "spi 0x00001001" in shown, shown
        code, report, out = nictune("apply", profile(tmp_path, port, "crypto", True), *state)
        outputs.append(out)
        assert code == 2, report  # the feature applied; the expectation is drift
        change = ipsec_change(report)
        assert (change["status"], change["before"], change["after"]) == ("drift", "none", "crypto")
        assert f"SA {LOCAL} > {PEER} esp spi 0x00001001: in software" in change["note"], change
        assert f"SA {PEER} > {LOCAL} esp spi 0x00001002: in software" in change["note"], change

        code, report, out = nictune("verify", profile(tmp_path, port, "none", True), *state)
        outputs.append(out)
        assert code == 0, report
        assert ipsec_change(report)["status"] == "ok"
        facts = report["hosts"][0]["facts"][port]
        assert (facts["ipsec_sa_offloaded"], facts["ipsec_sa_software"]) == (0, 2)

        code, report, out = nictune("rollback", *state)
        outputs.append(out)
        assert code == 0, report
    assert_no_key([KEY_OUT, KEY_IN], outputs, str(tmp_path / "state"), journaled=True)


def test_offloaded_sas_are_met_for_crypto_and_drift_for_packet(port, tmp_path):
    state = ["--state-dir", str(tmp_path / "state")]
    outputs = []
    with sas(port, offload=True):
        shown = sh("ip", "xfrm", "state").stdout
        assert shown.count("offload parameters") == 2 and f"dev {port}" in shown, shown
        code, report, out = nictune("verify", profile(tmp_path, port, "crypto"), *state)
        outputs.append(out)
        assert code == 0, report
        change = ipsec_change(report)
        assert (change["status"], change["before"]) == ("ok", "crypto"), change
        facts = report["hosts"][0]["facts"][port]
        assert (facts["ipsec_sa_offloaded"], facts["ipsec_sa_software"]) == (2, 0)

        code, report, out = nictune("verify", profile(tmp_path, port, "packet"), *state)
        outputs.append(out)
        assert code == 2, report
        change = ipsec_change(report)
        assert (change["status"], change["before"]) == ("drift", "crypto"), change
        assert f"crypto offload on {port}, not packet offload" in change["note"], change
    code, report, out = nictune("verify", profile(tmp_path, port, "crypto"), *state)
    outputs.append(out)
    assert ipsec_change(report)["note"] == f"no IPsec SA uses {port}"
    assert_no_key([KEY_OUT, KEY_IN], outputs, str(tmp_path / "state"), journaled=False)
