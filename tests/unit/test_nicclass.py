"""NIC class capability tables: what mlx5 and MANA can take."""

from __future__ import annotations

import pytest

from nictune.host.facts import nicclass


def test_mana_has_no_dcb_and_says_so_per_key():
    for name in ("trust", "dscp_map", "pfc", "ets.prio_tc", "ets.tc_bw", "ets.tc_tsa"):
        reason = nicclass.dcb_unsupported("mana", name)
        assert reason.startswith("not supported by mana: ") and "DCB" in reason


def test_mlx5_and_unknown_drivers_are_left_to_the_kernel():
    for name in ("trust", "dscp_map", "pfc", "ets.tc_bw"):
        assert nicclass.dcb_unsupported("mlx5_core", name) is None
        assert nicclass.dcb_unsupported("ice", name) is None


def test_ecn_reasons_name_the_driver_and_the_surface():
    assert "OFED" in nicclass.ecn_unsupported("mlx5_core")
    assert nicclass.ecn_unsupported("mana").startswith("not supported by mana")
    assert nicclass.ecn_unsupported("veth").startswith("not supported by veth")


def test_mana_roce_is_port_1_only():
    assert nicclass.roce_port_unsupported("mana", 1) is None
    assert "port 1 only" in nicclass.roce_port_unsupported("mana", 2)
    assert nicclass.roce_port_unsupported("mlx5_core", 2) is None


@pytest.mark.parametrize("name, asked, got", [
    ("rx", 100, 128), ("rx", 129, 256), ("rx", 8192, 8192), ("tx", 1000, 1024), ("tx", 16384, 16384)])
def test_mana_rings_round_up_to_a_power_of_two(name, asked, got):
    assert nicclass.rings_effective("mana", name, asked) == got
    assert nicclass.rings_effective("igb", name, asked) == asked  # no table: the kernel decides


def test_tables():
    assert nicclass.MANA.channels == nicclass.MLX5.channels == ("combined",)
    assert nicclass.MANA.rings == {"rx": (128, 8192), "tx": (128, 16384)}
    assert nicclass.MANA.max_mtu == 9000 and not nicclass.MANA.dcb
    assert {"trust", "pfc", "ets", "maxrate", "buffer"} <= nicclass.MLX5.dcb
    assert nicclass.for_driver("igb") is None


# -- the driver rules' decisions (DriverRule.holds, refusal) -------------------------

def test_a_rule_covers_its_key_its_section_and_placeholders(monkeypatch):
    vf_trust = nicclass.DriverRule(driver="mlx5_core", key="sriov.vfs.<n>.trust", effect="refused",
                                   when="w", why="y", source="s",
                                   holds=lambda facts: facts.get("eswitch") == "switchdev")
    monkeypatch.setattr(nicclass, "RULES", [vf_trust, nicclass.MANA_CHANNELS_VPORT_BUSY])
    on = {"eswitch": "switchdev"}
    assert nicclass.refusal("mlx5_core", "sriov.vfs.3.trust", on) is vf_trust
    assert nicclass.refusal("mlx5_core", "sriov.vfs.3.vlan", on) is None
    assert nicclass.refusal("mlx5_core", "sriov.vfs", on) is None
    assert nicclass.refusal("mlx5_core", "sriov.vfs.3.trust", {"eswitch": "legacy"}) is None
    assert nicclass.refusal("mana", "sriov.vfs.3.trust", on) is None
    assert nicclass.refusal("mana", "channels.combined", {"port_up": False, "raw_qp": None}) is (
        nicclass.MANA_CHANNELS_VPORT_BUSY)
    assert nicclass.refusal("mana", "channelsx.combined", {"port_up": False}) is None


def test_the_mana_rule_holds_only_on_a_down_port_a_raw_qp_may_hold():
    rule = nicclass.MANA_CHANNELS_VPORT_BUSY
    assert [rule.applies({"port_up": up, "raw_qp": raw}) for up, raw in (
        (False, True), (False, None), (False, False), (True, True), (True, None))] == [
        True, True, False, False, False]


def test_the_buffer_rules_hold_as_mlx5_owns_its_buffers():
    no_effect = nicclass.MLX5_CABLE_LENGTH_NO_EFFECT
    assert no_effect.applies({"buffers": "firmware"}) and no_effect.applies({"buffers": None})
    assert not no_effect.applies({"buffers": "software"})
    assert nicclass.MLX5_BUFFER_WRITE_ONE_WAY.applies({})  # every write
    assert [r.effect for r in nicclass.rules_holding("mlx5_core", "roce.buffer.size", {})] == ["one-way"]


def test_a_rule_without_a_decision_is_never_applied_generically(monkeypatch):
    # Its own module decides when it holds: refusal() cannot, so it never refuses by it.
    undecided = nicclass.DriverRule(driver="mlx5_core", key="macsec.offload", effect="refused",
                                    when="offload: phy", why="y", source="s")
    monkeypatch.setattr(nicclass, "RULES", [undecided])
    assert nicclass.refusal("mlx5_core", "macsec.offload", {"value": "phy"}) is None
    assert nicclass.rules_holding("mlx5_core", "macsec.offload", {}) == []


def test_every_rule_decides_through_holds():
    # One mechanism: plan, lint and the fakes all ask refusal() / rules_holding(),
    # so a rule without its decision would refuse (or round, or keep) nowhere.
    refusing = [r for r in nicclass.RULES if r.effect == "refused"]
    assert len(refusing) >= 10 and len(nicclass.RULES) > len(refusing)
    assert [r for r in nicclass.RULES if r.holds is None] == []


def test_the_section_wrappers_answer_through_the_registry():
    on, off = nicclass.SWITCHDEV, "legacy"
    assert nicclass.vf_write_refused("mlx5_core", "vlan", 100, on) is nicclass.MLX5_VF_VLAN_SWITCHDEV
    assert nicclass.vf_write_refused("mlx5_core", "vlan", 0, on) is None
    assert nicclass.vf_write_refused("mlx5_core", "trust", False, on) is nicclass.MLX5_VF_TRUST_SWITCHDEV
    assert nicclass.vf_write_refused("mlx5_core", "trust", True, off) is None
    assert nicclass.vf_write_refused("mlx5_core", "max_tx_rate", 10, on) is None
    assert nicclass.vf_write_refused("netdevsim", "max_tx_rate", 10, on) is nicclass.NSIM_VF_RATE_SWITCHDEV[0]
    # The plan's own eswitch mode counts over the current one.
    assert nicclass.refusal("mlx5_core", "sriov.vfs.2.spoofchk", {
        "eswitch": off, "value": True, "planned": {"eswitch.mode": on}}) is nicclass.MLX5_VF_SPOOFCHK_SWITCHDEV
    assert nicclass.hw_tc_kept("mlx5e_rep", None, on) is nicclass.MLX5_HW_TC_SWITCHDEV_ON
    assert nicclass.hw_tc_kept("mlx5_core", None, off) is None
    flows = {"eswitch": on, "value": False, "offloaded_flows": 3}
    assert nicclass.refusal("mlx5_core", "features.hw-tc-offload", flows) is nicclass.MLX5_HW_TC_OFF_REFUSED
    assert nicclass.refusal("mlx5_core", "features.hw-tc-offload", dict(flows, offloaded_flows=0)) is None
    assert nicclass.refusal("mlx5_core", "features.hw-tc-offload", dict(flows, value=True)) is None
    assert nicclass.ipsec_sa_refused("netdevsim", "crypto", True) is nicclass.IPSEC_ESN_NO_ADVANCE
    assert nicclass.ipsec_sa_refused("netdevsim", "packet", True) is None
    assert nicclass.ipsec_sa_refused("mlx5_core", "crypto", True) is None  # the firmware decides
    assert nicclass.refusal("mlx5_core", "ipsec.sas.esn", {"offload": "packet", "value": True,
                                                          "esn_offload": False}) is nicclass.IPSEC_ESN_MLX5_CAP
    assert nicclass.refusal("mlx5_core", "ipsec.sas.lifetime", {"offload": "packet", "value": {
        "soft_packets": 5, "hard_packets": 5}}) is nicclass.IPSEC_MLX5_PACKET_LIMITS
