"""Variables where nictune read an inventory or a playbook otherwise than Ansible.

Templates: Ansible renders a Jinja template in a variable when the
variable is used; nictune renders none, so a template in a `nictune:`
layer, a play's vars.nictune, or a connection value it reads is refused
with the variable and file:line, never used as the text it was written as.

Playbook-directory variables: group_vars/ and host_vars/ beside the
playbook count for every play, each just above the inventory's.

A `nictune` mapping set twice at one level: each assignment is its own
layer, in file order, so the profile merge deep-merges them.

ansible-core's own answers for the same inputs are compared in
tests/inventory/test_ansible_vars_oracle.py.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.remote import fleet, ssh
from nictune.control.rollout.playbook import load_playbook
from nictune.inventory import InventoryError, Unsafe, load_inventory
from nictune.inventory.templates import first_template, is_template
from nictune.profile.errors import ProfileError

NOT_RENDERED = "is a Jinja template, which nictune does not render"
PROFILE = "nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n"


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def refusal(path: str) -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return caught.value


# -- templates --------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["={{ rail_if }}", "{% if x %}a{% endif %}", "a{# note #}b", "{{",
                                  "#jinja2:variable_start_string:'[['\n[[ x ]]"])
def test_a_string_ansible_would_render_is_a_template(text):
    assert is_template(text)
    assert not is_template(Unsafe(text))  # !unsafe: Ansible never renders it


@pytest.mark.parametrize("text", ["=eth0", "{ x }", "50%", "a}}b", "#jinja", " #jinja2:x", "{x}#"])
def test_other_strings_are_not(text):
    assert not is_template(text)


def test_the_first_template_is_found_in_lists_and_mappings():
    value = {"a": [1, "x", {"b": "y"}], "c": {"d": ["ok", "{{ z }}"]}, "e": "{{ later }}"}
    assert first_template(value) == (("c", "d", 1), "{{ z }}")
    assert first_template({"{{ key }}": "value"}) is None  # Ansible renders no key


def test_a_templated_nictune_leaf_in_an_ini_inventory_is_refused(tmp_path):
    path = write(tmp_path, "hosts.ini", """\
        [rails]
        h1 rail_if=eth1
        [rails:vars]
        nictune={"host": {"nccl": {"env": {"NCCL_SOCKET_IFNAME": "={{ rail_if }}"}}}}
        """)
    error = refusal(path)
    assert (error.file, error.line) == (path, 4)
    assert f"nictune.host.nccl.env.NCCL_SOCKET_IFNAME of host 'h1' {NOT_RENDERED}" in error.message
    assert "'={{ rail_if }}'" in error.message


def test_a_templated_nictune_leaf_in_a_group_vars_file_is_refused(tmp_path):
    path = write(tmp_path, "hosts.yml", "rails:\n  hosts:\n    h1:\n")
    vars_file = write(tmp_path, "group_vars/rails.yml", """\
        rail_mtu: 9000
        nictune:
          interfaces:
            rails:
              match: {name: "eth*"}
              mtu: "{{ rail_mtu }}"
        """)
    error = refusal(path)
    assert (error.file, error.line) == (vars_file, 2)
    assert f"nictune.interfaces.rails.mtu of host 'h1' {NOT_RENDERED}" in error.message


def test_a_templated_nictune_value_is_refused_whole(tmp_path):
    path = write(tmp_path, "hosts.ini", "h1 nictune='{{ overrides }}'\n")
    error = refusal(path)
    assert error.line == 1 and f"nictune of host 'h1' {NOT_RENDERED}" in error.message


def test_unsafe_text_stays_literal(tmp_path):
    path = write(tmp_path, "hosts.yml", """\
        all:
          hosts:
            h1:
              nictune:
                host: {nccl: {env: {NCCL_SOCKET_IFNAME: !unsafe "={{ rail_if }}"}}}
        """)
    [(layer, where)] = load_inventory(path).hosts["h1"].nictune_overrides()
    assert layer["host"]["nccl"]["env"]["NCCL_SOCKET_IFNAME"] == "={{ rail_if }}"
    assert where == f"{path}:4"


@pytest.mark.parametrize("name", ["ansible_port", "ansible_ssh_port"])
def test_a_templated_port_says_template_not_port_number(tmp_path, name):
    path = write(tmp_path, "hosts.ini", f"h1\n[all:vars]\n{name}=\"{{{{ 2200 + 2 }}}}\"\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path).hosts["h1"].port
    assert (caught.value.file, caught.value.line) == (path, 3)
    assert f"{name} of host 'h1' {NOT_RENDERED}" in caught.value.message
    assert "port number" not in caught.value.message


@pytest.mark.parametrize("name", ["ansible_python_interpreter", "nictune_python", "nictune_state_dir"])
def test_a_templated_interpreter_says_template(tmp_path, name):
    path = write(tmp_path, "hosts.ini", f"h1\nh2 {name}=\"{{{{ ansible_playbook_python }}}}\"\n")
    [job] = fleet.jobs_for("rollback", load_inventory(path).select("h2"), None, ssh.SshOptions())
    assert job.target is None
    assert job.error["message"].startswith(f"{path}:2: {name} of host 'h2' {NOT_RENDERED}")
    assert "python3 command" not in job.error["message"]


def test_a_templated_interpreter_nictune_does_not_use_is_no_error(tmp_path):
    path = write(tmp_path, "hosts.ini", "h1 nictune_python=/usr/bin/python3\n"
                                        "[all:vars]\nansible_python_interpreter=\"{{ ansible_playbook_python }}\"\n")
    [job] = fleet.jobs_for("rollback", load_inventory(path).select("h1"), None, ssh.SshOptions())
    assert job.error is None and job.target.host.python == "/usr/bin/python3"


def test_a_templated_interpreter_names_the_way_out(tmp_path):
    path = write(tmp_path, "hosts.ini", "h1 ansible_python_interpreter=\"{{ ansible_playbook_python }}\"\n")
    [job] = fleet.jobs_for("rollback", load_inventory(path).select("h1"), None, ssh.SshOptions())
    assert job.error["message"].endswith("; set nictune_python to the interpreter's path.")


@pytest.mark.parametrize("text", ["{# x #}", "#jinja2:trim_blocks:True\nx"])
def test_every_marker_ansible_knows_is_refused_in_connection_values(tmp_path, text):
    path = write(tmp_path, "hosts.yml", "all:\n  hosts:\n    h1:\n      ansible_user: " + json.dumps(text) + "\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path).hosts["h1"].user
    assert caught.value.line == 4 and NOT_RENDERED in caught.value.message


def test_a_templated_play_nictune_leaf_is_refused_at_its_line(tmp_path):
    path = write(tmp_path, "pb.yaml", """\
        - hosts: all
          profile: p.yaml
          vars:
            nictune:
              host:
                nccl:
                  env:
                    NCCL_IB_HCA: "=mlx5_0"
                    NCCL_SOCKET_IFNAME: "={{ rail_if }}"
        """)
    with pytest.raises(ProfileError) as caught:
        load_playbook(path)
    assert (caught.value.file, caught.value.line) == (path, 9)
    assert caught.value.keypath == "[0].vars.nictune.host.nccl.env.NCCL_SOCKET_IFNAME"
    assert NOT_RENDERED in caught.value.message


def test_the_command_refuses_the_inventory_before_any_host(tmp_path):
    profile = write(tmp_path, "p.yaml", PROFILE)
    path = write(tmp_path, "hosts.ini", "h1 nictune='{\"host\": {\"sysctl\": {\"net.core.somaxconn\": "
                                        "\"{{ conns }}\"}}}'\n")
    result = CliRunner().invoke(app, ["plan", profile, "-i", path, "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code != 0 and report["hosts"] == []
    assert report["error"]["message"].startswith(f"{path}:1: nictune.host.sysctl.net.core.somaxconn "
                                                 f"of host 'h1' {NOT_RENDERED}")


# -- group_vars/ and host_vars/ beside the playbook ------------------------------------------

@pytest.fixture
def beside(tmp_path):
    """An inventory in inv/, a playbook in pb/ with its own group_vars and host_vars."""
    inventory = write(tmp_path, "inv/hosts.ini", """\
        [rails]
        h1
        h2
        """)
    write(tmp_path, "inv/group_vars/all.yml", "ansible_user: inventory_all\n")
    write(tmp_path, "inv/group_vars/rails.yml", "ansible_host: 198.18.0.1\nansible_port: 2201\n")
    write(tmp_path, "inv/host_vars/h1.yml", "ansible_port: 2202\n")
    write(tmp_path, "pb/group_vars/all.yml", "ansible_user: playbook_all\nansible_host: 198.18.0.9\n")
    write(tmp_path, "pb/host_vars/h1.yml", "ansible_port: 2299\n"
                                           "nictune: {host: {sysctl: {net.core.somaxconn: 4096}}}\n")
    write(tmp_path, "pb/p.yaml", PROFILE)
    playbook = write(tmp_path, "pb/site.yaml", "- hosts: rails\n  profile: p.yaml\n")
    return inventory, playbook


def test_a_plays_hosts_connect_as_the_playbook_directory_says(beside):
    inventory, playbook = beside
    (play,) = load_playbook(playbook)
    hosts = [play.host(h) for h in load_inventory(inventory).select(play.hosts)]
    jobs = fleet.jobs_for("rollback", hosts, None, ssh.SshOptions())
    assert len(jobs) == 2
    settings = [(j.target.host.label, j.target.host.address, j.target.host.port, j.target.host.user)
                for j in jobs]
    # rails (inventory) over all (playbook) for the address; the playbook's host_vars over the inventory's.
    assert settings == [("h1", "198.18.0.1", 2299, "playbook_all"), ("h2", "198.18.0.1", 2201, "playbook_all")]


def test_the_playbook_directory_adds_its_nictune_layers_in_order(beside, tmp_path):
    inventory, playbook = beside
    write(tmp_path, "inv/group_vars/all.yml", "nictune: {host: {sysctl: {net.ipv4.tcp_ecn: 2}}}\n")
    (play,) = load_playbook(playbook)
    host = play.host(load_inventory(inventory).hosts["h1"])
    assert [where for _, where in host.nictune_overrides()] == [f"{tmp_path}/inv/group_vars/all.yml:1",
                                                                f"{tmp_path}/pb/host_vars/h1.yml:2"]
    profile = fleet.PlayProfiles(play).for_host(host)
    assert profile.doc["host"]["sysctl"] == {"net.ipv4.tcp_ecn": 2, "net.core.somaxconn": 4096}


def test_the_inventorys_own_directory_is_read_once(tmp_path):
    inventory = write(tmp_path, "hosts.ini", "h1\n")
    write(tmp_path, "group_vars/all.yml", "nictune: {host: {sysctl: {net.ipv4.tcp_ecn: 2}}}\n")
    write(tmp_path, "p.yaml", PROFILE)
    (play,) = load_playbook(write(tmp_path, "site.yaml", "- hosts: all\n  profile: p.yaml\n"))
    host = play.host(load_inventory(inventory).hosts["h1"])
    assert len(host.nictune_overrides()) == 1


def test_a_broken_playbook_vars_file_stops_the_command_naming_it(beside, tmp_path):
    inventory, playbook = beside
    broken = write(tmp_path, "pb/group_vars/rails.yml", "a: [1,\n")
    result = CliRunner().invoke(app, ["plan", playbook, "-i", inventory, "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code != 0 and report["hosts"] == []
    assert report["error"]["message"].startswith(f"{broken}:")


def test_a_playbook_vars_file_warning_is_shown(beside, tmp_path):
    inventory, playbook = beside
    write(tmp_path, "pb/host_vars/h2.yml", "x: 1\nx: 2\n")
    write(tmp_path, "pb/group_vars/rails.yml", "nictune_python: perl\n")  # refused before connecting
    result = CliRunner().invoke(app, ["plan", playbook, "-i", inventory, "--json"])
    assert f"{tmp_path}/pb/host_vars/h2.yml:2: duplicate key 'x'" in result.stderr
    report = json.loads(result.stdout)
    assert [h["host"] for h in report["hosts"]] == ["h1", "h2"]
    assert all("nictune_python 'perl'" in h["error"]["message"] for h in report["hosts"])


# -- a mapping set twice at one level ------------------------------------------------------

def test_every_nictune_assignment_at_one_level_is_a_layer_in_file_order(tmp_path):
    inventory = tmp_path / "inv"
    a = write(tmp_path, "inv/a.ini", """\
        [g1]
        d1 nictune='{"host": {"sysctl": {"a": 1}}}' m='{"a": 1}'
        [g1:vars]
        nictune={"host": {"sysctl": {"ga": 1}}}
        [g1:vars]
        nictune={"host": {"sysctl": {"gb": 1}}}
        """)
    b = write(tmp_path, "inv/b.yml", """\
        g2:
          hosts:
            d1: {nictune: {host: {sysctl: {b: 1}}}, m: {b: 1}}
        g3:
          hosts:
            d1:
              nictune: {host: {sysctl: {c: 1}}}
        """)
    host = load_inventory(str(inventory)).hosts["d1"]
    layers = host.nictune_overrides()
    assert [(sorted(v["host"]["sysctl"]), where) for v, where in layers] == [
        (["ga"], f"{a}:4"), (["gb"], f"{a}:6"), (["a"], f"{a}:2"), (["b"], f"{b}:3"), (["c"], f"{b}:7")]
    # Any other variable: the last one wins, whole, as in Ansible.
    assert host.vars["m"] == {"b": 1} and host.vars["nictune"] == {"host": {"sysctl": {"c": 1}}}
    assert host.source_of("nictune") == f"{b}:7"


def test_a_group_under_two_parents_in_one_yaml_file_keeps_both_layers(tmp_path):
    path = write(tmp_path, "hosts.yml", """\
        left:
          children:
            rails:
              vars:
                nictune: {host: {sysctl: {net.ipv4.tcp_ecn: 2}}}
        right:
          children:
            rails:
              hosts: {h1: }
              vars:
                nictune: {host: {sysctl: {net.core.somaxconn: 4096}}}
        """)
    profile = write(tmp_path, "p.yaml", PROFILE)
    host = load_inventory(path).hosts["h1"]
    assert [where for _, where in host.nictune_overrides()] == [f"{path}:5", f"{path}:11"]
    merged = fleet.Profiles(profile).for_host(host)
    assert merged.doc["host"]["sysctl"] == {"net.ipv4.tcp_ecn": 2, "net.core.somaxconn": 4096}
