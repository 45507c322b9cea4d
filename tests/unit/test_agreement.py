"""Fleet agreement (control/review/agreement.py) over synthetic verify
reports: hosts that each match their own profile and still disagree with
their fabric are found, with the majority, the outliers and the failure
the disagreement predicts."""

from __future__ import annotations

import pytest

from nictune.control.review import agreement as ag
from nictune.host.knobs import nccl


def change(family, target, name, value, status="ok", after=None):
    return {"key": {"family": family, "target": target, "name": name}, "before": value,
            "after": value if after is None else after, "status": status}


def nccl_file(env: dict, status="ok", after=None):
    return change("nccl", "host", "/etc/nccl.conf", nccl.render(env), status, after)


def report(name, changes, facts=None, error=None):
    r = {"host": name, "changes": changes, "error": error}
    if facts is not None:
        r["facts"] = facts
    return r


def members(names_fabrics, docs=None):
    m = ag.Membership()
    for name, fabric in names_fabrics:
        m.add(name, ag.fabric_name(fabric), (docs or {}).get(name))
    return m


def rows_by_name(doc, fabric=None):
    [f] = [f for f in doc["fabrics"] if fabric is None or f["fabric"] == fabric]
    return {row["name"]: row for row in f["values"]}


def test_the_issue_sentence_nccl_ib_tc_106_on_95_hosts_0_on_5():
    # Two groups, two profiles: each host matches its own (status ok), and
    # the five hosts whose profile leaves NCCL_IB_TC unset run NCCL's 0.
    reports = [report(f"a{i:02d}", [nccl_file({"NCCL_IB_TC": 106})]) for i in range(95)]
    reports += [report(f"b{i}", [nccl_file({"NCCL_DEBUG": "WARN"})]) for i in range(5)]
    doc = ag.agreement(reports, members([(r["host"], "east") for r in reports]))
    row = rows_by_name(doc)["NCCL_IB_TC"]
    assert not row["agree"]
    assert row["majority"] == {"value": "106", "shown": "106", "count": 95}
    assert [(o["value"], o["hosts"]) for o in row["outliers"]] == [("0", [f"b{i}" for i in range(5)])]
    assert ag.sentence("east", row) == (
        "fabric east: NCCL_IB_TC 106 on 95 hosts, 0 on 5 (b0, b1, b2, b3, b4): their QPs use the "
        "peer's traffic class; collectives across them hang or lose PFC protection")
    # Every NCCL row is compared (unset: NCCL's default); only NCCL_IB_TC differs.
    nccl_rows = sum(1 for r in ag.MUST_MATCH if r.source.kind == "env" and r.source.family == "nccl")
    assert doc["summary"] == {"fabrics": 1, "compared": nccl_rows, "disagreeing": 1, "outlier_hosts": 5}
    assert ag.outlier_hosts(doc) == {f"b{i}" for i in range(5)}


def test_rails_that_differ_within_a_host_disagree_with_the_fabric():
    good = [change("link", "rail0", "mtu", 9000), change("link", "rail1", "mtu", 9000)]
    reports = [report("h1", good), report("h2", good),
               report("h3", [change("link", "rail0", "mtu", 9000), change("link", "rail1", "mtu", 4200)])]
    doc = ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")]))
    rows = rows_by_name(doc)
    assert rows["mtu"]["majority"]["count"] == 2
    [outlier] = rows["mtu"]["outliers"]
    assert outlier["hosts"] == ["h3"] and outlier["shown"] == "4200|9000 (rails differ)"
    assert outlier["value"] == {"rails": [4200, 9000]}
    assert rows["rails"]["agree"] and rows["rails"]["majority"]["value"] == 2


def test_each_fabric_is_compared_alone_and_hosts_without_one_not_at_all():
    reports = [report(n, [change("link", "rail0", "mtu", mtu)])
               for n, mtu in (("e1", 9000), ("e2", 9000), ("w1", 4200), ("w2", 4200), ("x", 1500))]
    m = members([("e1", "east"), ("e2", "east"), ("w1", "west"), ("w2", "west"), ("x", None)])
    doc = ag.agreement(reports, m)
    assert [f["fabric"] for f in doc["fabrics"]] == ["east", "west"]
    assert doc["summary"]["disagreeing"] == 0
    assert all(f["hosts"] == 2 for f in doc["fabrics"])


def test_values_come_from_what_the_host_has_not_what_its_profile_wants():
    # A drifted host: its profile wants 9000, it has 1500; the fabric sees 1500.
    reports = [report("h1", [change("link", "rail0", "mtu", 9000)]),
               report("h2", [change("link", "rail0", "mtu", 9000)]),
               report("h3", [change("link", "rail0", "mtu", 1500, "drift", after=9000)])]
    doc = ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")]))
    assert rows_by_name(doc)["mtu"]["outliers"][0]["value"] == 1500
    # What a plan leaves the hosts with (a change review): all agree.
    after = ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")]), side="after")
    assert rows_by_name(after)["mtu"]["agree"]
    # 1500 also leaves RoCE a 1024-byte MTU where 9000 gives 4096.
    assert ag.newly_disagreeing(after, doc) == {"hosts": ["h3"], "rows": ["f: mtu", "f: roce_active_mtu"],
                                                "fixed_hosts": []}
    assert ag.newly_disagreeing(doc, after) == {"hosts": [], "rows": [], "fixed_hosts": ["h3"]}


def test_unreadable_values_and_unreached_hosts_take_no_part():
    reports = [report("h1", [nccl_file({"NCCL_IB_TC": 106}), change("link", "rail0", "mtu", 9000)]),
               report("h2", [nccl_file({"NCCL_IB_TC": 106}), change("link", "rail0", "mtu", 9000)]),
               # a profile that manages no NCCL file: no value, not "unset"
               report("h3", [change("link", "rail0", "mtu", 9000)]),
               # a file nictune did not write: unsupported, its text a placeholder
               report("h4", [change("nccl", "host", "/etc/nccl.conf", "<file not written by nictune: 9 bytes>",
                                    "unsupported"), change("link", "rail0", "mtu", None, "unsupported")]),
               report("h5", [], error={"kind": "transport", "message": "unreachable"})]
    doc = ag.agreement(reports, members([(f"h{i}", "f") for i in range(1, 6)]))
    [fabric] = doc["fabrics"]
    assert fabric["not_compared"] == ["h5"]
    rows = rows_by_name(doc)
    assert doc["summary"]["disagreeing"] == 0
    assert rows["NCCL_IB_TC"]["majority"]["count"] == 2 and rows["NCCL_IB_TC"]["not_read"] == 2
    assert rows["mtu"]["majority"]["count"] == 3


def test_facts_firmware_speed_active_mtu_and_rdma_nic_count():
    def host(name, fw, speed, mtu, devices):
        facts = {f"rail{i}": {"driver": "mlx5_core", "firmware": fw, "link_speed_mbps": speed,
                              "rdma_device": dev, "rdma_port": 1}
                 for i, dev in enumerate(devices)}
        facts["eth0"] = {"driver": "igb", "link_speed_mbps": 1000}  # not a rail of the profile
        return report(name, [change("link", t, "mtu", mtu) for t in facts if t != "eth0"], facts)

    # The RoCE MTU by the kernel's rule (rdma.roce_mtu): 9000 and 4200 both
    # give 4096, 1500 gives 1024.
    reports = [host("h1", "28.39.1002", 400000, 9000, ["mlx5_0", "mlx5_1"]),
               host("h2", "28.39.1002", 400000, 4200, ["mlx5_0", "mlx5_1"]),
               host("h3", "28.37.1014", 200000, 1500, ["mlx5_0"])]
    rows = rows_by_name(ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")])))
    for name, majority, outlier in (("firmware", "28.39.1002", "28.37.1014"),
                                    ("link_speed_mbps", 400000, 200000),
                                    ("roce_active_mtu", 4096, 1024), ("rdma_nics", 2, 1), ("rails", 2, 1)):
        assert rows[name]["majority"]["value"] == majority, name
        assert [(o["value"], o["hosts"]) for o in rows[name]["outliers"]] == [(outlier, ["h3"])], name
    assert rows["driver"]["agree"]  # eth0's igb is not one of the rails


def test_dcb_maps_compare_as_a_whole():
    same = {"26": 3, "48": 6}
    reports = [report("h1", [change("dcb", "rail0", "dscp_map", same), change("dcb", "rail0", "pfc", [3])]),
               report("h2", [change("dcb", "rail0", "dscp_map", dict(reversed(list(same.items())))),
                             change("dcb", "rail0", "pfc", [3])]),
               report("h3", [change("dcb", "rail0", "dscp_map", {"26": 4, "48": 6}),
                             change("dcb", "rail0", "pfc", [4])])]
    rows = rows_by_name(ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")])))
    assert rows["dscp_map"]["majority"]["count"] == 2  # key order is not a difference
    assert rows["dscp_map"]["outliers"][0]["value"] == {"26": 4, "48": 6}
    assert rows["pfc"]["outliers"][0]["shown"] == "4"
    assert "loses PFC protection" in rows["dscp_map"]["predicts"]


def test_a_profile_skips_rows_and_adds_variables():
    docs = {n: {"agreement": {"skip": ["NCCL_IB_TC"], "env": {"nccl": ["NCCL_SOCKET_IFNAME"]}}}
            for n in ("h1", "h2", "h3")}
    reports = [report("h1", [nccl_file({"NCCL_IB_TC": 106, "NCCL_SOCKET_IFNAME": "bond0"})]),
               report("h2", [nccl_file({"NCCL_IB_TC": 106, "NCCL_SOCKET_IFNAME": "bond0"})]),
               report("h3", [nccl_file({"NCCL_IB_TC": 0, "NCCL_SOCKET_IFNAME": "eth0"})])]
    doc = ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")], docs))
    rows = rows_by_name(doc)
    assert "NCCL_IB_TC" not in rows
    assert rows["NCCL_SOCKET_IFNAME"]["outliers"][0]["hosts"] == ["h3"]
    assert [n for n in rows if not rows[n]["agree"]] == ["NCCL_SOCKET_IFNAME"]


def test_a_tie_has_one_majority_whatever_the_report_order():
    a = [report("h1", [change("link", "rail0", "mtu", 9000)]), report("h2", [change("link", "rail0", "mtu", 4200)])]
    m = members([("h1", "f"), ("h2", "f")])
    assert ag.agreement(a, m) == ag.agreement(list(reversed(a)), m)


def test_text_lines_say_the_verdict_per_fabric():
    reports = [report("h1", [change("link", "rail0", "mtu", 9000)]), report("h2", [change("link", "rail0", "mtu", 9000)]),
               report("h3", [change("link", "rail0", "mtu", 4200)])]
    lines = ag.text_lines(ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")])))
    # mtu, roce_active_mtu (4096 for both 9000 and 4200: it agrees) and rails
    assert lines[0] == "fabric f: 3 host(s), 3 value(s) compared, 1 value(s) disagree"
    assert lines[1].startswith("  fabric f: mtu 9000 on 2 hosts, 4200 on 1 (h3): frames larger")
    assert ag.text_lines(None) == []


@pytest.mark.parametrize("value", [None, ""])
def test_a_fabric_variable_that_names_no_fabric(value):
    assert ag.fabric_name(value) is None
    assert ag.fabric_name(7) == "7"


@pytest.mark.parametrize("value", [{"a": 1}, ["x"]])
def test_a_fabric_variable_that_cannot_name_one(value):
    with pytest.raises(ValueError, match="must be a fabric's name"):
        ag.fabric_name(value)


def test_a_bad_fabric_variable_stops_the_audit_before_any_host(tmp_path):
    from typer.testing import CliRunner

    from nictune.cli.app import app

    inventory = tmp_path / "inv.yaml"
    inventory.write_text("all:\n  hosts:\n    h1:\n      ansible_host: 198.18.0.1\n"
                         "      nictune_fabric: [east, west]\n")
    profile = tmp_path / "p.yaml"
    profile.write_text("nictune: 1\n")
    result = CliRunner().invoke(app, ["audit", str(profile), "-i", str(inventory)])
    assert result.exit_code == 1
    assert f"{inventory}:5" in result.output and "nictune_fabric of host 'h1' must be a fabric's name" \
        in result.output
    assert "Traceback" not in result.output


def test_every_row_names_a_failure_and_a_known_source():
    assert len(ag.MUST_MATCH) >= 30 and len(set(ag.NAMES)) == len(ag.NAMES)
    for row in ag.MUST_MATCH:
        assert row.predicts and row.source.kind in ("env", "rail", "fact", "count", "gid", "roce_mtu"), row.name


def plan_report(name, new_mtu, old_mtu):
    """A plan with a base: each side's wanted MTU of rail0 (control/review/change.py)."""
    return {"host": name, "error": None,
            "changes": [change("link", "rail0", "mtu", 9000, "pending" if new_mtu != 9000 else "ok", after=new_mtu)],
            "base": {"changes": [change("link", "rail0", "mtu", 9000, "ok", after=old_mtu)], "error": None}}


def test_a_change_that_makes_hosts_disagree_with_their_fabric():
    from nictune.control.review import markdown

    # The change lowers the MTU the west group's profile wants: west's two
    # hosts now disagree with east's three, which share their fabric.
    reports = [plan_report(f"e{i}", 9000, 9000) for i in range(3)]
    reports += [plan_report(f"w{i}", 4200, 9000) for i in range(2)]
    effect = ag.change_effect(reports, members([(r["host"], "f") for r in reports]))
    assert (effect["hosts"], effect["rows"], effect["fixed_hosts"]) == (["w0", "w1"], ["f: mtu"], [])
    assert ag.change_line(effect) == ("This change makes 2 host(s) disagree with their fabric (w0, w1) "
                                      "on f: mtu.")
    envelope = {"command": "plan", "hosts": reports, "exit_code": 2,
                "change": {"nictune_change": 1, "base": {"file": "old.yaml"}, "effect": [], "drift": [],
                           "errors": [], "lint": {"introduced": [], "fixed": []}, "agreement": effect,
                           "summary": {"hosts": 5, "affected": 2, "groups": 1, "drifted": 0, "errors": 0}}}
    text = markdown.report(envelope, "p.yaml")
    assert "**This change makes 2 host\\(s\\) disagree with their fabric" in text
    assert "#### Fabric disagreements once this change is applied" in text
    assert "`4200` on 2: `w0`, `w1`" in text
    # The reverse change brings them back.
    back = ag.change_effect([plan_report(r["host"], r["base"]["changes"][0]["after"], r["changes"][0]["after"])
                             for r in reports], members([(r["host"], "f") for r in reports]))
    assert back["hosts"] == [] and back["fixed_hosts"] == ["w0", "w1"]
    assert ag.change_line(back) == "This change brings 2 host(s) back into agreement (w0, w1)."


def test_the_audit_markdown_has_the_fabric_table():
    from nictune.control.review import markdown

    reports = [dict(report(n, [change("link", "rail0", "mtu", m)]), command="verify", exit_code=0,
                    summary={"ok": 1}, warnings=[])
               for n, m in (("h1", 9000), ("h2", 9000), ("h3", 4200))]
    doc = ag.agreement(reports, members([("h1", "f"), ("h2", "f"), ("h3", "f")]))
    text = markdown.report({"command": "audit", "hosts": reports, "exit_code": 2, "agreement": doc})
    assert "#### Fabric agreement" in text
    assert "| `f` | `mtu` | `9000` on 2 | `4200` on 1: `h3` | frames larger than" in text


def test_the_profile_agreement_section_is_checked_and_linted(tmp_path):
    from nictune.profile.errors import ProfileError
    from nictune.profile.lint import lint
    from nictune.profile.loader import load_profile

    good = tmp_path / "good.yaml"
    good.write_text("nictune: 1\nagreement:\n  skip: [firmware]\n  env:\n    nccl: [NCCL_SOCKET_IFNAME]\n"
                    "    ucx: [UCX_TLS]\nhost:\n  nccl:\n    env: {NCCL_SOCKET_IFNAME: bond0}\n")
    profile = load_profile(str(good))
    assert ag.Settings.of_profile(profile.doc).skip == {"firmware"}
    [finding] = [f for f in lint(profile) if f.code == "agreement-file-unset"]
    assert "agreement.env.ucx lists UCX_TLS, but the profile writes no host.ucx file" in finding.message
    assert finding.locations == (f"{good}:6",)

    bad = tmp_path / "bad.yaml"
    bad.write_text("nictune: 1\nagreement:\n  skip: [NCCL_IB_TCC]\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(bad))
    assert "bad.yaml:3" in str(e.value) and "NCCL_IB_TCC" in str(e.value)


def test_a_host_cannot_claim_a_fabric():
    from nictune.control.remote.hostreport import accept

    sent = {"host": "h1", "changes": [], "warnings": [], "error": None, "seconds": 0.1, "fabric": "other"}
    assert "fabric" not in accept(sent, "h1", "verify")


def test_the_kind_of_gid_nccl_will_use_on_each_rail():
    # Same NCCL_IB_GID_INDEX everywhere; on h3 index 3 is a RoCE v1 GID
    # (another GID table layout): NCCL on h3 talks RoCE v1 to RoCE v2 peers.
    v2 = {"0": "RoCE v1 IPv6 link-local", "1": "RoCE v2 IPv6 link-local", "2": "RoCE v1 IPv4", "3": "RoCE v2 IPv4"}
    v1 = {"0": "RoCE v1 IPv6 link-local", "3": "RoCE v1 IPv4"}

    def host(name, kinds, env):
        return report(name, [nccl_file(env), change("link", "rail0", "mtu", 9000)],
                      {"rail0": {"rdma_device": "mlx5_0", "rdma_port": 1, "roce_gids": kinds}})

    fixed = {"NCCL_IB_GID_INDEX": 3}
    rows = rows_by_name(ag.agreement([host("h1", v2, fixed), host("h2", v2, fixed), host("h3", v1, fixed)],
                                     members([("h1", "f"), ("h2", "f"), ("h3", "f")])))
    assert rows["nccl_gid"]["majority"]["value"] == "RoCE v2 IPv4"
    assert [(o["value"], o["hosts"]) for o in rows["nccl_gid"]["outliers"]] == [("RoCE v1 IPv4", ["h3"])]
    assert rows["NCCL_IB_GID_INDEX"]["agree"]  # the variable alone says nothing is wrong

    # Unset: NCCL selects RoCE v2 IPv4 (its defaults); h3 has none to select.
    rows = rows_by_name(ag.agreement([host("h1", v2, {}), host("h2", v2, {}), host("h3", v1, {})],
                                     members([("h1", "f"), ("h2", "f"), ("h3", "f")])))
    assert rows["nccl_gid"]["outliers"][0]["value"] == "no RoCE v2 IPv4 GID"
    six = {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}
    assert ag._gid_used(six, v2) == "no RoCE v2 IPv6 GID"
    assert ag._gid_used({"NCCL_IB_GID_INDEX": "7"}, v2) == "no GID at index 7"
