"""crypto: per interface, on the recorded ConnectX-7 and Maia hosts (tests/fakes.py).

The recorded mlx5 ports had no crypto capability in firmware (every bit
off [fixed]); a test makes the bits changeable, as a ConnectX-7 with the
capabilities reports them, to exercise writing and rollback through the
same fake kernel.  The real kernel runs in tests/netns/test_crypto_veth.py
(veth) and tests/vm/guest/test_crypto.py (netdevsim).
"""

from __future__ import annotations

import pytest

from nictune.host import model as m
from nictune.host.facts import nicclass
from nictune.host.transaction.engine import Engine
from nictune.host.knobs.crypto import CRYPTO_BITS, CryptoFamily
from nictune.host.knobs.ethtool import FeaturesFamily
from nictune.profile import check as profile_check
from nictune.profile import schema as s
from nictune.profile.errors import ProfileError
from nictune.profile.yamlpos import parse_text

pytestmark = pytest.mark.recorded

P0, MANA = "enp23s0f0np0", "enP30832p0s0"


def doc(ifname: str, crypto: dict) -> dict:
    return {"nictune": 1, "interfaces": {"rail": {"match": {"name": ifname}, "crypto": crypto}}}


def changes(out) -> dict:
    return {c.key.name: c for c in out.changes}


def capable(host, ifname: str) -> None:
    """The port as a ConnectX-7 with every crypto capability reports it."""
    host.kernel.features[ifname]["changeable"] |= set(CRYPTO_BITS.values())


def test_mana_has_none_and_says_so_before_anything_is_written(maia, tmp_path):
    before = maia.kernel.snapshot()
    out = Engine(maia, str(tmp_path / "state")).apply(
        doc(MANA, {"tls_tx": True, "esp": True, "macsec": True, "tls_rx": False}), {}, "p.yaml")
    got = changes(out)
    for name in ("tls_tx", "esp", "macsec"):
        assert got[name].status == m.UNSUPPORTED
        assert got[name].note.startswith("not supported by mana: the driver offers no inline crypto")
    assert got["tls_rx"].status == m.OK  # off is what it has
    assert maia.kernel.snapshot() == before


def test_a_fixed_bit_is_unsupported_with_its_state(cx7, tmp_path):
    out = Engine(cx7, str(tmp_path / "state")).plan(doc(P0, {"esp": True, "macsec": False}), {})
    got = changes(out)
    assert got["macsec"].status == m.OK
    assert got["esp"].status == m.UNSUPPORTED
    assert got["esp"].note == (f"{P0}: esp-hw-offload is fixed off (the driver does not let it "
                                "change); only esp: false can be met")


def test_apply_writes_the_bits_and_rollback_restores_them(cx7, tmp_path):
    capable(cx7, P0)
    engine = Engine(cx7, str(tmp_path / "state"))
    out = engine.apply(doc(P0, {"tls_tx": True, "tls_rx": True, "esp": True}), {}, "p.yaml")
    assert out.error is None, out.error
    assert {k: c.status for k, c in changes(out).items()} == {
        "tls_tx": m.APPLIED, "tls_rx": m.APPLIED, "esp": m.APPLIED}
    active = cx7.kernel.features[P0]["active"]
    assert (active["tls-hw-tx-offload"], active["tls-hw-rx-offload"], active["esp-hw-offload"],
            active["macsec-hw-offload"]) == (True, True, True, False)
    # show: the changeable crypto bits under crypto:, not twice under features:
    shown = [e for e in engine.show().extra["profile"]["interfaces"].values()
             if e["match"]["name"] == P0][0]
    assert shown["crypto"] == {"tls_tx": True, "tls_rx": True, "esp": True,
                               "esp_tx_csum": False, "macsec": False}
    assert not set(CRYPTO_BITS.values()) & set(shown["features"])
    assert engine.rollback().error is None
    assert not any(active[b] for b in CRYPTO_BITS.values())


def test_the_capability_table():
    assert CRYPTO_BITS
    for name in CRYPTO_BITS:
        assert nicclass.crypto_unsupported("mlx5_core", name) is None
        assert CryptoFamily.nic_support("mlx5_core", f"crypto.{name}").startswith("mlx5e_")
        assert "no tlsdev_ops, xfrmdev_ops or macsec_ops" in CryptoFamily.nic_support(
            "mana", f"crypto.{name}")
        assert nicclass.crypto_unsupported("ixgbe", name) is None  # unknown: the device answers


def test_features_still_take_the_raw_bits(cx7):
    from nictune.host.model import Key

    fam = FeaturesFamily(cx7)
    key = Key("features", P0, "esp-hw-offload")
    assert fam.read([key]) == {key: False}


def test_schema_refuses_a_name_that_is_not_a_crypto_bit():
    def check(text):
        parsed = parse_text("nictune: 1\ninterfaces:\n  r:\n    match: {name: x}\n" + text, "p.yaml")
        profile_check.check(parsed.doc, parsed.positions, parsed.plain, schema=s.SCHEMA)

    check("    crypto: {tls_tx: true, tls_rx: true, esp: true, esp_tx_csum: false, macsec: true}\n")
    with pytest.raises(ProfileError) as e:
        check("    crypto: {tls: true}\n")
    assert "p.yaml:5" in str(e.value) and "tls" in str(e.value)
