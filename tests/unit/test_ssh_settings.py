"""Where SSH connection settings come from: inventory, ssh config, ssh args."""

from __future__ import annotations

import paramiko
import pytest

from nictune.control.remote import ssh
from nictune.control.remote import sshargs
from nictune.control.remote.fleet import ssh_host
from nictune.host.errors import TransportError

CONFIG = """\
Host 198.18.1.*
    User ops
    Port 2222
    IdentityFile ~/.ssh/rails_ed25519
    UserKnownHostsFile /etc/nictune/known_hosts /etc/nictune/known_hosts.old
    IdentitiesOnly yes
Host gpu07
    HostName 198.18.1.7
    ProxyJump bastion@198.18.0.10:2200
"""


def config() -> paramiko.SSHConfig:
    return paramiko.SSHConfig.from_text(CONFIG)


def test_ssh_config_fills_what_the_inventory_leaves_open():
    ep = ssh._endpoint(config(), "198.18.1.3")
    assert (ep.hostname, ep.port, ep.user) == ("198.18.1.3", 2222, "ops")
    assert ep.key_files[0].endswith("/.ssh/rails_ed25519")
    assert ep.known_hosts == ["/etc/nictune/known_hosts", "/etc/nictune/known_hosts.old"]
    assert ep.identities_only and ep.proxy_jump is None


def test_inventory_values_win_over_ssh_config():
    ep = ssh._endpoint(config(), "198.18.1.3", port=22, user="root", key_files=["/k"],
                       known_hosts=["/run/kh"])
    assert (ep.port, ep.user, ep.known_hosts) == (22, "root", ["/run/kh"])
    # ssh tries every IdentityFile, the command line's first, then ssh config's.
    assert ep.key_files[0] == "/k" and ep.key_files[1].endswith("/.ssh/rails_ed25519")


def test_ssh_configs_proxy_command_gets_the_inventorys_port_and_user():
    # ssh fills %p and %r with the settings it connects with (the command
    # line's first); paramiko filled them with the config's own.
    cfg = paramiko.SSHConfig.from_text("Host x\n  HostName 198.18.0.1\n  Port 2201\n  User ops\n"
                                       "  ProxyCommand nc -q0 %h %p %r %%\n")
    assert ssh._endpoint(cfg, "x", port=2200, user="root").proxy_command == "nc -q0 198.18.0.1 2200 root %"
    assert ssh._endpoint(cfg, "x").proxy_command == "nc -q0 198.18.0.1 2201 ops %"


def test_proxyjump_and_its_hops():
    ep = ssh._endpoint(config(), "gpu07")
    assert ep.hostname == "198.18.1.7" and ep.proxy_jump == "bastion@198.18.0.10:2200"
    hop = ssh._hop(config(), "bastion@198.18.0.10:2200")
    assert (hop.hostname, hop.port, hop.user) == ("198.18.0.10", 2200, "bastion")
    hop = ssh._hop(config(), "bastion@[2001:db8::7]:2200")
    assert (hop.hostname, hop.port, hop.user) == ("2001:db8::7", 2200, "bastion")
    assert ssh._hop(config(), "[2001:db8::7]").hostname == "2001:db8::7"


def test_ansible_ssh_args_are_read_as_words_never_run():
    line = sshargs.resolve([("args", sshargs.parse(
        "-o UserKnownHostsFile=/run/lab/kh -oIdentitiesOnly=yes -J jump@198.18.0.1"))])
    assert line.known_hosts == ["/run/lab/kh"]
    assert line.identities_only and line.proxy_jump == "jump@198.18.0.1"
    # A ProxyCommand ssh's shell would read otherwise than nictune's argv is refused.
    with pytest.raises(sshargs.SshArgsError, match="plain command"):
        sshargs.parse("-o 'ProxyCommand=nc %h %p; rm -rf /'")
    with pytest.raises(sshargs.SshArgsError, match="cannot be split"):
        sshargs.parse("-o 'unbalanced")


class InvHost:
    def __init__(self, **vars):
        self.name, self.vars = "gpu01", vars
        self.address, self.port, self.user, self.key_file = "198.18.1.1", None, None, None

    def where_of(self, name):
        return ("hosts.yml", 3) if name in self.vars else None


def test_inventory_variables_become_connection_settings():
    host = ssh_host(InvHost(ansible_python_interpreter="auto_silent", nictune_state_dir="/srv/nt",
                            ansible_ssh_common_args="-o UserKnownHostsFile=/kh -o IdentitiesOnly=yes"))
    assert host.python == "python3" and host.state_dir == "/srv/nt"
    assert host.known_hosts == ["/kh"] and host.identities_only
    assert ssh_host(InvHost(nictune_python="/usr/bin/python3.11")).python == "/usr/bin/python3.11"


@pytest.mark.parametrize("python", ["python3; reboot", "perl", "/usr/bin/py thon", "$(id)"])
def test_a_python_that_is_not_a_plain_path_is_refused(python):
    with pytest.raises(TransportError, match="nictune_python"):
        ssh.SshTarget(ssh.SshHost("h", "198.18.1.1", python=python), ssh.SshOptions())


def test_a_state_dir_that_is_not_absolute_and_normalised_is_refused():
    with pytest.raises(ValueError):
        ssh.SshTarget(ssh.SshHost("h", "198.18.1.1", state_dir="/var/../etc"), ssh.SshOptions())


def test_play_vars_win_over_the_inventory_for_connection_settings(tmp_path):
    from nictune.control.remote.fleet import jobs_for
    from nictune.control.rollout.playbook import Play
    from nictune.inventory import load_inventory

    path = tmp_path / "hosts.ini"
    path.write_text("h ansible_host=198.18.1.1 nictune_state_dir=/srv/inventory\n")
    host = load_inventory(str(path)).hosts["h"]
    play = Play(name="p", hosts="all", profiles=[], vars={"nictune_state_dir": "/srv/play"},
                serial=["100%"], max_fail_percentage=0.0, source="pb.yaml:1")
    [job] = jobs_for("rollback", [play.host(host)], None, ssh.SshOptions())
    assert job.target.host.state_dir == "/srv/play"
    [job] = jobs_for("rollback", [host], None, ssh.SshOptions())
    assert job.target.host.state_dir == "/srv/inventory"


@pytest.mark.parametrize("name", ["nictune_state_dir", "nictune_python", "ansible_ssh_common_args"])
def test_a_vaulted_setting_nictune_reads_itself_is_refused_by_name(tmp_path, name):
    # Read as text it was "Vaulted(<encrypted>)": a state directory refused
    # for its shape, or ssh arguments silently dropped.
    from nictune.control.remote.fleet import jobs_for
    from nictune.inventory import load_inventory

    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    h:\n"
                    f"      {name}: !vault |\n"
                    "        $ANSIBLE_VAULT;1.1;AES256\n"
                    "        6231\n")
    [job] = jobs_for("plan", [load_inventory(str(path)).hosts["h"]], None, ssh.SshOptions())
    assert job.target is None
    message = job.error["message"]
    assert f"{path}:4" in message and name in message and "Ansible Vault" in message
