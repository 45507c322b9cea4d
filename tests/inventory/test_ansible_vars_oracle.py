"""Variables as ansible-playbook resolves them: the oracle for
tests/unit/test_ansible_vars_fidelity.py.

Precedence: an inventory in inv/ and a playbook in pb/, each with
group_vars/ and host_vars/, and a host h1 in group child of group parent.
Each pair of levels sets a variable of its own (v_I_J, valued with the
level's name), so every pair's order is compared: a play's view of h1 in
nictune (Play.host) must give every variable the value a `debug` task of
ansible-playbook prints, connection settings included; and its `nictune`
layers must end with the mapping Ansible keeps.

Templates: ansible-playbook prints what it makes of `nictune:` strings and
templated connection values; nictune must refuse exactly the ones Ansible
does not use as written, and keep the others.  ansible-core's own
is_possibly_template is compared with nictune's is_template on a few
thousand generated strings.

Two ansible-playbook runs, made once, side by side.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

import pytest

from inventory.test_ansible_oracle import ANSIBLE_PLAYBOOK, _run, pytestmark  # noqa: F401 - the same skip rule
from nictune.control.remote import fleet, ssh
from nictune.control.rollout.playbook import load_playbook
from nictune.inventory import InventoryError, load_inventory
from nictune.inventory.templates import is_template

# Lowest precedence first, as ansible-core's default VARIABLE_PRECEDENCE
# and VariableManager.get_vars order them.
LEVELS = ["all_inline", "parent_inline", "child_inline", "inv_gv_all", "pb_gv_all", "inv_gv_parent",
          "inv_gv_child", "pb_gv_parent", "pb_gv_child", "host_inline", "inv_hv", "pb_hv", "play_vars"]
PAIRS = list(itertools.combinations(range(len(LEVELS)), 2))
FILES = {"inv_gv_all": "inv/group_vars/all.yml", "pb_gv_all": "pb/group_vars/all.yml",
         "inv_gv_parent": "inv/group_vars/parent.yml", "inv_gv_child": "inv/group_vars/child.yml",
         "pb_gv_parent": "pb/group_vars/parent.yml", "pb_gv_child": "pb/group_vars/child.yml",
         "inv_hv": "inv/host_vars/h1.yml", "pb_hv": "pb/host_vars/h1.yml"}
# What else each level sets: connection settings where the playbook's
# files must win, and `nictune` layers.
EXTRA = {
    "inv_gv_all": {"ansible_host": "198.18.0.1", "nictune": {"host": {"sysctl": {"from_inv_all": 1}}}},
    "pb_gv_all": {"ansible_host": "198.18.0.2"},
    "inv_gv_child": {"ansible_user": "inventory_child", "nictune": {"host": {"sysctl": {"from_inv_child": 1}}}},
    "pb_gv_parent": {"ansible_user": "playbook_parent", "nictune": {"host": {"sysctl": {"from_pb_parent": 1}}}},
    "inv_hv": {"ansible_port": 2201},
    "pb_hv": {"ansible_port": 2202, "nictune": {"host": {"sysctl": {"from_pb_host": 1}}}},
}
COMPARED = [f"v_{i}_{j}" for i, j in PAIRS] + ["ansible_host", "ansible_user", "ansible_port", "nictune"]

# nictune: strings, each on a host of its own; "!unsafe" marks a tagged one.
TEMPLATE_CASES = ["={{ rail_if }}", "{% if true %}on{% endif %}", "a{# note #}b", "{{",
                  "#jinja2:variable_start_string:'[[',variable_end_string:']]'\n[[ rail_if ]]",
                  "=eth0", "{ rail_if }", "50%", "a}}b", " #jinja2:x", "{x}#", "!unsafe ={{ rail_if }}"]
# Ansible renders values, never keys.
TEMPLATED_KEY = 'rail_if: eth1\nnictune: {host: {sysctl: {"{{ rail_if }}.mtu": 1}}}\n'
CONNECTION_TEMPLATES = {"ansible_port": "{{ 2200 + 2 }}", "ansible_python_interpreter": "{{ '/usr/bin/python3' }}"}


def _level_vars(level: str) -> Dict[str, Any]:
    index = LEVELS.index(level)
    values: Dict[str, Any] = {f"v_{i}_{j}": level for i, j in PAIRS if index in (i, j)}
    values.update(EXTRA.get(level, {}))
    return values


def _debug_play(names: List[str], play_vars: Dict[str, Any]) -> list:
    return [{"hosts": "all", "gather_facts": False, "connection": "local", "vars": play_vars,
             "tasks": [{"debug": {"msg": {name: "{{ %s }}" % name for name in names}}}]}]


def _precedence_tree(root: Path) -> None:
    inventory = {"all": {"vars": _level_vars("all_inline"), "children": {"parent": {
        "vars": _level_vars("parent_inline"), "children": {"child": {
            "vars": _level_vars("child_inline"), "hosts": {"h1": _level_vars("host_inline")}}}}}}}
    (root / "inv").mkdir()
    (root / "inv/hosts.yml").write_text(json.dumps(inventory))
    for level, name in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(_level_vars(level)))
    (root / "pb/ansible.yml").write_text(json.dumps(_debug_play(COMPARED, _level_vars("play_vars"))))
    (root / "pb/nictune.yml").write_text(json.dumps([{"hosts": "all", "profile": "p.yaml",
                                                      "vars": _level_vars("play_vars")}]))


def _yaml_text(text: str) -> str:
    return "!unsafe " + json.dumps(text[len("!unsafe "):]) if text.startswith("!unsafe ") else json.dumps(text)


def _template_host(text: str) -> str:
    lines = ["rail_if: eth1", "nictune:", "  host: {nccl: {env: {NCCL_SOCKET_IFNAME: %s}}}" % _yaml_text(text)]
    return "\n".join(lines) + "\n"


def _template_tree(root: Path) -> None:
    (root / "tmpl").mkdir()
    hosts = "".join(f"    t{i}:\n" for i in range(len(TEMPLATE_CASES))) + "    tkey:\n"
    (root / "tmpl/hosts.yml").write_text("all:\n  vars:\n" + "".join(
        f"    {k}: {json.dumps(v)}\n" for k, v in CONNECTION_TEMPLATES.items()) + "  hosts:\n" + hosts)
    for i, text in enumerate(TEMPLATE_CASES):
        (root / "tmpl/host_vars").mkdir(exist_ok=True)
        (root / f"tmpl/host_vars/t{i}.yml").write_text(_template_host(text))
    (root / "tmpl/host_vars/tkey.yml").write_text(TEMPLATED_KEY)
    names = ["nictune", *CONNECTION_TEMPLATES]
    (root / "tmpl/ansible.yml").write_text(json.dumps(_debug_play(names, {})))


def _results(out: str) -> Dict[str, Any]:
    """host -> the debug message, or None for a host the task failed on.

    The minimal callback prints "HOST | SUCCESS => {json}" per host."""
    decoder, found = json.JSONDecoder(), {}
    for m in re.finditer(r"^(\S+) \| (SUCCESS|FAILED!) => ", out, re.M):
        body, _ = decoder.raw_decode(out, m.end())
        found[m.group(1)] = body.get("msg") if m.group(2) == "SUCCESS" else None
    return found


@pytest.fixture(scope="module")
def oracle():
    with tempfile.TemporaryDirectory(prefix="nt-vars-oracle-") as cwd:
        root = Path(cwd)
        (root / "ansible.cfg").write_text("[defaults]\nstdout_callback = minimal\n")
        _precedence_tree(root)
        _template_tree(root)
        calls = {"precedence": [ANSIBLE_PLAYBOOK, "-i", str(root / "inv/hosts.yml"), str(root / "pb/ansible.yml")],
                 "templates": [ANSIBLE_PLAYBOOK, "-i", str(root / "tmpl/hosts.yml"), str(root / "tmpl/ansible.yml")]}

        with ThreadPoolExecutor(2) as pool:
            answers = dict(zip(calls, pool.map(lambda argv: _run(argv, cwd), calls.values())))
        yield root, {key: _results(out) for key, (rc, out, err) in answers.items()}, answers


def test_ansible_answered_for_every_host(oracle):
    _, results, answers = oracle
    assert list(results["precedence"]) == ["h1"], answers["precedence"]
    assert sorted(results["templates"]) == sorted([f"t{i}" for i in range(len(TEMPLATE_CASES))] + ["tkey"]), \
        answers["templates"]


def test_each_pair_of_levels_is_ordered_as_ansible_playbook_orders_it(oracle):
    root, results, _ = oracle
    theirs = results["precedence"]["h1"]
    (play,) = load_playbook(str(root / "pb/nictune.yml"))
    host = play.host(load_inventory(str(root / "inv/hosts.yml")).hosts["h1"])
    ours = {name: host.vars[name] for name in COMPARED}
    assert len(PAIRS) == 78 and ours == theirs
    # The order the issue states is Ansible's: the higher level of each pair wins.
    assert all(theirs[f"v_{i}_{j}"] == LEVELS[j] for i, j in PAIRS)


def test_the_play_connects_where_and_as_ansible_would(oracle):
    root, results, _ = oracle
    theirs = results["precedence"]["h1"]
    (play,) = load_playbook(str(root / "pb/nictune.yml"))
    host = play.host(load_inventory(str(root / "inv/hosts.yml")).hosts["h1"])
    assert (host.address, host.user, host.port) == (theirs["ansible_host"], theirs["ansible_user"],
                                                    theirs["ansible_port"]) == ("198.18.0.2", "playbook_parent", 2202)


def test_the_nictune_layers_end_with_the_mapping_ansible_keeps(oracle):
    root, results, _ = oracle
    (play,) = load_playbook(str(root / "pb/nictune.yml"))
    layers = play.host(load_inventory(str(root / "inv/hosts.yml")).hosts["h1"]).nictune_overrides()
    assert [where.rsplit(":", 1)[0] for _, where in layers] == [
        str(root / FILES[level]) for level in ("inv_gv_all", "inv_gv_child", "pb_gv_parent", "pb_hv")]
    assert layers[-1][0] == results["precedence"]["h1"]["nictune"]


@pytest.mark.parametrize("index", range(len(TEMPLATE_CASES)), ids=[repr(t) for t in TEMPLATE_CASES])
def test_nictune_refuses_exactly_what_ansible_renders(oracle, tmp_path, index):
    root, results, _ = oracle
    text = TEMPLATE_CASES[index]
    written = text[len("!unsafe "):] if text.startswith("!unsafe ") else text
    answer = results["templates"][f"t{index}"]
    used_as_written = answer is not None and answer["nictune"]["host"]["nccl"]["env"]["NCCL_SOCKET_IFNAME"] == written
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    h1:\n" + "".join("      " + line + "\n"
                                                        for line in _template_host(text).splitlines()))
    try:
        [(layer, _)] = load_inventory(str(path)).hosts["h1"].nictune_overrides()
    except InventoryError as e:
        assert not used_as_written, f"nictune refused {text!r}, which Ansible uses as written: {e}"
        assert "is a Jinja template, which nictune does not render" in e.message and e.line == 5
    else:
        assert used_as_written, f"Ansible renders {text!r} as {answer}; nictune took it as written"
        assert layer["host"]["nccl"]["env"]["NCCL_SOCKET_IFNAME"] == written


def test_a_templated_key_is_kept_as_ansible_keeps_it(oracle, tmp_path):
    _, results, _ = oracle
    assert results["templates"]["tkey"]["nictune"] == {"host": {"sysctl": {"{{ rail_if }}.mtu": 1}}}
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    h1:\n" + "".join("      " + line + "\n" for line in TEMPLATED_KEY.splitlines()))
    [(layer, _)] = load_inventory(str(path)).hosts["h1"].nictune_overrides()
    assert layer == results["templates"]["tkey"]["nictune"]


@pytest.mark.parametrize("name", list(CONNECTION_TEMPLATES))
def test_templated_connection_values_are_rendered_by_ansible_and_refused_by_nictune(oracle, tmp_path, name):
    _, results, _ = oracle
    rendered = {"ansible_port": 2202, "ansible_python_interpreter": "/usr/bin/python3"}[name]
    assert results["templates"]["t0"][name] == rendered
    path = tmp_path / "hosts.yml"
    path.write_text(f"all:\n  hosts:\n    h1:\n      {name}: {json.dumps(CONNECTION_TEMPLATES[name])}\n")
    [job] = fleet.jobs_for("rollback", load_inventory(str(path)).select("h1"), None, ssh.SshOptions())
    assert job.target is None
    assert job.error["message"].startswith(f"{path}:4: {name} of host 'h1' is a Jinja template, "
                                           "which nictune does not render")


def _generated_strings(count: int) -> List[str]:
    pieces = ["{", "}", "%", "#", "{{", "{%", "{#", "#jinja2:", "jinja2:", "x", " ", "\n", "}}", "%}"]
    rng = random.Random(21)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))) for _ in range(count)]


def test_is_template_is_ansibles_is_possibly_template():
    from ansible._internal._templating._jinja_bits import is_possibly_template

    strings = _generated_strings(4000)
    templated = [s for s in strings if is_possibly_template(s)]
    print(f"{len(strings)} strings, {len(templated)} templates to Ansible")
    assert 1000 < len(templated) < 3900, "both kinds must be well represented"
    assert [s for s in strings if is_template(s) != is_possibly_template(s)] == []
