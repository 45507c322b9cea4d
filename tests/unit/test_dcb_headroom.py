"""PFC headroom, DCBX owner, PFC storm prevention, verbs ToS, the disruptive
mark of a PFC change, and DCB/ECN on VFs and representors (issue 11 items
3, 10, 13).

No mlx5 here: the fake kernel (tests/fakes.py FakeDcb, FakeTunables) answers
as mlx5's dcbnl and tunable ops do, and tests/fixtures/mlx5-sriov is a sysfs
tree shaped like an mlx5 PF with a VF and its representor (labelled fixtures,
not recordings of a real host).  The bytes of the messages are checked
against iproute2/ethtool in tests/recorded.
"""

from __future__ import annotations

import pytest

from fakes import FakeHost, cx7_rails_state, load_state
from nictune.host import model as m
from nictune.host.facts import nicclass
from nictune.host.transaction.engine import Engine
from nictune.host.knobs.dcb import DcbFamily
from nictune.host.knobs.roce import RoceFamily
from nictune.host.knobs.tunable import TunableFamily
from nictune.host.model import Key, Unsupported

P0, P1 = "enp23s0f0np0", "enp23s0f1np1"
VF, REP = "enp23s0f0v0", "pf0vf0"
TC_FILE = "sys/class/infiniband/mlx5_0/tc/1/traffic_class"


def rail_state(**extra) -> dict:
    return cx7_rails_state(**{"tunables": {P0: {"pfc-prevention-tout": 8000}}, **extra})


@pytest.fixture
def rails(tmp_path):
    return FakeHost(rail_state(), tmp_path / "root")


def doc(roce: dict, name: str = P0) -> dict:
    return {"nictune": 1, "interfaces": {"rail": {"match": {"name": name}, "roce": roce}}}


def by_key(outcome) -> dict:
    return {(c.key.family, c.key.name): c for c in outcome.changes}


def plan(host, tmp_path, roce, name=P0):
    return Engine(host, str(tmp_path / "state")).plan(doc(roce, name), {})


def apply(host, tmp_path, roce, name=P0):
    return Engine(host, str(tmp_path / "state")).apply(doc(roce, name), {}, "p.yaml")


# -- item 3: DCB and ECN on VFs and representors ---------------------------------

def sriov_state() -> dict:
    """cx7-host with the mlx5-sriov tree: PF enp23s0f0np0, its VF 0
    enp23s0f0v0 and the VF's representor pf0vf0.  The VF and the
    representor have no dcbnl ops (absent from "dcb": EOPNOTSUPP), as on
    mlx5; their ecn files exist, as MLNX_OFED creates them."""
    state = load_state("cx7-host")
    state["tree"] = "mlx5-sriov"
    state["files"] = {k: v for k, v in state["files"].items() if "enp23s0f1np1" not in k}
    link = next(l for l in state["links"] if l["name"] == P0)
    state["links"] += [dict(link, name=VF, index=5, mac="0c:42:a1:00:00:10", num_tx_queues=64),
                       dict(link, name=REP, index=6, mac="0c:42:a1:00:00:20", num_tx_queues=8)]
    state["drvinfo"][VF] = dict(state["drvinfo"][P0], bus_info="0000:17:00.2")
    state["drvinfo"][REP] = dict(state["drvinfo"][P0])
    state["dcb"] = {P0: {}}
    return state


@pytest.fixture
def sriov(tmp_path):
    return FakeHost(sriov_state(), tmp_path / "root")


def test_the_fixture_tells_a_vf_and_a_representor_from_the_pf(sriov):
    ifaces = {i.name: i for i in sriov.interfaces()}
    assert ifaces[VF].physfn == "0000:17:00.0" and ifaces[VF].vf_index == 0
    assert ifaces[REP].phys_port_name == "pf0vf0" and ifaces[REP].physfn is None
    assert ifaces[P0].phys_port_name == "p0" and ifaces[P0].physfn is None


@pytest.mark.parametrize("name, where", [(VF, "a VF"), (REP, "a VF representor")])
def test_dcb_and_ecn_on_a_vf_or_representor_are_refused_in_plan(sriov, tmp_path, name, where):
    roce = {"trust": "dscp", "pfc": [3], "dcbx": "host", "ecn": {"np": [3], "cnp_dscp": 46}}
    out = plan(sriov, tmp_path, roce, name)
    changes = by_key(out)
    for key in (("dcb", "trust"), ("dcb", "pfc"), ("dcb", "dcbx"), ("roce", "ecn.np"), ("roce", "ecn.cnp_dscp")):
        assert changes[key].status == m.UNSUPPORTED, key
        assert changes[key].note.startswith(f"not supported on {where} ({name}): "), changes[key].note
    assert "vport group manager" in changes[("dcb", "pfc")].note
    assert "writable on the PF only" in changes[("roce", "ecn.np")].note
    assert sriov.kernel.writes == []


def test_the_pf_of_the_same_card_keeps_dcb_and_ecn(sriov, tmp_path):
    out = plan(sriov, tmp_path, {"pfc": [3], "ecn": {"np": [3]}}, P0)
    changes = by_key(out)
    assert changes[("dcb", "pfc")].status == m.PENDING
    assert changes[("roce", "ecn.np")].status == m.PENDING


def test_nic_support_says_where_mlx5_has_dcb():
    assert "not on VFs" in DcbFamily.nic_support("mlx5_core", "roce.pfc")
    assert DcbFamily.nic_support("mana", "roce.dcbx").startswith("not supported by mana")


# -- item 10a: PFC cable length and port buffers ------------------------------------

def test_cable_length_plan_apply_and_rollback(rails, tmp_path):
    changes = by_key(plan(rails, tmp_path, {"pfc_cable_length": 100}))
    change = changes[("dcb", "pfc_cable_length")]
    assert (change.before, change.after, change.status) == (7, 100, m.PENDING)
    out = apply(rails, tmp_path, {"pfc_cable_length": 100})
    assert out.error is None, out.error
    assert rails.kernel.dcb[P0].pfc.delay == 100
    assert rails.kernel.dcb[P0].pfc.pfc_en == 0  # the PFC enables stay as they were
    out = Engine(rails, str(tmp_path / "state")).rollback()
    assert rails.kernel.dcb[P0].pfc.delay == 7


def test_cable_length_and_pfc_go_in_one_message(rails, tmp_path):
    out = apply(rails, tmp_path, {"pfc": [3], "pfc_cable_length": 30})
    assert out.error is None, out.error
    pfc_writes = [w for w in rails.kernel.writes if w[0] == "set_pfc"]
    assert len(pfc_writes) == 1 and (pfc_writes[0][2]["pfc_en"], pfc_writes[0][2]["delay"]) == (8, 30)


def test_cable_length_mlx5_ignores_is_refused_before_writing(rails, tmp_path):
    change = by_key(plan(rails, tmp_path, {"pfc_cable_length": 1000}))[("dcb", "pfc_cable_length")]
    assert change.status == m.UNSUPPORTED and "1-999 m" in change.note
    assert "MLX5E_MAX_CABLE_LENGTH" in change.note


def test_cable_length_is_not_a_length_on_other_drivers(tmp_path):
    host = FakeHost(rail_state(), tmp_path / "root")
    host.kernel.drvinfo[P0].driver = "ice"
    fam = DcbFamily(host)
    fam.expand(P0, {"roce": {"pfc_cable_length": 100}}, lambda *a: "")
    key = Key("dcb", P0, "pfc_cable_length")
    got = fam.read([key])[key]
    assert isinstance(got, Unsupported) and "bit times" in got.reason


def test_cable_length_unreported_without_port_buffers(tmp_path):
    host = FakeHost(rail_state(dcb={P0: {"pfc": {"delay": 0}}, P1: {}}), tmp_path / "root")
    fam = DcbFamily(host)
    key = Key("dcb", P0, "pfc_cable_length")
    assert "port buffer support only" in fam.read([key])[key].reason


def test_buffers_apply_in_one_message_and_read_back(rails, tmp_path):
    roce = {"pfc": [3], "buffer": {"prio2buffer": [0, 0, 0, 1, 0, 0, 0, 0],
                                   "size": [262144, 524288, 0, 0, 0, 0, 0, 0]}}
    changes = by_key(plan(rails, tmp_path, roce))
    assert changes[("dcb", "buffer.size")].before == [0, 262016, 0, 0, 0, 0, 0, 0]
    assert "buffer cells" in changes[("dcb", "buffer.size")].note
    out = apply(rails, tmp_path, roce)
    assert out.error is None, out.error
    assert [w[0] for w in rails.kernel.writes].count("set_buffer") == 1
    assert rails.kernel.dcb[P0].buffer.prio2buffer == [0, 0, 0, 1, 0, 0, 0, 0]
    assert rails.kernel.dcb[P0].buffer.buffer_size[:2] == [262144, 524288]


def test_a_zero_size_lossless_buffer_is_refused_in_plan(rails, tmp_path):
    roce = {"pfc": [3], "buffer": {"prio2buffer": [0, 0, 0, 1, 0, 0, 0, 0], "size": [262144] + [0] * 7}}
    change = by_key(plan(rails, tmp_path, roce))[("dcb", "buffer.size")]
    assert change.status == m.UNSUPPORTED and "buffer 1 holds priority 3" in change.note


# -- who owns the port buffers (nicclass MLX5_CABLE_LENGTH_NO_EFFECT, -----------------
#    MLX5_BUFFER_WRITE_ONE_WAY; en_dcbnl.c mlx5e_dcbnl_ieee_setpfc, setbuffer)

BUFFERS = {"prio2buffer": [0, 0, 0, 1, 0, 0, 0, 0], "size": [262144, 524288, 0, 0, 0, 0, 0, 0]}


def test_cable_length_without_buffers_is_planned_as_no_effect(rails, tmp_path):
    change = by_key(plan(rails, tmp_path, {"pfc_cable_length": 100}))[("dcb", "pfc_cable_length")]
    rule = nicclass.MLX5_CABLE_LENGTH_NO_EFFECT
    assert change.status == m.PENDING
    assert change.note == ("no effect while the firmware owns the buffers (the default; roce.buffer "
                           f"is not set): {rule.why} ({rule.source})")
    # With buffers in the same profile it does size the headroom: no such note.
    both = by_key(plan(rails, tmp_path, {"pfc_cable_length": 100, "buffer": BUFFERS}))
    assert both[("dcb", "pfc_cable_length")].note == ""


def test_a_buffer_write_is_planned_as_one_way(rails, tmp_path):
    rule = nicclass.MLX5_BUFFER_WRITE_ONE_WAY
    alone = by_key(plan(rails, tmp_path, {"pfc": [3], "buffer": BUFFERS}))
    for name in ("buffer.size", "buffer.prio2buffer"):
        assert f"one-way: {rule.why}; here: headroom sized for 7 m" in alone[("dcb", name)].note
    sized = by_key(plan(rails, tmp_path, {"pfc": [3], "pfc_cable_length": 30, "buffer": BUFFERS}))
    assert "here: headroom sized for the 30 m cable length this profile sets" in (
        sized[("dcb", "buffer.size")].note)


def test_the_fake_keeps_the_headroom_while_the_firmware_owns_the_buffers(rails, tmp_path):
    out = apply(rails, tmp_path, {"pfc_cable_length": 100})
    assert out.error is None, out.error  # stored and read back: verify passes
    assert rails.kernel.dcb[P0].pfc.delay == 100
    assert rails.kernel.buffers[P0] == {"owner": "firmware", "headroom_for_m": None}


def test_the_fake_hands_the_buffers_to_software_for_good(rails, tmp_path):
    out = apply(rails, tmp_path, {"pfc": [3], "buffer": BUFFERS})
    assert out.error is None, out.error
    # Sized for the driver's default cable length, 7 m.
    assert rails.kernel.buffers[P0] == {"owner": "software", "headroom_for_m": 7}
    Engine(rails, str(tmp_path / "state")).rollback()
    assert rails.kernel.dcb[P0].buffer.buffer_size == [0, 262016, 0, 0, 0, 0, 0, 0]
    assert rails.kernel.buffers[P0]["owner"] == "software"  # rollback cannot give them back
    # From now on the cable length re-sizes the headroom.
    out = apply(rails, tmp_path, {"pfc_cable_length": 30})
    assert out.error is None and rails.kernel.buffers[P0]["headroom_for_m"] == 30


def test_the_reference_says_so():
    from nictune.profile.reference import render

    text = render()
    for rule in (nicclass.MLX5_CABLE_LENGTH_NO_EFFECT, nicclass.MLX5_BUFFER_WRITE_ONE_WAY):
        assert f"| {rule.driver} | `{rule.key}` | {rule.effect} | {rule.when} | {rule.why} |" in text
    assert "with firmware-owned buffers (the default) it is stored and read back but changes nothing" in text
    assert "one-way: a write hands the port buffers to software; rollback does not give them back" in text


# -- item 10b: DCBX owner ----------------------------------------------------------------

def test_dcbx_host_then_firmware(rails, tmp_path):
    change = by_key(plan(rails, tmp_path, {"dcbx": "host"}))[("dcb", "dcbx")]
    assert (change.before, change.after) == ("firmware", "host")
    assert apply(rails, tmp_path, {"dcbx": "host"}).error is None
    assert ("set_dcbx", P0, {"mode": 0x09}) in rails.kernel.writes  # `dcb dcbx set host ieee`
    out = apply(rails, tmp_path, {"dcbx": "firmware"})
    assert out.error is None, out.error
    assert ("set_dcbx", P0, {"mode": 0}) in rails.kernel.writes  # mlx5: 0 is firmware control
    assert by_key(plan(rails, tmp_path, {"dcbx": "firmware"}))[("dcb", "dcbx")].status == m.OK


def test_dcbx_is_restored_when_a_later_write_fails(rails, tmp_path):
    rails.kernel.fail("set_ets", P0)
    out = apply(rails, tmp_path, {"dcbx": "host", "ets": {"tc_tsa": ["strict"] * 8, "tc_bw": [0] * 8}})
    assert out.error["kind"] == "rolled-back"
    assert rails.kernel.dcb[P0].dcbx & 0x1 == 0  # back to firmware


# -- item 10c: PFC storm prevention -----------------------------------------------------

def test_pfc_prevention_timeout_plan_apply_and_auto(rails, tmp_path):
    change = by_key(plan(rails, tmp_path, {"pfc_prevention_timeout": 200}))[("tunable", "pfc_prevention_timeout")]
    assert (change.before, change.after, change.status) == (8000, 200, m.PENDING)
    assert apply(rails, tmp_path, {"pfc_prevention_timeout": 200}).error is None
    assert rails.kernel.tunables[P0]["pfc-prevention-tout"] == 200
    # mlx5 runs auto as 100 ms and reads that back: the plan says so and
    # compares 100, so an applied auto is not drift.
    change = by_key(plan(rails, tmp_path, {"pfc_prevention_timeout": "auto"}))[("tunable", "pfc_prevention_timeout")]
    assert (change.after, change.status) == (100, m.PENDING) and "auto: mlx5_core uses 100 ms" in change.note
    out = apply(rails, tmp_path, {"pfc_prevention_timeout": "auto"})
    assert out.error is None, out.error
    assert by_key(plan(rails, tmp_path, {"pfc_prevention_timeout": "auto"}))[
        ("tunable", "pfc_prevention_timeout")].status == m.OK


def test_a_driver_reporting_0xffff_reads_as_auto(tmp_path):
    host = FakeHost(rail_state(tunables={P0: {"pfc-prevention-tout": 0xFFFF}}), tmp_path / "root")
    host.kernel.drvinfo[P0].driver = "bnxt_en"
    fam = TunableFamily(host)
    fam.expand(P0, {"roce": {"pfc_prevention_timeout": "auto"}}, lambda *a: "")
    key = Key("tunable", P0, "pfc_prevention_timeout")
    assert fam.read([key])[key] == "auto"


def test_pfc_prevention_timeout_outside_mlx5_range_is_refused(rails, tmp_path):
    change = by_key(plan(rails, tmp_path, {"pfc_prevention_timeout": 50}))[("tunable", "pfc_prevention_timeout")]
    assert change.status == m.UNSUPPORTED and "80-8000 ms" in change.note


def test_pfc_prevention_timeout_without_the_tunable(rails, tmp_path):
    # P1 is mlx5 without the firmware capability here: the ioctl says EOPNOTSUPP.
    change = by_key(plan(rails, tmp_path, {"pfc_prevention_timeout": 100}, P1))[
        ("tunable", "pfc_prevention_timeout")]
    assert change.status == m.UNSUPPORTED and "no pfc-prevention-tout tunable" in change.note
    assert TunableFamily.nic_support("mana", "roce.pfc_prevention_timeout").startswith("not supported by mana")


# -- item 10d: verbs ToS --------------------------------------------------------------------

def test_verbs_tos_needs_ofed_tc_sysfs(rails, tmp_path):
    change = by_key(plan(rails, tmp_path, {"verbs_tos": 106}))[("roce", "verbs_tos")]
    assert change.status == m.UNSUPPORTED and "init_tc_sysfs" in change.note


def ofed_traffic_class(monkeypatch):
    """Make the fixture's traffic_class file answer as MLNX_OFED's does
    (main_ext.c traffic_class_store: N sets the global tclass, -1 unsets
    it; traffic_class_show: "Global tclass=N" while one is set)."""
    from nictune.host.knobs import roce

    plain = roce._write

    def write(io, path, text):
        if not path.endswith("/traffic_class"):
            return plain(io, path, text)
        plain(io, path, "" if int(text) < 0 else f"Global tclass={int(text)}\n")

    monkeypatch.setattr(roce, "_write", write)


def test_verbs_tos_apply_and_rollback(tmp_path, monkeypatch):
    ofed_traffic_class(monkeypatch)
    host = FakeHost(rail_state(files={**load_state("cx7-host")["files"], TC_FILE: ""}), tmp_path / "root")
    change = by_key(plan(host, tmp_path, {"verbs_tos": 106}))[("roce", "verbs_tos")]
    assert (change.before, change.after, change.status) == (None, 106, m.PENDING)
    assert "overrides the ToS of every RoCE QP" in change.note
    out = apply(host, tmp_path, {"verbs_tos": 106})
    assert out.error is None, out.error
    assert by_key(out)[("roce", "verbs_tos")].status == m.APPLIED
    assert host.kernel.read_file(TC_FILE) == "Global tclass=106\n"
    Engine(host, str(tmp_path / "state")).rollback()
    assert host.kernel.read_file(TC_FILE) == ""


def test_verbs_tos_reads_the_global_tclass_line(tmp_path):
    host = FakeHost(rail_state(files={**load_state("cx7-host")["files"],
                                      TC_FILE: "Global tclass=106\ndst_ip=198.18.0.9/32,tclass=96\n"}),
                    tmp_path / "root")
    fam = RoceFamily(host)
    fam.expand(P0, {"roce": {"verbs_tos": 106}}, lambda *a: "")
    key = Key("roce", P0, "verbs_tos")
    assert fam.read([key])[key] == 106


# -- item 13: a PFC change on mlx5 drops the link -----------------------------------------

def test_pfc_change_is_marked_disruptive_on_mlx5(rails, tmp_path):
    changes = by_key(plan(rails, tmp_path, {"pfc": [3], "pfc_cable_length": 30, "dcbx": "host"}))
    assert "mlx5_toggle_port_link" in changes[("dcb", "pfc")].disruptive
    assert changes[("dcb", "pfc_cable_length")].disruptive == ""
    assert changes[("dcb", "dcbx")].disruptive == ""
    fam = DcbFamily(rails)
    assert fam.disruptive(Key("dcb", P0, "pfc"), [3], [3]) == ""
    assert fam.disruptive(Key("dcb", "eth0", "pfc"), [], [3]) == ""  # igb: not mlx5
