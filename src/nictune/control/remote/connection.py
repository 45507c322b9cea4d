"""How Ansible would reach an inventory host, and what of it nictune can do.

nictune reaches every host over SSH (paramiko) and runs its agent as root
(`sudo -n` for a login that is not root).  Ansible decides otherwise per
host with variables nictune must not ignore:

- `ansible_connection`: only its SSH transports (ansible-core 2.19 runs
  `ssh` for ssh, smart, ansible.builtin.ssh, ansible.legacy.ssh, and
  paramiko for paramiko, paramiko_ssh and their FQCNs) reach the host as
  nictune does; a host marked local, winrm, docker... is refused.  With
  paramiko, Ansible reads neither ~/.ssh/config nor the ssh args, and
  neither does nictune.
- become: nictune becomes root with sudo and no password; another
  become_user, become_method or become_exe, or a become password, is refused.
- `ansible_ssh_args`, then Ansible's own -o Port/IdentityFile/User, then
  `ansible_ssh_common_args`, then `ansible_ssh_extra_args`: ssh's first
  value of each option wins (control/remote/sshargs.py).  A key given as content,
  a PKCS#11 provider or another ssh executable is refused.

Every refusal is an InventoryError naming the variable, the host and the
file:line that set it, raised before anything connects.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from nictune.control.remote import sshargs
from nictune.inventory.errors import InventoryError, shown

# ansible_connection values that run `ssh`, and those that run paramiko
# (tests/inventory/test_connection_oracle.py asks ansible-core which do).
SSH_TRANSPORTS = ("ssh", "smart", "ansible.builtin.ssh", "ansible.legacy.ssh")
PARAMIKO_TRANSPORTS = ("paramiko", "paramiko_ssh", "ansible.builtin.paramiko_ssh", "ansible.legacy.paramiko_ssh")
SUDO = ("sudo", "ansible.builtin.sudo", "ansible.legacy.sudo")
# The sudo become plugin's variables (ansible-core plugins/become/sudo.py).
BECOME_USER = ("ansible_become_user", "ansible_sudo_user")
BECOME_EXE = ("ansible_become_exe", "ansible_sudo_exe")
BECOME_PASSWORD = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
HOST_KEY_CHECKING = ("ansible_host_key_checking", "ansible_ssh_host_key_checking")
_FALSE = {"false", "no", "n", "0", "off", "f"}
_TEMPLATE = ("{{", "{%", "{#")


def _where(host, name: str) -> Tuple[Optional[str], Optional[int]]:
    return host.where_of(name) or (None, None)


def _refuse(host, name: str, why: str) -> InventoryError:
    return InventoryError(*_where(host, name), f"{name} of host {host.name!r} {why}")


def _text(host, name: str) -> Optional[str]:
    """A variable's text, refused when it is vaulted, templated or not text."""
    from nictune.inventory.model import VAULT_ADVICE, Vaulted
    from nictune.inventory.templates import Unsafe

    value = host.vars.get(name)
    if value is None:
        return None
    if isinstance(value, Vaulted):
        raise _refuse(host, name, f"is an Ansible Vault value (!vault); {VAULT_ADVICE}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise _refuse(host, name, f"must be text, not {type(value).__name__}")
    if not isinstance(value, Unsafe) and any(t in value for t in _TEMPLATE):
        raise _refuse(host, name, "is a Jinja template, which nictune does not render")
    return value


def transport(host) -> str:
    """"ssh" or "paramiko": how Ansible would reach this host; refuses any other."""
    value = _text(host, "ansible_connection")
    if value is None or value in SSH_TRANSPORTS:
        return "ssh"
    if value in PARAMIKO_TRANSPORTS:
        if host.vars.get("ansible_paramiko_proxy_command") is not None:
            raise _refuse(host, "ansible_paramiko_proxy_command",
                          "sets a proxy for Ansible's paramiko connection, which nictune does not honour; "
                          "use ansible_connection=ssh and ProxyJump or ProxyCommand in ansible_ssh_common_args")
        return "paramiko"
    hint = (" (Ansible runs its tasks for it on the controller; run nictune on that machine itself)"
            if value in ("local", "ansible.builtin.local", "ansible.legacy.local") else "")
    raise _refuse(host, "ansible_connection",
                  f"is {shown(value)}: nictune reaches hosts only over SSH (ssh, smart, paramiko or their "
                  f"ansible.builtin names), so it refuses this host rather than reach it otherwise than "
                  f"Ansible would{hint}")


def check_become(host) -> None:
    """Refuses a become nictune would not do: it runs the agent as root,
    through `sudo -n` (never a password) when the login is not root."""
    for name in BECOME_USER:
        user = _text(host, name)
        if user is not None and user != "root":
            raise _refuse(host, name, f"is {shown(user)}: nictune runs its agent as root, never as another "
                                      "user; leave it unset or root for this host")
    method = _text(host, "ansible_become_method")
    if method is not None and method not in SUDO:
        raise _refuse(host, "ansible_become_method",
                      f"is {shown(method)}: nictune becomes root only with sudo (`sudo -n`)")
    for name in BECOME_EXE:
        exe = _text(host, name)
        if exe is not None and exe != "sudo":
            raise _refuse(host, name, f"is {shown(exe)}: nictune runs `sudo` from the host's PATH")
    for name in BECOME_PASSWORD:
        value = host.vars.get(name)
        if value is not None and value != "":  # never shown: it is a secret
            raise _refuse(host, name, "sets a become password, which nictune never sends: it runs "
                                      "`sudo -n`, so give the login passwordless sudo (or log in as root) "
                                      "and remove the password")


def own_options(host) -> sshargs.Settings:
    """What Ansible puts first on ssh's command line: -o Port, IdentityFile, User."""
    return sshargs.resolve(_own_sources(host))


def _own_sources(host) -> List[Tuple[str, List[sshargs.Option]]]:
    out = []
    for label, key, value in (("ansible_port", "port", host.port),
                              ("ansible_ssh_private_key_file", "identityfile", host.key_file),
                              ("ansible_user", "user", host.user)):
        if value is not None:
            out.append((label, [sshargs.Option(key, str(value), f"{key}={value}")]))
    return out


def command_line(host) -> sshargs.Settings:
    """ssh's command line as Ansible builds it: ansible_ssh_args (in place of
    ansible.cfg's ssh_args), its own options, ansible_ssh_common_args,
    ansible_ssh_extra_args; ssh's first value of each option."""
    _refuse_unsupported(host)
    sources = _args_sources(host, "ansible_ssh_args") + _own_sources(host)
    sources += _args_sources(host, "ansible_ssh_common_args") + _args_sources(host, "ansible_ssh_extra_args")
    try:
        return sshargs.resolve(sources)
    except sshargs.SshArgsError as e:
        raise _refuse(host, e.label or "ansible_ssh_common_args", str(e)) from None


def _args_sources(host, name: str) -> List[Tuple[str, List[sshargs.Option]]]:
    text = _text(host, name)
    if text is None or not text.strip():
        return []
    try:
        return [(name, sshargs.parse(text))]
    except sshargs.SshArgsError as e:
        raise _refuse(host, name, str(e)) from None


# Other ways Ansible's ssh connection is told how to connect, which nictune does not take.
_UNSUPPORTED = {
    "ansible_private_key": "gives a private key's content; nictune reads keys from files: use "
                           "ansible_ssh_private_key_file",
    "ansible_ssh_private_key": "gives a private key's content; nictune reads keys from files: use "
                               "ansible_ssh_private_key_file",
    "ansible_ssh_pkcs11_provider": "asks for a PKCS#11 key, which nictune does not use",
}


def _refuse_unsupported(host) -> None:
    for name, why in _UNSUPPORTED.items():
        if host.vars.get(name) not in (None, ""):
            raise _refuse(host, name, why)
    exe = _text(host, "ansible_ssh_executable")
    if exe not in (None, "ssh"):
        raise _refuse(host, "ansible_ssh_executable", f"is {shown(exe)}: nictune connects with its own SSH "
                                                      "client, as `ssh` would, never through another program")


def host_key_note(host, line: sshargs.Settings) -> str:
    """Why a host key nictune refuses was not let through by the inventory's
    StrictHostKeyChecking=no (or ansible_host_key_checking=false), which
    Ansible would obey: host-key checking is turned off only by the user
    running nictune (--accept-new-host-keys), never by an inventory, which
    may be shared or committed, and a changed key is always refused."""
    for name in HOST_KEY_CHECKING:
        value = host.vars.get(name)
        if value is False or str(value).lower() in _FALSE:
            return _note(host, name, f"{name}={value}")
    opt = line.host_key_checking
    if opt is not None and opt.value.lower() in ("no", "false", "off", "accept-new"):
        name = line.where.get("stricthostkeychecking", "ansible_ssh_common_args")
        return _note(host, name, f"{opt.word} in {name}")
    return ""


def _note(host, name: str, what: str) -> str:
    file, line = _where(host, name)
    where = "" if file is None else f" ({file}:{line})" if line is not None else f" ({file})"
    return (f"{what}{where} is not honoured: nictune checks host keys unless you run it with "
            "--accept-new-host-keys, and never accepts a changed one")
