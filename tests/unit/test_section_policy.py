"""on_unsupported per section: a word or a mapping of profile paths
(schema.py _on_unsupported, engine.Policy), checked when the profile loads.

The host is the fake mlx5 kernel (tests/fakes.py: no ConnectX-7 here) with
an inbox driver's lack of /sys/class/net/X/ecn."""

from __future__ import annotations

import pytest

from fakes import FakeHost, load_state
from nictune.host import agent
from nictune.host.transaction.engine import Policy
from nictune.profile import ProfileError, load_profile_text


def test_the_longest_covering_path_wins_then_default_then_the_next_layer():
    entry = Policy({"roce": "skip", "roce.ecn": "warn"}, {"default": "fail", "rings": "warn"})
    assert entry.of("roce.ecn.np") == "warn"
    assert entry.of("roce.pfc") == "skip"
    assert entry.of("roce.ecnx") == "skip"  # a path, not a string prefix
    assert entry.of("rings.rx") == "warn"   # not in the entry's mapping: the profile's
    assert entry.of("mtu") == "fail"
    assert Policy({"default": "skip", "roce.ecn": "warn"}, "fail").of("mtu") == "skip"
    assert Policy("warn", {"roce.ecn": "skip"}).of("roce.ecn.np") == "warn"  # the entry's word first
    assert Policy(None, None).of("mtu") == "fail"


def _plan(text: str, tmp_path) -> dict:
    profile = load_profile_text(text, "p.yaml")
    state = load_state("cx7-host")
    state["dcb"] = {"enp23s0f0np0": {}, "enp23s0f1np1": {}}
    host = FakeHost(state, str(tmp_path / "root"))
    return agent.run({"nictune_request": agent.REQUEST_FORMAT, "command": "plan", "host": "h",
                      "state_dir": str(tmp_path / "state"),
                      "profile": {"path": "p.yaml", "doc": profile.doc, "sources": profile.sources}},
                     host=host)


RAILS = """nictune: 1
{top}interfaces:
  rails:
    match: {{name: enp23s0f0np0}}
{entry}    roce:
      pfc: [3]
      ecn: {{np: [3]}}
"""


def test_ecn_warns_while_the_rest_of_the_entry_still_fails(tmp_path):
    report = _plan(RAILS.format(top="", entry="    on_unsupported: {roce.ecn: warn}\n"), tmp_path)
    assert report.get("error") is None
    status = {c["key"]["name"]: c["status"] for c in report["changes"]}
    assert status == {"pfc": "pending", "ecn.np": "skipped"}
    assert any(w.startswith("skipped roce ecn.np on enp23s0f0np0: not supported by mlx5_core")
               for w in report["warnings"])


def test_without_the_section_word_the_plan_is_refused(tmp_path):
    report = _plan(RAILS.format(top="", entry=""), tmp_path)
    assert report["error"]["kind"] == "unsupported" and "ecn.np" in report["error"]["message"]


def test_a_profile_level_mapping_reaches_entries_and_skip_is_silent(tmp_path):
    report = _plan(RAILS.format(top="on_unsupported: {default: fail, roce.ecn: skip}\n", entry=""),
                   tmp_path)
    assert report.get("error") is None
    assert not [w for w in report["warnings"] if "ecn" in w]


@pytest.mark.parametrize("where, key, line", [
    ("top", "roce.ecm", 2),
    ("entry", "host.nccl", 5),   # a host path on an interface entry covers nothing
    ("entry", "rings.rx.x", 5),
])
def test_a_path_that_names_no_setting_is_refused_with_file_and_line(where, key, line):
    top = f"on_unsupported: {{{key}: warn}}\n" if where == "top" else ""
    entry = f"    on_unsupported: {{{key}: warn}}\n" if where == "entry" else ""
    text = RAILS.format(top=top, entry=entry)
    with pytest.raises(ProfileError) as info:
        load_profile_text(text, "p.yaml")
    err = info.value
    assert err.line == line and err.keypath.endswith(key)
    assert "names no setting here" in err.message and "\n" not in str(err)


def test_free_form_paths_below_a_mapping_are_settings():
    for key in ("sysctl.net.core.rmem_max", "features.rx-gro", "roce.ecn.params.rpg_ai_rate",
                "host.nccl.env.NCCL_IB_HCA", "default"):
        load_profile_text(RAILS.format(top=f"on_unsupported: {{{key}: warn}}\n", entry=""), "p.yaml")


def test_on_drift_paths_are_checked_the_same_way():
    with pytest.raises(ProfileError) as info:
        load_profile_text(RAILS.format(top="on_drift: {roce.ecm: restore}\n", entry=""), "p.yaml")
    assert info.value.line == 2 and "names no setting here" in info.value.message
    load_profile_text(RAILS.format(top="on_drift: {default: report, roce.ecn: restore}\n",
                                   entry="    on_drift: {mtu: restore}\n"), "p.yaml")
