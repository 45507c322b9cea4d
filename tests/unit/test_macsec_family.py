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
