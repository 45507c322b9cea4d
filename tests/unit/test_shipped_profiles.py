"""Every shipped profile loads (schema, extends) and lints clean; the
inline-crypto profile plans as it says on the recorded ConnectX-7 host
(tests/fakes.py); maia-mana.yaml says MANA has none of ASAP2 and inline
crypto, and the families agree."""

from __future__ import annotations

import glob
import os

import pytest

from fakes import FakeHost
from nictune.host import model as m
from nictune.host.transaction.engine import Engine
from nictune.host.knobs.crypto import CRYPTO_BITS, CryptoFamily
from nictune.host.knobs.eswitch import EswitchFamily
from nictune.host.knobs.expect import ExpectFamily
from nictune.host.knobs.macsec import MacsecFamily
from nictune.profile.lint import lint_file
from nictune.profile.loader import load_profile

pytestmark = pytest.mark.recorded

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = sorted(glob.glob(os.path.join(REPO, "profiles", "*.yaml")))
CRYPTO = os.path.join(REPO, "profiles", "connectx7-inline-crypto.yaml")


def test_the_list_is_the_directory():
    names = {os.path.basename(p) for p in SHIPPED}
    assert {"connectx7-inline-crypto.yaml", "connectx7-asap2-switchdev.yaml", "maia-mana.yaml"} <= names
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    for name in names:  # the README's profile table lists each
        assert f"| `{name}` |" in readme, name


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_every_shipped_profile_loads_and_lints_clean(path):
    assert lint_file(path) == []


def test_the_inline_crypto_profile_plans_on_a_capable_connectx7(tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    for dev in host.kernel.features.values():  # as a crypto-enabled ConnectX-7 reports them
        dev["changeable"] |= set(CRYPTO_BITS.values())
    os.makedirs(host.path("proc/net"))
    with open(host.path("proc/net/tls_stat"), "w") as f:
        # An idle host: no kTLS socket at all (the profile asks only that none runs in software).
        f.write("".join("%-32s\t%d\n" % (n, 0)
                        for n in ("TlsCurrTxSw", "TlsCurrRxSw", "TlsCurrTxDevice", "TlsDecryptError")))
    profile = load_profile(CRYPTO)
    # The MACsec link as wpa_supplicant makes it (macsec_csindex=1, no SA yet).
    rail = next(i for i in host.interfaces() if i.name == "enp23s0f1np1")
    host.macsec().add_link(rail.index, "macsec0", sci=bytes(6) + b"\x00\x01", encrypt=True,
                           cipher="gcm-aes-256", icv_len=16)
    out = Engine(host, str(tmp_path / "state")).plan(profile.doc, profile.sources)
    got = {(c.key.target, c.key.family, c.key.name): c.status for c in out.changes}
    # Idle is not drift: every expectation holds with no kTLS socket open.
    expectations = {k: v for k, v in got.items() if k[1] == "expect"}
    assert len(expectations) == 6 and m.DRIFT not in expectations.values(), expectations
    for port in ("enp23s0f0np0", "enp23s0f1np1"):
        for name in CRYPTO_BITS:
            assert got[(port, "crypto", name)] == m.PENDING
        assert got[(port, "expect", "counters.TlsDecryptError")] == m.OK
        assert got[(port, "expect", "counters.TlsCurrTxSw")] == m.OK
        # NETLINK_XFRM is the running kernel's only: not a fixture's.
        assert got[(port, "expect", "ipsec_offload")] == m.UNSUPPORTED
    macsec = {k[2]: v for k, v in got.items() if k[1] == "macsec"}
    assert macsec == {"macsec0/keys": m.OK, "macsec0/cipher": m.OK, "macsec0/encrypt": m.OK,
                      "macsec0/validate": m.OK, "macsec0/offload": m.PENDING}, macsec
    assert not any("static MACsec keys" in w for w in out.warnings), out.warnings


def test_no_shipped_profile_installs_a_macsec_key():
    """MKA owns the keys of every shipped MACsec link: no tx_sa, no rx."""
    sections = [(name, entry["macsec"])
                for name in sorted(os.listdir(os.path.join(REPO, "profiles"))) if name.endswith(".yaml")
                for entry in (load_profile(os.path.join(REPO, "profiles", name)).doc.get("interfaces")
                              or {}).values() if entry.get("macsec") is not None]
    assert sections
    for name, sec in sections:
        assert sec.get("keys") == "mka" and "tx_sa" not in sec and "rx" not in sec, name


def test_maia_mana_says_mana_has_none_of_it_and_the_families_agree():
    with open(os.path.join(REPO, "profiles", "maia-mana.yaml")) as f:
        comment = f.read().split("\nnictune:")[0]
    for what in ("IPsec:", "TLS:", "MACsec:", "switchdev / SR-IOV eswitch:"):
        assert what in comment, what
    assert ExpectFamily.nic_support("mana", "expect.ipsec_offload").startswith("not supported by mana")
    assert MacsecFamily.nic_support("mana", "macsec.offload").startswith("not supported by mana")
    assert EswitchFamily.nic_support("mana", "eswitch.mode").startswith("not supported by mana")
    assert CRYPTO_BITS
    for name in CRYPTO_BITS:
        assert CryptoFamily.nic_support("mana", f"crypto.{name}").startswith("not supported by mana")
