"""DCB, RoCE and NCCL-auto knobs on the fake kernel (tests/fakes.py: a
labelled fake of mlx5's dcbnl ops, and the sysfs fixture trees)."""

from __future__ import annotations

import os

import pytest

from fakes import FakeHost, cx7_rails_state
from nictune.host import model as m
from nictune.host.transaction.engine import Engine
from nictune.host.knobs.dcb import DcbFamily, default_dscp_map
from nictune.host.knobs.nccl import AutoUnresolved, NcclFamily, resolve_auto
from nictune.host.knobs.roce import RoceFamily
from nictune.host.model import HOST, Key, Unsupported, Want
from nictune.host.validate import InvalidInput

P0, P1 = "enp23s0f0np0", "enp23s0f1np1"
ROCE = {"trust": "dscp", "dscp_map": {"26": 3, "48": 6}, "pfc": [3],
        "ets": {"prio_tc": [0, 1, 2, 3, 4, 5, 6, 7], "tc_bw": [50, 0, 0, 50, 0, 0, 0, 0],
                "tc_tsa": ["ets", "strict", "strict", "ets", "strict", "strict", "strict", "strict"]},
        "mode": "v2", "tos": 106,
        "ecn": {"np": [3], "rp": [3], "cnp_dscp": 48, "cnp_prio": 6, "params": {"rpg_ai_rate": 7}}}


rail_state = cx7_rails_state


@pytest.fixture
def rails(tmp_path):
    return FakeHost(rail_state(), tmp_path / "root")


def doc(roce=ROCE, env=None, **entry) -> dict:
    d = {"nictune": 1, "interfaces": {"rail": {"match": {"name": P0}, "roce": roce, **entry}}}
    if env is not None:
        d["host"] = {"nccl": {"env": env}}
    return d


def by_key(outcome) -> dict:
    return {(c.key.family, c.key.name): c for c in outcome.changes}


def test_apply_writes_everything_and_reads_it_back(rails, tmp_path):
    out = Engine(rails, str(tmp_path / "state")).apply(doc(), {}, "p.yaml")
    assert out.error is None, out.error
    assert {c.status for c in out.changes} <= {m.APPLIED, m.OK}
    dev = rails.kernel.dcb[P0]
    assert sorted((a.protocol, a.priority) for a in dev.apps) == [(26, 3), (48, 6)]
    assert dev.pfc.pfc_en == 1 << 3
    assert dev.ets.tc_tsa == [2, 0, 0, 2, 0, 0, 0, 0] and dev.ets.tc_tx_bw[3] == 50
    assert rails.kernel.dcb[P1].pfc.pfc_en == 0  # not matched
    ecn = "sys/class/net/%s/ecn/" % P0
    assert rails.kernel.read_file(ecn + "roce_np/enable/3") == "1"
    assert rails.kernel.read_file(ecn + "roce_np/enable/2").strip() == "0"
    assert rails.kernel.read_file(ecn + "roce_rp/rpg_ai_rate") == "7"
    cm = "sys/kernel/config/rdma_cm/mlx5_0/ports/1/"
    assert rails.kernel.read_file(cm + "default_roce_mode") == "RoCE v2"
    assert rails.kernel.read_file(cm + "default_roce_tos") == "106"
    # PFC and ETS are each one message.
    ops = [op for op, ifname, _ in rails.kernel.writes if ifname == P0]
    assert ops.count("set_pfc") == 1 and ops.count("set_ets") == 1
    # A second plan finds nothing to do.
    again = Engine(rails, str(tmp_path / "state")).plan(doc(), {})
    assert {c.status for c in again.changes} == {m.OK}


def test_failure_after_dcb_restores_every_vector(rails, tmp_path):
    before = rails.kernel.snapshot()
    rails.kernel.fail("set_link", P0)
    out = Engine(rails, str(tmp_path / "state")).apply(doc(mtu=9000), {}, "p.yaml")
    assert out.error["kind"] == "rolled-back"
    assert by_key(out)[("dcb", "ets.tc_bw")].status == m.REVERTED
    after = rails.kernel.snapshot()
    assert after["dcb"] == before["dcb"]
    assert after["files"] == before["files"]


def test_trust_dscp_alone_writes_the_default_map_and_pcp_deletes_it(rails, tmp_path):
    Engine(rails, str(tmp_path / "s")).apply(doc({"trust": "dscp"}), {}, "p.yaml")
    apps = {str(a.protocol): a.priority for a in rails.kernel.dcb[P0].apps}
    assert apps == default_dscp_map()
    out = Engine(rails, str(tmp_path / "s")).apply(doc({"trust": "pcp"}), {}, "p.yaml")
    assert by_key(out)[("dcb", "trust")].before == "dscp"
    assert rails.kernel.dcb[P0].apps == []


def test_dscp_map_is_exact_and_replaces_changed_entries(tmp_path):
    host = FakeHost(rail_state(dcb={P0: {"apps": [[5, 1, 26], [5, 0, 10]]}, P1: {}}), tmp_path / "r")
    out = Engine(host, str(tmp_path / "s")).apply(doc({"dscp_map": {"26": 3, "48": 6}}), {}, "p.yaml")
    assert by_key(out)[("dcb", "dscp_map")].before == {"10": 0, "26": 1}
    assert sorted((a.protocol, a.priority) for a in host.kernel.dcb[P0].apps) == [(26, 3), (48, 6)]


def test_ets_bandwidth_not_100_is_refused_before_any_write(rails, tmp_path):
    roce = {"ets": {"tc_bw": [50, 0, 0, 40, 0, 0, 0, 0],
                    "tc_tsa": ["ets", "strict", "strict", "ets", "strict", "strict", "strict", "strict"]}}
    out = Engine(rails, str(tmp_path / "s")).apply(doc(roce), {}, "p.yaml")
    assert out.error["kind"] == "unsupported"
    assert "sum to 90" in by_key(out)[("dcb", "ets.tc_bw")].note
    assert rails.kernel.writes == []


def test_bandwidth_on_a_class_that_is_not_ets_is_refused(rails, tmp_path):
    roce = {"ets": {"tc_bw": [50, 10, 0, 40, 0, 0, 0, 0],
                    "tc_tsa": ["ets", "strict", "strict", "ets", "strict", "strict", "strict", "strict"]}}
    out = Engine(rails, str(tmp_path / "s")).apply(doc(roce), {}, "p.yaml")
    assert "traffic class 1 is strict, so its tc_bw must be 0" in by_key(out)[("dcb", "ets.tc_bw")].note
    assert rails.kernel.writes == []


def test_bandwidth_reads_as_0_on_strict_and_vendor_classes(rails, tmp_path):
    # mlx5 reports 100% for them; the profile says 0: no endless drift.
    assert rails.kernel.dcb[P0].ets.tc_tx_bw == [100] * 8
    plan = Engine(rails, str(tmp_path / "s")).plan(doc(), {})
    assert by_key(plan)[("dcb", "ets.tc_bw")].before == [0] * 8
    assert Engine(rails, str(tmp_path / "s")).apply(doc(), {}, "p.yaml").error is None
    assert rails.kernel.dcb[P0].ets.tc_tx_bw == [50, 100, 100, 50, 100, 100, 100, 100]
    out = Engine(rails, str(tmp_path / "s")).rollback()
    assert out.error is None and rails.kernel.dcb[P0].ets.tc_tsa == [255] * 8


def test_trust_pcp_with_a_map_is_refused(rails):
    fam = DcbFamily(rails)
    fam.expand(P0, {"roce": {"trust": "pcp", "dscp_map": {"26": 3}}}, lambda *p: "")
    assert "contradict" in fam.check(Key("dcb", P0, "trust"), Want("pcp"))


def test_devices_without_dcb_say_why(tmp_path):
    host = FakeHost(rail_state(dcb={}), tmp_path / "r")
    fam = DcbFamily(host)
    got = fam.read([Key("dcb", P0, "pfc")])[Key("dcb", P0, "pfc")]
    assert isinstance(got, Unsupported) and got.reason.startswith("no DCB on mlx5_core")


def test_maia_dcb_and_ecn_are_not_supported_by_mana(maia):
    fam, roce = DcbFamily(maia), RoceFamily(maia)
    key = Key("dcb", "enP30832p0s0", "trust")
    assert fam.read([key])[key].reason.startswith("not supported by mana")
    key = Key("roce", "enP30832p0s0", "ecn.np")
    assert roce.read([key])[key].reason.startswith("not supported by mana")


def test_ecn_without_ofed_sysfs_and_unknown_params(rails):
    fam = RoceFamily(rails)
    igb = Key("roce", "eth0", "ecn.np")
    assert "no /sys/class/net/<if>/ecn" in fam.read([igb])[igb].reason
    made_up = Key("roce", P0, "ecn.rpg_made_up")
    assert "exposes no ECN setting rpg_made_up" in fam.read([made_up])[made_up].reason
    with pytest.raises(InvalidInput):
        fam.expand(P0, {"roce": {"ecn": {"params": {"../x": 1}}}}, lambda *p: "")


def test_explicit_rdma_device(rails):
    fam = RoceFamily(rails)
    fam.expand(P0, {"roce": {"rdma_device": "mlx5_1", "tos": 1}}, lambda *p: "")
    key = Key("roce", P0, "tos")
    assert fam.read([key])[key] == 0 and fam.note(key).startswith("rdma_cm mlx5_1 port 1")
    fam.expand(P0, {"roce": {"rdma_device": "mlx5_9", "tos": 1}}, lambda *p: "")
    assert fam.read([key])[key].reason == "no RDMA device mlx5_9 on this host"


# -- NCCL auto -------------------------------------------------------------------

def test_auto_resolves_hca_and_gid_index(rails):
    env, note = resolve_auto(rails, {"NCCL_IB_HCA": "auto", "NCCL_IB_GID_INDEX": "auto", "NCCL_IB_TC": 106})
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": 3, "NCCL_IB_TC": 106}
    assert note == ("auto: mlx5_0 port 1 GID 3 (RoCE v2, 198.18.0.1), "
                    "mlx5_1 port 1 GID 3 (RoCE v2, 198.18.0.5)")


def test_auto_skips_ports_whose_netdev_is_down(tmp_path):
    state = rail_state()
    state["links"] = [dict(l, up=False) if l["name"] == P1 else l for l in state["links"]]
    host = FakeHost(state, tmp_path / "r")
    env, _ = resolve_auto(host, {"NCCL_IB_HCA": "auto"})
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1"


def test_auto_gid_index_differing_names_each_device(rails):
    port = rails.path("sys/class/infiniband/mlx5_1/ports/1")
    for n in (2, 3):  # move the IPv4 pair of mlx5_1 to indexes 4 and 5
        for part in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            os.rename(os.path.join(port, part, str(n)), os.path.join(port, part, str(n + 2)) + ".new")
    for part in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        for n in (4, 5):
            os.replace(os.path.join(port, part, f"{n}.new"), os.path.join(port, part, str(n)))
    with pytest.raises(AutoUnresolved) as e:
        resolve_auto(rails, {"NCCL_IB_GID_INDEX": "auto"})
    assert "mlx5_0 port 1 (enp23s0f0np0) has it at 3" in str(e.value)
    assert "mlx5_1 port 1 (enp23s0f1np1) has it at 5" in str(e.value)


def test_auto_without_rdma_is_an_error(cx7):
    with pytest.raises(AutoUnresolved, match="no RoCE port"):
        resolve_auto(cx7, {"NCCL_IB_HCA": "auto"})


def test_nccl_names_missing_here_are_reported(rails):
    fam = NcclFamily(rails)
    [d] = fam.expand(HOST, {"nccl": {"env": {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_7:1",
                                              "NCCL_SOCKET_IFNAME": "=bond0"}}}, lambda *p: "")
    reason = fam.check(d.key, d.want)
    assert "NCCL_IB_HCA names mlx5_7:1" in reason and "NCCL_SOCKET_IFNAME names bond0" in reason
    [d] = fam.expand(HOST, {"nccl": {"env": {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "^docker,lo"}}},
                     lambda *p: "")
    assert fam.check(d.key, d.want) is None  # prefix match; exclusions


def test_plan_shows_the_resolved_value_with_a_note(rails, tmp_path):
    out = Engine(rails, str(tmp_path / "s")).plan(
        doc(env={"NCCL_IB_HCA": "auto", "NCCL_IB_GID_INDEX": "auto"}), {})
    nccl = by_key(out)[("nccl", "/etc/nccl.conf")]
    # Resolved from the ports under the interfaces the profile matched.
    assert "NCCL_IB_GID_INDEX=3\n" in nccl.after
    assert nccl.note.startswith("auto from enp23s0f0np0: mlx5_0 port 1 GID 3")
    assert rails.kernel.writes == []
