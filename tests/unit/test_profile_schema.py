"""The JSON Schema: valid 2020-12, complete, and the same rules as validate.py."""

from __future__ import annotations

import json
import os
import re

import pytest
from jsonschema import Draft202012Validator

from nictune.host import validate
from nictune.profile import SCHEMA, schema_json
from nictune.profile.check import Validator
from nictune.profile.schema import NOT_NORMALISED, PATTERN_WORDS, describe

HERE = os.path.dirname(os.path.abspath(__file__))


def _nodes(node, path=()):
    """Every schema object in SCHEMA, with its location."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _nodes(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _nodes(value, path + (i,))


def test_schema_is_valid_2020_12():
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["$id"] == "https://nictune.dev/schema/profile-1.json"
    assert SCHEMA["title"] and SCHEMA["description"]


def test_schema_json_is_pretty_sorted_and_round_trips():
    text = schema_json()
    assert json.loads(text) == json.loads(json.dumps(SCHEMA))
    assert text == json.dumps(SCHEMA, indent=2, sort_keys=True) + "\n"


def test_every_string_has_max_length_and_pattern():
    strings = [(path, node) for path, node in _nodes(SCHEMA) if node.get("type") == "string"]
    assert len(strings) > 10, strings
    for path, node in strings:
        assert "maxLength" in node, path
        assert "pattern" in node, path


def test_every_mapping_is_closed():
    # additionalProperties is either false or a schema for the values of a
    # map whose keys propertyNames restricts.
    mappings = [(path, node) for path, node in _nodes(SCHEMA) if node.get("type") == "object"]
    assert len(mappings) > 10, mappings
    for path, node in mappings:
        extra = node.get("additionalProperties")
        assert extra is False or "propertyNames" in node, path


def test_patterns_come_from_validate_and_have_words():
    used = {node["pattern"] for _, node in _nodes(SCHEMA) if isinstance(node.get("pattern"), str)}
    for name in ("IFGLOB", "SYSCTL_KEY", "IF_SYSCTL_KEY", "SYSCTL_VALUE", "NCCL_NAME", "NCCL_VALUE",
                 "FEATURE_NAME", "MAC", "PCI_ID", "DRIVER", "OWNED_PATH", "OWNED_DIR"):
        assert getattr(validate, name) in used, name
    assert used - {NOT_NORMALISED}
    for pattern in used - {NOT_NORMALISED}:
        assert pattern in PATTERN_WORDS, pattern


def test_brief_example_validates_with_a_plain_validator():
    # What an editor sees: the stock validator, no nictune extensions.
    import yaml

    with open(os.path.join(HERE, "profiles", "full.yaml")) as f:
        doc = yaml.safe_load(f)
    assert list(Draft202012Validator(SCHEMA).iter_errors(doc)) == []


@pytest.mark.parametrize("path", [
    "/etc/nccl.conf", "/a", "/a/b.c", "/a/.b", "/a/..b", "/a/b../c",
    "/", "//a", "/a/", "/a//b", "/a/./b", "/a/../b", "/..", "/.", "/a/.", "/a/..",
    "etc/nccl.conf", "", "/a b", "/a\n", "/" + "a" * 255, "/" + "a" * 256,
])
def test_nccl_path_rule_matches_check_path(path):
    # The schema may be stricter than check_path, never looser.
    try:
        validate.check_path(path)
        host_ok = True
    except validate.InvalidInput:
        host_ok = False
    node = SCHEMA["properties"]["host"]["properties"]["nccl"]["properties"]["path"]
    schema_ok = Validator(node).is_valid(path)
    assert schema_ok <= host_ok
    if path != "//a":  # POSIX keeps a leading '//'; we do not bother
        assert schema_ok == host_ok


@pytest.mark.parametrize("value", ["eth0\n", "eth0\r", "eth\n0", "\neth0"])
def test_end_anchor_means_end(value):
    # jsonschema's re.search lets "$" match before a final newline.
    node = {"type": "string", "pattern": validate.IFGLOB}
    assert not Validator(node).is_valid(value)


def test_integer_means_int():
    node = {"type": "integer"}
    assert Validator(node).is_valid(9000)
    assert not Validator(node).is_valid(9000.0)
    assert not Validator(node).is_valid(True)


def test_bound_is_exactly_one_of_min_max():
    mtu = SCHEMA["$defs"]["entry"]["properties"]["mtu"]
    check = Validator(mtu).is_valid
    assert check(9000) and check({"min": 1500}) and check({"max": 9000})
    assert not check({}) and not check({"min": 1500, "max": 9000}) and not check({"min": 70000})
    assert not check({"mn": 1500})


def test_words():
    mtu = SCHEMA["$defs"]["entry"]["properties"]["mtu"]
    assert describe(mtu) == "an integer from 68 to 65535, or {min: N} / {max: N}"
    assert describe(SCHEMA["properties"]["on_unsupported"]) == (
        "one of fail, warn, skip, or a mapping whose keys are default, or a dotted profile path "
        "such as roce.ecn or host.nccl")
    assert "a list of 1 to 8 integers" in describe(SCHEMA["$defs"]["sysctl_value"])
    assert re.search(r"a list of them$", describe(SCHEMA["$defs"]["entry"]["properties"]["match"]["properties"]["mac"]))


def test_one_pattern_has_one_meaning():
    from nictune.profile.schema import register_words

    pattern = next(iter(PATTERN_WORDS))
    register_words({pattern: PATTERN_WORDS[pattern]})  # the same words again: fine
    with pytest.raises(ValueError, match="already means"):
        register_words({pattern: "something else"})


def test_a_bad_counter_name_is_described_as_a_counter_name():
    from nictune.profile.loader import ProfileError, load_profile_text

    text = ("nictune: 1\ninterfaces:\n  r:\n    match: {name: x}\n"
            "    expect: {counters: {\"bad name!\": 1}}\n")
    with pytest.raises(ProfileError, match="allowed: a counter name"):
        load_profile_text(text, "p.yaml")
