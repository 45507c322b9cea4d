"""nictune lint's MACsec rules: the overhead against the interface MTU, and
offload asked of a NIC class that has none (profiles through the real loader)."""

from __future__ import annotations

import textwrap

from nictune.profile.lint import lint
from nictune.profile.loader import load_profile_text


def findings(driver: str = "mlx5_core", mtu: str = "", macsec: str = "{offload: mac}") -> list:
    text = textwrap.dedent(f"""\
        nictune: 1
        interfaces:
          rail:
            match: {{driver: {driver}}}
        """) + (f"    mtu: {mtu}\n" if mtu else "") + f"    macsec: {macsec}\n"
    return [(f.code, f.severity, str(f)) for f in lint(load_profile_text(text, "p.yaml"))]


def test_a_rail_with_room_for_macsec_is_clean():
    assert findings(mtu="9000") == []
    assert findings(mtu="1532") == []
    assert findings() == []  # no mtu in the profile: lint cannot know the interface's


def test_macsec_overhead_below_a_1500_byte_payload_is_a_warning():
    (f,) = findings(mtu="1500")
    assert f[:2] == ("macsec-shrinks-mtu", "warning")
    assert "MACsec takes 32 bytes" in f[2] and "MTU is 1468" in f[2] and "at least 1532" in f[2]
    assert "p.yaml:5" in f[2] and "p.yaml:6" in f[2]
    (f,) = findings(mtu="1520", macsec="{offload: mac, icv_len: 8}")
    assert "MACsec takes 24 bytes" in f[2] and "MTU is 1496" in f[2]
    assert findings(mtu="1524", macsec="{offload: mac, icv_len: 8}") == []


def test_macsec_offload_on_mana_is_an_error():
    (f,) = findings(driver="mana")
    assert f[:2] == ("macsec-offload-unsupported", "error")
    assert "macsec offload mac on mana: not supported by mana" in f[2]
    # mlx5 refuses phy too (nicclass.MLX5_MACSEC_PHY); mana refuses any offload.
    found = findings(driver="[mlx5_core, mana]", macsec="{offload: phy}")
    assert [f[0] for f in found] == ["macsec-offload-unsupported"] * 2
    assert "on mlx5_core: not supported by mlx5_core: mlx5 offloads MACsec at the MAC only" in found[0][2]
    assert "on mana: not supported by mana" in found[1][2]
    (f,) = findings(driver="[mlx5_core, mana]", macsec="{offload: mac}")
    assert "on mana" in f[2]
    assert findings(driver="mana", macsec="{offload: 'off'}") == []
    assert findings(driver="mana", macsec="{encrypt: true}") == []
