"""Every shipped profile, playbook play and doc example, planned and applied
on the strict fakes of its NIC class (tests/strict_fakes.py): nothing
nictune ships may plan as a success what the driver rules refuse.

The fakes hold no rule of their own: they ask nicclass.RULES, so a rule
declared there (with its holds(facts)) reaches this test without touching
it.  The last tests show that the harness catches a refusal: the ASAP2
profile as shipped before the switchdev rules (VF vlan/trust/spoofchk in
switchdev), rules declared here for the purpose (one plan does not
consult), and the MANA channel rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fakes import overlay
from nictune.control.rollout.playbook import load_playbook
from nictune.host.facts import nicclass
from nictune.host.facts.nicclass import DriverRule
from nictune.profile.loader import load_profile, load_profile_text
from shipped import REPO, VF, entry_blocks, play_blocks, profile_blocks
from strict_fakes import (CX7_PFS, DOC_PAGES, FAKE_HOSTS, PLAYBOOK_FILES, PROFILE_FILES, mana_state, mlx5_state,
                          nic_classes, shipped_artifacts, strict_run)

pytestmark = pytest.mark.recorded

ARTIFACTS = shipped_artifacts()
RUNS = [(a, cls) for a in ARTIFACTS for cls in nic_classes(a.load().doc)]
ASAP2 = os.path.join(REPO, "profiles", "connectx7-asap2-switchdev.yaml")


def _yaml_files(directory: str) -> list:
    return sorted(os.path.join(REPO, directory, n) for n in os.listdir(os.path.join(REPO, directory))
                  if n.endswith((".yaml", ".yml")))


def test_every_shipped_file_and_example_is_run():
    # The listings themselves: a .yml file, or a new directory entry, is not left out.
    assert PROFILE_FILES == _yaml_files("profiles") and len(PROFILE_FILES) >= 10
    assert PLAYBOOK_FILES == _yaml_files("playbooks") and len(PLAYBOOK_FILES) >= 3
    assert {str(p) for p in DOC_PAGES} >= {os.path.join(REPO, "README.md"),
                                          *(str(p) for p in (Path(REPO) / "docs" / "howto").glob("*.md"))}
    by_file = {}
    for artifact in ARTIFACTS:
        by_file[artifact.file] = by_file.get(artifact.file, 0) + 1
    for path in PROFILE_FILES:
        assert by_file.get(path) == 1, path
    for path in PLAYBOOK_FILES:
        assert by_file.get(path) == len(load_playbook(path)) >= 1, path
    plays = {str(p): sum(len(yaml.safe_load(b)) for b in play_blocks(p.read_text())) for p in DOC_PAGES}
    entries = {str(p): len(entry_blocks(p.read_text())) * len(FAKE_HOSTS) for p in DOC_PAGES}
    for page in DOC_PAGES:
        assert by_file.get(str(page), 0) == (len(profile_blocks(page.read_text())) + plays[str(page)]
                                             + entries[str(page)]), page
    # playbooks/README.md's example play and docs/howto/ipsec.md's entry, besides the profile blocks.
    assert plays[os.path.join(REPO, "playbooks", "README.md")] >= 1
    assert entries[os.path.join(REPO, "docs", "howto", "ipsec.md")] >= 1
    examples = sum(len(profile_blocks(p.read_text())) for p in DOC_PAGES) + sum(plays.values()) + sum(
        entries.values())
    assert examples >= 28
    assert len(ARTIFACTS) == len(PROFILE_FILES) + sum(len(load_playbook(p)) for p in PLAYBOOK_FILES) + examples
    # Each NIC class's fake runs something, and the ASAP2 profile runs on mlx5's.
    assert {cls for _, cls in RUNS} == set(FAKE_HOSTS) and len(RUNS) >= len(ARTIFACTS)
    assert ("profiles/connectx7-asap2-switchdev.yaml", "mlx5_core") in {(a.label, c) for a, c in RUNS}


@pytest.mark.parametrize("artifact, nic", RUNS, ids=[f"{a.label}@{c}" for a, c in RUNS])
def test_nothing_shipped_plans_a_success_the_driver_refuses(artifact, nic, tmp_path):
    problems, _ = strict_run(artifact.load(), FAKE_HOSTS[nic](), tmp_path)
    assert problems == [], "\n".join(problems)


# -- the harness catches what the rules refuse ------------------------------------------

ASAP2_BEFORE = os.path.join(REPO, "tests", "fixtures", "strict", "connectx7-asap2-switchdev-before.yaml")


def test_the_asap2_profile_as_shipped_before_the_switchdev_rules_fails(tmp_path):
    """VF vlan, trust and spoofchk on a switchdev eswitch: plan refuses them
    on mlx5 by the switchdev rules, and the run says the artifact asks its
    own NIC class for them."""
    problems, _ = strict_run(load_profile(ASAP2_BEFORE), mlx5_state(), tmp_path)
    refused = {(p.split(" on ")[0], p.split(" on ")[1].split(" ")[0]) for p in problems}
    wanted = {("sriov vfs.0.vlan", "enp23s0f0np0"), ("sriov vfs.0.trust", "enp23s0f0np0"),
              ("sriov vfs.0.spoofchk", "enp23s0f1np1"), ("sriov vfs.3.vlan", "enp23s0f1np1")}
    assert wanted <= refused and len(problems) == 20
    assert all(" is refused on its own NIC class: " in p for p in problems)
    assert nicclass.MLX5_VF_TRUST_SWITCHDEV.why in "\n".join(problems)


def test_the_generic_rule_check_itself_catches_the_asap2_profile_before(monkeypatch, tmp_path):
    """The switchdev rules decide through holds(facts) like every other rule:
    the sweep's own refusal() finds each refused VF write of the old profile
    (the plan's eswitch mode in facts["planned"]), with plan's refusal text
    left out of the run."""
    import strict_fakes

    monkeypatch.setattr(strict_fakes, "_refused_in_plan", lambda changes, reported: [])
    problems, _ = strict_run(load_profile(ASAP2_BEFORE), mlx5_state(), tmp_path)
    counts = {r.key: sum(f"mlx5_core refuses it while {r.when}: {r.why}" in p for p in problems)
              for r in (nicclass.MLX5_VF_VLAN_SWITCHDEV, nicclass.MLX5_VF_TRUST_SWITCHDEV,
                        nicclass.MLX5_VF_SPOOFCHK_SWITCHDEV)}
    # 2 PFs: VFs 0-3 with a VLAN and spoofchk, VFs 0-1 with trust.
    assert counts == {"sriov.vfs.<n>.vlan": 8, "sriov.vfs.<n>.trust": 4, "sriov.vfs.<n>.spoofchk": 8}
    assert len(problems) == 20


def mac_in_switchdev(facts: dict) -> bool:
    # port_up: a fact the fakes give and plan's VF check does not ask (it asks
    # the registry with the eswitch mode and the value only), so that plan
    # does not consult this rule while the sweep and the fake's apply do.
    return bool(facts.get("port_up")) and "switchdev" in (
        facts.get("eswitch"), facts.get("planned", {}).get("eswitch.mode"))


SCRATCH_VF_MAC = DriverRule(
    driver="mlx5_core", key="sriov.vfs.<n>.mac", effect="refused",
    when="the eswitch is in switchdev mode", why="a scratch rule of this test: EOPNOTSUPP",
    source="tests/unit/test_strict_fakes.py", holds=mac_in_switchdev)


def test_a_rule_plan_does_not_consult_fails_the_asap2_profile(monkeypatch, tmp_path):
    """The ASAP2 profile sets VF MACs under switchdev; with a rule that
    refuses them (plan does not know this one), the sweep and the fake's
    apply both say so, by the rule's own words."""
    clean, pending = strict_run(load_profile(ASAP2), mlx5_state(), tmp_path / "clean")
    assert clean == [] and [c for c in pending if c.key.name == "vfs.0.mac"]
    monkeypatch.setattr(nicclass, "RULES", nicclass.RULES + [SCRATCH_VF_MAC])
    problems, _ = strict_run(load_profile(ASAP2), mlx5_state(), tmp_path / "ruled")
    swept = [p for p in problems if p.startswith("plan predicts sriov vfs.")]
    assert {p.split(" (")[0] for p in swept} == {f"plan predicts sriov vfs.{n}.mac on {pf}"
                                                 for n in range(4) for pf in ("enp23s0f0np0", "enp23s0f1np1")}
    assert all("while the eswitch is in switchdev mode: a scratch rule of this test" in p for p in swept)
    applied = [p for p in problems if p.startswith("apply: sriov vfs.")]
    assert len(applied) == 1 and "write refused: " in applied[0] and SCRATCH_VF_MAC.why in applied[0]


def test_a_refusing_buffer_rule_fails_a_scratch_profile(monkeypatch, tmp_path):
    text = ("nictune: 1\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n    roce:\n"
            "      pfc: [3]\n      pfc_cable_length: 30\n"
            "      buffer: {prio2buffer: [0, 0, 0, 1, 0, 0, 0, 0]}\n")
    scratch = load_profile_text(text, "scratch.yaml")
    assert strict_run(scratch, mlx5_state(), tmp_path / "clean")[0] == []
    monkeypatch.setattr(nicclass, "RULES", nicclass.RULES + [DriverRule(
        driver="mlx5_core", key="roce.buffer", effect="refused", when="the port is up",
        why="a scratch rule of this test: EBUSY", source="tests/unit/test_strict_fakes.py",
        holds=lambda facts: facts["port_up"])])
    problems, _ = strict_run(load_profile_text(text, "scratch.yaml"), mlx5_state(), tmp_path / "ruled")
    assert sum(p.startswith("plan predicts dcb buffer.prio2buffer on enp23s0f") for p in problems) == 2
    assert [p for p in problems if p.startswith("apply: dcb buffer.prio2buffer") and "EBUSY" not in p] == []
    assert any(p.startswith("apply: dcb buffer.prio2buffer") for p in problems)


@pytest.mark.parametrize("raw_qp", [True, False])
def test_an_artifact_asking_its_class_for_a_refused_setting_fails(tmp_path, raw_qp):
    """Plan consults the MANA channel rule: on a down MANA port under
    mana_ib an artifact that changes channels is refused by it, which the
    harness reports as the artifact asking for what its class refuses:
    by the rule holding for the fake's facts (a RAW QP holds the vPort),
    or by plan's refusal in the rule's words (plan cannot tell, the fake
    has none)."""
    state = overlay(mana_state(), {"links": [{"name": VF, "up": False, "operstate": "DOWN"}],
                                   "quirks": {VF: {"raw_qp": raw_qp}}})
    text = "nictune: 1\ninterfaces:\n  vf:\n    match: {driver: mana}\n    channels: {combined: 8}\n"
    problems, _ = strict_run(load_profile_text(text, "scratch.yaml"), state, tmp_path)
    rule = nicclass.MANA_CHANNELS_VPORT_BUSY
    assert len(problems) == 1 and problems[0].startswith(
        f"channels combined on {VF} (scratch.yaml:5) is refused on its own NIC class: ")
    assert rule.why in problems[0]
    assert (f"mana refuses it while {rule.when}" in problems[0]) is raw_qp


def test_the_sweep_sees_hw_tc_offload_off_on_an_uplink_with_offloaded_flows(tmp_path):
    """The fakes count their offloaded tc filters (facts["offloaded_flows"]),
    so MLX5_HW_TC_OFF_REFUSED reaches the sweep and the fake's FEATURES_SET
    by its holds: plan cannot count OVS's flows and predicts the change."""
    state = mlx5_state()
    for eswitch in state["eswitch"].values():
        eswitch["mode"] = "switchdev"
    for port in CX7_PFS:
        state["features"][port]["active"]["hw-tc-offload"] = True
    state["tc_flows"] = {CX7_PFS[0]: 5}
    text = "nictune: 1\ninterfaces:\n  up:\n    match: {driver: mlx5_core}\n    features: {hw-tc-offload: false}\n"
    problems, _ = strict_run(load_profile_text(text, "scratch.yaml"), state, tmp_path)
    rule = nicclass.MLX5_HW_TC_OFF_REFUSED
    assert problems == [
        f"plan predicts features hw-tc-offload on {CX7_PFS[0]} (scratch.yaml:5) but mlx5_core refuses it while "
        f"{rule.when}: {rule.why} ({rule.source})",
        f"apply: features hw-tc-offload on {CX7_PFS[0]} (scratch.yaml:5) planned as a success, then: write "
        f"refused: {CX7_PFS[0]}: the kernel did not change hw-tc-offload"]
