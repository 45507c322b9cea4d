"""Inventories: host ranges, INI and YAML edge cases, variable precedence,
host patterns and the errors users see.  Whole-inventory agreement with
Ansible itself is in tests/inventory/test_ansible_oracle.py."""

from __future__ import annotations

import ast
import os
import textwrap

import pytest

from nictune.host.errors import NictuneError
from nictune.inventory import InventoryError, Unsafe, Vaulted, load_inventory
from nictune.inventory.ini import parse_value
from nictune.inventory.patterns import split_pattern
from nictune.inventory.ranges import RangeError, expand_host_pattern

CASES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "inventory", "cases")


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def load_text(tmp_path, text: str, name: str = "hosts.ini"):
    return load_inventory(write(tmp_path, name, text))


def error_of(tmp_path, text: str, name: str = "hosts.ini") -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        load_text(tmp_path, text, name)
    return caught.value


# -- host ranges ------------------------------------------------------------

@pytest.mark.parametrize("pattern,names,port", [
    ("node1", ["node1"], None),
    ("node[1:3]", ["node1", "node2", "node3"], None),
    ("node[08:10]", ["node08", "node09", "node10"], None),
    ("node[1:10:4]", ["node1", "node5", "node9"], None),
    ("node[:2]", ["node0", "node1", "node2"], None),
    ("rack[a:c]", ["racka", "rackb", "rackc"], None),
    ("rack[a:e:2]", ["racka", "rackc", "racke"], None),
    ("r[a:b]-n[1:2]", ["ra-n1", "ra-n2", "rb-n1", "rb-n2"], None),
    ("198.18.0.[1:2]", ["198.18.0.1", "198.18.0.2"], None),
    ("node[1:2]:2222", ["node1", "node2"], 2222),
    ("gpu01.example.net:22", ["gpu01.example.net"], 22),
    ("198.18.0.1:2200", ["198.18.0.1"], 2200),
    ("[2001:db8::1]:2022", ["2001:db8::1"], 2022),
    ("2001:db8::1", ["2001:db8::1"], None),
    # Not a valid host name once the port is off, so Ansible keeps the text whole.
    ("bad_:22", ["bad_:22"], None),
])
def test_host_patterns_expand_as_ansible_does(pattern, names, port):
    assert expand_host_pattern(pattern) == (names, port)


@pytest.mark.parametrize("pattern,why", [
    ("node[3:1]", "backwards"),
    ("rack[c:a]", "backwards"),
    ("node[01:100]", "same length"),
    ("node[1:2:3:4]", "begin:end"),
    ("node[1]", "begin:end"),
    ("node[1:]", "no end"),
    ("node[1:4:0]", "step of at least 1"),
    ("node[a:5]", "neither"),
    ("node[0:9999999]", "more than"),
    ("node]1:2[", "before"),
])
def test_bad_ranges_are_refused_with_the_reason(pattern, why):
    with pytest.raises(RangeError, match=why):
        expand_host_pattern(pattern)


def test_a_bad_range_in_a_file_names_file_and_line(tmp_path):
    err = error_of(tmp_path, "[g]\nok1\nnode[5:1]\n")
    assert (err.file, err.line) == (str(tmp_path / "hosts.ini"), 3)
    assert "node[5:1]" in str(err) and "backwards" in str(err)


# -- INI values -------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("1", 1), ("-3", -3), ("1.5", 1.5), ("0x10", 16), ("True", True), ("None", None),
    ("'x y'", "x y"), ("[1, 2]", [1, 2]), ("(1, 2)", [1, 2]), ("{3}", [3]),
    ("{'a': (1,)}", {"a": [1]}), ("...", "..."), ("1j", "1j"), ("b'x'", "x"),
    # Not Python literals: kept as written.
    ("01", "01"), ("yes", "yes"), ("{{ x }}", "{{ x }}"), ("a=b", "a=b"), ("", ""), ("x # y", "x # y"),
])
def test_ini_values_are_python_literals_when_they_are_one(text, value):
    got = parse_value(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", [
    "ops", "gpu-a01", "a_b-c", "x.y:z/w@v", "Nonesuch", "True", "True-1j", "False", "None", "not-1",
    "lambda:1", "0", "12", "007", "1.2", "198.18.0.1", "1.2.3", "99999999999999999999", "-4", "1_0",
])
def test_ini_value_shortcuts_agree_with_literal_eval(text):
    # parse_value skips literal_eval for common values; it must not change the answer.
    try:
        expected = ast.literal_eval(text)
        expected = str(expected) if isinstance(expected, complex) else expected
    except (ValueError, SyntaxError):
        expected = text
    got = parse_value(text)
    assert got == expected and type(got) is type(expected)


def test_ini_host_lines_and_vars_sections(tmp_path):
    inv = load_text(tmp_path, """\
        # ungrouped hosts come first
        solo ansible_host=198.18.0.9 note="two words"   # a comment
        ; another comment style
        [g]
        h1:2201 ansible_user=ops
        h1:2999
        [g:vars]
        spaced = a b c
        quoted="q"
        """)
    solo, h1 = inv.hosts["solo"], inv.hosts["h1"]
    assert solo.vars == {"ansible_host": "198.18.0.9", "note": "two words"}
    assert h1.port == 2201  # only the first mention's port counts
    assert h1.vars["spaced"] == "a b c" and h1.vars["quoted"] == "q"
    assert inv.groups["ungrouped"].host_names == ["solo"]
    assert inv.groups["all"].child_names == ["ungrouped", "g"]


def test_ini_children_may_be_declared_later(tmp_path):
    inv = load_text(tmp_path, """\
        [top:children]
        mid
        [mid:vars]
        v=1
        [mid:children]
        leaf
        [leaf]
        n1
        """)
    assert inv.groups["top"].child_names == ["mid"]
    assert inv.groups["mid"].child_names == ["leaf"]
    assert [h.name for h in inv.select("top")] == ["n1"]
    assert inv.hosts["n1"].groups == ["leaf", "mid", "top"]


def test_hosts_only_in_all_are_ungrouped(tmp_path):
    inv = load_text(tmp_path, "top\n[all]\na\nb\n[g]\nb\ntop\n")
    assert inv.groups["ungrouped"].host_names == ["a"]
    assert inv.hosts["a"].groups == ["ungrouped"]
    assert inv.hosts["b"].groups == inv.hosts["top"].groups == ["g"]


@pytest.mark.parametrize("text,line,what", [
    ("[g:hosts2]\nh\n", 1, "unknown type 'hosts2'"),
    ("[bad group]\n", 1, "invalid section header"),
    ("[p:children]\nmissing\n", 2, "names group 'missing', which is never declared"),
    ("[g:vars]\nv=1\n", 1, "[g:vars] is for a group that is never declared"),
    ("[a:children]\nb\n[b:children]\na\n", 4, "cycle"),
    ("[a:children]\na\n", 2, "its own child"),
    ("[g]\nh1 novalue\n", 2, "expected key=value"),
    ("[g]\nh1 ok=1\n[g:vars]\njustaword\n", 4, "expected key=value"),
    ("[g]\nh1:\n", 2, "ends in ':'"),
    ("[g]\nh1 a='unclosed\n", 2, "cannot split"),
    ("[g]\nh1 x={[1]:2}\n", 2, "cannot be read"),
    ("---\n", 1, "YAML"),
])
def test_ini_mistakes_name_file_and_line(tmp_path, text, line, what):
    err = error_of(tmp_path, text)
    assert err.line == line, str(err)
    assert what in str(err)
    assert str(err).startswith(str(tmp_path / "hosts.ini") + f":{line}: ")
    assert "\n" not in str(err) and isinstance(err, NictuneError) and err.kind == "invalid-input"


# -- YAML -------------------------------------------------------------------

def test_yaml_shorthand_and_null_hosts(tmp_path):
    inv = load_text(tmp_path, """\
        web:
          hosts: w1
        db:
          hosts:
            d1:
            d2: ~
            "d3:2200":
          children: web
          vars: lonely
        """, "inv.yml")
    assert inv.groups["web"].host_names == ["w1"]
    assert inv.groups["db"].host_names == ["d1", "d2", "d3"] and inv.groups["db"].child_names == ["web"]
    assert inv.hosts["d3"].port == 2200
    assert inv.hosts["d1"].vars == {"lonely": None}


def test_yaml_values_keep_ansibles_types(tmp_path):
    inv = load_text(tmp_path, """\
        g:
          hosts:
            h1:
              flag: on
              octal: 017
              text: 1e3
              day: 2024-05-01
              raw: !unsafe '{{ x }}'
              secret: !vault |
                $ANSIBLE_VAULT;1.1;AES256
                6162
              merged:
                <<: {a: 1, b: 2}
                b: 3
        """, "inv.yaml")
    v = inv.hosts["h1"].vars
    assert v["flag"] is True and v["octal"] == 15 and v["text"] == "1e3"
    assert v["day"].isoformat() == "2024-05-01"
    assert isinstance(v["raw"], Unsafe) and v["raw"] == "{{ x }}"
    assert isinstance(v["secret"], Vaulted) and "AES256" not in repr(v["secret"])
    assert v["merged"] == {"a": 1, "b": 3}


def test_yaml_duplicate_keys_warn_and_keep_the_last(tmp_path):
    inv = load_text(tmp_path, "g:\n  hosts:\n    h1: {a: 1}\n    h2:\n    h1: {b: 2}\n", "inv.yml")
    assert list(inv.hosts) == ["h1", "h2"] and inv.hosts["h1"].vars == {"b": 2}
    assert inv.warnings == [f"{tmp_path / 'inv.yml'}:5: duplicate key 'h1': the last one is used"]


@pytest.mark.parametrize("text,line,what", [
    ("g:\n  hosts:\n    1234:\n", 3, "must be text"),
    ("g:\n  hosts:\n    h1: just-text\n", 3, "mapping of variables"),
    ("g:\n  hosts: [a, b]\n", 2, "'hosts' of group 'g' must be a mapping"),
    ("a:\n  children:\n    b:\n      children:\n        a:\n", 3, "cycle"),
    ("plugin: aws_ec2\nregions: [x]\n", 1, "plugin configuration"),
    ("g:\n  hosts:\n    n[9:1]:\n", 3, "backwards"),
    ("g:\n  hosts:\n    h: {a: 1\n", 4, "not a YAML inventory"),
    ("- a\n- b\n", 1, "not a YAML inventory"),
])
def test_yaml_mistakes_name_file_and_line(tmp_path, text, line, what):
    err = error_of(tmp_path, text, "inv.yml")
    assert what in str(err) and err.line == line, str(err)
    assert "\n" not in str(err)


def test_a_file_without_extension_falls_back_to_ini(tmp_path):
    inv = load_text(tmp_path, "[g]\nh1 a=1\n", "hosts")
    assert inv.hosts["h1"].vars == {"a": 1}
    err = error_of(tmp_path, "[g]\nh1 novalue\n", "hosts2")
    assert "neither a YAML inventory" in str(err) and err.line == 2


def test_skipped_yaml_keys_are_warnings(tmp_path):
    inv = load_text(tmp_path, "g:\n  hosts:\n    h1:\n  colour: {a: 1}\nbad: 5\n", "inv.yml")
    assert len(inv.warnings) == 2 and "colour" in inv.warnings[0] and "'bad'" in inv.warnings[1]


# -- variables: precedence, layers, sources, nictune overrides --------------

@pytest.fixture(scope="module")
def site():
    return load_inventory(os.path.join(CASES, "site"))


def test_precedence_follows_ansible(site):
    node01, node02, node03, node04 = (site.hosts[n] for n in ("node01", "node02", "node03", "node04"))
    # all inline < group inline (parents, then children) < group_vars files < host inline < host_vars
    assert node03.layers("v") == ["rails-inline", "rack1-inline", "all-file-10", "rack1-file", "host-inline"]
    assert node03.vars["v"] == "host-inline"
    assert node02.vars["v"] == "node02-file-a" and node02.port == 2202
    assert node04.vars["v"] == "all-file-10"  # a group_vars/all file beats an inline group var
    assert node04.vars["w"] == "rails-file"   # rails.yml is used, rails.yaml is not
    assert node01.vars["x"] == "all-file-20" and node01.vars["z"] == "all-file-30"
    assert node01.vars["deep"] == {"json": True}
    assert "ignored" not in node01.vars        # hidden, .txt and backup files are skipped


def test_source_of_names_the_winning_file_and_line(site):
    base = os.path.join(CASES, "site")
    assert site.source_of("node03", "v") == os.path.join(base, "10-hosts.ini") + ":6"
    assert site.source_of("node04", "w") == os.path.join(base, "group_vars", "rails.yml") + ":1"
    assert site.source_of("node02", "v") == os.path.join(base, "host_vars", "node02", "a.yml") + ":1"
    assert site.source_of("node04", "not_set") is None


def test_nictune_overrides_come_from_every_level_lowest_first(site):
    base = os.path.join(CASES, "site")
    overrides = site.hosts["node01"].nictune_overrides()
    assert [src for _, src in overrides] == [
        os.path.join(base, "group_vars", "all", "10-base.yml") + ":3",
        os.path.join(base, "group_vars", "rails.yml") + ":2",
        os.path.join(base, "group_vars", "rack1", "main.yml") + ":2",
        os.path.join(base, "host_vars", "node01.yaml") + ":2",
    ]
    assert overrides[1][0]["interfaces"]["rails"]["mtu"] == 9000
    assert overrides[2][0] == {"interfaces": {"rails": {"rings": {"rx": 8192}}}}
    # Ansible alone would keep only the last one:
    assert site.hosts["node01"].vars["nictune"] == overrides[-1][0]


def test_nictune_must_be_a_mapping(tmp_path):
    write(tmp_path, "group_vars/g.yml", "other: 1\nnictune: [mtu]\n")
    with pytest.raises(InventoryError) as caught:
        load_text(tmp_path, "[g]\nh1\n")
    err = caught.value
    assert (err.file, err.line) == (str(tmp_path / "group_vars" / "g.yml"), 2)
    assert "'nictune' of host 'h1' must be a mapping" in str(err)


def test_group_priority_and_depth_order_siblings():
    inv = load_inventory(os.path.join(CASES, "priority.ini"))
    # depth 1: alpha (priority 3), beta (2); depth 2: zeta under deep.
    assert inv.hosts["h1"].layers("v") == ["deep", "beta", "alpha", "zeta"]


def test_a_bad_vars_file_is_an_error(tmp_path):
    write(tmp_path, "group_vars/all.yml", "- a list\n")
    err = error_of(tmp_path, "h1\n")
    assert "must be a mapping" in str(err) and err.line == 1


# -- connection variables ---------------------------------------------------

def test_connection_variables_and_their_ssh_aliases(tmp_path):
    inv = load_text(tmp_path, """\
        plain
        full ansible_host=198.18.0.2 ansible_port=2200 ansible_user=ops ansible_ssh_private_key_file=~/.ssh/k
        alias ansible_host=198.18.0.3 ansible_ssh_host=198.18.0.4 ansible_port=1 ansible_ssh_port="2201" ansible_user=a ansible_ssh_user=b
        """)
    plain, full, alias = (inv.hosts[n] for n in ("plain", "full", "alias"))
    assert (plain.address, plain.port, plain.user, plain.key_file) == ("plain", None, None, None)
    assert (full.address, full.port, full.user) == ("198.18.0.2", 2200, "ops")
    assert full.key_file == os.path.expanduser("~/.ssh/k")
    # Ansible's ssh connection takes the last alias that is set.
    assert (alias.address, alias.port, alias.user) == ("198.18.0.4", 2201, "b")


@pytest.mark.parametrize("line,attribute,what", [
    ("h ansible_host={{other}}", "address", "Jinja template"),
    ("h ansible_port=70000", "port", "port number"),
    ("h ansible_port=True", "port", "port number"),
    ("h ansible_user='two words'", "user", "blanks"),
])
def test_unusable_connection_variables_are_errors(tmp_path, line, attribute, what):
    inv = load_text(tmp_path, line + "\n")
    with pytest.raises(InventoryError) as caught:
        getattr(inv.hosts["h"], attribute)
    assert what in str(caught.value) and caught.value.line == 1


# -- patterns ---------------------------------------------------------------

@pytest.mark.parametrize("pattern,parts", [
    ("all", ["all"]),
    ("a:b", ["a", "b"]),
    ("a:&b:!c", ["a", "&b", "!c"]),
    ("a, b[1], c[2:3] ,d", ["a", "b[1]", "c[2:3]", "d"]),
    ("node[1:3]", ["node[1:3]"]),
    ("198.18.0.1:22", ["198.18.0.1:22"]),
    ("web*:db[0]", ["web*", "db[0]"]),
])
def test_patterns_split_as_ansible_splits_them(pattern, parts):
    assert split_pattern(pattern) == parts


@pytest.fixture(scope="module")
def fabric():
    return load_inventory(os.path.join(CASES, "fabric.ini"))


def names(hosts):
    return [h.name for h in hosts]


def test_select(fabric):
    assert names(fabric.select("rack_a")) == ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04", "gpu-a05", "gpu-a08"]
    assert names(fabric.select("rack_a[0]")) == ["gpu-a01"]
    assert names(fabric.select("rack_a[-1]")) == ["gpu-a08"]
    assert names(fabric.select("rack_a[1:2]")) == ["gpu-a02", "gpu-a03"]
    assert names(fabric.select("rack_a[4:]")) == ["gpu-a05", "gpu-a08"]
    assert names(fabric.select("~gpu-a0[12]")) == ["gpu-a01", "gpu-a02"]
    assert names(fabric.select("~gpu-a0")) == names(fabric.select("gpu-a0*"))  # regexes match from the start
    assert names(fabric.select("!rack_b:!racks:!mgmt*")) == ["spine1.example.net", "spine2.example.net"]
    assert names(fabric.select("rack_a", limit="~gpu-a0[12]")) == ["gpu-a01", "gpu-a02"]
    everyone = names(fabric.select(None))
    assert everyone == names(fabric.select("*")) and sorted(everyone) == sorted(fabric.hosts)
    # Ungrouped hosts first, then group by group, breadth first: "training" is a
    # child of "all", so its own hosts come before those of fabric's grandchildren.
    assert everyone[:6] == ["mgmt01", "mgmt02", "gpu-a01", "gpu-a02", "spine1.example.net", "spine2.example.net"]


def test_select_from_a_limit_file(fabric, tmp_path):
    limit = write(tmp_path, "limit.txt", "gpu-a01\n\nspine*\n")
    assert names(fabric.select("all", limit="@" + limit)) == ["gpu-a01", "spine1.example.net", "spine2.example.net"]
    with pytest.raises(InventoryError, match="limit file"):
        fabric.select("all", limit="@" + str(tmp_path / "missing"))


def test_a_host_name_wins_over_a_group_of_the_same_name(tmp_path):
    inv = load_text(tmp_path, "[web]\nw1\nw2\n[other]\nweb\n")
    assert names(inv.select("web")) == ["web"]
    assert any("both a group and a host" in w for w in inv.warnings)


@pytest.mark.parametrize("pattern,limit,what", [
    ("rack_c", None, "pattern 'rack_c' matches no host or group"),
    ("rack_a:!rack_z", None, "'rack_z' matches no host"),
    ("rack_a[10]", None, "past the last of its 6 host(s)"),
    ("rack_a[7:]", None, "past the last"),
    ("rack_a:&rack_b", None, "selects no host"),
    ("rack_a", "spines", "with --limit 'spines' selects no host"),
    ("~gpu-(", None, "not a valid regular expression"),
])
def test_select_refuses_what_would_silently_shrink_the_target(fabric, pattern, limit, what):
    with pytest.raises(InventoryError) as caught:
        fabric.select(pattern, limit=limit)
    assert what in str(caught.value)


@pytest.mark.parametrize("pattern,limit,where,what", [
    ("all", "rack_a,rack_z", "fabric.ini", "--limit pattern 'rack_z' matches no host or group"),
    ("all", "rack_a:!rack_z", "fabric.ini", "--limit pattern 'rack_z' matches no host or group"),
    ("all", "rack_a[10]", "fabric.ini", "--limit pattern 'rack_a[10]' has a subscript past the last"),
    ("all", "~gpu-(", "fabric.ini", "--limit pattern '~gpu-(' is not a valid regular expression"),
    ("rack_z", "rack_a", "fabric.ini", "pattern 'rack_z' matches no host or group"),
    ("all", "@LIMIT", "limit.txt:3", "--limit pattern 'spine9*' matches no host or group"),
])
def test_a_limit_part_that_names_nothing_says_it_came_from_the_limit(fabric, tmp_path, pattern, limit, where, what):
    path = write(tmp_path, "limit.txt", "gpu-a01\n\nspine9*\n")
    with pytest.raises(InventoryError) as caught:
        fabric.select(pattern, limit=limit.replace("LIMIT", path))
    message = str(caught.value)
    assert message.split(": ", 1)[0].endswith(where) and message.split(": ", 1)[1].startswith(what), message


# -- sources ----------------------------------------------------------------

def test_a_directory_is_read_in_name_order():
    inv = load_inventory(os.path.join(CASES, "site"))
    assert list(inv.hosts) == ["node01", "node02", "node03", "node04", "node05", "nvme1", "nvme2", "node06", "bastion"]


def test_a_host_list(tmp_path):
    inv = load_inventory("198.18.0.1,gpu2:2222,")
    assert names(inv.select("all")) == ["198.18.0.1", "gpu2"] and inv.hosts["gpu2"].port == 2222


@pytest.mark.parametrize("setup,what", [
    (lambda p: str(p / "missing.ini"), "no such inventory"),
    (lambda p: (p / "empty").mkdir() or str(p / "empty"), "holds no inventory file"),
    (lambda p: write(p, "inv.toml", "[g]\n"), "TOML"),
    (lambda p: str(p), None),
])
def test_unusable_sources(tmp_path, setup, what):
    if what is None:  # an executable script: never run
        path = write(tmp_path, "dyn.py", "#!/usr/bin/env python3\nprint('{}')\n")
        os.chmod(path, 0o755)
        setup, what = (lambda p: path), "dynamic inventory script"
    with pytest.raises(InventoryError) as caught:
        load_inventory(setup(tmp_path))
    assert what in str(caught.value)


def test_an_unreadable_file(tmp_path):
    path = write(tmp_path, "hosts.ini", "[g]\nh\n")
    (tmp_path / "hosts.ini").write_bytes(b"[g]\nh\xff\n")
    with pytest.raises(InventoryError, match="not valid UTF-8"):
        load_inventory(path)
