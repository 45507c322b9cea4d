"""Knob families describe themselves: the schema, the apply order and the
profile reference are built from what each family declares, and agree."""

from __future__ import annotations

import os

import pytest

from nictune.host.transaction.engine import Engine
from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.knobs import FAMILIES, REGISTERED, family_named
from nictune.host.knobs.base import Family
from nictune.host.knobs.link import LinkFamily
from nictune.host.model import Key, Unsupported
from nictune.profile import reference
from nictune.profile.schema import KIT, SCHEMA, build, describe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(REPO, "docs", "reference", "profile.md")


def _leaves(node: dict, prefix: str = ""):
    """Dotted paths of the settings below an object node: every property
    that is not itself a closed mapping of named keys, and every mapping of
    free-form keys (which stands for all of its keys)."""
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        child = reference.resolve(child)
        closed = "properties" in child and child.get("additionalProperties") is False
        if not closed:
            yield path
        if "properties" in child and child.get("type") == "object":
            yield from _leaves(child, path + ".")


def _declared(attribute: str) -> set:
    return {path for family in REGISTERED for path in family.settings
            if path.split(".")[0] in getattr(family, attribute)}


def test_the_entry_schema_holds_exactly_what_the_families_declare():
    entry = set(_leaves(SCHEMA["$defs"]["entry"]))
    engine_keys = {"on_unsupported", "on_drift", "match.name", "match.driver", "match.lower_driver",
                   "match.pci_id", "match.mac",
                   "match.phys_port_name", "match.phys_switch_id", "match.flavour",
                   "match.vf_of", "match.vfs"}
    assert entry - engine_keys == _declared("sections")
    assert engine_keys <= entry


def test_the_host_schema_holds_exactly_what_the_families_declare():
    assert set(_leaves(SCHEMA["properties"]["host"])) == _declared("host_sections")


def test_each_family_declares_the_sections_its_schema_has():
    assert REGISTERED
    for family in REGISTERED:
        parts = family.schema(KIT)
        assert tuple(parts.get("entry", {})) == family.sections, family.name
        assert tuple(parts.get("host", {})) == family.host_sections, family.name
        assert family.settings, family.name


def test_every_setting_is_in_the_checked_in_reference():
    with open(REFERENCE) as f:
        text = f.read()
    assert REGISTERED
    for family in REGISTERED:
        found = [path for path, _ in reference.settings_of(family)]
        assert found, family.name
        for path in found:
            assert f"### `{path}`" in text, path


def test_the_checked_in_reference_is_current():
    with open(REFERENCE) as f:
        assert f.read() == reference.render(), (
            "docs/reference/profile.md is stale: regenerate it with "
            "`.venv/bin/python -m nictune.profile.reference > docs/reference/profile.md`")


def test_families_are_registered_once_with_distinct_names_and_positions():
    assert len({f.name for f in REGISTERED}) == len(REGISTERED)
    assert len({f.position for f in REGISTERED}) == len(REGISTERED)
    assert set(FAMILIES) == set(REGISTERED)
    assert [f.position for f in FAMILIES] == sorted(f.position for f in FAMILIES)
    assert all(f.position_note for f in REGISTERED)
    assert family_named("rings").sections == ("rings",) and family_named("nope") is None


def test_the_apply_order_keeps_its_rules():
    order = [f.name for f in FAMILIES]
    before = lambda a, b: order.index(a) < order.index(b)  # noqa: E731
    # Files and sysctls cannot cut the management path: before any device.
    device = [f.name for f in FAMILIES if f.sections and not f.host_sections and not f.read_only]
    assert device
    assert all(before("sysctl", d) and before("nccl", d) for d in device)
    assert before("channels", "rings")       # a channel change can reallocate rings
    assert before("pause", "dcb")            # mlx5: pause off before PFC on
    assert before("dcb", "roce")             # ECN enables follow the DCB priorities
    # MTU and state last of what is written but the rails' routes, which the
    # kernel adds only through a link that is up (fib_check_nh: "Device for
    # nexthop is not up"); then the expectations and the switch port's view,
    # only read.
    assert order[-5:] == ["link", "routing", "expect", "gpudirect", "switch"]
    assert [f.name for f in FAMILIES if f.read_only] == ["expect", "gpudirect", "switch"]


class _Toy(Family):
    """A family as the next issue would add one: one module, nothing else."""

    name = "toy"
    position = 95
    position_note = "between roce and link"
    sections = ("toy",)
    settings = ("toy.level", "toy.colour")

    @classmethod
    def schema(cls, s):
        return {"entry": {"toy": s.section("A toy.", {
            "level": s.wanted(0, 7, "Level."),
            # A pattern of the family's own, with its words: no edit to validate.py.
            "colour": s.text(r"^(red|blue)$", 4, "Colour.", words="red or blue"),
        })}}


def test_a_new_family_reaches_the_schema_through_registration_alone():
    schema = build(REGISTERED + (_Toy,))
    assert "toy" in schema["$defs"]["entry"]["properties"]
    assert set(_leaves(schema["$defs"]["entry"])) >= {"toy.level", "toy.colour"}
    assert describe(schema["$defs"]["entry"]["properties"]["toy"]["properties"]["colour"]) == "red or blue"
    assert "toy" not in SCHEMA["$defs"]["entry"]["properties"]


def test_two_families_cannot_claim_the_same_setting():
    class Clash(_Toy):
        @classmethod
        def schema(cls, s):
            return {"entry": {"roce": s.section("x", {"pfc": s.integer(0, 1)})}}

    with pytest.raises(ValueError, match="roce.pfc is already declared"):
        build(REGISTERED + (Clash,))


def test_nic_support_comes_from_the_class_tables():
    assert family_named("dcb").nic_support("mana", "roce.pfc").startswith("not supported by mana")
    # mlx5: not on every netdev (issue 11 item 3), and a PFC change drops the link.
    assert family_named("dcb").nic_support("mlx5_core", "roce.pfc") == (
        "PF and uplink representor only, not on VFs or VF representors; a change toggles the port link")
    assert "power of two" in family_named("rings").nic_support("mana", "rings.rx")
    assert family_named("channels").nic_support("mlx5_core", "channels.rx").startswith("not supported")
    assert family_named("channels").nic_support("mlx5_core", "channels.combined") is None
    assert LinkFamily.nic_support("igb", "mtu") is None  # no class table: the kernel decides


def test_plans_name_interface_sysctls_as_the_profile_spells_them():
    sysctl = family_named("sysctl")
    assert sysctl.label("eth0.100", "net.ipv4.conf.eth0.100.rp_filter") == "ipv4.rp_filter"
    assert sysctl.label("host", "net.ipv4.tcp_ecn") == "net.ipv4.tcp_ecn"
    # A name from a hostile host that does not fit is shown as it came.
    assert sysctl.label("eth0", "garbage") == "garbage"
    assert sysctl.label("eth0", "net.ipv4.conf.eth1.x") == "net.ipv4.conf.eth1.x"
    assert family_named("rings").label("eth0", "rx") == "rx"


# -- the error vocabulary at the family boundary -----------------------------

def test_invalid_input_is_a_nictune_error_and_a_value_error():
    assert issubclass(InvalidInput, NictuneError) and issubclass(InvalidInput, ValueError)
    assert InvalidInput("x").as_dict() == {"kind": "invalid-input", "message": "x"}


def _doc(policy: str) -> dict:
    return {"nictune": 1, "on_unsupported": policy,
            "host": {"sysctl": {"net.ipv4.tcp_ecn": 1},
                     "nccl": {"env": {"NCCL_IB_HCA": "auto", "NCCL_DEBUG": "WARN"}}}}


def test_an_unresolvable_nccl_auto_fails_like_any_unsupported_key(cx7, tmp_path):
    out = Engine(cx7, str(tmp_path / "s")).plan(_doc("fail"), {})
    assert out.error["kind"] == "unsupported"
    assert "nccl /etc/nccl.conf" in out.error["message"]
    assert "auto found no RoCE port" in out.error["message"]
    nccl = next(c for c in out.changes if c.key.family == "nccl")
    assert nccl.status == "unsupported"
    # The other keys were still read and planned.
    assert any(c.key.family == "sysctl" for c in out.changes)


def test_an_unresolvable_nccl_auto_is_skipped_with_a_warning_when_asked(cx7, tmp_path):
    out = Engine(cx7, str(tmp_path / "s")).apply(_doc("warn"), {}, "p.yaml")
    assert out.error is None
    assert [c.status for c in out.changes if c.key.family == "nccl"] == ["skipped"]
    assert any("no RoCE port" in w for w in out.warnings)
    assert [c.status for c in out.changes if c.key.family == "sysctl"] == ["applied"]


def test_a_value_error_in_one_family_read_leaves_the_others_planned(cx7, tmp_path, monkeypatch):
    from nictune.host.knobs.ethtool import RingsFamily

    def garbled(self, keys):
        raise ValueError("unparsable kernel text")

    monkeypatch.setattr(RingsFamily, "read", garbled)
    doc = {"nictune": 1, "on_unsupported": "warn", "host": {"sysctl": {"net.ipv4.tcp_ecn": 1}},
           "interfaces": {"r": {"match": {"name": "enp23s0f0np0"}, "rings": {"rx": 4096}}}}
    out = Engine(cx7, str(tmp_path / "s")).plan(doc, {})
    assert out.error is None
    rings = next(c for c in out.changes if c.key.family == "rings")
    assert rings.status == "skipped" and "cannot read rings: unparsable" in rings.note
    assert any(c.key.family == "sysctl" and c.status == "pending" for c in out.changes)


def test_invalid_input_during_a_read_refuses_the_whole_command(cx7, tmp_path, monkeypatch):
    from nictune.host import agent
    from nictune.host.knobs.ethtool import RingsFamily

    def hostile(self, keys):
        raise InvalidInput("invalid RDMA device name: '../x'")

    monkeypatch.setattr(RingsFamily, "read", hostile)
    doc = {"nictune": 1, "interfaces": {"r": {"match": {"name": "enp23s0f0np0"}, "rings": {"rx": 4096}}}}
    report = agent.run({"nictune_request": 1, "command": "plan", "state_dir": str(tmp_path / "s"),
                        "profile": {"path": "p.yaml", "doc": doc}}, host=cx7)
    assert report["error"]["kind"] == "invalid-input" and report["exit_code"] == 1


def test_a_read_that_raises_marks_only_that_family(cx7):
    from nictune.host.transaction.engine import Families

    fams = Families(cx7)
    keys = [Key("rings", "enp23s0f0np0", "rx"), Key("link", "enp23s0f0np0", "mtu")]

    fams["rings"].read = lambda keys: (_ for _ in ()).throw(OSError(5, "I/O error"))
    current = fams.read(keys)
    assert isinstance(current[keys[0]], Unsupported)
    assert isinstance(current[keys[1]], int)
