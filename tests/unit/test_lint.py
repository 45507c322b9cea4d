"""nictune lint: one test per rule, on small profiles loaded through the
real loader (schema included), plus the shipped RoCE profiles and the CLI."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.cli.lint_cmds import LintFailed, lint_gate
from nictune.profile.lint import lint, lint_file, roce_mtu
from nictune.profile.loader import load_profile_text

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES = os.path.join(REPO, "profiles")

# A consistent lossless rail: each test breaks one layer of it.
GOOD = textwrap.dedent("""\
    nictune: 1
    interfaces:
      rail:
        match: {name: "ens*np0"}
        mtu: 9000
        roce:
          mode: v2
          tos: 106
          trust: dscp
          dscp_map: {"26": 3, "48": 6}
          pfc: [3]
          ets:
            prio_tc: [0, 1, 2, 3, 4, 5, 6, 7]
            tc_bw: [50, 0, 0, 50, 0, 0, 0, 0]
            tc_tsa: [ets, strict, strict, ets, strict, strict, strict, strict]
          ecn: {np: [3], rp: [3], cnp_dscp: 48, cnp_prio: 6}
    host:
      nccl:
        env:
          NCCL_IB_TC: 106
          NCCL_IB_GID_INDEX: 3
          NCCL_IB_HCA: "=mlx5_0:1,mlx5_1:1"
          NCCL_SOCKET_IFNAME: "=ens1np0"
""")


def run(text: str = GOOD, **edits: str) -> list:
    for old, new in edits.values():
        assert old in text, old
        text = text.replace(old, new)
    return lint(load_profile_text(text, "p.yaml"))


def codes(findings) -> list:
    return [(f.code, f.severity) for f in findings]


def line_of(text: str, needle: str) -> str:
    return f"p.yaml:{next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)}"


def test_a_consistent_profile_has_no_findings():
    assert run() == []


def test_nccl_tc_must_equal_the_tos_and_both_sides_are_named():
    found = run(e=("NCCL_IB_TC: 106", "NCCL_IB_TC: 98"))
    assert codes(found) == [("nccl-tc-mismatch", "error")]
    assert found[0].locations == (line_of(GOOD, "NCCL_IB_TC"), line_of(GOOD, "tos: 106"))


def test_nccl_tc_as_text_is_compared_as_a_number():
    assert run(e=("NCCL_IB_TC: 106", 'NCCL_IB_TC: "106"')) == []


def test_unset_nccl_tc_is_a_warning():
    assert codes(run(e=("      NCCL_IB_TC: 106\n", ""))) == [("nccl-tc-unset", "warning")]


def test_nccl_tc_out_of_range_is_an_error():
    assert ("nccl-tc-invalid", "error") in codes(run(e=("NCCL_IB_TC: 106", "NCCL_IB_TC: 300")))


def test_tos_whose_dscp_is_not_mapped():
    found = run(e=('dscp_map: {"26": 3, "48": 6}', 'dscp_map: {"24": 3, "48": 6}'))
    assert codes(found) == [("tos-dscp-unmapped", "error")]
    assert found[0].locations == (line_of(GOOD, "tos: 106"), line_of(GOOD, "dscp_map"))


def test_roce_priority_needs_pfc_or_ecn():
    # Lossy (ECN np+rp, no PFC) is fine; neither is an error.
    assert run(e=("pfc: [3]", "pfc: []")) == []
    found = run(e=("pfc: [3]", "pfc: []"), f=("np: [3], rp: [3]", "np: [3], rp: []"))
    assert codes(found) == [("roce-prio-unprotected", "error")]
    # Lossless without ECN is fine too.
    assert run(f=("np: [3], rp: [3]", "np: [], rp: []")) == []


def test_roce_traffic_class_without_bandwidth():
    found = run(e=("tc_bw: [50, 0, 0, 50", "tc_bw: [100, 0, 0, 0"))
    assert codes(found) == [("roce-tc-no-bandwidth", "error")]
    # A strict class needs no share.
    assert run(e=("tc_bw: [50, 0, 0, 50", "tc_bw: [100, 0, 0, 0"),
               f=("tc_tsa: [ets, strict, strict, ets", "tc_tsa: [ets, strict, strict, strict")) == []


def test_ets_bandwidth_must_sum_to_100_over_ets_classes():
    found = run(e=("tc_bw: [50, 0, 0, 50", "tc_bw: [40, 0, 0, 50"))
    assert codes(found) == [("ets-bandwidth-sum", "error")]
    assert "90%" in found[0].message


def test_trust_pcp_with_a_dscp_map_is_contradictory():
    found = run(e=("trust: dscp", "trust: pcp"))
    assert ("trust-pcp-with-dscp-map", "error") in codes(found)


def test_pfc_on_a_priority_nothing_uses_is_a_warning():
    found = run(e=("pfc: [3]", "pfc: [3, 5]"))
    assert codes(found) == [("pfc-unused-priority", "warning")]
    assert "priority 5" in found[0].message


def test_cnp_priority_with_pfc_is_a_warning():
    found = run(e=("pfc: [3]", "pfc: [3, 6]"))
    assert ("cnp-prio-lossless", "warning") in codes(found)


def test_cnp_dscp_and_priority_must_agree():
    found = run(e=("cnp_prio: 6", "cnp_prio: 5"))
    assert codes(found) == [("cnp-dscp-prio-mismatch", "error")]
    found = run(e=("cnp_dscp: 48", "cnp_dscp: 46"))
    assert codes(found) == [("cnp-dscp-unmapped", "warning")]


def test_fixed_gid_index_with_roce_v1():
    found = run(e=("mode: v2", "mode: v1"))
    assert codes(found) == [("gid-index-roce-v1", "error")]
    assert run(e=("mode: v2", "mode: v1"), f=("NCCL_IB_GID_INDEX: 3", "NCCL_IB_GID_INDEX: auto")) == []


@pytest.mark.parametrize("mtu,roce", [(1500, 1024), (4191, 2048), (4192, 4096), (9000, 4096)])
def test_roce_mtu_follows_the_kernel_rule(mtu, roce):
    assert roce_mtu(mtu) == roce


def test_an_mtu_that_caps_the_roce_mtu_is_a_warning():
    found = run(e=("mtu: 9000", "mtu: 4191"))
    assert codes(found) == [("mtu-caps-roce-mtu", "warning")]
    assert "2048" in found[0].message and "4192" in found[0].message
    assert run(e=("mtu: 9000", "mtu: 4192")) == []


def test_nccl_ib_hca_syntax():
    for bad in ("mlx5_0:1:2:3:4", "=mlx5_0:x", "mlx5_0,,mlx5_1"):
        found = run(e=('NCCL_IB_HCA: "=mlx5_0:1,mlx5_1:1"', f'NCCL_IB_HCA: "{bad}"'))
        assert codes(found) == [("nccl-ib-hca-syntax", "error")], bad
    for good in ("^=mlx5_4", "mlx5", "auto", "=mlx5_0:1:0:0"):
        assert run(e=('NCCL_IB_HCA: "=mlx5_0:1,mlx5_1:1"', f'NCCL_IB_HCA: "{good}"')) == [], good


@pytest.mark.parametrize("value,finding", [
    ("=ens1np0", False), ("ens", False), ("ens1", False), ("=eth0", True), ("eth", True),
    ("^eth", False), ("^ens", True), ("^=ens1np0", False),
])
def test_nccl_socket_ifname_against_entry_names(value, finding):
    found = run(e=('NCCL_SOCKET_IFNAME: "=ens1np0"', f'NCCL_SOCKET_IFNAME: "{value}"'))
    assert codes(found) == ([("nccl-socket-ifname-no-entry", "warning")] if finding else [])


def test_every_interface_with_roce_is_checked():
    spare = textwrap.indent(textwrap.dedent("""\
        spare:
          match: {name: "ens9*"}
          roce: {tos: 98, dscp_map: {"24": 3}, pfc: [3]}
    """), "  ")
    assert "\nhost:\n" in GOOD
    text = GOOD.replace("\nhost:\n", "\n" + spare + "host:\n")
    found = run(text)
    assert codes(found) == [("nccl-tc-mismatch", "error")]
    assert "interfaces.spare" in found[0].message


@pytest.mark.parametrize("name", ["connectx7-roce-lossless", "connectx7-roce-lossy", "maia-rdma",
                                  "connectx7-training", "maia-mana"])
def test_shipped_profiles_are_consistent(name):
    assert lint_file(os.path.join(PROFILES, f"{name}.yaml")) == []


def test_lint_gate_refuses_errors_unless_forced():
    bad = load_profile_text(GOOD.replace("NCCL_IB_TC: 106", "NCCL_IB_TC: 98"), "p.yaml")
    with pytest.raises(LintFailed) as e:
        lint_gate(bad, force=False)
    assert "nccl-tc-mismatch" in str(e.value) and "--force" in str(e.value)
    assert codes(lint_gate(bad, force=True)) == [("nccl-tc-mismatch", "error")]
    warn_only = load_profile_text(GOOD.replace("pfc: [3]", "pfc: [3, 5]"), "p.yaml")
    assert codes(lint_gate(warn_only, force=False)) == [("pfc-unused-priority", "warning")]


def _cli(*args):
    return CliRunner().invoke(app, list(args))


def test_cli_exit_codes_and_json(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    r = _cli("lint", str(good))
    assert r.exit_code == 0 and "consistent" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("NCCL_IB_TC: 106", "NCCL_IB_TC: 98"))
    r = _cli("lint", str(bad), "--json")
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["exit_code"] == 1
    assert [f["code"] for f in report["findings"]] == ["nccl-tc-mismatch"]
    warn = tmp_path / "warn.yaml"
    warn.write_text(GOOD.replace("pfc: [3]", "pfc: [3, 5]"))
    assert _cli("lint", str(warn)).exit_code == 0


def test_cli_profile_errors_exit_1(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("nictune: 1\ninterfaces: {rail: {match: {name: x}, roce: {tos: 999}}}\n")
    assert _cli("lint", str(broken)).exit_code == 1


# -- PFC headroom: cable length and port buffers (nicclass buffer rules) -----------------

def _rail(roce: str, driver: str = "mlx5_core") -> str:
    return (f"nictune: 1\ninterfaces:\n  rail:\n    match: {{driver: {driver}}}\n"
            f"    roce:\n{textwrap.indent(roce, '      ')}")


def _codes(text: str) -> list:
    return [(f.code, f.severity, f.locations) for f in lint(load_profile_text(text, "p.yaml"))]


def test_cable_length_without_buffers_is_a_warning():
    found = [f for f in lint(load_profile_text(_rail("pfc_cable_length: 30\n"), "p.yaml"))]
    assert [(f.code, f.severity, f.locations) for f in found] == [
        ("cable-length-without-buffers", "warning", ("p.yaml:6",))]
    assert "no effect while the firmware owns the buffers" in found[0].message


def test_buffers_without_cable_length_is_a_warning():
    text = _rail("buffer: {prio2buffer: [0, 0, 0, 1, 0, 0, 0, 0]}\n")
    found = lint(load_profile_text(text, "p.yaml"))
    assert [(f.code, f.severity) for f in found] == [("buffers-without-cable-length", "warning")]
    assert "sized for 7 m" in found[0].message and "one-way" in found[0].message


def test_cable_length_with_buffers_and_other_drivers_are_clean():
    both = _rail("pfc_cable_length: 30\nbuffer: {prio2buffer: [0, 0, 0, 1, 0, 0, 0, 0]}\n")
    assert _codes(both) == []
    assert _codes(_rail("pfc_cable_length: 30\n", driver="ice")) == []
