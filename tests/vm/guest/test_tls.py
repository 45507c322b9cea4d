"""kTLS counters (/proc/net/tls_stat) against the VM kernel's own tls module.

Without the module an expectation on a Tls* counter is unsupported ("the
tls module is not loaded"); with it, the counters are health facts of
every interface and meet expectations.  A TCP connection over loopback
given the "tls" ULP and a TLS 1.2 AES-GCM-128 TX key (test constants, no
secret) makes TlsCurrTxSw and TlsTxSw go up: the numbers nictune reads are
the kernel's, live.  The CLI runs in-process (CliRunner); the expectations
sit on a dummy link, since the counters are the namespace's, not a port's.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Iterator

import pytest

from nictune_cli import nictune
from rxe import sh

TLS_STAT = "/proc/net/tls_stat"
LINK = "nttls0"
# include/uapi/linux/tcp.h, linux/socket.h, linux/tls.h
TCP_ULP, SOL_TLS, TLS_TX = 31, 282, 1
TLS_1_2_VERSION, TLS_CIPHER_AES_GCM_128 = 0x0303, 51


def stat() -> dict:
    with open(TLS_STAT) as f:
        return {name: int(value) for name, value in (line.split() for line in f)}


@pytest.fixture(scope="module")
def link() -> Iterator[str]:
    """The dummy link, and loopback up for the TCP pair (put back as found)."""
    lo_was_up = "UP" in sh("ip", "-br", "link", "show", "lo").stdout.split()[1]
    sh("ip", "link", "add", LINK, "type", "dummy")
    sh("ip", "link", "set", "lo", "up")
    try:
        yield LINK
    finally:
        sh("ip", "link", "del", LINK, check=False)
        if not lo_was_up:
            sh("ip", "link", "set", "lo", "down", check=False)


def profile(tmp_path, counters: str) -> str:
    path = tmp_path / "tls.yaml"
    path.write_text(f"nictune: 1\ninterfaces:\n  any:\n    match: {{name: {LINK}}}\n"
                    f"    expect: {{counters: {counters}}}\n")
    return str(path)


def changes(report: dict) -> dict:
    (host,) = report["hosts"]
    return {c["key"]["name"]: c for c in host["changes"]}


def tls_sender() -> tuple:
    """A loopback TCP pair whose client end encrypts in the kernel (kTLS, TX)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    server.close()
    client.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
    # struct tls12_crypto_info_aes_gcm_128: version, cipher, iv[8], key[16], salt[4], rec_seq[8]
    info = struct.pack("=HH8s16s4s8s", TLS_1_2_VERSION, TLS_CIPHER_AES_GCM_128,
                       bytes(range(8)), bytes(range(16, 32)), bytes(4), bytes(8))
    client.setsockopt(SOL_TLS, TLS_TX, info)
    return client, peer


def test_without_the_module_an_expectation_is_unsupported(link, tmp_path):
    sh("modprobe", "-r", "tls", check=False)
    assert not os.path.exists(TLS_STAT), "the tls module stayed loaded"
    code, report, _ = nictune("verify", profile(tmp_path, "{TlsDecryptError: 0}"),
                           "--state-dir", str(tmp_path / "state"))
    change = changes(report)["counters.TlsDecryptError"]
    assert change["status"] == "unsupported" and "the tls module is not loaded" in change["note"], change
    assert code != 0


def test_the_kernels_counters_are_facts_and_expectations(link, tmp_path):
    sh("modprobe", "tls")
    before = stat()
    assert before["TlsCurrTxSw"] == 0 and "TlsRxNoPadViolation" in before, before
    client, peer = tls_sender()
    try:
        client.sendall(b"x" * 100)
        assert peer.recv(4096)  # a TLS record, encrypted by the kernel
        after = stat()
        assert after["TlsCurrTxSw"] == 1 and after["TlsTxSw"] == before["TlsTxSw"] + 1, after
        code, report, _ = nictune(
            "verify", profile(tmp_path, "{TlsCurrTxSw: 1, TlsDecryptError: 0, TlsTxDevice: {min: 1}}"),
            "--state-dir", str(tmp_path / "state"))
        got = {name: (c["status"], c["before"]) for name, c in changes(report).items()}
        assert got == {"counters.TlsCurrTxSw": ("ok", 1), "counters.TlsDecryptError": ("ok", 0),
                       "counters.TlsTxDevice": ("drift", 0)}, got  # no device offload here
        assert code == 2
        facts = report["hosts"][0]["facts"][LINK]["tls"]
        assert facts["TlsCurrTxSw"] == 1 and facts["TlsTxSw"] == after["TlsTxSw"], facts
    finally:
        client.close()
        peer.close()


# A kTLS sender in a network namespace of its own (as a pod's), printing its
# namespace's TlsCurrTxSw, then holding the socket open until stdin closes.
POD_SENDER = """
import socket, struct, sys
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
client = socket.create_connection(server.getsockname()); peer, _ = server.accept()
client.setsockopt(socket.IPPROTO_TCP, 31, b"tls")
client.setsockopt(282, 1, struct.pack("=HH8s16s4s8s", 0x0303, 51, bytes(range(8)),
                                      bytes(range(16, 32)), bytes(4), bytes(8)))
client.sendall(b"x" * 100); peer.recv(4096)
stat = dict(line.split() for line in open("/proc/net/tls_stat"))
print(stat["TlsCurrTxSw"], flush=True)
sys.stdin.read()
"""


def test_the_if_present_form_holds_idle_and_a_pods_socket_is_not_the_hosts(link, tmp_path):
    """TlsCurrTxSw {max: 0} (no kTLS socket in software now) holds on an idle
    host, where TlsCurrTxDevice {min: 1} drifts; and /proc/net/tls_stat is
    per network namespace: a kTLS socket in another one is not counted."""
    import subprocess
    import sys

    sh("modprobe", "tls")
    path = profile(tmp_path, "{TlsCurrTxSw: {max: 0}, TlsCurrTxDevice: {min: 1}}")
    ns = "ntpodtls"
    sh("ip", "netns", "add", ns)
    pod = None
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        pod = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", POD_SENDER],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert pod.stdout.readline().strip() == "1"  # the pod's namespace counts its socket
        assert stat()["TlsCurrTxSw"] == 0, stat()  # the host's does not
        code, report, _ = nictune("verify", path, "--state-dir", str(tmp_path / "state"))
        got = {name: (c["status"], c["before"]) for name, c in changes(report).items()}
        assert got == {"counters.TlsCurrTxSw": ("ok", 0),
                       "counters.TlsCurrTxDevice": ("drift", 0)}, got
        assert code == 2
        client, peer = tls_sender()  # the host's own software kTLS socket: drift
        try:
            code, report, _ = nictune("verify", path, "--state-dir", str(tmp_path / "state"))
            assert changes(report)["counters.TlsCurrTxSw"]["status"] == "drift", report
        finally:
            client.close()
            peer.close()
    finally:
        if pod is not None:
            pod.stdin.close()
            pod.wait(10)
        sh("ip", "netns", "del", ns, check=False)
