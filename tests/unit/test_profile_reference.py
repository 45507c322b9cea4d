"""docs/reference/profile.md shows what is inside a setting's mappings
and an example per registered family, and every example is a profile the
schema takes."""

from __future__ import annotations

import os

from nictune.host.knobs import CATALOG, family_named
from nictune.profile import reference
from nictune.profile.check import Validator
from nictune.profile.loader import load_profile_text
from nictune.profile.schema import SCHEMA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(REPO, "docs", "reference", "profile.md")


def _section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of any level."""
    start = text.index(heading + "\n") + len(heading) + 1
    ends = [i for i in (text.find("\n#", start),) if i >= 0]
    return text[start:min(ends)] if ends else text[start:]


def test_the_reference_lists_the_keys_of_each_vf():
    with open(REFERENCE) as f:
        vfs = _section(f.read(), "### `interfaces.<entry>.sriov.vfs`")
    for key in ("mac", "vlan", "qos", "trust", "spoofchk", "link_state", "max_tx_rate", "min_tx_rate"):
        assert f"| `<key>.{key}` |" in vfs, key


def test_lists_of_mappings_show_their_keys_to_any_depth():
    found = dict(reference.sub_keys(reference.node_at(SCHEMA["$defs"]["entry"], "macsec.rx")))
    assert {"[].address", "[].port", "[].sa", "[].sa.an", "[].sa.key_file"} <= set(found)
    # A {min: N} / {max: N} bound is worded whole, not listed as two keys.
    assert list(reference.sub_keys(reference.node_at(SCHEMA["$defs"]["entry"], "mtu"))) == []


def _owned_paths(doc: dict, family) -> set:
    """Dotted paths in the profile document below the family's sections."""
    paths = set()

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{prefix}{key}"
                paths.add(path)
                walk(value, path + ".")

    for entry in (doc.get("interfaces") or {}).values():
        walk({k: v for k, v in entry.items() if k in family.sections}, "")
    walk({k: v for k, v in (doc.get("host") or {}).items() if k in family.host_sections}, "")
    return paths


def example_problems(examples: dict) -> list:
    """Why the examples fall short: a registered family without one, one
    the schema or the loader refuses, one that sets nothing its family owns."""
    problems = []
    for name in CATALOG:
        text = examples.get(name)
        if not text:
            problems.append(f"{name}: no example")
            continue
        try:  # the loader: YAML as profiles are read, the schema, its own checks
            doc = load_profile_text("nictune: 1\n" + text, f"the example of {name}").doc
        except Exception as e:
            problems.append(f"{name}: {e}")
            continue
        errors = [e.message for e in Validator(SCHEMA).iter_errors(doc)]
        if errors:  # and the schema itself, on what the loader made of it
            problems.append(f"{name}: {errors[0]}")
            continue
        if not _owned_paths(doc, family_named(name)) & set(family_named(name).settings):
            problems.append(f"{name}: the example sets none of the family's settings")
    return problems


def test_every_registered_family_has_an_example_the_schema_takes():
    assert len(CATALOG) >= 20  # the registry is read, not an empty list
    assert example_problems(reference.examples()) == []


def test_a_broken_or_missing_example_is_found():
    examples = dict(reference.examples())
    examples["sriov"] = examples["sriov"].replace("vlan: 100", "vlan: 5000")
    examples["mpi"] = examples["ovs"]            # an example of another family
    del examples["link"]
    problems = example_problems(examples)
    assert [p.split(":")[0] for p in problems] == ["link", "sriov", "mpi"], problems


def test_the_reference_shows_each_example_under_its_family():
    with open(REFERENCE) as f:
        text = f.read()
    examples = reference.examples()
    assert len(examples) >= 20
    for name, body in examples.items():
        section = text.split(f"\n## {name}\n", 1)
        assert len(section) == 2, name
        assert section[1].split("\n## ", 1)[0].count(body.rstrip()) == 1, name
