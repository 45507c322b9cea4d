"""Where nictune read inventories and playbooks otherwise than Ansible (issue 9, items 14-20).

Ansible's own answers for the same inputs are compared in
tests/inventory/test_ansible_oracle.py (limit order, play host lists,
JSON files, host lists, connection value types); here are the command
line, the play's connection settings and the errors users see.

Fleet commands here never reach the network: every host of the
inventories below has an unusable nictune_python, which the controller
refuses before connecting, so each selected host comes back as a report
with that error, in the order the command chose.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.remote import fleet, ssh
from nictune.control.rollout.playbook import load_playbook
from nictune.inventory import InventoryError, Vaulted, load_inventory
from nictune.profile import yamlpos
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile

INVENTORY = """\
[rack_a]
a1
a2
[rack_b]
b1
b2
[edge]
a2
b2
[all:vars]
nictune_python=perl
ansible_host=198.18.0.1
"""

VAULTED = """\
!vault |
          $ANSIBLE_VAULT;1.1;AES256
          35356336653962363030653731663639366435313264666436623065636633396462373732353761
          3561643831613063376433383637363463366434626262660a333064313466313630323664313164
"""


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def nictune(*args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def inventory(tmp_path):
    return write(tmp_path, "hosts.ini", INVENTORY)


@pytest.fixture
def profile(tmp_path):
    return write(tmp_path, "p.yaml", "nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n")


def hosts_of(report) -> list:
    for host in report["hosts"]:  # the proof that nothing was reached
        assert "nictune_python" in host["error"]["message"], host
    return [h["host"] for h in report["hosts"]]


# -- 14: --limit on the command line ------------------------------------------------

def test_a_limit_file_works_on_the_command_line(tmp_path, inventory, profile):
    limit = write(tmp_path, "limit.txt", "b2\n\na1\n")
    code, report = nictune("plan", profile, "-i", inventory, "--limit", f"@{limit}")
    assert code == 1 and "error" not in report
    assert hosts_of(report) == ["a1", "b2"]


def test_hosts_come_in_inventory_order_whatever_the_limits(inventory, profile):
    code, report = nictune("plan", profile, "-i", inventory, "--limit", "b2,edge,a1")
    assert hosts_of(report) == ["a1", "a2", "b2"]


def test_a_playbook_takes_a_limit_file_too(tmp_path, inventory, profile):
    playbook = write(tmp_path, "pb.yaml", "- hosts: all\n  profile: p.yaml\n")
    limit = write(tmp_path, "limit.txt", "rack_b\n")
    code, report = nictune("plan", playbook, "-i", inventory, "--limit", f"@{limit}")
    assert hosts_of(report) == ["b1", "b2"]


# -- 15: a play's vars reach the connection ------------------------------------------

PLAY_VARS = """\
- hosts: rack_a
  profile: p.yaml
  vars:
    ansible_host: 198.18.7.7
    ansible_port: 2299
    ansible_user: tuner
    ansible_ssh_private_key_file: /keys/play_ed25519
    nictune_python: /usr/bin/python3
"""


def test_play_vars_set_the_connection_settings(tmp_path, inventory):
    (play,) = load_playbook(write(tmp_path, "pb.yaml", PLAY_VARS))
    inv = load_inventory(inventory)
    hosts = [play.host(h) for h in inv.select(play.hosts)]
    [job, _] = fleet.jobs_for("rollback", hosts, None, ssh.SshOptions())
    assert job.error is None
    settings = job.target.host
    assert (settings.label, settings.address, settings.port, settings.user) == ("a1", "198.18.7.7", 2299, "tuner")
    assert settings.key_files == ["/keys/play_ed25519"]
    assert inv.hosts["a1"].address == "198.18.0.1"  # the inventory's own host is left as it was


def test_a_bad_play_var_is_named_where_the_play_sets_it(tmp_path, inventory, profile):
    playbook = write(tmp_path, "pb.yaml", "- hosts: rack_a\n  profile: p.yaml\n  vars:\n    ansible_port: 0\n")
    code, report = nictune("plan", playbook, "-i", inventory)
    assert code == 1 and [h["host"] for h in report["hosts"]] == ["a1", "a2"]
    for host in report["hosts"]:
        assert host["error"]["message"].startswith(f"{playbook}:4: ansible_port of host ")
        assert "must be a port number (1-65535), not 0" in host["error"]["message"]


# -- 16: a list of patterns ---------------------------------------------------------------

def test_each_item_of_a_hosts_list_is_split_on_its_own(tmp_path, inventory):
    (play,) = load_playbook(write(tmp_path, "pb.yaml", '- hosts: ["rack_b:&edge", "a1"]\n  profile: p.yaml\n'))
    assert play.name == "rack_b:&edge,a1"
    # & applies to the whole union, as in Ansible: (rack_b + a1) & edge.
    assert [h.name for h in load_inventory(inventory).select(play.hosts)] == ["b2"]
    (play,) = load_playbook(write(tmp_path, "pb.yaml", '- hosts: ["rack_a:!a1", "rack_b"]\n  profile: p.yaml\n'))
    assert [h.name for h in load_inventory(inventory).select(play.hosts)] == ["a2", "b1", "b2"]


@pytest.mark.parametrize("hosts", ['" "', '[" ", ","]'])
def test_a_hosts_pattern_that_names_nothing_is_refused(tmp_path, hosts):
    with pytest.raises(ProfileError) as caught:
        load_playbook(write(tmp_path, "pb.yaml", f"- hosts: {hosts}\n  profile: p.yaml\n"))
    assert (caught.value.line, caught.value.keypath) == (1, "[0].hosts")
    assert "names no host or group" in caught.value.message


# -- 17: JSON is read as JSON ----------------------------------------------------------------

def test_json_numbers_are_numbers_and_keep_their_lines(tmp_path):
    path = write(tmp_path, "inv/hosts.json", '{"rails": {"hosts": {"gpu01": {\n  "ansible_port": 2.2e3,\n'
                                             '  "ratio": 1e3, "text": "1e3", "esc": "a\\u00e9"}}}}\n')
    write(tmp_path, "inv/group_vars/all.yml", '{\n  "mtu": 4.2e3,\n  "n": 1E+1\n}\n')
    host = load_inventory(path).hosts["gpu01"]
    assert host.vars == {"mtu": 4200.0, "n": 10.0, "ansible_port": 2200.0, "ratio": 1000.0,
                         "text": "1e3", "esc": "a\u00e9"}
    assert host.port == 2200
    assert host.source_of("ansible_port") == f"{path}:2"
    assert host.source_of("mtu") == f"{tmp_path}/inv/group_vars/all.yml:2"


def test_json_that_yaml_cannot_read_is_still_json(tmp_path):
    # JSON's surrogate pairs are not YAML's escapes; such a file has no lines.
    path = write(tmp_path, "hosts.json", '{"all": {"hosts": {"h1": {"key": "\\ud83d\\ude00", "x": 5e0}}}}\n')
    host = load_inventory(path).hosts["h1"]
    assert host.vars == {"key": "\U0001F600", "x": 5.0}
    assert host.source_of("key") == path


def test_json_tagged_values_are_ansibles(tmp_path):
    path = write(tmp_path, "hosts.json", '{"all": {"hosts": {"h1": {"s": {"__ansible_vault": "$ANSIBLE_VAULT;x"},'
                                         ' "u": {"__ansible_unsafe": "{{ x }}"}}}}}\n')
    host = load_inventory(path).hosts["h1"]
    assert host.vars["s"] == Vaulted("$ANSIBLE_VAULT;x") and host.vars["u"] == "{{ x }}"


# -- 18: a host list with an IPv6 address and port ------------------------------------------

def test_a_host_list_reads_bracketed_ipv6_with_a_port():
    inv = load_inventory("web1,[2001:db8::1]:2022,")
    assert list(inv.hosts) == ["web1", "2001:db8::1"]
    assert (inv.hosts["2001:db8::1"].address, inv.hosts["2001:db8::1"].port) == ("2001:db8::1", 2022)


# -- 19: Ansible Vault is named as such ---------------------------------------------------------

def test_a_vaulted_connection_value_says_vault(tmp_path):
    path = write(tmp_path, "hosts.yml", "all:\n  hosts:\n    h1:\n      ansible_user: " + VAULTED)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path).hosts["h1"].user
    assert caught.value.line == 4
    assert "ansible_user of host 'h1' is an Ansible Vault value (!vault)" in caught.value.message
    assert "does not decrypt" in caught.value.message and "ansible-vault decrypt" in caught.value.message


def test_a_vaulted_variables_file_says_vault(tmp_path):
    path = write(tmp_path, "hosts.ini", "h1\n")
    write(tmp_path, "group_vars/all.yml", "$ANSIBLE_VAULT;1.1;AES256\n3533633665396236\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert (caught.value.file, caught.value.line) == (f"{tmp_path}/group_vars/all.yml", 1)
    assert "encrypted with Ansible Vault" in caught.value.message
    assert "ansible-inventory -i INVENTORY --list -y --ask-vault-pass > FILE" in caught.value.message


def test_a_vaulted_inventory_file_says_vault(tmp_path):
    path = write(tmp_path, "hosts.ini", "$ANSIBLE_VAULT;1.1;AES256\n3533633665396236\n")
    with pytest.raises(InventoryError, match="encrypted with Ansible Vault"):
        load_inventory(path)


def test_a_vaulted_value_in_nictune_says_vault(tmp_path):
    path = write(tmp_path, "hosts.yml", "all:\n  hosts:\n    h1:\n  vars:\n    nictune:\n      host:\n"
                                        "        nccl: " + VAULTED)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.line == 5 and "holds an Ansible Vault value (!vault)" in caught.value.message


def test_vault_in_a_playbook_says_vault(tmp_path):
    # The host is never reached: its profile (here, the TARGET) fails first.
    inventory = write(tmp_path, "hosts.ini", "h1 ansible_host=198.18.0.1\n")
    playbook = write(tmp_path, "pb.yaml", "- hosts: all\n  profile: p.yaml\n  vars:\n    ansible_become_pass: "
                     + VAULTED)
    code, report = nictune("plan", playbook, "-i", inventory)
    [host] = report["hosts"]  # a TARGET that does not read is each host's error
    assert code == 1 and host["error"]["message"].startswith(f"{playbook}:4: ")
    assert "Ansible Vault value (!vault)" in host["error"]["message"]


def test_vault_in_a_profile_says_vault(tmp_path):
    err = pytest.raises(ProfileError, yamlpos.parse_text, "nictune: 1\nx: " + VAULTED, "p.yaml").value
    assert err.line == 2 and "Ansible Vault value (!vault)" in err.message
    path = write(tmp_path, "p.yaml", "$ANSIBLE_VAULT;1.1;AES256\n3533633665396236\n")
    err = pytest.raises(ProfileError, load_profile, path).value
    assert "encrypted with Ansible Vault" in err.message and "ansible-vault decrypt" in err.message


# -- 20: INI numbers as connection values -------------------------------------------------------

def test_numbers_become_what_ansibles_options_take(tmp_path):
    path = write(tmp_path, "hosts.ini", "h1 ansible_user=1000 ansible_port=2222.0 ansible_host=10\n"
                                        'h2 ansible_port="2.2e3" ansible_ssh_private_key_file=7\n')
    inv = load_inventory(path)
    h1, h2 = inv.hosts["h1"], inv.hosts["h2"]
    assert h1.vars["ansible_user"] == 1000 and h1.vars["ansible_port"] == 2222.0  # as the INI reads them
    assert (h1.user, h1.port, h1.address) == ("1000", 2222, "10")
    assert (h2.port, h2.key_file) == (2200, "7")


@pytest.mark.parametrize("value", ["2222.5", "True", "'22a'", "nan", "inf"])
def test_ports_that_are_not_whole_numbers_are_refused(tmp_path, value):
    path = write(tmp_path, "hosts.ini", f"h1 ansible_port={value}\n")
    with pytest.raises(InventoryError, match="must be a port number"):
        load_inventory(path).hosts["h1"].port
