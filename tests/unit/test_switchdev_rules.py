"""What mlx5 refuses or does by itself in switchdev (nicclass.py, "mlx5 in
switchdev"), applied alike by lint, plan, rollback and the fakes
(tests/fakes.py): VF vlan/qos/trust/spoofchk refused, rates taken; mlx5's
own hw-tc-offload on the uplink kept by a rollback, and the fake refusing
to turn it off while OVS's flows are offloaded."""

from __future__ import annotations

import errno
import os

import pytest

from fakes import FakeHost, cx7_eswitch_state
from nictune.host import model as m
from nictune.host.facts import nicclass
from nictune.host.transaction.engine import Engine
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.vf import VfConfig
from nictune.profile.lint import lint_file
from nictune.profile.loader import load_profile, load_profile_text

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASAP2 = os.path.join(REPO, "profiles", "connectx7-asap2-switchdev.yaml")
UPLINK, UPLINK1 = "enp23s0f0np0", "enp23s0f1np1"
HANDLE = "pci/0000:17:00.0"

# The VFs as the shipped ASAP2 profile had them: what mlx5 refuses in switchdev.
OLD_VFS = """\
      vfs:
        "0": {mac: "02:00:00:00:00:10", vlan: 100, trust: true, spoofchk: true}
        "1": {mac: "02:00:00:00:00:11", vlan: 100, trust: true, spoofchk: true}
        "2": {mac: "02:00:00:00:00:12", vlan: 101, spoofchk: true}
"""


def profile_text(vfs: str, eswitch: str = "    eswitch: {mode: switchdev}\n",
                 driver: str = "driver: mlx5_core, ") -> str:
    return ("nictune: 1\ninterfaces:\n  uplinks:\n"
            f"    match: {{{driver}flavour: physical}}\n{eswitch}"
            f"    sriov:\n      numvfs: 4\n{vfs}    features: {{hw-tc-offload: true}}\n")


def old_asap2(tmp_path) -> str:
    """The shipped profile with the VF lines it had: a copy to lint and plan."""
    with open(ASAP2) as f:
        text = f.read()
    head, _, rest = text.partition("      vfs:\n")
    rest = rest.split("    features:", 1)[1]
    path = tmp_path / "old-asap2.yaml"
    path.write_text(head + OLD_VFS + "    features:" + rest)
    return str(path)


def by_key(out) -> dict:
    return {(c.key.target, c.key.family, c.key.name): c for c in out.changes}


# -- lint ------------------------------------------------------------------------

def test_lint_errs_on_vf_attributes_mlx5_refuses_in_switchdev(tmp_path):
    path = old_asap2(tmp_path)
    found = [f for f in lint_file(path) if f.code == "vf-attr-refused-in-switchdev"]
    assert {f.severity for f in found} == {"error"}
    # vlan, trust and spoofchk of VF 0 and 1, vlan and spoofchk of VF 2.
    assert len(found) == 8, found
    first = found[0]
    assert "sriov.vfs.0.vlan" in first.message and "esw/legacy.c mlx5_eswitch_set_vport_vlan" \
        in first.message and "tag=" in first.message
    lines = open(path).read().splitlines()
    vf0 = next(n for n, line in enumerate(lines, 1) if line.startswith('        "0":'))
    mode = next(n for n, line in enumerate(lines, 1) if line.strip() == "mode: switchdev")
    assert first.locations == (f"{path}:{vf0}", f"{path}:{mode}")


def test_lint_takes_rates_mac_and_the_defaults_in_switchdev(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(profile_text('      vfs:\n        "0": {mac: "02:00:00:00:00:10", vlan: 0, '
                                 "trust: false, spoofchk: false, max_tx_rate: 1000, "
                                 "min_tx_rate: 100, link_state: auto}\n"))
    assert [f for f in lint_file(str(path)) if f.code == "vf-attr-refused-in-switchdev"] == []


def test_lint_warns_without_a_driver_and_for_another_entrys_eswitch(tmp_path):
    nodriver = tmp_path / "nodriver.yaml"
    nodriver.write_text(profile_text('      vfs:\n        "0": {qos: 3}\n', driver=""))
    (found,) = [f for f in lint_file(str(nodriver)) if f.code == "vf-attr-refused-in-switchdev"]
    assert found.severity == "warning" and "names no driver" in found.message
    other = tmp_path / "other.yaml"
    other.write_text(
        "nictune: 1\ninterfaces:\n  uplinks:\n    match: {driver: mlx5_core, name: enp23s0f0np0}\n"
        "    eswitch: {mode: switchdev}\n  vfs-host:\n    match: {driver: mlx5_core}\n"
        "    sriov:\n      numvfs: 2\n      vfs:\n        \"1\": {trust: true}\n")
    (found,) = [f for f in lint_file(str(other)) if f.code == "vf-attr-refused-in-switchdev"]
    assert found.severity == "warning" and "interfaces.uplinks puts a mlx5_core eswitch" in found.message


def test_lint_says_mlx5_turns_tc_offload_on_by_itself_in_switchdev(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("nictune: 1\nhost:\n  ovs: {hw_offload: true}\ninterfaces:\n  uplinks:\n"
                    "    match: {driver: mlx5_core, flavour: physical}\n"
                    "    eswitch: {mode: switchdev}\n")
    (found,) = [f for f in lint_file(str(path)) if f.code == "switchdev-tc-offload-missing"]
    assert "off on a fresh mlx5 port" not in found.message
    assert "mlx5 turns it on by itself in switchdev" in found.message


# -- plan --------------------------------------------------------------------------

def test_plan_refuses_the_old_shipped_shape_naming_the_line_and_the_rule(tmp_path):
    path = old_asap2(tmp_path)
    profile = load_profile(path)
    host = FakeHost(cx7_eswitch_state(), tmp_path / "root")
    before = host.kernel.snapshot()
    out = Engine(host, str(tmp_path / "state")).plan(profile.doc, profile.sources)
    got = by_key(out)
    vlan = got[(UPLINK, "sriov", "vfs.0.vlan")]
    assert vlan.status == m.UNSUPPORTED
    assert vlan.note == nicclass.refusal_text(nicclass.MLX5_VF_VLAN_SWITCHDEV)
    for name, rule in (("vfs.0.trust", nicclass.MLX5_VF_TRUST_SWITCHDEV),
                       ("vfs.2.spoofchk", nicclass.MLX5_VF_SPOOFCHK_SWITCHDEV)):
        assert got[(UPLINK1, "sriov", name)].note == nicclass.refusal_text(rule)
    assert got[(UPLINK, "sriov", "vfs.0.mac")].status == m.PENDING
    assert out.error["kind"] == "unsupported"
    assert f"{UPLINK} sriov vfs.0.vlan: not supported by mlx5_core" in out.error["message"]
    assert f"({vlan.source})" in out.error["message"] and vlan.source.startswith(path + ":")
    assert host.kernel.writes == [] and host.kernel.snapshot() == before


def test_the_fixed_shipped_profile_plans_and_applies_clean_on_the_strict_fakes(tmp_path):
    profile = load_profile(ASAP2)
    host = FakeHost(cx7_eswitch_state(), tmp_path / "root")
    engine = Engine(host, str(tmp_path / "state"))
    out = engine.plan(profile.doc, profile.sources)
    assert out.error is None, out.error
    got = by_key(out)
    assert got[(UPLINK, "sriov", "vfs.0.max_tx_rate")].status == m.PENDING  # rates: both modes
    mode = got[(HANDLE, "eswitch", "mode")]
    assert "stop ovs-vswitchd" in mode.note and "hw-tc-offload stays on" in mode.note
    assert got[(UPLINK, "features", "hw-tc-offload")].note.startswith(
        nicclass.MLX5_HW_TC_SWITCHDEV_ON.why)
    out = engine.apply(profile.doc, profile.sources, ASAP2)
    assert out.error is None, out.error
    assert {c.status for c in out.changes} == {m.APPLIED, m.OK}
    assert host.kernel.vfs[UPLINK][0].max_tx_rate == 25000


def test_leaving_switchdev_says_what_ovs_needs_first(tmp_path):
    doc = load_profile_text(profile_text("", eswitch="    eswitch: {mode: legacy}\n"), "p.yaml")
    host = FakeHost(cx7_eswitch_state("switchdev"), tmp_path / "root")
    got = by_key(Engine(host, str(tmp_path / "state")).plan(doc.doc, doc.sources))
    mode = got[(HANDLE, "eswitch", "mode")]
    assert mode.status == m.PENDING and mode.note.startswith("leaving switchdev: first stop "
                                                             "ovs-vswitchd")


def test_a_pf_already_in_switchdev_is_refused_and_one_going_legacy_is_not(tmp_path):
    vfs = '      vfs:\n        "1": {vlan: 10, max_tx_rate: 100}\n'
    for n, (now, eswitch, status) in enumerate((
            ("switchdev", "", m.UNSUPPORTED),                                  # is in switchdev
            ("switchdev", "    eswitch: {mode: legacy}\n", m.PENDING),        # will leave it
            ("legacy", "", m.PENDING))):
        doc = load_profile_text(profile_text(vfs, eswitch=eswitch), "p.yaml")
        host = FakeHost(cx7_eswitch_state(now), tmp_path / f"root{n}")
        got = by_key(Engine(host, str(tmp_path / f"state{n}")).plan(doc.doc, doc.sources))
        assert got[(UPLINK, "sriov", "vfs.1.vlan")].status == status, (now, eswitch)
        assert got[(UPLINK, "sriov", "vfs.1.max_tx_rate")].status == m.PENDING


# -- rollback: mlx5's own hw-tc-offload ------------------------------------------

def test_a_rollback_leaves_mlx5s_hw_tc_offload_on_while_ovs_has_flows(tmp_path):
    profile = load_profile(ASAP2)
    host = FakeHost(cx7_eswitch_state(), tmp_path / "root")
    engine = Engine(host, str(tmp_path / "state"))
    assert engine.apply(profile.doc, profile.sources, ASAP2).error is None
    host.kernel.tc_flows[UPLINK] = 12  # OVS offloaded its flows since
    out = engine.rollback()
    assert out.error is None, out.error
    got = by_key(out)
    tc = got[(UPLINK, "features", "hw-tc-offload")]
    assert tc.status == m.KEPT and nicclass.MLX5_HW_TC_SWITCHDEV_ON.source in tc.note
    assert got[(HANDLE, "eswitch", "mode")].status == m.REVERTED
    assert host.kernel.eswitch[HANDLE]["mode"] == "legacy"
    assert ("set_features", UPLINK, {"hw-tc-offload": False}) not in host.kernel.writes


# -- the fakes refuse what the driver refuses ------------------------------------

def _fake_with_vfs(tmp_path, mode: str, driver: str = "mlx5_core") -> FakeHost:
    state = cx7_eswitch_state(mode)
    state["drvinfo"][UPLINK]["driver"] = driver
    host = FakeHost(state, tmp_path / "root")
    with open(host.path("sys/class/net", UPLINK, "device", "sriov_numvfs"), "w") as f:
        f.write("2\n")
    return host


@pytest.mark.parametrize("cfg,rule", [
    (VfConfig(vlan=100, qos=0), nicclass.MLX5_VF_VLAN_SWITCHDEV),
    (VfConfig(vlan=100, qos=3), nicclass.MLX5_VF_VLAN_SWITCHDEV),
    (VfConfig(trust=True), nicclass.MLX5_VF_TRUST_SWITCHDEV),
    (VfConfig(trust=False), nicclass.MLX5_VF_TRUST_SWITCHDEV),
    (VfConfig(spoofchk=True), nicclass.MLX5_VF_SPOOFCHK_SWITCHDEV),
])
def test_the_fake_vf_setter_refuses_what_mlx5_refuses_in_switchdev(tmp_path, cfg, rule):
    host = _fake_with_vfs(tmp_path, "switchdev")
    handle = host.vfs()
    index = host.kernel.links[UPLINK].index
    with pytest.raises(NetlinkError) as info:
        handle.set(index, 1, cfg)
    assert info.value.errno == errno.EOPNOTSUPP and rule.why in str(info.value)
    legacy = _fake_with_vfs(tmp_path / "legacy", "legacy")
    legacy.vfs().set(index, 1, cfg)  # legacy takes all of it
    got = legacy.vfs().all()[UPLINK][1]
    given = {a: v for a, v in vars(cfg).items() if v is not None}
    assert given and {a: getattr(got, a) for a in given} == given


def test_the_fake_vf_setter_takes_what_mlx5_takes_in_switchdev(tmp_path):
    host = _fake_with_vfs(tmp_path, "switchdev")
    index = host.kernel.links[UPLINK].index
    host.vfs().set(index, 0, VfConfig(mac="02:00:00:00:00:10", min_tx_rate=100, max_tx_rate=1000,
                                      link_state="enable"))
    host.vfs().set(index, 0, VfConfig(vlan=0, qos=5))  # taken, and dropped (libvirt's VLAN 0)
    got = host.vfs().all()[UPLINK][0]
    assert (got.mac, got.min_tx_rate, got.max_tx_rate, got.link_state, got.qos) == (
        "02:00:00:00:00:10", 100, 1000, "enable", 0)


def test_the_fake_netdevsim_refuses_rates_in_switchdev(tmp_path):
    host = _fake_with_vfs(tmp_path, "switchdev", driver="netdevsim")
    index = host.kernel.links[UPLINK].index
    with pytest.raises(NetlinkError) as info:
        host.vfs().set(index, 0, VfConfig(max_tx_rate=1000, min_tx_rate=0))
    assert info.value.errno == errno.EOPNOTSUPP
    host.vfs().set(index, 0, VfConfig(vlan=100, trust=True))  # netdevsim takes these


def test_the_fake_eswitch_turns_hw_tc_offload_on_and_keeps_it_while_flows_exist(tmp_path):
    host = FakeHost(cx7_eswitch_state(), tmp_path / "root")
    active = host.kernel.features[UPLINK]["active"]
    assert active["hw-tc-offload"] is False
    host.devlink().set_eswitch(HANDLE, mode="switchdev")
    assert active["hw-tc-offload"] is True  # en_rep.c mlx5e_uplink_rep_enable
    assert host.kernel.features[UPLINK1]["active"]["hw-tc-offload"] is False  # the other PF's
    host.kernel.tc_flows[UPLINK] = 1
    assert host.ethtool().set_features(UPLINK, {"hw-tc-offload": False}) == {"hw-tc-offload": False}
    assert active["hw-tc-offload"] is True
    host.kernel.tc_flows[UPLINK] = 0
    assert host.ethtool().set_features(UPLINK, {"hw-tc-offload": False}) == {}
    assert active["hw-tc-offload"] is False


def test_every_switchdev_rule_cites_a_source_function():
    assert len(nicclass.SWITCHDEV_RULES) == 8
    for found in nicclass.SWITCHDEV_RULES:
        assert found in nicclass.RULES  # the profile reference lists it
        assert found.source.split()[0].endswith(".c") and len(found.source.split()) >= 2, found


def test_the_strict_fake_itself_refuses_the_old_shape_when_plan_lets_it_through(tmp_path, monkeypatch):
    from nictune.host.knobs.sriov import SriovFamily

    monkeypatch.setattr(SriovFamily, "_refused_in_mode", lambda self, pf, attr, value: None)
    profile = load_profile(old_asap2(tmp_path))
    host = FakeHost(cx7_eswitch_state(), tmp_path / "root")
    out = Engine(host, str(tmp_path / "state")).apply(profile.doc, profile.sources, "old.yaml")
    assert out.error["kind"] == "rolled-back", out.error
    assert nicclass.MLX5_VF_VLAN_SWITCHDEV.why in out.error["message"]
    assert host.kernel.eswitch[HANDLE]["mode"] == "legacy" and host.kernel.vfs_of(UPLINK) == {}


def test_a_rollback_summary_counts_what_the_driver_kept():
    from nictune.cli.output import _summary

    said = _summary({"command": "rollback", "journal": "a1", "summary": {"reverted": 3, "kept": 1},
                     "changes": []})
    assert said == ("Restored 3 setting(s) from apply a1; 1 left as the driver keeps them "
                    "(see their notes).")


def test_lint_errs_on_more_vfs_than_the_firmware_offers_and_on_sriov_off(tmp_path):
    path = tmp_path / "fw.yaml"
    path.write_text("nictune: 1\ninterfaces:\n  uplinks:\n    match: {driver: mlx5_core}\n"
                    "    firmware: {sriov_enabled: false, total_vfs: 4}\n"
                    "    sriov: {numvfs: 8}\n")
    found = {f.code: f for f in lint_file(str(path))}
    beyond = found["sriov-beyond-firmware-vfs"]
    assert beyond.severity == "error" and "sriov.numvfs 8 is more than the firmware's total_vfs 4" \
        in beyond.message
    assert beyond.locations == (f"{path}:6", f"{path}:5")
    assert found["sriov-disabled-in-firmware"].severity == "error"
    shipped = [f for f in lint_file(ASAP2) if f.code.startswith("sriov-")]
    assert shipped == []
    assert load_profile(ASAP2).doc["interfaces"]["uplinks"]["firmware"]["total_vfs"] >= \
        load_profile(ASAP2).doc["interfaces"]["uplinks"]["sriov"]["numvfs"]
