"""A MACsec link with `offload: mac` on netdevsim, SAs from key files, real
traffic between two linked ports (the VM kernel's own macsec code and
netdevsim's MACsec offload, drivers/net/netdevsim/macsec.c).

Port 0 stays here and gets its MACsec link from nictune; port 1 goes into
namespace ntmsec and plays the peer, set up with `ip` (the test's own
keys, in the peer's argv only: that side is not nictune).  The two ports
are peered through /sys/bus/netdevsim/link_device ("netnsfd:ifindex
netnsfd:ifindex", fds of the writing process), so frames pass between
them.  nictune plans, applies, verifies and rolls back; the link and its
SAs are read back with `ip -j -d link` and `ip macsec show`; a ping runs
through the two macsec links; the key bytes (hex either case, raw) are in
no report, no file under the state directory, nor the JUnit XML and
Prometheus text the fleet audit renders from the plan and verify reports
(control/review/audit_formats.py).  The CLI runs in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Iterator

import pytest

from nictune_cli import assert_no_key, audited, fingerprint, key_file, nictune
from rxe import sh

NETNS = "ntmsec"
LINK, PEER_LINK = "ntms0", "ntms1"
LOCAL, PEER = "198.18.7.1", "198.18.7.2"
# Test keys (gcm-aes-128): ours (TX here, RX at the peer) and the peer's.
KEY_TX = "3c4d5e6f708192a3b4c5d6e7f8091a2b"
KEY_RX = "a0b1c2d3e4f5061728394a5b6c7d8e9f"


def _mac(ifname: str, netns: str = "") -> str:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "link", "show", ifname]
    return json.loads(sh(*argv).stdout)[0]["address"]


def _ifindex(ifname: str, netns: str = "") -> int:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "link", "show", ifname]
    return json.loads(sh(*argv).stdout)[0]["ifindex"]


def _link_ports(a: str, b: str) -> None:
    """Peer port a (here) with port b (in NETNS): link_device takes netns
    fds of the writing process."""
    here = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{NETNS}", os.O_RDONLY)
    try:
        fd = os.open("/sys/bus/netdevsim/link_device", os.O_WRONLY)
        try:
            os.write(fd, f"{here}:{_ifindex(a)} {there}:{_ifindex(b, NETNS)}".encode())
        finally:
            os.close(fd)
    finally:
        os.close(here)
        os.close(there)


@pytest.fixture(scope="module")
def ports(nsim) -> Iterator[tuple]:
    """(our port, our MAC, the peer port's MAC) with the peer side ready."""
    mine, theirs = nsim.ifnames[0], nsim.ifnames[1]
    sh("modprobe", "macsec")
    sh("ip", "netns", "add", NETNS)
    try:
        sh("ip", "link", "set", theirs, "netns", NETNS)
        _link_ports(mine, theirs)
        sh("ip", "link", "set", mine, "up")
        sh("ip", "-n", NETNS, "link", "set", theirs, "up")
        my_mac, peer_mac = _mac(mine), _mac(theirs, NETNS)
        ns = ["ip", "-n", NETNS]
        sh(*ns, "link", "add", "link", theirs, PEER_LINK, "type", "macsec", "port", "1",
           "encrypt", "on", "offload", "mac")
        sh(*ns, "macsec", "add", PEER_LINK, "tx", "sa", "0", "pn", "1", "on", "key", "02", KEY_RX)
        sh(*ns, "macsec", "add", PEER_LINK, "rx", "port", "1", "address", my_mac)
        sh(*ns, "macsec", "add", PEER_LINK, "rx", "port", "1", "address", my_mac, "sa", "0", "pn",
           "1", "on", "key", "01", KEY_TX)
        sh(*ns, "addr", "add", f"{PEER}/30", "dev", PEER_LINK)
        sh(*ns, "link", "set", PEER_LINK, "up")
        yield mine, my_mac, peer_mac
    finally:
        sh("ip", "link", "del", LINK, check=False)
        sh("ip", "-n", NETNS, "link", "del", PEER_LINK, check=False)
        # The port comes back here before the namespace goes, so that the
        # nsim fixture deletes the device with both ports in one place.
        sh("ip", "-n", NETNS, "link", "set", theirs, "netns", "1", check=False)
        sh("ip", "netns", "del", NETNS, check=False)


def _changes(report: dict, link: str = LINK) -> dict:
    """The macsec changes, by what they set ("link", "tx_sa", ...) on `link`."""
    (host,) = report["hosts"]
    mine = [c for c in host["changes"] if c["key"]["family"] == "macsec"]
    assert all(c["key"]["name"].startswith(f"{link}/") for c in mine), mine
    return {c["key"]["name"].split("/", 1)[1]: c for c in mine}


def _ping() -> subprocess.CompletedProcess:
    # iputils' ping is not installed on these machines; busybox-static is.
    return subprocess.run(["busybox", "ping", "-c", "2", "-W", "3", "-I", LINK, PEER],
                          capture_output=True, text=True)



def test_a_macsec_link_with_mac_offload_and_sas_from_key_files(ports, tmp_path):
    port, my_mac, peer_mac = ports
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    tx_file = key_file(keys / "tx", KEY_TX)
    rx_file = key_file(keys / "rx", KEY_RX)
    profile = tmp_path / "macsec.yaml"
    profile.write_text(
        "nictune: 1\ninterfaces:\n  rail:\n"
        f"    match: {{name: {port}}}\n"
        "    macsec:\n"
        f"      name: {LINK}\n      cipher: gcm-aes-128\n      port: 1\n      encrypt: true\n"
        "      offload: mac\n"
        f"      tx_sa: {{an: 0, pn: 1, key_file: {tx_file}}}\n"
        f"      rx: [{{address: \"{peer_mac}\", port: 1, sa: {{an: 0, pn: 1, key_file: {rx_file}}}}}]\n")
    state = ["--state-dir", str(tmp_path / "state")]
    peer_sci = peer_mac.replace(":", "") + "0001"
    outputs = []

    code, report, out = nictune("plan", str(profile), *state)
    outputs.append(out)
    assert code == 2, report
    ch = _changes(report)
    assert set(ch) == {"link", "offload", "tx_sa", f"rx.{peer_sci}"}, ch
    assert all(c["status"] == "pending" for c in ch.values()), ch
    assert ch["tx_sa"]["after"] == f"an 0 key {fingerprint(KEY_TX)}", ch
    assert ch[f"rx.{peer_sci}"]["after"] == f"an 0 key {fingerprint(KEY_RX)}", ch
    assert ch["link"]["after"] == f"{LINK} gcm-aes-128 icv 16 encrypt on port 1", ch
    assert ch["link"]["before"] is None and ch["offload"]["after"] == "mac"
    rendered = audited(report, {c["key"]["name"] for c in ch.values()})
    assert fingerprint(KEY_TX) in rendered[0], rendered[0]  # a rotation shows in CI too
    outputs += rendered

    code, report, out = nictune("apply", str(profile), *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    assert all(c["status"] == "applied" for c in _changes(report).values()), report

    # Read back without nictune.
    (link,) = json.loads(sh("ip", "-j", "-d", "link", "show", LINK).stdout)
    data = link["linkinfo"]["info_data"]
    assert link["link"] == port and link["linkinfo"]["info_kind"] == "macsec", link
    assert data["offload"] == "mac" and data["cipher_suite"] == "GCM-AES-128", data
    assert data["icv_len"] == 16 and data["encrypt"] is True, data
    assert data["sci"] == my_mac.replace(":", "") + "0001", data
    shown = sh("ip", "macsec", "show", LINK).stdout
    assert "offload: mac" in shown, shown
    assert f"TXSC: {my_mac.replace(':', '')}0001 on SA 0" in shown, shown
    assert f"0: PN 1, state on, key {fingerprint(KEY_TX)}6e696374756e65" in shown, shown
    assert f"RXSC: {peer_sci}, state on" in shown, shown
    assert f"0: PN 1, state on, key {fingerprint(KEY_RX)}6e696374756e65" in shown, shown
    assert not any(k in shown for k in (KEY_TX, KEY_RX))

    # Traffic through both macsec links.
    sh("ip", "addr", "add", f"{LOCAL}/30", "dev", LINK)
    done = _ping()
    assert done.returncode == 0, done.stdout + done.stderr
    # The peer was reached over ntms0: its address resolved there, to the
    # MAC of the peer's macsec link.  (Offloaded macsec links count no
    # packets of their own: netdevsim has no mdo_get_*_stats.)
    neigh = json.loads(sh("ip", "-j", "neigh", "show", PEER, "dev", LINK).stdout)
    assert [n["lladdr"] for n in neigh] == [_mac(PEER_LINK, NETNS)], neigh

    code, report, out = nictune("verify", str(profile), *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    assert all(c["status"] == "ok" for c in _changes(report).values()), report
    outputs += audited(report, set())

    code, report, out = nictune("rollback", *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    assert subprocess.run(["ip", "link", "show", LINK], capture_output=True).returncode != 0
    assert "ntms0" not in sh("ip", "macsec", "show").stdout
    assert_no_key([KEY_TX, KEY_RX], outputs, str(tmp_path / "state"))


def test_a_key_file_others_can_read_is_refused_before_anything_is_written(ports, tmp_path):
    port, _my_mac, peer_mac = ports
    loose = tmp_path / "loose"
    loose.write_text(KEY_TX + "\n")
    os.chmod(loose, 0o644)
    profile = tmp_path / "loose.yaml"
    profile.write_text(
        "nictune: 1\ninterfaces:\n  rail:\n"
        f"    match: {{name: {port}}}\n"
        f"    macsec: {{name: {LINK}, offload: mac, tx_sa: {{an: 0, key_file: {loose}}}}}\n")
    code, report, out = nictune("apply", str(profile), "--state-dir", str(tmp_path / "state"))
    assert code not in (0, 2), report
    assert f"macsec.tx_sa.key_file: key file {loose}: mode 0644, must be 0600" in out, out
    assert KEY_TX not in out
    assert subprocess.run(["ip", "link", "show", LINK], capture_output=True).returncode != 0


def test_a_link_nictune_did_not_make_only_gets_its_offload_mode(ports, tmp_path):
    """As wpa_supplicant leaves a link before MKA has a peer: made by
    someone else, no SA, down.  nictune sets and verifies its offload mode,
    and a rollback puts the mode back without deleting the link."""
    port, _my_mac, _peer_mac = ports
    other = "ntms9"
    sh("ip", "link", "add", "link", port, other, "type", "macsec", "port", "9")
    try:
        profile = tmp_path / "adopt.yaml"
        profile.write_text(
            "nictune: 1\ninterfaces:\n  rail:\n"
            f"    match: {{name: {port}}}\n"
            f"    macsec: {{name: {other}, offload: mac, encrypt: false}}\n")
        state = ["--state-dir", str(tmp_path / "state")]
        code, report, _ = nictune("apply", str(profile), *state)
        assert code == 0, json.dumps(report["hosts"][0], indent=0)
        ch = _changes(report, other)
        assert set(ch) == {"offload"}, ch
        assert (ch["offload"]["before"], ch["offload"]["after"], ch["offload"]["status"]) == \
            ("off", "mac", "applied"), ch
        assert "not made by nictune" in ch["offload"]["note"], ch
        (link,) = json.loads(sh("ip", "-j", "-d", "link", "show", other).stdout)
        assert link["linkinfo"]["info_data"]["offload"] == "mac", link

        code, report, _ = nictune("rollback", *state)
        assert code == 0, json.dumps(report["hosts"][0], indent=0)
        (link,) = json.loads(sh("ip", "-j", "-d", "link", "show", other).stdout)
        assert link["linkinfo"]["info_data"]["offload"] == "off", link
    finally:
        sh("ip", "link", "del", other, check=False)
