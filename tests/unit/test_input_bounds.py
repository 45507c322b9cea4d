"""Bounds on what an input can ask of the controller (issue 9, item 13).

An empty --limit must not widen to the whole inventory; a few ranged lines
must not expand into a million hosts; a huge profile must be refused by
counting, before its whole node graph is built; and a file is parsed once.
Each refusal is checked for its message (the bound, with file and line)
and for coming quickly, so that a test run cannot pass by waiting.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.inventory import InventoryError, load_inventory
from nictune.inventory.model import MAX_GROUPS, MAX_HOSTS
from nictune.inventory.yamlinv import MAX_VALUES
from nictune.profile import yamlpos
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile, load_profile_parsed

CASES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "inventory", "cases")
FABRIC = os.path.join(CASES, "fabric.ini")
QUICK = 10.0  # seconds: the bounds refuse within about one; the unbounded code took 23 to 30


def nictune(*args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n")
    return str(path)


# -- an empty --limit ----------------------------------------------------------

@pytest.mark.parametrize("limit", ["", " ", ",", " , ,"])
def test_an_empty_limit_is_refused_not_read_as_every_host(limit):
    inv = load_inventory(FABRIC)
    with pytest.raises(InventoryError, match="names no host or group; leave --limit out"):
        inv.select(None, limit=limit)


def test_an_empty_limit_file_is_refused(tmp_path):
    (tmp_path / "limit").write_text("\n  \n")
    with pytest.raises(InventoryError, match="names no host or group"):
        load_inventory(FABRIC).select(None, limit=f"@{tmp_path / 'limit'}")


def test_an_empty_limit_on_the_command_line_reaches_no_host(profile):
    # Before, `--limit ""` was falsy and every host of the inventory was targeted.
    code, report = nictune("plan", profile, "-i", FABRIC, "--limit", "", "--connect-timeout", "0.2")
    assert code == 1 and report["hosts"] == []
    assert "--limit '' names no host or group" in report["error"]["message"]


# -- hosts in an inventory -------------------------------------------------------

def test_ranged_lines_past_the_total_are_refused_quickly(tmp_path):
    # Each line stays under the per-pattern bound; together they name a million hosts.
    lines = [f"[g{i}]\nn{i}-[0:99999]\n" for i in range(10)]
    path = tmp_path / "hosts.ini"
    path.write_text("".join(lines))
    started = time.monotonic()
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path))
    assert time.monotonic() - started < QUICK
    assert (caught.value.file, caught.value.line) == (str(path), 4)  # the line that goes past
    assert f"more than {MAX_HOSTS} hosts" in caught.value.message


def test_the_total_counts_hosts_not_mentions(tmp_path):
    # The same 60,000 hosts in two groups are 60,000 hosts.
    path = tmp_path / "hosts.yml"
    path.write_text("a:\n  hosts:\n    n[0:59999]:\nb:\n  hosts:\n    n[0:59999]:\n")
    assert len(load_inventory(str(path)).hosts) == 60000


def test_a_yaml_inventory_past_the_total_names_its_line(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("".join(f"g{i}:\n  hosts:\n    n{i}-[0:60000]:\n" for i in range(3)))
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path))
    assert caught.value.line == 6 and "more than 100000 hosts" in caught.value.message


def test_a_huge_yaml_inventory_is_refused_by_counting(tmp_path):
    path = tmp_path / "hosts.yml"
    with open(path, "w") as f:
        f.write("all:\n  vars:\n    x: [")
        f.write("1, " * 2 * MAX_VALUES)
        f.write("1]\n")
    started = time.monotonic()
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path))
    assert time.monotonic() - started < QUICK
    assert caught.value.line == 3 and f"more than {MAX_VALUES} values" in caught.value.message


def test_a_huge_json_inventory_yaml_cannot_read_is_bounded_too(tmp_path):
    # The surrogate pair makes YAML fail at once; JSON would then read it all.
    path = tmp_path / "hosts.json"
    path.write_text('{"all": {"vars": {"e": "\\ud83d\\ude00", "x": [' + "[], " * MAX_VALUES + "[]]}}}\n")
    with pytest.raises(InventoryError, match=f"has more than {MAX_VALUES} values"):
        load_inventory(str(path))


def test_groups_are_bounded_too(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text("".join(f"[g{i}]\n" for i in range(MAX_GROUPS)))
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path))
    # "all" and "ungrouped" come first, so the group of the line before last is one too many.
    assert caught.value.line == MAX_GROUPS - 1
    assert f"more than {MAX_GROUPS} groups" in caught.value.message


# -- profiles ----------------------------------------------------------------------

def test_a_15_mb_profile_is_refused_by_counting(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "w") as f:
        f.write("nictune: 1\nhost:\n  sysctl:\n    net.core.rmem_max: [")
        f.write("1, " * 5_000_000)
        f.write("1]\n")
    assert os.path.getsize(path) > 15_000_000
    started = time.monotonic()
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    assert time.monotonic() - started < QUICK
    assert caught.value.line == 4
    assert caught.value.message == f"has more than {yamlpos.MAX_NODES} values"


def test_a_playbook_is_bounded_the_same_way(tmp_path):
    path = tmp_path / "pb.yaml"
    path.write_text("- hosts: all\n  profile: p.yaml\n  vars: {x: [" + "1, " * 200_000 + "1]}\n")
    with pytest.raises(ProfileError, match="has more than 100000 values"):
        yamlpos.read_target(str(path))


@pytest.mark.parametrize("text, line, words", [
    ("nictune: 1\nx: " + "[" * 33 + "]" * 33 + "\n", 2, "nested more than 32 levels deep"),
    ("nictune: 1\na: &x 1\nb: &x 2\n", 3, "duplicate anchor 'x'"),
    ("nictune: 1\na: *nope\n", 2, "undefined alias 'nope'"),
    ("nictune: 1\n---\nnictune: 1\n", 2, "expected a single document"),
])
def test_the_composer_refuses_what_pyyaml_refuses(tmp_path, text, line, words):
    with pytest.raises(ProfileError) as caught:
        yamlpos.parse_text(text, "t.yaml")
    assert caught.value.line == line and words in caught.value.message


@pytest.mark.parametrize("loader", ["C", "python"])
def test_the_composer_builds_what_pyyaml_builds(monkeypatch, loader):
    if loader == "python":
        monkeypatch.setattr(yamlpos, "LOADER", yaml.SafeLoader)
    elif not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML without libyaml")
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "profiles",
                        "connectx7-training.yaml")
    with open(path) as f:
        text = f.read()
    text += "anchored: &a {x: [1, 2]}\nagain: *a\nempty: []\nnull_value:\n"
    assert yamlpos.parse_text(text, path).doc == yaml.load(text, Loader=yamlpos.LOADER)


def test_a_profile_is_parsed_once(monkeypatch, tmp_path, profile):
    # plan reads its TARGET with read_target, then loads the profile from
    # what was parsed (cli/host_cmds.py): one YAML parser over the text in
    # all.  It used to be two (a pass for the depth check, then compose).
    made = []

    class Counting(yamlpos.LOADER):  # type: ignore[misc, valid-type]
        def __init__(self, stream):
            made.append(stream)
            super().__init__(stream)

    monkeypatch.setattr(yamlpos, "LOADER", Counting)
    kind, parsed = yamlpos.read_target(profile)
    assert kind == "profile"
    load_profile_parsed(parsed, profile)
    assert len(made) == 1
    load_profile(profile)
    assert len(made) == 2
