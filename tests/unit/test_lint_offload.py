"""nictune lint's ASAP2 and inline-crypto rules (profiles through the real
loader): hw-tc-offload off on a switchdev PF or its representors, or left
out with OVS hw-offload on; crypto bits a NIC class lacks or set twice;
MACsec and ESP overhead against the RoCE MTU."""

from __future__ import annotations

import textwrap

from nictune.profile.lint import lint
from nictune.profile.loader import load_profile_text


def findings(body: str, host: str = "") -> list:
    text = "nictune: 1\ninterfaces:\n" + textwrap.indent(textwrap.dedent(body), "  ") + host
    return [(f.code, f.severity, str(f)) for f in lint(load_profile_text(text, "p.yaml"))]


UPLINK = """\
    uplink:
      match: {driver: mlx5_core, flavour: physical}
      eswitch: {mode: %s}
    """
REPS = """\
    reps:
      match: {driver: mlx5_core, flavour: pcivf}
      features: {hw-tc-offload: %s}
    """
OVS = "host:\n  ovs: {hw_offload: true}\n"


def test_tc_offload_off_on_a_switchdev_pf_is_an_error():
    (f,) = findings(UPLINK % "switchdev" + "  features: {hw-tc-offload: false}\n")
    assert f[:2] == ("switchdev-tc-offload-off", "error")
    assert "hw-tc-offload off while the eswitch is in switchdev" in f[2]
    assert "p.yaml:6" in f[2] and "p.yaml:5" in f[2]
    assert findings(UPLINK % "switchdev" + "  features: {hw-tc-offload: true}\n") == []
    assert findings(UPLINK % "legacy" + "  features: {hw-tc-offload: false}\n") == []


def test_tc_offload_off_on_the_representors_of_a_switchdev_pf_is_an_error():
    (f,) = findings(UPLINK % "switchdev" + "  features: {hw-tc-offload: true}\n" + REPS % "false")
    assert f[:2] == ("switchdev-tc-offload-off", "error") and "interfaces.reps" in f[2]
    assert "it matches representors" in f[2]
    assert findings(UPLINK % "switchdev" + "  features: {hw-tc-offload: true}\n" + REPS % "true") == []
    assert findings(REPS % "false") == []  # no switchdev in the profile: not lint's to say


def test_tc_offload_left_out_with_ovs_hw_offload_is_a_warning():
    (f,) = findings(UPLINK % "switchdev", OVS)
    assert f[:2] == ("switchdev-tc-offload-missing", "warning")
    assert "(p.yaml:5, p.yaml:7)" in f[2]  # eswitch mode, host.ovs.hw_offload
    assert findings(UPLINK % "switchdev") == []  # no OVS offload asked


CRYPTO = """\
    rail:
      match: {driver: %s}
      crypto: %s
    """


def test_crypto_a_nic_class_lacks_is_an_error():
    found = findings(CRYPTO % ("mana", "{tls_tx: true, esp: true, macsec: false}"))
    assert [f[:2] for f in found] == [("crypto-unsupported", "error")] * 2
    assert "crypto.tls_tx on mana: not supported by mana" in found[0][2]
    assert findings(CRYPTO % ("mlx5_core", "{tls_tx: true, esp: true, macsec: true}")) == []
    assert findings(CRYPTO % ("mana", "{tls_tx: false}")) == []


def test_a_crypto_bit_also_under_features_is_an_error():
    (f,) = findings(CRYPTO % ("mlx5_core", "{esp: true}") + "  features: {esp-hw-offload: true}\n")
    assert f[:2] == ("crypto-feature-twice", "error")
    assert "crypto.esp and features.esp-hw-offload" in f[2]


ROCE = """\
    rail:
      match: {driver: mlx5_core}
      mtu: %d
      roce: {mode: v2}
    """


def test_macsec_overhead_that_drops_the_roce_mtu_is_a_warning():
    (f,) = findings(ROCE % 4200 + "  macsec: {offload: mac}\n")
    assert f[:2] == ("crypto-overhead-caps-roce-mtu", "warning")
    assert "MACsec (SecTAG with SCI and ICV) takes 32 bytes" in f[2]
    assert "RoCE MTU of 2048 instead of 4096 at MTU 4200" in f[2] and "at least 4224" in f[2]
    assert findings(ROCE % 4224 + "  macsec: {offload: mac}\n") == []
    assert findings(ROCE % 9000 + "  macsec: {offload: mac}\n") == []


def test_esp_packet_offload_overhead_that_drops_the_roce_mtu_is_a_warning():
    # Only mlx5 packet offload puts RoCE v2 through an SA (lib/ipsec_fs_roce.c).
    for esp in ("  expect: {ipsec_offload: packet}\n",
                "  expect: {ipsec_offload: {if_present: packet}}\n"):
        (f,) = findings(ROCE % 4200 + esp)
        assert f[:2] == ("crypto-overhead-caps-roce-mtu", "warning")
        assert "ESP packet offload (mlx5 steers RoCE v2" in f[2] and "takes 37 bytes" in f[2]
        assert "at least 4229" in f[2]
        assert "(p.yaml:5, p.yaml:7)" in f[2]  # the mtu, the ESP key
    assert findings(ROCE % 4229 + "  expect: {ipsec_offload: packet}\n") == []
    assert findings(ROCE % 4200 + "  expect: {ipsec_offload: none}\n") == []


def test_esp_crypto_offload_never_covers_roce():
    # RDMA bypasses xfrm: ESP in software or crypto offload takes no byte of a
    # RoCE frame, and leaves RoCE in clear -- said, and no MTU warning.
    for esp, line in (("  crypto: {esp: true}\n", 7),
                      ("  expect: {ipsec_offload: crypto}\n", 7),
                      ("  expect: {ipsec_offload: {if_present: crypto}}\n", 7)):
        (f,) = findings(ROCE % 4200 + esp)
        assert f[:2] == ("esp-leaves-roce-clear", "warning"), f
        assert "never covers RoCE: RDMA traffic bypasses xfrm" in f[2], f
        assert "protects" not in f[2] and f"p.yaml:{line}" in f[2]
    assert findings(ROCE % 4200 + "  crypto: {esp: false}\n") == []
    assert findings("""\
    rail:
      match: {driver: mlx5_core}
      crypto: {esp: true}
    """) == []  # no RoCE on the entry: nothing to say


SAS = """\
    rail:
      match: {driver: mlx5_core}
      ipsec:%s
        sas:
          - {src: 198.18.0.1, dst: 198.18.0.2, spi: 0x1001, reqid: 1, key_file: /etc/k}
    """


def test_static_sas_outside_a_lab_are_an_error_and_a_warning_inside_one():
    (f,) = findings(SAS % "")
    assert f[:2] == ("ipsec-static-sa-outside-lab", "error")
    assert "nothing rekeys a static SA" in f[2] and "nonce" in f[2] and "p.yaml:6" in f[2]
    assert "strongSwan hw_offload, libreswan nic-offload" in f[2]
    (f,) = findings(SAS % "\n        lab: true")
    assert f[:2] == ("ipsec-static-sa", "warning")
    assert "nothing rekeys a static SA" in f[2] and "hard lifetime" in f[2]


PF = """\
    uplink:
      match: {driver: mlx5_core, flavour: physical}
      sriov: {numvfs: 4}
    """


def test_vfs_with_tc_offload_on_a_legacy_eswitch_are_a_warning():
    (f,) = findings(PF + "  eswitch: {mode: legacy}\n      features: {hw-tc-offload: true}\n")
    assert f[:2] == ("sriov-offload-legacy-eswitch", "warning")
    assert "4 VF(s) with hw-tc-offload on, but the eswitch mode is legacy" in f[2]
    assert "(p.yaml:5, p.yaml:7, p.yaml:6)" in f[2]  # numvfs, hw-tc-offload, eswitch mode
    (f,) = findings(PF + "  features: {hw-tc-offload: true}\n")
    assert f[0] == "sriov-offload-legacy-eswitch" and "mode is not set" in f[2]
    assert "(p.yaml:5, p.yaml:6)" in f[2]
    assert findings(PF + "  eswitch: {mode: switchdev}\n      features: {hw-tc-offload: true}\n") == []
    assert findings(PF + "  features: {hw-tc-offload: false}\n") == []  # no offload asked
    assert findings(PF.replace("numvfs: 4", "numvfs: 0") + "  features: {hw-tc-offload: true}\n") == []


def test_vfs_with_ovs_hw_offload_on_a_legacy_eswitch_are_a_warning():
    (f,) = findings(PF, OVS)
    assert f[:2] == ("sriov-offload-legacy-eswitch", "warning")
    assert "with OVS hw_offload on" in f[2] and "(p.yaml:5, p.yaml:7)" in f[2]  # numvfs, host.ovs
    assert findings(PF) == []
