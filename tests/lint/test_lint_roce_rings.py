"""Lint rules for RoCE and rings: the CNP class, PFC against global pause and ECN,
ECT in every ToS, one traffic class across RDMA-CM, verbs, NCCL, UCX and
NVSHMEM, NCCL_IB_FIFO_TC placement, and ring sizes the NIC class rounds or
refuses; plus the README's RoCE example, linted as it is written.

host.ucx, host.nvshmem and roce.verbs_tos are being added to the schema by
other work: profiles that use them are built here as the loader builds them
(extends merged, key positions kept) without the schema check, so these
rules are tested whether or not the schema has them yet."""

from __future__ import annotations

import os
import re
import textwrap

import pytest

from nictune.host.facts import nicclass
from nictune.profile.lint import lint
from nictune.profile.loader import Profile, load_profile_text, sources_of
from nictune.profile.merge import Resolver
from nictune.profile.yamlpos import parse_text

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A lossless mlx5 rail that lints clean; each test breaks one thing.
GOOD = textwrap.dedent("""\
    nictune: 1
    interfaces:
      rail:
        match: {name: "ens*np0", driver: mlx5_core}
        mtu: 9000
        pause: {rx: false, tx: false}
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
          NCCL_IB_GID_INDEX: auto
""")


def edit(text: str, *pairs) -> str:
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def run(*pairs, text: str = GOOD) -> list:
    return lint(load_profile_text(edit(text, *pairs), "p.yaml"))


def unchecked(text: str) -> Profile:
    """The profile the loader would build, without the schema check."""
    merged = Resolver().resolve(parse_text(text, "p.yaml"), "p.yaml", None, [("p.yaml", None)])
    return Profile("p.yaml", merged.doc, sources_of(merged), ["p.yaml"])


def run_unchecked(*pairs, text: str = GOOD) -> list:
    return lint(unchecked(edit(text, *pairs)))


def codes(findings) -> list:
    return [(f.code, f.severity) for f in findings]


def line_of(text: str, needle: str) -> str:
    return f"p.yaml:{next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)}"


def test_the_base_profile_is_clean_with_and_without_the_schema():
    assert run() == []
    assert run_unchecked() == []


# -- item 1: the CNP class ------------------------------------------------------

README_OLD_TSA = ("tc_tsa: [ets, strict, strict, ets, strict, strict, strict, strict]",
                  "tc_tsa: [ets, strict, strict, ets, strict, strict, ets, strict]")


def test_a_cnp_class_with_no_share_and_not_strict_is_an_error():
    found = run(README_OLD_TSA)  # the README's example before issue 11
    assert codes(found) == [("cnp-class-starved", "error")]
    assert found[0].locations == (line_of(GOOD, "ecn:"), line_of(GOOD, "prio_tc"),
                                  line_of(GOOD, "tc_bw"), line_of(GOOD, "tc_tsa"))
    assert "priority 6" in found[0].message and "traffic class 6" in found[0].message
    assert "mlx5e_build_tc_group" in found[0].message


def test_the_cnp_priority_comes_from_the_cnp_dscp_without_cnp_prio():
    found = run(README_OLD_TSA, ("cnp_dscp: 48, cnp_prio: 6}", "cnp_dscp: 48}"))
    assert codes(found) == [("cnp-class-starved", "error")]
    assert found[0].locations[:2] == (line_of(GOOD, "ecn:"), line_of(GOOD, "dscp_map"))


def test_a_cnp_class_with_a_share_is_fine():
    assert run(("tc_bw: [50, 0, 0, 50, 0, 0, 0, 0]", "tc_bw: [45, 0, 0, 50, 0, 0, 5, 0]"),
               README_OLD_TSA) == []


def readme_roce_example() -> str:
    # The README's RoCE example lives in the RoCE how-to since the README
    # became a front door.
    with open(os.path.join(REPO, "docs", "howto", "roce.md")) as f:
        readme = f.read()
    section = readme.split("\n## RoCE v2\n", 1)
    assert len(section) == 2, "docs/howto/roce.md has no '## RoCE v2' section"
    block = re.search(r"```yaml\n(.*?)```", section[1], re.S)
    assert block and "roce:" in block.group(1), "no yaml block with roce: under '## RoCE v2'"
    return block.group(1)


def test_the_readme_roce_example_lints_clean():
    example = readme_roce_example()
    # The README shows the keys only; a profile file starts with the version.
    text = example if example.startswith("nictune:") else "nictune: 1\n" + example
    assert lint(load_profile_text(text, "docs/howto/roce.md")) == []


# -- item 9: PFC and link-level pause --------------------------------------------

def test_pfc_with_global_pause_on_is_an_error():
    found = run(("pause: {rx: false, tx: false}", "pause: {rx: false, tx: true}"))
    assert codes(found) == [("pfc-with-global-pause", "error")]
    assert found[0].locations == (line_of(GOOD, "pause:"), line_of(GOOD, "pfc: [3]"))
    assert "tx" in found[0].message and "rx and" not in found[0].message
    # No PFC: global pause is the profile's business.
    assert run(("pause: {rx: false, tx: false}", "pause: {rx: true, tx: true}"),
               ("pfc: [3]", "pfc: []")) == []


def test_pfc_with_pause_left_as_an_mlx5_port_has_it_is_a_warning():
    text = edit(GOOD, ("    pause: {rx: false, tx: false}\n", ""))
    found = run(text=text)
    assert codes(found) == [("pfc-global-pause-unset", "warning")]
    assert found[0].locations == (line_of(text, "pfc: [3]"), line_of(text, "match:"))
    assert "rx and tx" in found[0].message and "mlx5" in found[0].message
    found = run(("pause: {rx: false, tx: false}", "pause: {rx: false}"))
    assert codes(found) == [("pfc-global-pause-unset", "warning")]
    assert "pause tx" in found[0].message
    # A driver whose boot default lint does not know: no guess.
    assert run(("    pause: {rx: false, tx: false}\n", ""),
               ('match: {name: "ens*np0", driver: mlx5_core}', 'match: {name: "ens*np0"}')) == []


# -- item 11a: PFC without ECN ----------------------------------------------------

def test_pfc_on_a_used_priority_without_ecn_is_a_warning():
    found = run(('dscp_map: {"26": 3, "48": 6}', 'dscp_map: {"26": 3, "34": 4, "48": 6}'),
                ("pfc: [3]", "pfc: [3, 4]"))
    assert codes(found) == [("pfc-without-ecn", "warning")]
    assert "priority 4" in found[0].message and "np and rp" in found[0].message
    assert found[0].locations == (line_of(GOOD, "pfc: [3]"), line_of(GOOD, "ecn:"))
    found = run(("np: [3], rp: [3]", "np: [3], rp: []"))
    assert [(f.code, "rp" in f.message) for f in found] == [("pfc-without-ecn", True)]


def test_without_ecn_enables_the_device_keeps_its_own_and_lint_is_silent():
    assert run(("np: [3], rp: [3]", "np: [], rp: []")) == []
    assert run(("      ecn: {np: [3], rp: [3], cnp_dscp: 48, cnp_prio: 6}\n", "")) == []


# -- item 11b: ECT in the ECN bits ---------------------------------------------

def test_a_tos_without_ect_while_ecn_is_on_is_a_warning():
    found = run(("tos: 106", "tos: 104"), ("NCCL_IB_TC: 106", "NCCL_IB_TC: 104"))
    assert codes(found) == [("tos-not-ect", "warning")] * 2
    assert [f.locations for f in found] == [(line_of(GOOD, "tos: 106"), line_of(GOOD, "ecn:")),
                                            (line_of(GOOD, "NCCL_IB_TC"), line_of(GOOD, "ecn:"))]
    assert "Not-ECT" in found[0].message and "106" in found[0].message
    found = run(("tos: 106", "tos: 107"), ("NCCL_IB_TC: 106", "NCCL_IB_TC: 107"))
    assert "CE" in found[0].message
    # ECT(1) is ECT; without ECN enables the bits do not matter.
    assert run(("tos: 106", "tos: 105"), ("NCCL_IB_TC: 106", "NCCL_IB_TC: 105")) == []
    assert run(("tos: 106", "tos: 104"), ("NCCL_IB_TC: 106", "NCCL_IB_TC: 104"),
               ("np: [3], rp: [3]", "np: [], rp: []")) == []


def test_a_host_traffic_class_is_reported_once_for_several_ecn_entries():
    second = textwrap.indent(textwrap.dedent("""\
        rail2:
          match: {name: "ens*np1"}
          roce: {tos: 104, dscp_map: {"26": 3}, ecn: {np: [3], rp: [3]}}
    """), "  ")
    text = edit(GOOD, ("\nhost:\n", "\n" + second + "host:\n"), ("tos: 106", "tos: 104"),
                ("NCCL_IB_TC: 106", "NCCL_IB_TC: 104"))
    found = [f for f in lint(load_profile_text(text, "p.yaml")) if f.code == "tos-not-ect"]
    said = sorted(f.message.split(" has ")[0] for f in found)
    assert said == sorted(["interfaces.rail: NCCL_IB_TC 104", "interfaces.rail: roce.tos 104",
                           "interfaces.rail2: roce.tos 104"])


# -- item 11c: one traffic class everywhere ---------------------------------------

UCX = "  ucx:\n    env: {UCX_IB_TRAFFIC_CLASS: %s}\n"
NVSHMEM = "  nvshmem:\n    env: {NVSHMEM_IB_TRAFFIC_CLASS: %s}\n"


def with_host(text: str, section: str) -> str:
    return text + section


def test_ucx_nvshmem_and_verbs_tos_must_equal_roce_tos():
    text = with_host(GOOD, UCX % 98)
    found = run_unchecked(text=text)
    assert codes(found) == [("traffic-class-mismatch", "error")]
    assert found[0].locations == (line_of(text, "UCX_IB_TRAFFIC_CLASS"), line_of(text, "tos: 106"))
    assert "UCX_IB_TRAFFIC_CLASS is 98 but roce.tos is 106" in found[0].message
    text = with_host(GOOD, NVSHMEM % 104)
    assert codes(run_unchecked(text=text)) == [("traffic-class-mismatch", "error"),
                                               ("tos-not-ect", "warning")]
    found = run_unchecked(("      tos: 106\n", "      tos: 106\n      verbs_tos: 98\n"))
    assert codes(found) == [("traffic-class-mismatch", "error")]
    assert "roce.verbs_tos is 98 but roce.tos is 106" in found[0].message
    assert run_unchecked(text=with_host(with_host(GOOD, UCX % 106), NVSHMEM % '"106"')) == []


def test_verbs_tos_alone_is_the_reference_and_nccl_must_follow_it():
    verbs_only = ("      tos: 106\n", "      verbs_tos: 106\n")
    found = run_unchecked(verbs_only, ("NCCL_IB_TC: 106", "NCCL_IB_TC: 98"))
    assert codes(found) == [("traffic-class-mismatch", "error")]
    assert "NCCL_IB_TC is 98 but roce.verbs_tos is 106" in found[0].message
    found = run_unchecked(verbs_only, ("      NCCL_IB_TC: 106\n", ""))
    assert codes(found) == [("nccl-tc-unset", "warning")]


def test_libraries_left_unset_send_with_their_own_default():
    # UCX's auto is 106 on RoCE v2: right for tos 106, wrong for 98.
    assert run_unchecked(text=with_host(GOOD, UCX % "auto")) == []
    text = with_host(edit(GOOD, ("tos: 106", "tos: 98"), ("NCCL_IB_TC: 106", "NCCL_IB_TC: 98"),
                          ('"26": 3', '"24": 3')),
                     "  ucx:\n    env: {UCX_TLS: rc}\n")
    found = run_unchecked(text=text)
    assert codes(found) == [("traffic-class-unset", "warning")]
    assert found[0].locations == (line_of(text, "tos: 98"), line_of(text, "ucx:"))
    # NVSHMEM's default is 0.
    found = run_unchecked(text=with_host(GOOD, "  nvshmem:\n    env: {NVSHMEM_IB_GID_INDEX: 3}\n"))
    assert codes(found) == [("traffic-class-unset", "warning")]
    assert "NVSHMEM_IB_TRAFFIC_CLASS is not set" in found[0].message


def test_host_traffic_classes_agree_without_any_roce_entry():
    text = textwrap.dedent("""\
        nictune: 1
        host:
          nccl:
            env: {NCCL_IB_TC: 106}
          ucx:
            env: {UCX_IB_TRAFFIC_CLASS: 98}
          nvshmem:
            env: {NVSHMEM_IB_TRAFFIC_CLASS: 300}
    """)
    found = lint(unchecked(text))
    assert codes(found) == [("traffic-class-invalid", "error"), ("traffic-class-mismatch", "error")]
    assert found[1].locations == (line_of(text, "UCX_IB"), line_of(text, "NCCL_IB_TC"))


# -- item 11d: NCCL_IB_FIFO_TC ------------------------------------------------------

def fifo(value) -> tuple:
    return ("NCCL_IB_TC: 106", f"NCCL_IB_TC: 106\n      NCCL_IB_FIFO_TC: {value}")


def test_fifo_tc_on_a_mapped_strict_class_is_fine():
    assert run(fifo(192)) == []   # DSCP 48: priority 6, strict


def test_fifo_tc_on_an_unmapped_dscp_is_a_warning():
    found = run(fifo(184))        # DSCP 46
    assert codes(found) == [("fifo-tc-unmapped", "warning")]
    assert "DSCP 46" in found[0].message and "priority 0" in found[0].message


def test_fifo_tc_in_a_class_without_bandwidth_is_an_error():
    text = edit(GOOD, fifo(192), README_OLD_TSA)
    found = run(text=text)
    assert codes(found) == [("cnp-class-starved", "error"), ("fifo-tc-starved", "error")]
    assert found[1].locations == (line_of(text, "NCCL_IB_FIFO_TC"), line_of(text, "dscp_map"),
                                  line_of(text, "prio_tc"), line_of(text, "tc_bw"),
                                  line_of(text, "tc_tsa"))


def test_fifo_tc_on_an_ecn_priority_needs_ect_and_a_byte():
    found = run(fifo(104))        # DSCP 26 (priority 3, ECN on) without ECT
    assert codes(found) == [("tos-not-ect", "warning")]
    assert "NCCL_IB_FIFO_TC 104" in found[0].message
    assert ("nccl-tc-invalid", "error") in codes(run(fifo(256)))


# -- item 11e / 2: ring sizes the NIC class rounds or refuses -----------------------

MANA = textwrap.dedent("""\
    nictune: 1
    interfaces:
      vf:
        match: {driver: mana}
        rings: {rx: RX, tx: 1024}
""")


def rings(rx, driver: str = "mana") -> list:
    text = MANA.replace("RX", str(rx)).replace("driver: mana", f"driver: {driver}")
    return lint(load_profile_text(text, "p.yaml"))


def test_a_ring_size_mana_rounds_up_is_a_warning():
    found = rings(6000)
    assert codes(found) == [("rings-rounded", "warning")]
    assert "reads back 8192" in found[0].message and "power of two" in found[0].message
    assert found[0].locations == ("p.yaml:5", "p.yaml:4")
    assert rings(4096) == [] and rings("{min: 6000}") == []


def test_a_ring_size_outside_the_class_limits_is_an_error():
    assert codes(rings(64)) == [("rings-out-of-range", "error")]
    assert codes(rings(16384)) == [("rings-out-of-range", "error")]   # rx max is 8192 on mana
    assert codes(rings("{max: 64}")) == [("rings-out-of-range", "error")]
    assert rings("{min: 64}") == []  # met by any size mana takes


@pytest.mark.parametrize("rx", [6000, 100, 8192, 16384])
def test_mlx5_rings_follow_the_class_table(rx):
    """Whatever nicclass says mlx5 does (rounding to a power of two, the rx
    minimum of 128 once the table has them): lint agrees with it."""
    least, most = nicclass.MLX5.rings["rx"]
    if not least <= rx <= most:
        expected = [("rings-out-of-range", "error")]
    elif nicclass.rings_effective("mlx5_core", "rx", rx) != rx:
        expected = [("rings-rounded", "warning")]
    else:
        expected = []
    assert codes(rings(rx, "mlx5_core")) == expected
