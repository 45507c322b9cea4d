"""Safe MACsec keys, without a kernel (the VM tier runs the same against
one): the extended-packet-number ciphers on the wire, mlx5's refusal of
offload phy (one driver rule for plan, lint and the fake), links an MKA
daemon owns (checked, never given an SA), and static keys only with XPN
and a PN high-water mark per key that a re-install never goes below."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from fakes import FakeHost
from nictune.host import model as m
from nictune.host.errors import InvalidInput
from nictune.host.facts import nicclass
from nictune.host.knobs import macsec as fam
from nictune.host.transaction.engine import Engine
from nictune.host.transports import keyfile
from nictune.host.transports.netlink import macsec as nl
from nictune.profile.lint import lint
from nictune.profile.loader import load_profile_text

RAIL = "enp23s0f1np1"
KEY_TX = "5a" * 32  # gcm-aes-xpn-256 test keys
KEY_RX = "a5" * 32
SALT = "0123456789abcdef01234567"


# -- XPN on the wire ------------------------------------------------------------


def _attrs(msg) -> dict:
    """The SA_CONFIG attributes of an encoded SA message, by name, as raw bytes."""
    msg.encode()
    back = nl.macsecmsg(bytes(msg.data))
    back.decode()
    sa = back.get_attr("MACSEC_ATTR_SA_CONFIG")
    return {name: value for name, value in sa["attrs"]}


def test_xpn_ciphers_go_to_the_kernel_with_their_suite_ids():
    # include/uapi/linux/if_macsec.h MACSEC_CIPHER_ID_GCM_AES_XPN_128/256
    assert nl.CIPHERS["gcm-aes-xpn-128"] == 0x0080C20001000003
    assert nl.CIPHERS["gcm-aes-xpn-256"] == 0x0080C20001000004
    assert nl.KEY_LENGTHS["gcm-aes-xpn-256"] == 32
    msg = nl.link_add_message(3, "ms0", cipher="gcm-aes-xpn-256")
    data = msg["attrs"][2][1]["attrs"][1][1]["attrs"]
    assert ("IFLA_MACSEC_CIPHER_SUITE", 0x0080C20001000004) in data
    # The kernel reports them back by name.
    assert nl.SUITE_NAMES[0x0080C20001000003] == "gcm-aes-xpn-128"


def test_an_xpn_sa_carries_a_64_bit_pn_its_ssci_and_its_salt():
    key = bytearray(32)
    pn = (1 << 40) + 5
    got = _attrs(nl.sa_message(nl.CMD_ADD_TXSA, 7, 1, pn, b"id", key,
                               xpn=(0x01020304, bytes.fromhex(SALT))))
    assert got["MACSEC_SA_ATTR_PN"] == pn.to_bytes(8, sys.byteorder)
    assert got["MACSEC_SA_ATTR_SSCI"] == 0x01020304
    # Big-endian on the wire, as iproute2's `ssci` (get_be32) sends it.
    msg = nl.sa_message(nl.CMD_ADD_TXSA, 7, 1, pn, b"id", key, xpn=(0x01020304, bytes(12)))
    msg.encode()
    assert (8).to_bytes(2, sys.byteorder) + b"\x01\x02\x03\x04" in bytes(msg.data)
    assert got["MACSEC_SA_ATTR_SALT"] == bytes.fromhex(SALT)
    # Without XPN: 4 bytes, no SSCI or salt, and a PN past 32 bits refused.
    got = _attrs(nl.sa_message(nl.CMD_ADD_TXSA, 7, 1, 9, b"id", key))
    assert got["MACSEC_SA_ATTR_PN"] == (9).to_bytes(4, sys.byteorder)
    assert "MACSEC_SA_ATTR_SSCI" not in got and "MACSEC_SA_ATTR_SALT" not in got
    with pytest.raises(ValueError, match="1..4294967295"):
        nl.sa_message(nl.CMD_ADD_TXSA, 7, 1, pn, b"id", key)
    with pytest.raises(ValueError, match="salt is 12 bytes"):
        nl.sa_message(nl.CMD_ADD_TXSA, 7, 1, pn, b"id", key, xpn=(1, b"short"))


def test_a_dumped_pn_is_read_by_its_length():
    """dump_secy puts 4 bytes, or 8 on an XPN link."""
    for pn, width in ((7, 4), ((1 << 50) + 3, 8)):
        msg = nl.macsecmsg()
        msg["cmd"], msg["version"] = nl.CMD_GET_TXSC, 1
        msg["attrs"] = [("MACSEC_ATTR_IFINDEX", 5), ("MACSEC_ATTR_TXSA_LIST", {"attrs": [
            ("SA", {"attrs": [("MACSEC_SA_ATTR_AN", 0), ("MACSEC_SA_ATTR_ACTIVE", 1),
                              ("MACSEC_SA_ATTR_PN", pn.to_bytes(width, sys.byteorder)),
                              ("MACSEC_SA_ATTR_KEYID", bytes(16))]})]})]
        msg.encode()
        back = nl.macsecmsg(bytes(msg.data))
        back.decode()
        (sa,) = nl.decode_secy(back).tx_sas
        assert sa.pn == pn


# -- mlx5: offload mac only -----------------------------------------------------


def test_mlx5_refuses_offload_phy_by_one_rule_that_plan_lint_and_the_fake_share(tmp_path):
    rule = nicclass.macsec_offload_refused("mlx5_core", "phy")
    assert rule is nicclass.MLX5_MACSEC_PHY and rule in nicclass.RULES
    assert "mlx5e_macsec_build_netdev" in rule.source and "macsec_check_offload" in rule.source
    assert nicclass.macsec_offload_refused("mlx5_core", "mac") is None
    assert nicclass.macsec_offload_refused("netdevsim", "phy") is None
    # The class notes: ConnectX-7 onwards, not ConnectX-6 Dx.
    note = nicclass.crypto_note("mlx5_core", "macsec")
    assert "ConnectX-7 onwards" in note and "not ConnectX-6 Dx" in note
    assert "ConnectX-6 Dx" not in fam.MacsecFamily.nic_support("mlx5_core", "macsec.offload")
    assert "ConnectX-6 Dx and later" not in fam.__doc__
    assert "ConnectX-7 onwards" in fam.__doc__.split("What each NIC class offers")[1]

    # lint: an error naming the file:line of offload and of the driver match.
    text = f"nictune: 1\ninterfaces:\n  rail:\n    match: {{driver: mlx5_core}}\n" \
           f"    macsec: {{keys: mka, offload: phy}}\n"
    (f,) = [f for f in lint(load_profile_text(text, "p.yaml"))]
    assert (f.code, f.severity) == ("macsec-offload-unsupported", "error")
    assert rule.why in str(f) and "p.yaml:5" in str(f) and "p.yaml:4" in str(f)
    assert lint(load_profile_text(text.replace("phy", "mac"), "p.yaml")) == []

    # plan: refused before anything is written, with the rule's words.
    host = FakeHost("cx7-host", tmp_path / "root")
    rail = next(i for i in host.interfaces() if i.name == RAIL)
    host.macsec().add_link(rail.index, "macsec0", sci=bytes(8), encrypt=True)
    profile = load_profile_text(text.replace("driver: mlx5_core", f"name: {RAIL}"), "p.yaml")
    out = Engine(host, str(tmp_path / "state")).apply(profile.doc, profile.sources, None)
    (c,) = [c for c in out.changes if c.key.name == "macsec0/offload"]
    assert c.status == m.UNSUPPORTED and rule.why in c.note, c
    assert host.macsec().links()[0].offload == "off"
    # The fake refuses what plan refuses, in the same words.
    with pytest.raises(OSError, match="mlx5 offloads MACsec at the MAC only"):
        host.macsec().set_offload(host.macsec().links()[0].index, "phy")
    with pytest.raises(OSError, match="mlx5 offloads MACsec at the MAC only"):
        host.macsec().add_link(rail.index, "ms9", offload="phy")


# -- links an MKA daemon owns -----------------------------------------------------


def _mka_profile(extra: str = "") -> tuple:
    text = textwrap.dedent(f"""\
        nictune: 1
        interfaces:
          rail:
            match: {{name: {RAIL}}}
            macsec:
              keys: mka
              offload: mac
              cipher: gcm-aes-256
              encrypt: true
              validate: strict
        """) + extra
    profile = load_profile_text(text, "mka.yaml")
    return profile.doc, profile.sources


def _wpa_link(host, cipher="gcm-aes-256", encrypt=True) -> int:
    """A link as wpa_supplicant's macsec_linux driver makes it, with an SA
    whose KEYID is MKA's key identifier (member identifier + key number)."""
    rail = next(i for i in host.interfaces() if i.name == RAIL)
    ms = host.macsec()
    ms.add_link(rail.index, "macsec0", sci=bytes.fromhex("0200000000010001"), encrypt=encrypt,
                cipher=cipher, icv_len=16)
    index = ms.links()[-1].index
    ms.add_sa(index, 0, 1, bytes.fromhex("8a4f0d1e2c3b4a596877869500000001"),
              bytearray(32 if cipher.endswith("256") else 16))
    ms.sent.clear()
    return index


def test_an_mka_link_gets_its_offload_mode_and_is_checked_never_given_an_sa(tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    _wpa_link(host)
    doc, sources = _mka_profile()
    engine = Engine(host, str(tmp_path / "state"))
    out = engine.apply(doc, sources, None)
    got = {c.key.name: (c.status, c.before) for c in out.changes}
    assert got == {"macsec0/keys": (m.OK, "mka"), "macsec0/cipher": (m.OK, "gcm-aes-256"),
                   "macsec0/encrypt": (m.OK, True), "macsec0/validate": (m.OK, "strict"),
                   "macsec0/offload": (m.APPLIED, "off")}, got
    assert host.macsec().links()[0].offload == "mac"
    assert host.macsec().sent == []  # no SA written, no key read
    assert not os.path.exists(tmp_path / "state" / fam.PN_MARKS)

    # Once the daemon has brought the link up the kernel refuses an offload
    # change (EBUSY): the offload is then compared only, never written.
    host.macsec().set_offload(host.macsec().links()[0].index, "off")
    host.macsec().set_up(host.macsec().links()[0].index)
    out = engine.apply(doc, sources, None)
    (c,) = [c for c in out.changes if c.key.name == "macsec0/offload"]
    assert (c.status, c.before) == (m.DRIFT, "off") and "macsec_update_offload: EBUSY" in c.note, c
    assert host.macsec().links()[0].offload == "off"

    # wpa_supplicant.conf changed the cipher: drift in verify, never written.
    host.macsec().k.macsec.clear()
    _wpa_link(host, cipher="gcm-aes-128")
    host.macsec().set_offload(host.macsec().links()[0].index, "mac")
    out = engine.plan(doc, sources, command="verify")
    (c,) = [c for c in out.changes if c.status != m.OK]
    assert (c.key.name, c.status, c.before) == ("macsec0/cipher", m.DRIFT, "gcm-aes-128"), c
    assert "wpa_supplicant.conf (macsec_csindex)" in c.note
    out = engine.apply(doc, sources, None)
    assert [c.status for c in out.changes if c.key.name == "macsec0/cipher"] == [m.DRIFT]
    assert host.macsec().links()[0].cipher == "gcm-aes-128" and host.macsec().sent == []


def test_an_mka_link_that_is_not_there_yet_or_nictunes_own_is_reported(tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    doc, sources = _mka_profile()
    out = Engine(host, str(tmp_path / "state")).plan(doc, sources)
    (c,) = [c for c in out.changes if c.key.name.endswith("/offload")]
    assert c.status == m.UNSUPPORTED and "the MKA daemon makes it" in c.note, c
    with pytest.raises(InvalidInput, match=r"mka.yaml:\d+: macsec.tx_sa: with keys: mka the MKA "
                                           "daemon owns the SAs"):
        doc, sources = _mka_profile("      tx_sa: {an: 0, key_file: /etc/k}\n")
        Engine(host, str(tmp_path / "state")).plan(doc, sources)


# -- static keys: XPN only, above the key's high-water mark --------------------------


def _key(path, hexkey: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, hexkey.encode() + b"\n")
    os.close(fd)
    return str(path)


def _static_profile(tmp_path, cipher="gcm-aes-xpn-256", sa_extra=f", ssci: 1, salt: {SALT}"):
    tx, rx = _key(tmp_path / "tx", KEY_TX), _key(tmp_path / "rx", KEY_RX)
    text = textwrap.dedent(f"""\
        nictune: 1
        interfaces:
          rail:
            match: {{name: {RAIL}}}
            macsec:
              name: ms0
              cipher: {cipher}
              offload: mac
              tx_sa: {{an: 0, pn: 1, key_file: {tx}{sa_extra}}}
              rx:
                - {{address: "02:00:00:00:01:02", port: 1, sa: {{an: 0, key_file: {rx}{sa_extra}}}}}
        """)
    profile = load_profile_text(text, "static.yaml")
    return profile.doc, profile.sources


def test_static_keys_without_xpn_are_refused_by_plan_and_lint(tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    doc, sources = _static_profile(tmp_path, cipher="gcm-aes-256", sa_extra="")
    with pytest.raises(InvalidInput, match=r"static.yaml:7: macsec.cipher: static keys need an "
                                           r"extended-packet-number cipher"):
        Engine(host, str(tmp_path / "state")).plan(doc, sources)
    text = (f"nictune: 1\ninterfaces:\n  rail:\n    match: {{driver: mlx5_core}}\n"
            f"    macsec: {{offload: mac, tx_sa: {{an: 0, key_file: /etc/k}}}}\n")
    (f,) = lint(load_profile_text(text, "p.yaml"))
    assert (f.code, f.severity) == ("macsec-static-key-nonce-reuse", "error") and "p.yaml:5" in str(f)
    text = (f"nictune: 1\ninterfaces:\n  rail:\n    match: {{driver: mlx5_core}}\n"
            f"    macsec:\n      keys: mka\n      tx_sa: {{an: 0, key_file: /etc/k}}\n")
    (f,) = lint(load_profile_text(text, "p.yaml"))
    assert (f.code, f.severity) == ("macsec-mka-with-sas", "error") and "p.yaml:7" in str(f)
    doc, sources = _static_profile(tmp_path, sa_extra="")
    with pytest.raises(InvalidInput, match="an SA of an XPN cipher needs ssci and salt"):
        Engine(host, str(tmp_path / "state")).plan(doc, sources)
    assert host.macsec().links() == []


def test_a_static_key_is_never_installed_again_below_its_high_water_mark(tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    state = str(tmp_path / "state")
    doc, sources = _static_profile(tmp_path)
    tx_fp = keyfile.fingerprint((KEY_TX + "\n").encode())
    rx_fp = keyfile.fingerprint((KEY_RX + "\n").encode())

    out = Engine(host, state).plan(doc, sources)
    assert any("ms0 uses static MACsec keys" in w and fam.PN_MARKS in w for w in out.warnings)
    out = Engine(host, state).apply(doc, sources, None)
    assert not out.error, [c.as_dict() for c in out.changes]
    assert any("static MACsec keys" in w for w in out.warnings)
    ms = host.macsec()
    assert [(d, pn, xpn) for d, _, _, pn, xpn in ms.sent] == [("tx", 1, True), ("rx", 1, True)]
    marks = fam.load_marks(state)
    assert marks == {tx_fp: {"tx": fam.PN_LEASE}, rx_fp: {"rx": 1}}

    # Traffic moves the PNs past the lease; a verify (or the agent) reads them.
    index = ms.links()[0].index
    ms.send_traffic(index, fam.PN_LEASE + 1000)
    Engine(host, state).plan(doc, sources, command="verify")
    assert fam.load_marks(state)[tx_fp]["tx"] == 2 * fam.PN_LEASE + 1000
    assert fam.load_marks(state)[rx_fp]["rx"] == fam.PN_LEASE + 1001

    # Rollback then apply: the key comes back above everything it sent.
    ms.send_traffic(index, 500)
    assert not Engine(host, state).rollback().error
    assert ms.links() == []
    ms.sent.clear()
    Engine(host, state).apply(doc, sources, None)
    (tx_pn,) = [pn for d, _, _, pn, _ in ms.sent if d == "tx"]
    (rx_pn,) = [pn for d, _, _, pn, _ in ms.sent if d == "rx"]
    assert tx_pn == 2 * fam.PN_LEASE + 1501 and rx_pn == fam.PN_LEASE + 1501

    # A crash (the link gone without a read-back, as at an unclean reboot):
    # the next install still starts past what the last one may have sent.
    ms.send_traffic(ms.links()[0].index, 77)
    ms.k.macsec.clear()
    ms.sent.clear()
    Engine(host, state).apply(doc, sources, None)
    (again,) = [pn for d, _, _, pn, _ in ms.sent if d == "tx"]
    assert again == tx_pn + fam.PN_LEASE

    # The state file names keys by fingerprint; no key byte is in it.
    with open(os.path.join(state, fam.PN_MARKS)) as f:
        text = f.read()
    assert set(json.loads(text)["marks"]) == {tx_fp, rx_fp}
    for secret in (KEY_TX, KEY_RX):
        assert secret not in text.lower() and secret[:16] not in text.lower()


def test_a_key_whose_pns_are_spent_is_refused(tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    state = str(tmp_path / "state")
    doc, sources = _static_profile(tmp_path)
    fp = keyfile.fingerprint((KEY_TX + "\n").encode())
    fam.save_marks(state, {fp: {"tx": (1 << 64) - 10}})
    out = Engine(host, state).apply(doc, sources, None)
    assert out.error and "has used its PNs: rotate the key" in json.dumps(
        [c.as_dict() for c in out.changes]), out.error
    assert host.macsec().links() == []  # rolled back


def test_marks_only_rise_and_concurrent_savers_lose_nothing(tmp_path):
    """A verify's read-back and an apply's reservation may save at once
    (verify holds no apply lock): each merges under the marks' own lock."""
    import threading

    state = str(tmp_path / "state")
    assert fam.save_marks(state, {"1a2b3c4d": {"tx": 50}}) == {"1a2b3c4d": {"tx": 50}}
    assert fam.save_marks(state, {"1a2b3c4d": {"tx": 7, "rx": 3}}) == {"1a2b3c4d": {"tx": 50, "rx": 3}}
    threads = [threading.Thread(target=fam.save_marks, args=(state, {f"{i:08x}": {"tx": i}}))
               for i in range(1, 33)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    marks = fam.load_marks(state)
    assert len(marks) == 33 and all(marks[f"{i:08x}"] == {"tx": i} for i in range(1, 33))
