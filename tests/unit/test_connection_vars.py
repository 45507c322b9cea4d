"""Inventory variables that decide how a host is reached: what nictune
refuses, and how it says so (variable, host, file:line, before connecting).

Which values Ansible and OpenSSH accept, and what they make of them, is
compared with the real ansible-core and ssh in
tests/inventory/test_connection_oracle.py; here are the refusals users see.
Nothing here reaches the network: a refused host never gets an SSH target.
"""

from __future__ import annotations

import json
import textwrap

import paramiko
import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.remote import fleet, ssh
from nictune.inventory import load_inventory


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def job_of(path: str, name: str = "h") -> fleet.Job:
    [job] = fleet.jobs_for("plan", [load_inventory(path).hosts[name]], None, ssh.SshOptions())
    return job


def refusal(path: str, name: str = "h") -> str:
    job = job_of(path, name)
    assert job.target is None and job.error is not None, job
    return job.error["message"]


# -- ssh args ---------------------------------------------------------------------

def test_ssh_args_set_where_and_as_whom_after_ansibles_own_options(tmp_path):
    # Before: only ProxyJump/UserKnownHostsFile/IdentitiesOnly were read, the
    # last value winning; Port, User, HostName and -i were dropped.
    path = write(tmp_path, "hosts.yml", """\
        all:
          hosts:
            h:
              ansible_port: 2200
              ansible_ssh_common_args: -o Port=3300 -l bob -o HostName=198.18.0.7 -i /keys/a -J j1@198.18.0.9
              ansible_ssh_extra_args: -o User=carol -p 4400 -i /keys/b -o ProxyJump=j2@198.18.0.10
        """)
    host = job_of(path).target.host
    assert (host.port, host.user, host.hostname) == (2200, "bob", "198.18.0.7")
    assert host.key_files == ["/keys/a", "/keys/b"] and host.proxy_jump == "j1@198.18.0.9"


@pytest.mark.parametrize("args,words", [
    ("-o SendEnv=LANG", "'-o SendEnv=LANG', which changes where or how ssh connects"),
    ("-L 8080:localhost:80", "-L ('-L 8080:localhost:80')"),
    ("-o HostKeyAlias=spine01", "'-o HostKeyAlias=spine01'"),
    ("-o ProxyCommand='nc %h %p; touch /tmp/x'", "ssh would run this ProxyCommand with a shell"),
    ("198.18.0.1", "which ssh would take as the host to connect to"),
    ("-o Port={{ rail_port }}", "is a Jinja template, which nictune does not render"),
    ("{# note #} -o Port=22", "is a Jinja template"),
    ("-o 'Port 22", "cannot be split into words"),
])
def test_ssh_args_nictune_cannot_honour_are_refused_by_name_and_line(tmp_path, args, words):
    path = write(tmp_path, "hosts.yml", f"""\
        all:
          vars:
            ansible_user: root
          hosts:
            h:
              ansible_ssh_extra_args: {json.dumps(args)}
        """)
    message = refusal(path)
    assert message.startswith(f"{path}:6: ansible_ssh_extra_args of host 'h' "), message
    assert words in message


def test_a_second_jump_after_the_common_args_one_is_refused_as_ssh_refuses_it(tmp_path):
    path = write(tmp_path, "hosts.ini", """\
        h ansible_ssh_common_args="-J a@198.18.0.1" ansible_ssh_extra_args="-J b@198.18.0.2"
        """)
    message = refusal(path)
    assert message.startswith(f"{path}:1: ansible_ssh_extra_args of host 'h' ") and "single -J" in message


def test_unsafe_args_are_text_not_templates(tmp_path):
    path = write(tmp_path, "hosts.yml", """\
        all:
          hosts:
            h:
              ansible_ssh_common_args: !unsafe "-o ProxyJump=j{{x}}@198.18.0.1"
        """)
    assert job_of(path).target.host.proxy_jump == "j{{x}}@198.18.0.1"


def test_play_vars_args_are_named_where_the_play_sets_them(tmp_path):
    from nictune.control.rollout.playbook import load_playbook

    inventory = write(tmp_path, "hosts.ini", "h ansible_host=198.18.0.1\n")
    playbook = write(tmp_path, "pb.yaml", """\
        - hosts: h
          profile: p.yaml
          vars:
            ansible_ssh_common_args: -o RemoteCommand=id
        """)
    (play,) = load_playbook(playbook)
    [job] = fleet.jobs_for("plan", [play.host(load_inventory(inventory).hosts["h"])], None, ssh.SshOptions())
    assert job.error["message"].startswith(f"{playbook}:4: ansible_ssh_common_args of host 'h' ")


def test_a_proxy_command_from_args_gets_its_tokens_and_rules_out_ssh_configs_jump():
    config = paramiko.SSHConfig.from_text("Host 198.18.0.*\n  ProxyJump cfg@198.18.9.9\n  User ops\n")
    ep = ssh._endpoint(config, "198.18.0.5", port=2200, proxy_command="ssh -W %h:%p -l %r bastion %%")
    assert ep.proxy_jump is None
    assert ep.proxy_command == "ssh -W 198.18.0.5:2200 -l ops bastion %"


def test_a_proxy_command_whose_host_is_not_plain_is_refused():
    with pytest.raises(ssh.TransportError, match="not a plain command"):
        ssh._endpoint(paramiko.SSHConfig(), "a;reboot", proxy_command="nc %h 22")


def test_ansible_ssh_args_come_before_ansibles_own_options(tmp_path):
    path = write(tmp_path, "hosts.ini", 'h ansible_port=2200 ansible_ssh_args="-o Port=2400 -C" '
                                        'ansible_ssh_common_args="-p 2500"\n')
    assert job_of(path).target.host.port == 2400


@pytest.mark.parametrize("line,name", [
    ("ansible_ssh_executable=/usr/local/bin/ssh-wrapper", "ansible_ssh_executable"),
    ("ansible_ssh_private_key='-----BEGIN OPENSSH PRIVATE KEY-----'", "ansible_ssh_private_key"),
    ("ansible_private_key='-----BEGIN OPENSSH PRIVATE KEY-----'", "ansible_private_key"),
    ("ansible_ssh_pkcs11_provider=/usr/lib/opensc-pkcs11.so", "ansible_ssh_pkcs11_provider"),
])
def test_other_ways_to_tell_ansibles_ssh_how_to_connect_are_refused(tmp_path, line, name):
    path = write(tmp_path, "hosts.ini", f"h {line}\n")
    message = refusal(path)
    assert message.startswith(f"{path}:1: {name} of host 'h' ") and "BEGIN" not in message


# -- StrictHostKeyChecking ----------------------------------------------------------

def test_strict_host_key_checking_no_is_named_when_a_host_key_is_refused(tmp_path):
    # Before: the option was dropped without a word; the refusal said only
    # "unknown host key", and the user could not see why Ansible connected.
    path = write(tmp_path, "hosts.ini", """\
        [all:vars]
        ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
        [rails]
        h ansible_host=198.18.0.1
        """)
    host = job_of(path).target.host
    assert host.known_hosts == ["/dev/null"]
    note = host.host_key_note
    assert note.startswith(f"-o StrictHostKeyChecking=no in ansible_ssh_common_args ({path}:2) is not honoured")
    key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else paramiko.ECDSAKey.generate()
    check = ssh._HostKeyCheck({}, False, str(tmp_path / "kh"), note)
    with pytest.raises(ssh.HostKeyRefused) as refused:
        check.missing_host_key(None, "198.18.0.1", key)
    assert "unknown host key" in str(refused.value) and note in str(refused.value)


def test_ansible_host_key_checking_false_is_named_too(tmp_path):
    path = write(tmp_path, "hosts.ini", "h ansible_host=198.18.0.1 ansible_host_key_checking=false\n")
    assert job_of(path).target.host.host_key_note.startswith(f"ansible_host_key_checking=false ({path}:1) is not honoured")


# -- ansible_connection -------------------------------------------------------------

@pytest.mark.parametrize("value", ["local", "winrm", "ansible.builtin.local", "docker", "SSH"])
def test_a_host_ansible_reaches_otherwise_than_over_ssh_is_refused(tmp_path, value):
    # Before: ansible_connection was never read: a local or winrm host was
    # reached over SSH at its name.
    path = write(tmp_path, "hosts.ini", f"[ctl]\nh ansible_connection={value}\n")
    message = refusal(path)
    assert message.startswith(f"{path}:2: ansible_connection of host 'h' is {value!r}: nictune reaches hosts "
                              "only over SSH"), message


def test_a_play_that_sets_a_local_connection_is_refused_where_it_says_so(tmp_path):
    from nictune.control.rollout.playbook import load_playbook

    inventory = write(tmp_path, "hosts.ini", "h ansible_host=198.18.0.1\n")
    playbook = write(tmp_path, "pb.yaml", "- hosts: h\n  profile: p.yaml\n  vars:\n    ansible_connection: local\n")
    (play,) = load_playbook(playbook)
    [job] = fleet.jobs_for("plan", [play.host(load_inventory(inventory).hosts["h"])], None, ssh.SshOptions())
    assert job.error["message"].startswith(f"{playbook}:4: ansible_connection of host 'h' is 'local'")


def test_a_play_keyword_connection_or_become_is_refused_by_the_playbook_schema(tmp_path):
    from nictune.control.rollout.playbook import load_playbook
    from nictune.profile.errors import ProfileError

    for key, value in (("connection", "local"), ("become_user", "postgres"), ("become_method", "su")):
        playbook = write(tmp_path, "pb.yaml", f"- hosts: h\n  profile: p.yaml\n  {key}: {value}\n")
        with pytest.raises(ProfileError, match=f"pb.yaml:3: .*unknown key '{key}'"):
            load_playbook(playbook)


def test_paramiko_hosts_read_no_ssh_args_as_ansibles_paramiko_does(tmp_path):
    path = write(tmp_path, "hosts.ini", """\
        h ansible_connection=paramiko ansible_port=2200 ansible_ssh_common_args="-o Port=1 -J j@198.18.0.9"
        """)
    host = job_of(path).target.host
    assert (host.port, host.proxy_jump, host.read_ssh_config) == (2200, None, False)


def test_a_paramiko_proxy_command_is_refused(tmp_path):
    path = write(tmp_path, "hosts.ini", "h ansible_connection=paramiko ansible_paramiko_proxy_command=\"nc j 22\"\n")
    assert refusal(path).startswith(f"{path}:1: ansible_paramiko_proxy_command of host 'h' sets a proxy")


# -- become ----------------------------------------------------------------------------

@pytest.mark.parametrize("line,name,words", [
    ("ansible_become_user=postgres", "ansible_become_user", "is 'postgres': nictune runs its agent as root"),
    ("ansible_sudo_user=app", "ansible_sudo_user", "is 'app'"),
    ("ansible_become_method=su", "ansible_become_method", "is 'su': nictune becomes root only with sudo"),
    ("ansible_become_method=doas", "ansible_become_method", "is 'doas'"),
    ("ansible_become_exe=/opt/bin/sudo2", "ansible_become_exe", "is '/opt/bin/sudo2': nictune runs `sudo`"),
    ("ansible_become_password=s3cret-pw", "ansible_become_password", "sets a become password, which nictune never sends"),
    ("ansible_become_pass=s3cret-pw", "ansible_become_pass", "sets a become password"),
    ("ansible_sudo_pass=s3cret-pw", "ansible_sudo_pass", "sets a become password"),
])
def test_a_become_nictune_would_not_do_is_refused_before_connecting(tmp_path, line, name, words):
    # Before: all ignored; the agent ran as root through `sudo -n`, which
    # then failed on a host that wants a password.
    path = write(tmp_path, "hosts.ini", f"[gpu]\nh ansible_user=ops {line}\n")
    message = refusal(path)
    assert message.startswith(f"{path}:2: {name} of host 'h' {words}"), message
    assert "s3cret-pw" not in message


@pytest.mark.parametrize("line", ["ansible_become_user=root ansible_become_method=sudo",
                                  "ansible_become_method=ansible.builtin.sudo ansible_become=true",
                                  "ansible_become_password=''"])
def test_a_become_nictune_does_is_taken(tmp_path, line):
    assert job_of(write(tmp_path, "hosts.ini", f"h ansible_user=ops {line}\n")).error is None


def test_refused_hosts_come_back_in_the_report_and_others_still_run(tmp_path):
    inventory = write(tmp_path, "hosts.ini", """\
        a ansible_connection=local
        b ansible_become_method=su nictune_python=perl
        """)
    profile = write(tmp_path, "p.yaml", "nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n")
    result = CliRunner().invoke(app, ["plan", profile, "-i", inventory, "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    messages = {h["host"]: h["error"]["message"] for h in report["hosts"]}
    assert "ansible_connection of host 'a'" in messages["a"] and "ansible_become_method of host 'b'" in messages["b"]


def test_hostile_args_end_in_a_refusal_never_a_traceback():
    import random

    from nictune.control.remote import sshargs

    rng = random.Random(2119)
    alphabet = ["-", "o", "J", "p", "i", "l", "=", " ", "'", '"', "%", "h", "\\", "\t", "\n", "\x00", "{", ":",
                "[", "]", ",", "@", "Port", "ProxyCommand", "ProxyJump", "HostName", "none", "9", "é", ";"]
    counts = {"taken": 0, "refused": 0}
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        try:
            sshargs.resolve([("args", sshargs.parse(text))])
            counts["taken"] += 1
        except sshargs.SshArgsError:
            counts["refused"] += 1
    print(counts)
    assert sum(counts.values()) == 3000 and counts["taken"] >= 10 and counts["refused"] >= 1000, counts
