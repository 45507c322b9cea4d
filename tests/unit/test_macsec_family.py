"""The macsec family's own logic, without a kernel (the host has no macsec
module; tests/vm/guest/test_macsec.py runs it against one): how nictune
marks the SAs it made, what plans show, what each NIC class is told."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nictune.host.errors import InvalidInput
from nictune.host.knobs import family_named
from nictune.host.knobs import macsec as fam
from nictune.host.model import Key, Want


def test_a_nictune_keyid_carries_the_fingerprint_and_nothing_else_does():
    kid = fam._keyid("1a2b3c4d")
    assert len(kid) == 11 and kid.startswith(bytes.fromhex("1a2b3c4d"))
    padded = (kid + bytes(16 - len(kid))).hex()  # as the kernel stores and dumps it
    assert fam._fp_of(padded) == "1a2b3c4d"
    # An MKA daemon's KI (member identifier + key number), iproute2's "01": not ours.
    assert fam._fp_of("8a4f0d1e2c3b4a5968778695000000a1") is None
    assert fam._fp_of("01" + "00" * 15) is None
    assert fam._fp_of((kid + b"\x01" + bytes(4)).hex()) is None
    assert fam._fp_of("") is None


def test_plans_show_the_fingerprint_or_the_foreign_keyid():
    assert fam.sa_text(0, fp="1a2b3c4d") == "an 0 key 1a2b3c4d"
    ours = (fam._keyid("1a2b3c4d") + bytes(5)).hex()
    assert fam.sa_text(2, ours) == "an 2 key 1a2b3c4d"
    assert fam.sa_text(1, "01" + "00" * 15) == f"an 1 keyid {'01' + '00' * 15} (not set by nictune)"
    assert fam.link_text("ms0", "gcm-aes-256", 16, True, 7) == "ms0 gcm-aes-256 icv 16 encrypt on port 7"


def test_each_nic_class_is_told_before_anything_is_written():
    f = family_named("macsec")
    assert f is fam.MacsecFamily
    assert f.nic_support("mana", "macsec.offload").startswith("not supported by mana")
    assert "offload mac" in f.nic_support("mlx5_core", "macsec.offload")
    assert f.nic_support("mana", "macsec.tx_sa.key_file") is None  # software MACsec is fine

    def family_on(driver):
        host = SimpleNamespace(interfaces=lambda: [SimpleNamespace(name="eth0", driver=driver)])
        return f(host)

    assert family_on("mana").check(Key("macsec", "eth0", "ms0/offload"), Want("mac")).startswith(
        "not supported by mana")
    assert family_on("mana").check(Key("macsec", "eth0", "ms0/offload"), Want("off")) is None
    assert family_on("mlx5_core").check(Key("macsec", "eth0", "ms0/offload"), Want("mac")) is None
    assert family_on("netdevsim").check(Key("macsec", "eth0", "ms0/offload"), Want("mac")) is None


def test_a_peer_is_named_by_its_sci_or_address_and_port():
    assert fam.MacsecFamily._sci({"address": "02:00:00:00:00:0A", "port": 2}, "p:1") == \
        "02000000000a0002"
    assert fam.MacsecFamily._sci({"sci": "0200000000020001"}, "p:1") == "0200000000020001"
    with pytest.raises(InvalidInput, match="p:1: macsec.rx: give sci, or address and port"):
        fam.MacsecFamily._sci({"sci": "0200000000020001", "port": 1}, "p:1")
    with pytest.raises(InvalidInput, match="needs sci, or address and port"):
        fam.MacsecFamily._sci({"address": "02:00:00:00:00:02"}, "p:1")


def test_an_sa_is_written_with_the_key_the_host_port_reads_and_only_if_unchanged(tmp_path):
    """The SA write path without a kernel: the key comes through Host.io (a
    recording or a probe sees it), is checked against the plan's fingerprint,
    and reaches the handle with nictune's keyid; the VM tier writes it for real."""
    key = bytearray(b"k" * 32)
    loaded = []

    def key_load(path, length=None):
        loaded.append((path, length))
        return key, "1a2b3c4d"

    written = []
    handle = SimpleNamespace(add_sa=lambda *args, **kw: written.append((args, kw)))
    family = fam.MacsecFamily(SimpleNamespace(io=SimpleNamespace(key_load=key_load)))
    family.state_dir = str(tmp_path / "state")  # the engine sets it: the PN marks live there
    xpn = (1, bytes(12))
    planned = {"path": "/etc/nictune/tx.key", "fp": "1a2b3c4d", "an": 0, "pn": 1, "xpn": xpn}
    family._add_sa(handle, 7, planned, 32, None)
    assert loaded == [("/etc/nictune/tx.key", 32)]
    assert written == [((7, 0, 1, fam._keyid("1a2b3c4d"), key), {"rx_sci": None, "xpn": xpn})]
    assert key == bytearray(32)  # wiped once written
    with pytest.raises(InvalidInput, match="changed since the plan"):
        family._add_sa(handle, 7, dict(planned, fp="ffffffff"), 32, None)
    assert len(written) == 1
