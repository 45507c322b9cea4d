"""How a host is reached, nictune against ansible-core 2.19 and OpenSSH.

Two oracles, neither touching the network:

- ansible-core builds the ssh command line.  `ansible all -m ping -vvv`
  runs with `ansible_ssh_executable` set to a stand-in that records its
  argv and fails (so every host is "unreachable" at once); `-vvv` says
  which connection plugin each host got ("ESTABLISH SSH CONNECTION",
  "ESTABLISH PARAMIKO SSH CONNECTION", another, or an error).
- OpenSSH reads that command line: `ssh -G -F <ssh config> <argv>` prints
  the settings ssh would connect with (HostName, Port, User, IdentityFile,
  ProxyJump, ProxyCommand, UserKnownHostsFile, IdentitiesOnly), command-line
  options first as ssh takes them, then the ssh config's.

nictune's own settings for the same inventory (fleet.ssh_host, then
ssh._endpoint with the same ssh config) must be ssh's, and nictune must
take exactly the hosts Ansible reaches over SSH.  Which become methods are
sudo, and which variables carry the sudo become plugin's settings, are
asked of ansible-core's plugin loader and documentation.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

from nictune.control.remote import connection, fleet, ssh, sshargs
from nictune.inventory import InventoryError, load_inventory

BIN = Path(sys.executable).parent
ANSIBLE = shutil.which("ansible", path=str(BIN)) or shutil.which("ansible")
SSH = shutil.which("ssh")

pytestmark = pytest.mark.skipif(ANSIBLE is None or SSH is None,
                                reason="ansible-core and OpenSSH's ssh (the oracles) are not installed")

FAKE_SSH = """\
#!{python}
import json, os, sys
with open(os.environ["NT_RECORD"], "a") as f:
    f.write(json.dumps(sys.argv) + "\\n")
sys.exit(255)
"""

SSH_CONFIG = """\
Host cfg-*
    Port 2201
    User cfguser
    IdentityFile {keys}/k3
    ProxyJump cfgjump@198.18.0.30
    UserKnownHostsFile {tmp}/kh_cfg
    IdentitiesOnly yes
Host cmd-*
    ProxyCommand nc 198.18.0.31 22
Host tok-*
    HostName 198.18.0.35
    Port 2201
    User cfguser
    ProxyCommand nc -X connect %h %p %r %n
"""

# Hosts whose ssh settings both sides work out (the address is the
# destination ssh is given; every one distinct, to find its argv).
SSH_HOSTS = """\
own   ansible_host=198.18.0.5 ansible_port=2200 ansible_user=ops ansible_ssh_private_key_file={keys}/k1 ansible_ssh_common_args="-o Port=3300 -i {keys}/k2 -J jump@198.18.0.9" ansible_ssh_extra_args="-p 4400 -oUser=x"
args  ansible_host=198.18.0.6 ansible_ssh_common_args="-o Port=3300 -l bob -o IdentityFile={keys}/k2" ansible_ssh_extra_args="-p 4400 -o User=carol -o HostName=198.18.0.77 -i {keys}/k1"
glued ansible_host=198.18.0.7 ansible_ssh_common_args="-Cp2222 -o 'PORT 1' -oHostName=198.18.0.66 -vv -o ControlMaster=auto -o ServerAliveInterval=5" ansible_ssh_extra_args="-o HostName=198.18.0.67 -tt"
cfg1  ansible_host=cfg-one ansible_ssh_common_args="-o ProxyCommand='ssh -W %h:%p -l jump 198.18.0.10' -o UserKnownHostsFile='{tmp}/kh_a {tmp}/kh_b'"
cfg2  ansible_host=cfg-two ansible_user=root ansible_ssh_extra_args="-o IdentitiesOnly=no -o Port=2299 -o ProxyJump=none"
cfg3  ansible_host=cfg-three ansible_ssh_common_args="-o ProxyCommand=none"
cfg4  ansible_host=cfg-four ansible_ssh_private_key_file={keys}/k1 ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
cmd1  ansible_host=cmd-one ansible_ssh_common_args="-o ProxyJump=none" ansible_ssh_extra_args="-o User=u1"
cmd2  ansible_host=cmd-two ansible_ssh_common_args="-J j2@198.18.0.32:2022,j3@198.18.0.33"
tok1  ansible_host=tok-one ansible_port=2200 ansible_ssh_extra_args="-l argsuser"
early ansible_host=198.18.0.8 ansible_port=2200 ansible_user=ops ansible_ssh_args="-C -o Port=2400 -o User=early" ansible_ssh_common_args="-p 2500"
"""

# ansible_connection values, each on its own loopback address with a port
# nothing listens on: Ansible fails at once whichever plugin it picks.
CONNECTIONS = ["ssh", "smart", "paramiko", "paramiko_ssh", "ansible.builtin.ssh", "ansible.legacy.ssh",
               "ansible.builtin.paramiko_ssh", "ansible.legacy.paramiko_ssh", "local", "ansible.builtin.local",
               "winrm", "psrp", "SSH", "ansible.builtin.smart", "ansible.builtin.paramiko", "docker", ""]


def _connection_hosts() -> str:
    return "".join(f"conn{i} ansible_host=127.0.0.{20 + i} ansible_port=1 ansible_connection=\"{value}\"\n"
                   for i, value in enumerate(CONNECTIONS))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The inventory, the ssh config, the keys, and what Ansible did with them."""
    tmp = tmp_path_factory.mktemp("nt-connection-oracle")
    keys = tmp / "keys"
    keys.mkdir()
    for name in ("k1", "k2", "k3"):
        (keys / name).write_text("not a key: ssh -G only checks that it exists\n")
    fake = tmp / "fake-ssh"
    fake.write_text(FAKE_SSH.format(python=sys.executable))
    fake.chmod(0o755)
    config = tmp / "ssh_config"
    config.write_text(SSH_CONFIG.format(keys=keys, tmp=tmp))
    inventory = tmp / "hosts.ini"
    inventory.write_text(SSH_HOSTS.format(keys=keys, tmp=tmp) + _connection_hosts())
    (tmp / "ansible.cfg").write_text("")
    record = tmp / "argv.jsonl"
    env = dict(os.environ, NT_RECORD=str(record), ANSIBLE_CONFIG=str(tmp / "ansible.cfg"), ANSIBLE_HOME=str(tmp),
               ANSIBLE_LOCAL_TEMP=str(tmp), ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp / "cp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_SSH_RETRIES="0")
    proc = subprocess.run([ANSIBLE, "-i", str(inventory), "all", "-m", "ping", "-vvv", "--forks", "8",
                           "-e", f"ansible_ssh_executable={fake}"],
                          capture_output=True, text=True, cwd=tmp, env=env, timeout=300)
    argvs = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return {"tmp": tmp, "config": str(config), "inventory": load_inventory(str(inventory)),
            "output": proc.stdout + proc.stderr, "argv": {argv[-2]: argv for argv in argvs}}


def ssh_G(config: str, argv: List[str]) -> Dict[str, List[str]]:
    """What ssh would connect with, for Ansible's command line (its options
    and the host; not the remote command)."""
    proc = subprocess.run([SSH, "-G", "-F", config] + argv[1:-1], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out: Dict[str, List[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


def _unbracketed(jump):
    """ssh -G writes each jump host in brackets: j2@[198.18.0.32]:2022 (an
    IPv6 address keeps them, as written)."""
    return jump and re.sub(r"\[([^]:]*)\]", r"\1", jump)


def _nictune_endpoint(world, name: str) -> ssh._Endpoint:
    host = fleet.ssh_host(world["inventory"].hosts[name])
    return ssh._endpoint(ssh._config(world["config"]), host.address, host.port, host.user, host.key_files,
                         host.known_hosts, host.proxy_jump, host.identities_only, host.hostname,
                         host.proxy_command)


@pytest.mark.parametrize("name", re.findall(r"^(\w+) ", SSH_HOSTS, re.M))
def test_ssh_settings_are_the_ones_ssh_takes_from_ansibles_command_line(world, name):
    host = world["inventory"].hosts[name]
    assert host.address in world["argv"], world["output"][-3000:]
    theirs = ssh_G(world["config"], world["argv"][host.address])
    ours = _nictune_endpoint(world, name)
    assert ours.hostname == theirs["hostname"][0]
    assert ours.port == int(theirs["port"][0])
    assert ours.user == theirs["user"][0]
    assert ours.identities_only == (theirs["identitiesonly"][0] == "yes")
    defaults = [f"~/.ssh/id_{kind}" for kind in ("rsa", "ecdsa", "ecdsa_sk", "ed25519", "ed25519_sk", "xmss", "dsa")]
    assert ours.key_files == ([] if theirs["identityfile"] == defaults else theirs["identityfile"])
    known = theirs["userknownhostsfile"][0].split()
    home = os.path.expanduser("~/.ssh/known_hosts")
    assert ours.known_hosts == ([home] if known == [home, home + "2"] else known)
    jump = theirs.get("proxyjump", [None])[0]
    assert ours.proxy_jump == _unbracketed(jump)
    command = theirs.get("proxycommand", [None])[0]
    if command is not None:  # ssh prints it with its tokens; nictune has filled them in
        command = sshargs.expand_proxy_command(command, ours.hostname, ours.port, ours.user, host.address)
    assert ours.proxy_command == command


def test_the_ssh_args_cases_are_all_there(world):
    # The parametrized test above runs one case per inventory line: none lost.
    assert len(re.findall(r"^(\w+) ", SSH_HOSTS, re.M)) == 11
    assert len(world["argv"]) >= 11


def _plugin_of(output: str, address: str) -> str:
    found = re.search(rf"<{re.escape(address)}> ESTABLISH (PARAMIKO SSH|SSH|\w+) CONNECTION", output)
    return found.group(1) if found else "none"


@pytest.mark.parametrize("number,value", list(enumerate(CONNECTIONS)))
def test_hosts_are_taken_exactly_when_ansible_reaches_them_over_ssh(world, number, value):
    host = world["inventory"].hosts[f"conn{number}"]
    plugin = _plugin_of(world["output"], host.address)
    if plugin in ("SSH", "PARAMIKO SSH"):
        assert connection.transport(host) == ("ssh" if plugin == "SSH" else "paramiko")
        fleet.ssh_host(host)
    else:
        with pytest.raises(InventoryError) as refused:
            fleet.ssh_host(host)
        message = str(refused.value)
        assert message.startswith(f"{world['tmp']}/hosts.ini:{12 + number}: ansible_connection of host "
                                  f"'conn{number}' is "), message


def test_the_connection_cases_cover_both_answers(world):
    plugins = [_plugin_of(world["output"], f"127.0.0.{20 + i}") for i in range(len(CONNECTIONS))]
    assert plugins.count("SSH") == 4 and plugins.count("PARAMIKO SSH") == 4, plugins
    assert plugins.count("LOCAL") == 2, plugins


def test_become_methods_that_are_sudo_are_the_ones_ansible_loads_as_sudo():
    from ansible.plugins.loader import become_loader, init_plugin_loader

    init_plugin_loader()
    names = ["sudo", "ansible.builtin.sudo", "ansible.legacy.sudo", "su", "doas", "ansible.builtin.su",
             "pbrun", "runas", "SUDO", "community.general.sudosu"]
    is_sudo = {}
    for name in names:
        found = become_loader.find_plugin_with_context(name)
        is_sudo[name] = found.resolved and found.resolved_fqcn == "ansible.builtin.sudo"
    assert sum(is_sudo.values()) == 3, is_sudo
    assert {name for name, yes in is_sudo.items() if yes} == set(connection.SUDO)


def test_the_become_variables_are_the_sudo_plugins():
    import yaml
    from ansible import constants as C
    from ansible.plugins.become import sudo

    options = yaml.safe_load(sudo.DOCUMENTATION)["options"]
    names = lambda option: tuple(v["name"] for v in options[option]["vars"])  # noqa: E731
    assert names("become_user") == connection.BECOME_USER
    assert names("become_exe") == connection.BECOME_EXE
    assert set(names("become_pass")) | set(C.MAGIC_VARIABLE_MAPPING["become_pass"]) == set(connection.BECOME_PASSWORD)
    assert C.MAGIC_VARIABLE_MAPPING["become_method"] == ("ansible_become_method",)


# -- the args as ssh reads them, case by case (ssh -G, no Ansible) ----------------

# (args, answer): both take them (and must agree), ssh refuses them (so
# must nictune), or only nictune refuses them: they change where or how
# ssh connects, or ask for what nictune does not do (tokens, a shell).
TAKEN, SSH_REFUSES, NICTUNE_REFUSES = "taken", "ssh refuses", "nictune refuses"
ARGS = [
    ("-o Port=2222 -p 1", TAKEN),
    ("-o 'Port 2222' -o port=1", TAKEN),
    ("-oPORT=2222", TAKEN),
    ("-o 'Port = 5' -o Port=6", TAKEN),
    ("-o 'port= 5'", TAKEN),
    ("-o 'Port==5'", SSH_REFUSES),
    ("-Cqp2222", TAKEN),
    ("-p2222 -l u1 -o User=u2", TAKEN),
    ("-o Port=010", TAKEN),
    ("-i /etc/hostname -o IdentityFile=/etc/passwd", TAKEN),
    ("-o 'IdentityFile=\"/etc/hostname\"' -o User='\"u1\"'", TAKEN),
    ("-o 'UserKnownHostsFile=/etc/a /etc/b' -o UserKnownHostsFile=/etc/c", TAKEN),
    ("-o HostName=198.18.0.9 -o hostname=198.18.0.10", TAKEN),
    ("-o ProxyJump=a@198.18.0.1 -o ProxyCommand=nc", TAKEN),
    ("-o ProxyJump=none -o ProxyCommand='nc %h %p'", TAKEN),
    # deepops' example inventory, as written there.
    ("-o ProxyCommand=\"ssh -W %h:%p -q ubuntu@10.0.0.1\"", TAKEN),
    ("-o ProxyCommand=none -o ProxyJump=a", TAKEN),
    ("-J u@[2001:db8::1]:2222,_x,u@h@x", TAKEN),
    ("-o IdentitiesOnly=yes -o IdentitiesOnly=no", TAKEN),
    ("-o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=30 -vvv -tt -A", TAKEN),
    ("-o StrictHostKeyChecking=no", TAKEN),
    ("-J a -J b", SSH_REFUSES),
    ("-o ProxyJump=a -J b", SSH_REFUSES),
    ("-o ProxyCommand=nc -J b", SSH_REFUSES),
    ("-o Port=0", SSH_REFUSES),
    ("-o Port=65536", SSH_REFUSES),
    ("-p 22x", SSH_REFUSES),
    ("-o IdentitiesOnly=maybe", SSH_REFUSES),
    ("-o", SSH_REFUSES),
    ("-J -Cp", SSH_REFUSES),
    ("-J a@b:x", SSH_REFUSES),
    ("-J a,-b", SSH_REFUSES),
    ("-o ProxyJump=a:0", SSH_REFUSES),
    ("-o Port 2222", SSH_REFUSES),
    ("-o Nonsense=1", SSH_REFUSES),
    ("-Z", SSH_REFUSES),
    ("-L 8080:localhost:80", NICTUNE_REFUSES),
    ("-o SendEnv=LANG", NICTUNE_REFUSES),
    ("-o HostKeyAlias=other", NICTUNE_REFUSES),
    ("-o AddressFamily=inet6", NICTUNE_REFUSES),
    ("-F /dev/null", NICTUNE_REFUSES),
    ("-o User=%u", NICTUNE_REFUSES),
    ("-o 'ProxyCommand=nc %h %p | tee /tmp/x'", NICTUNE_REFUSES),
    ("198.18.0.1", NICTUNE_REFUSES),
]


def _ssh_G_args(words: List[str]) -> Dict[str, List[str]]:
    proc = subprocess.run([SSH, "-G", "-F", "/dev/null"] + words + ["h"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return {}
    out: Dict[str, List[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("args,answer", ARGS)
def test_ssh_args_read_as_ssh_reads_them(args, answer):
    theirs = _ssh_G_args(shlex.split(args))
    assert bool(theirs) == (answer != SSH_REFUSES), f"ssh -G: {args!r}"
    try:
        ours = sshargs.resolve([("args", sshargs.parse(args))])
    except sshargs.SshArgsError:
        assert answer != TAKEN, args
        return
    assert answer == TAKEN, f"nictune took {args!r}"
    if ours.port is not None:
        assert ours.port == int(theirs["port"][0])
    if ours.user is not None:
        assert ours.user == theirs["user"][0]
    if ours.hostname is not None:
        assert ours.hostname == theirs["hostname"][0]
    if ours.key_files:
        assert ours.key_files == theirs["identityfile"]
    if ours.known_hosts is not None:
        assert ours.known_hosts == theirs["userknownhostsfile"][0].split()
    if ours.identities_only is not None:
        assert ours.identities_only == (theirs["identitiesonly"][0] == "yes")
    jump = ours.proxy_jump if ours.proxy_jump not in (None, "none") else None
    assert jump == _unbracketed(theirs.get("proxyjump", [None])[0])
    command = None if jump or ours.proxy_command in (None, "none") else ours.proxy_command
    assert command == theirs.get("proxycommand", [None])[0]


def test_the_args_table_has_every_answer():
    answers = [answer for _, answer in ARGS]
    assert answers.count(TAKEN) >= 15 and answers.count(SSH_REFUSES) >= 10 and answers.count(NICTUNE_REFUSES) >= 8


# -- random args, seeded: nictune and ssh -G agree, or nictune refuses ------------

PIECES = ["-o Port=2201", "-p 2202", "-p2203", "-o 'Port 2204'", "-oport=2205", "-l u1", "-o User=u2", "-lu3",
          "-i /etc/hostname", "-o IdentityFile=/etc/passwd", "-o HostName=198.18.0.41", "-o hostname=198.18.0.42",
          "-J j1@198.18.0.43", "-o ProxyJump=j2@198.18.0.44:2022", "-o ProxyJump=none", "-o ProxyCommand=none",
          "-o 'ProxyCommand=nc %h %p'", "-o UserKnownHostsFile=/etc/kh1", "-o 'UserKnownHostsFile=/etc/kh2 /etc/kh3'",
          "-o IdentitiesOnly=yes", "-o IdentitiesOnly=no", "-C", "-q", "-vv", "-tt", "-o ControlMaster=auto",
          "-o StrictHostKeyChecking=no", "-o Port=0", "-p 70000", "-o SendEnv=X", "-L 1:h:2", "-o", "-J", "-Cp",
          "198.18.0.45", "-o Nonsense=1", "-o IdentitiesOnly=perhaps"]


def test_random_args_are_read_as_ssh_reads_them_or_refused():
    import random

    rng = random.Random(21)
    counts = {"agreed": 0, "both refused": 0, "only nictune refused": 0}
    for _ in range(300):
        args = " ".join(rng.choice(PIECES) for _ in range(rng.randint(1, 5)))
        theirs = _ssh_G_args(shlex.split(args))
        try:
            ours = sshargs.resolve([("args", sshargs.parse(args))])
        except sshargs.SshArgsError:
            counts["both refused" if not theirs else "only nictune refused"] += 1
            continue
        assert theirs, f"nictune took {args!r}, which ssh refuses"
        expected = (theirs["port"][0], theirs["user"][0], theirs["hostname"][0],
                    _unbracketed(theirs.get("proxyjump", [None])[0]), theirs.get("proxycommand", [None])[0])
        jump = ours.proxy_jump if ours.proxy_jump not in (None, "none") else None
        command = None if jump or ours.proxy_command in (None, "none") else ours.proxy_command
        got = (str(ours.port or 22), ours.user or theirs["user"][0], ours.hostname or "h", jump, command)
        assert got == expected, args
        if ours.key_files:
            assert ours.key_files == theirs["identityfile"], args
        counts["agreed"] += 1
    print(counts)
    assert sum(counts.values()) == 300 and counts["agreed"] >= 30 and counts["both refused"] >= 30, counts
