"""A MACsec link with `offload: mac` on netdevsim, real traffic between two
linked ports (the VM kernel's own macsec code and netdevsim's MACsec
offload, drivers/net/netdevsim/macsec.c): static XPN SAs from key files,
installed again above their PN high-water mark; and a link that a real
wpa_supplicant (MKA, PSK CAK/CKN, one daemon per end) owns, which nictune
checks and never gives an SA.

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
import re
import subprocess
import time
from typing import Iterator

import pytest

from nictune_cli import assert_no_key, audited, fingerprint, key_file, nictune
from rxe import sh

NETNS = "ntmsec"
LINK, PEER_LINK = "ntms0", "ntms1"
LOCAL, PEER = "198.18.7.1", "198.18.7.2"
# Test keys (gcm-aes-xpn-128): ours (TX here, RX at the peer) and the peer's,
# with each SA's SSCI and salt (XPN needs both).
KEY_TX = "3c4d5e6f708192a3b4c5d6e7f8091a2b"
KEY_RX = "a0b1c2d3e4f5061728394a5b6c7d8e9f"
SSCI_TX, SSCI_RX = 1, 2
SALT_TX, SALT_RX = "0123456789abcdef01234567", "76543210fedcba9876543210"


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
           "encrypt", "on", "offload", "mac", "cipher", "gcm-aes-xpn-128")
        sh(*ns, "macsec", "add", PEER_LINK, "tx", "sa", "0", "xpn", "1", "ssci", str(SSCI_RX),
           "salt", SALT_RX, "on", "key", "02", KEY_RX)
        sh(*ns, "macsec", "add", PEER_LINK, "rx", "port", "1", "address", my_mac)
        # The lowest PN accepted stays 1: nictune's re-install starts far above it.
        sh(*ns, "macsec", "add", PEER_LINK, "rx", "port", "1", "address", my_mac, "sa", "0",
           "xpn", "1", "ssci", str(SSCI_TX), "salt", SALT_TX, "on", "key", "01", KEY_TX)
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


def _ping(link: str = LINK) -> subprocess.CompletedProcess:
    # iputils' ping is not installed on these machines; busybox-static is.
    return subprocess.run(["busybox", "ping", "-c", "2", "-W", "3", "-I", link, PEER],
                          capture_output=True, text=True)



_SA_LINE = re.compile(r"^\s*(\d): PN (\d+),.*\bkey ([0-9a-f]{32})\s*$")


def _sas(shown: str) -> list:
    """(PN, key id) of every SA line of `ip macsec show`
    ("0: PN 1, state on, key <id>"; XPN: "0: PN 1,SSCI 00000001 state on, key <id>")."""
    return [(int(m.group(2)), m.group(3)) for m in map(_SA_LINE.match, shown.splitlines()) if m]


def _kernel_tx_pn(link: str) -> int:
    """The TX SA's next PN as the kernel dumps it (GET_TXSC), whole."""
    from nictune.host.transports.netlink.macsec import Macsec

    with Macsec() as m:
        (index,) = [ln.index for ln in m.links() if ln.name == link]
        (sa,) = m.secys()[index].tx_sas
    return sa.pn


@pytest.fixture(autouse=True)
def _our_link_goes():
    """Our link is gone after each test, even a failed one (the next one makes it)."""
    yield
    sh("ip", "link", "del", LINK, check=False)


def test_a_macsec_link_with_mac_offload_and_xpn_sas_from_key_files(ports, tmp_path):
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
        f"      name: {LINK}\n      cipher: gcm-aes-xpn-128\n      port: 1\n      encrypt: true\n"
        "      offload: mac\n"
        f"      tx_sa: {{an: 0, pn: 1, ssci: {SSCI_TX}, salt: {SALT_TX}, key_file: {tx_file}}}\n"
        f"      rx: [{{address: \"{peer_mac}\", port: 1, sa: {{an: 0, pn: 1, ssci: {SSCI_RX}, "
        f"salt: {SALT_RX}, key_file: {rx_file}}}}}]\n")
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
    assert ch["link"]["after"] == f"{LINK} gcm-aes-xpn-128 icv 16 encrypt on port 1", ch
    assert any(f"{LINK} uses static MACsec keys" in w for w in report["hosts"][0]["warnings"])
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
    assert data["offload"] == "mac" and data["cipher_suite"] == "GCM-AES-XPN-128", data
    assert data["icv_len"] == 16 and data["encrypt"] is True, data
    assert data["sci"] == my_mac.replace(":", "") + "0001", data
    shown = sh("ip", "macsec", "show", LINK).stdout
    assert "offload: mac" in shown, shown
    assert f"TXSC: {my_mac.replace(':', '')}0001 on SA 0" in shown, shown
    ours = f"{fingerprint(KEY_TX)}6e696374756e65" + "00" * 5
    theirs = f"{fingerprint(KEY_RX)}6e696374756e65" + "00" * 5
    assert f"RXSC: {peer_sci}, state on" in shown, shown
    assert sorted(_sas(shown)) == sorted([(1, ours), (1, theirs)]), shown
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

    # The TX SA's PN moved with the ping; the rollback reads it before
    # deleting the link, and the next install of the same key starts above
    # everything it may have sent (the 2**48 lease past its first PN).
    # (netdevsim's offloaded SAs keep the PN the kernel gave them: the
    # kernel counts PNs only in software, so `sent` is the first PN here;
    # tests/unit/test_macsec_keys.py moves PNs with traffic.)
    sent = dict((k, pn) for pn, k in _sas(sh("ip", "macsec", "show", LINK).stdout))[ours]
    code, report, out = nictune("rollback", *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    assert subprocess.run(["ip", "link", "show", LINK], capture_output=True).returncode != 0
    assert "ntms0" not in sh("ip", "macsec", "show").stdout

    code, report, out = nictune("apply", str(profile), *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
    # The kernel's dump of the new TX SA: a 64-bit PN (8 bytes: dump_secy on an
    # XPN link), above the lease.  (iproute2 6.1 prints only its low 32 bits.)
    again = _kernel_tx_pn(LINK)
    assert sent + (1 << 48) <= again < sent + (1 << 48) + 1000, (again, sent)
    assert again & 0xFFFFFFFF == dict((k, pn) for pn, k in _sas(
        sh("ip", "macsec", "show", LINK).stdout))[ours]
    sh("ip", "addr", "add", f"{LOCAL}/30", "dev", LINK)
    done = _ping()  # the peer accepts it: above its lowest PN
    assert done.returncode == 0, done.stdout + done.stderr
    code, report, out = nictune("rollback", *state)
    outputs.append(out)
    assert code == 0, json.dumps(report["hosts"][0], indent=0)
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
        f"    macsec: {{name: {LINK}, offload: mac, cipher: gcm-aes-xpn-128,\n"
        f"              tx_sa: {{an: 0, ssci: 1, salt: {SALT_TX}, key_file: {loose}}}}}\n")
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


# -- a link wpa_supplicant owns (MKA with a pre-shared CAK) -------------------------

CAK = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # the test's pre-shared CAK (128 bits)
CKN = "6e74746573746b6579"


def _wpa_conf(path, priority: int) -> str:
    """wpa_supplicant.conf for one end: MKA, PSK CAK/CKN.  (Debian 12's
    wpa_supplicant 2.10 has no macsec_offload: its links run in software.)"""
    path.write_text(
        "ap_scan=0\nnetwork={\n  key_mgmt=NONE\n"
        "  eapol_flags=0\n  macsec_policy=1\n  macsec_integ_only=0\n"
        f"  mka_priority={priority}\n  mka_cak={CAK}\n  mka_ckn={CKN}\n}}\n")
    os.chmod(path, 0o600)
    return str(path)


def _mka_links(netns: str = "") -> list:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "-d", "link", "show", "type", "macsec"]
    return json.loads(sh(*argv).stdout or "[]")


def _secured(netns: str = "") -> bool:
    """Both SAs installed by MKA: an active TX SA and an RX SA."""
    argv = ["ip"] + (["-n", netns] if netns else []) + ["macsec", "show"]
    shown = sh(*argv).stdout
    return "TXSC" in shown and "RXSC" in shown and len(_sas(shown)) >= 2


def test_a_link_wpa_supplicant_owns_is_checked_and_never_given_an_sa(ports, tmp_path):
    """wpa_supplicant -D macsec_linux on both ports (one in ntmsec) makes
    the macsec links and installs MKA's SAs; nictune's keys: mka profile
    verifies the link's offload, cipher, encryption and validation; another
    cipher, or offload mac on the running link (the kernel would answer
    EBUSY), is drift that apply leaves alone; nothing nictune does changes
    an SA or deletes the link, and traffic passes over it throughout."""
    port, _my_mac, _peer_mac = ports
    # The static-key tests' peer link would hold the SCI MKA wants: gone first.
    sh("ip", "-n", NETNS, "link", "del", PEER_LINK, check=False)
    peer_port = _peer_port()
    daemons = []
    try:
        for netns, priority, ifname in (("", 10, port), (NETNS, 20, peer_port)):
            d = tmp_path / (netns or "here")
            d.mkdir()
            argv = ["wpa_supplicant", "-D", "macsec_linux", "-i", ifname,
                    "-c", _wpa_conf(d / "wpa.conf", priority)]
            argv = (["ip", "netns", "exec", netns] if netns else []) + argv
            daemons.append(subprocess.Popen(argv, stdout=open(d / "log", "w"),
                                            stderr=subprocess.STDOUT))
        assert len(daemons) == 2
        deadline = time.monotonic() + 240  # MKA's hello is 2 s; the guest is slow
        while time.monotonic() < deadline and not (_secured() and _secured(NETNS)):
            assert all(p.poll() is None for p in daemons), _logs(tmp_path)
            time.sleep(2)
        assert _secured() and _secured(NETNS), _logs(tmp_path) + sh("ip", "macsec", "show").stdout
        (link,) = _mka_links()
        name = link["ifname"]
        assert link["link"] == port and link["linkinfo"]["info_data"]["offload"] == "off", link
        before = sh("ip", "macsec", "show", name).stdout
        # Traffic over the MKA links (addresses on both, as for the static ones).
        (peer_link,) = _mka_links(NETNS)
        sh("ip", "addr", "add", f"{LOCAL}/30", "dev", name)
        sh("ip", "-n", NETNS, "addr", "add", f"{PEER}/30", "dev", peer_link["ifname"])
        done = _ping(name)
        assert done.returncode == 0, done.stdout + done.stderr

        profile = tmp_path / "mka.yaml"
        body = ("nictune: 1\ninterfaces:\n  rail:\n"
                f"    match: {{name: {port}}}\n"
                "    macsec: {keys: mka, offload: OFFLOAD, cipher: CIPHER, encrypt: true, "
                "validate: strict}\n")
        profile.write_text(body.replace("CIPHER", "gcm-aes-128").replace("OFFLOAD", "'off'"))
        state = ["--state-dir", str(tmp_path / "state")]
        outputs = []
        code, report, out = nictune("verify", str(profile), *state)
        outputs.append(out)
        assert code == 0, json.dumps(report["hosts"][0], indent=0)
        ch = _changes(report, name)
        assert set(ch) == {"keys", "offload", "cipher", "encrypt", "validate"}, ch
        assert all(c["status"] == "ok" for c in ch.values()), ch
        assert ch["keys"]["before"] == "mka" and ch["offload"]["before"] == "off", ch

        # Not the profile's cipher, and offload mac asked of the running link:
        # drift, with what to change in wpa_supplicant.conf; apply writes nothing.
        profile.write_text(body.replace("CIPHER", "gcm-aes-256").replace("OFFLOAD", "mac"))
        code, report, out = nictune("verify", str(profile), *state)
        outputs.append(out)
        ch = _changes(report, name)
        assert code == 2 and ch["cipher"]["status"] == "drift", json.dumps(report, indent=0)
        assert ch["offload"]["status"] == "drift", ch
        assert "wpa_supplicant.conf (macsec_csindex)" in ch["cipher"]["note"], ch
        assert "macsec_update_offload: EBUSY" in ch["offload"]["note"], ch
        code, report, out = nictune("apply", str(profile), *state)
        outputs.append(out)
        ch = _changes(report, name)
        assert ch["cipher"]["status"] == ch["offload"]["status"] == "drift", report
        code, report, out = nictune("rollback", *state)
        outputs.append(out)
        after = sh("ip", "macsec", "show", name).stdout
        assert [k for _, k in _sas(after)] == [k for _, k in _sas(before)], (before, after)
        assert not any(k.endswith("6e696374756e650000000000") for _, k in _sas(after))
        assert [ln["ifname"] for ln in _mka_links()] == [name]
        (link,) = _mka_links()
        assert link["linkinfo"]["info_data"]["offload"] == "off", link
        assert all(p.poll() is None for p in daemons), _logs(tmp_path)
        done = _ping(name)
        assert done.returncode == 0, done.stdout + done.stderr
        assert_no_key([CAK], outputs, str(tmp_path / "state"))
    finally:
        for p in daemons:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for netns in ("", NETNS):
            for ln in _mka_links(netns):
                argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "del", ln["ifname"]]
                sh(*argv, check=False)


def _peer_port() -> str:
    """The other netdevsim port, which the ports fixture moved into NETNS."""
    (link,) = [ln for ln in json.loads(sh("ip", "-n", NETNS, "-j", "-d", "link", "show").stdout)
               if ln["ifname"] != "lo" and ln.get("linkinfo", {}).get("info_kind") != "macsec"]
    return link["ifname"]


def _logs(tmp_path) -> str:
    return "".join(p.read_text() for p in sorted(tmp_path.glob("*/log")))
