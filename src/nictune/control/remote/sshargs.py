"""`ansible_ssh_common_args` and `ansible_ssh_extra_args`, read as OpenSSH reads them.

Ansible's ssh connection (ansible-core plugins/connection/ssh.py
`_build_command`) runs `ssh` with the words of ansible_ssh_args (which
replaces ansible.cfg's ssh_args) first, then its own options -- `-o Port=`
from ansible_port, `-o IdentityFile=` from ansible_ssh_private_key_file,
`-o User=` from ansible_user -- then the words of ansible_ssh_common_args,
then those of ansible_ssh_extra_args (each split with shlex), then the
host.  ssh keeps the FIRST value it is given of each option (command line
before ~/.ssh/config), except IdentityFile, which adds a key each time,
and ProxyJump/ProxyCommand, where whichever comes first rules out the other.

nictune honours the options it honours from ~/.ssh/config (HostName, User,
Port, IdentityFile, ProxyJump, ProxyCommand, UserKnownHostsFile,
IdentitiesOnly), the same way; ignores options that do not change where
or how it connects (multiplexing, keep-alives, logging, compression, a
terminal, agent and X11 forwarding, and the authentication options
Ansible itself sets before the args, so that ssh never reads theirs);
keeps StrictHostKeyChecking only to explain a refused host key
(control/remote/ssh.py: an inventory never turns host-key checking off); and
refuses every other option, a word ssh would take as the destination, and
what ssh itself would refuse.  The words are only read, never run by a
shell; a ProxyCommand is run later as argv (control/remote/ssh.py), so only one a
shell would read as the same words is taken.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

# ssh's getopt string (OpenSSH ssh.c): a letter followed by ':' takes a value.
_GETOPT = "1246ab:c:e:fgi:kl:m:no:p:qstvxAB:CD:E:F:GI:J:KL:MNO:P:Q:R:S:TVw:W:XYy"
_TAKES_VALUE = {c for i, c in enumerate(_GETOPT) if _GETOPT[i + 1:i + 2] == ":"}

# Flags that are options under another name.
_FLAG_OPTION = {"i": "identityfile", "l": "user", "p": "port", "J": "proxyjump"}
# Flags that change nothing about where and how nictune connects: -A/-a agent
# forwarding, -C compression, -e escape char, -E log file, -g, -k, -M/-S
# multiplexing, -q/-v logging, -t/-T terminal, -x/-X/-Y X11, -y syslog.
_FLAG_IGNORED = set("AaCeEgkMSqvtTxXYy")

# Options that change nothing about where and how nictune connects, with the
# values that keep it so (None: any value).  The authentication ones are set
# by Ansible before the args (without a password), so ssh never reads them.
_IGNORED = {
    "batchmode": None, "checkhostip": None, "compression": None, "connectionattempts": None,
    "connecttimeout": None, "controlmaster": None, "controlpath": None, "controlpersist": None,
    "escapechar": None, "forwardagent": None, "forwardx11": None, "forwardx11timeout": None,
    "forwardx11trusted": None, "hashknownhosts": None, "loglevel": None, "logverbose": None,
    "numberofpasswordprompts": None, "requesttty": None, "serveralivecountmax": None,
    "serveraliveinterval": None, "tcpkeepalive": None, "updatehostkeys": None, "visualhostkey": None,
    "kbdinteractiveauthentication": None, "challengeresponseauthentication": None,
    "passwordauthentication": None, "preferredauthentications": None,
    "gssapiauthentication": ("no",), "gssapidelegatecredentials": None,
    "hostbasedauthentication": ("no",), "pubkeyauthentication": ("yes",),
    "permitlocalcommand": ("no",), "clearallforwardings": ("yes",), "exitonforwardfailure": None,
    "addkeystoagent": ("no",),
}
# What nictune honours, as ssh_config(5) spells it (for messages).
HONOURED = {"hostname": "HostName", "user": "User", "port": "Port", "identityfile": "IdentityFile",
            "proxyjump": "ProxyJump", "proxycommand": "ProxyCommand",
            "userknownhostsfile": "UserKnownHostsFile", "identitiesonly": "IdentitiesOnly",
            "stricthostkeychecking": "StrictHostKeyChecking"}
_YES_NO = {"yes": True, "true": True, "no": False, "false": False}
_HOST_KEY_CHECKING = {"yes", "true", "no", "false", "off", "ask", "accept-new"}
# A ProxyCommand nictune runs as argv (paramiko.ProxyCommand splits it with
# shlex) where ssh runs it with `$SHELL -c`: the same only without shell syntax.
_PLAIN_COMMAND = re.compile(r"^[A-Za-z0-9_@%+,./:= -]+$")
# ProxyCommand's tokens (ssh_config(5)); ssh refuses any other.
_PROXY_TOKENS = {"%": "%", "h": "hostname", "n": "original", "p": "port", "r": "user"}

SUPPORTED = ("nictune honours HostName, User (-l), Port (-p), IdentityFile (-i), ProxyJump (-J), ProxyCommand, "
             "UserKnownHostsFile and IdentitiesOnly there, and ignores options that do not change the connection "
             "(ControlMaster, ServerAliveInterval, Compression, LogLevel, ...)")


class SshArgsError(ValueError):
    """Args nictune cannot honour: why, in words that fit after "<variable> of host <h> ".
    label: the source whose option it is, when resolve() raised it."""

    label: Optional[str] = None


@dataclass
class Option:
    key: str      # lowercased ssh_config keyword
    value: str
    word: str     # as written, for messages
    flag: str = ""  # the flag it came from ("J" for -J), "" for -o


@dataclass
class Settings:
    """The connection settings of a host's command line, ssh's first value of each."""
    hostname: Optional[str] = None
    port: Optional[int] = None
    user: Optional[str] = None
    key_files: List[str] = field(default_factory=list)
    proxy_jump: Optional[str] = None        # "none" too: it rules out ssh config's
    proxy_command: Optional[str] = None     # idem; tokens not yet expanded
    known_hosts: Optional[List[str]] = None
    identities_only: Optional[bool] = None
    host_key_checking: Optional[Option] = None   # as written, for the refusal's explanation
    where: dict = field(default_factory=dict)    # key -> label of what set it


def parse(text: str) -> List[Option]:
    """The options of one args variable, in order; raises SshArgsError.
    (A template is refused before: connection.command_line.)"""
    try:
        words = [w.strip() for w in shlex.split(text) if w.strip()]  # Ansible's _split_ssh_args
    except ValueError as e:
        raise SshArgsError(f"cannot be split into words as Ansible splits it ({e})") from None
    out: List[Option] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word == "-":
            raise SshArgsError(f"holds {word!r}, which ssh would take as the host to connect to")
        if word == "--":
            raise SshArgsError("holds '--', after which ssh takes the host to connect to")
        i = _flags(words, i, out)
    return out


def _flags(words: List[str], i: int, out: List[Option]) -> int:
    """Read the flags of words[i] (getopt: -Cp2222 is -C -p 2222); the next index."""
    word = words[i]
    j = 1
    while j < len(word):
        flag = word[j]
        if flag not in _TAKES_VALUE:
            if flag not in _GETOPT or flag == ":":
                raise SshArgsError(f"holds {word!r}: ssh has no option -{flag}")
            if flag not in _FLAG_IGNORED:
                raise SshArgsError(f"holds -{flag} ({word!r}), which changes how ssh connects or what it "
                                   f"runs; {SUPPORTED}")
            j += 1
            continue
        value = word[j + 1:]
        shown = word
        if not value:
            if i + 1 >= len(words):
                raise SshArgsError(f"ends with {word!r}, which needs a value")
            i += 1
            value = words[i]
            shown = f"{word} {value}"
        _one(flag, value, shown, out)
        break
    return i + 1


def _one(flag: str, value: str, shown: str, out: List[Option]) -> None:
    if flag == "o":
        out.append(_config_line(value, shown))
    elif flag in _FLAG_OPTION:
        out.append(_checked(Option(_FLAG_OPTION[flag], value, shown, flag)))
    elif flag not in _FLAG_IGNORED:
        raise SshArgsError(f"holds -{flag} ({shown!r}), which changes how ssh connects or what it runs; "
                           f"{SUPPORTED}")


def _config_line(line: str, shown: str) -> Option:
    """One -o value: "Key=Value", "Key Value" or "Key = Value", as ssh's
    readconf (strdelim) reads it."""
    found = re.match(r"^([A-Za-z0-9]+)(?:[ \t]*=[ \t]*|[ \t]+)(\S.*)$", line.strip())
    if not found:
        raise SshArgsError(f"holds {shown!r}, which ssh would refuse (an option needs Key=Value)")
    key, value = found.group(1).lower(), found.group(2).strip()
    if key in _IGNORED:
        allowed = _IGNORED[key]
        if allowed is None or value.lower() in allowed:
            return Option("", value, shown)  # read, and changes nothing
    elif key in HONOURED:
        return _checked(Option(key, value, shown))
    raise SshArgsError(f"holds {shown!r}, which changes where or how ssh connects and which nictune "
                       f"cannot honour; {SUPPORTED}")


def _checked(opt: Option) -> Option:
    """An honoured option's value, refused where ssh would refuse it or read
    more into it (%-tokens, quotes, "none") than nictune would."""
    value = _unquoted(opt)
    key = opt.key
    if key == "port":
        if not re.fullmatch(r"[0-9]{1,5}", value) or not 0 < int(value) < 65536:
            raise SshArgsError(f"holds {opt.word!r}: not a port number (1-65535), which ssh would refuse")
    elif key == "identitiesonly":
        if value.lower() not in _YES_NO:
            raise SshArgsError(f"holds {opt.word!r}: IdentitiesOnly is yes or no")
    elif key == "stricthostkeychecking":
        if value.lower() not in _HOST_KEY_CHECKING:
            raise SshArgsError(f"holds {opt.word!r}, which ssh would refuse")
    elif key == "proxycommand":
        _check_command(opt)
    elif key == "proxyjump" and value.lower() != "none":
        for hop in value.split(","):
            _check_hop(opt, hop)
    elif "%" in value or (value.lower() == "none" and key != "proxyjump"):
        raise SshArgsError(f"holds {opt.word!r}: ssh would read %-tokens or 'none' in it, which nictune "
                           "does not; write the value out")
    if key not in ("proxycommand", "userknownhostsfile") and any(c.isspace() for c in value):
        raise SshArgsError(f"holds {opt.word!r}: a value with blanks, which nictune does not take here")
    return Option(key, value, opt.word, opt.flag)


# One ProxyJump hop: [user@]host[:port], host a name or a bracketed IPv6 address.
_HOP = re.compile(r"^(?:[^\s,]+@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.][A-Za-z0-9_.-]*)(?::([0-9]{1,5}))?$")


def _check_hop(opt: Option, hop: str) -> None:
    """A hop ssh's parse_jump takes, and _hop (control/remote/ssh.py) reads alike."""
    found = _HOP.match(hop)
    if not found or (found.group(2) is not None and not 0 < int(found.group(2)) < 65536):
        raise SshArgsError(f"holds {opt.word!r}: {hop!r} is not a jump host ([user@]host[:port]), "
                           "which ssh would refuse")


def _unquoted(opt: Option) -> str:
    value = opt.value
    if opt.key != "proxycommand" and len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]  # as ssh does with Ansible's own IdentityFile="..." and User="..."
    if '"' in value or ("'" in value and opt.key != "proxycommand"):
        raise SshArgsError(f"holds {opt.word!r}: quotes inside a value, which nictune does not take")
    return value


def _check_command(opt: Option) -> None:
    value = opt.value
    if value.lower() == "none":
        return
    if not _PLAIN_COMMAND.match(value) or value.split()[0].find("=") >= 0:
        raise SshArgsError(f"holds {opt.word!r}: ssh would run this ProxyCommand with a shell, and nictune runs "
                           "only a plain command (words of letters, digits and _@%+,./:=-) the shell would run "
                           "the same way")
    for token in re.findall(r"%(.?)", value.replace("%%", "")):
        if token not in _PROXY_TOKENS:
            raise SshArgsError(f"holds {opt.word!r}: %{token} is not a ProxyCommand token (%h, %p, %r, %n, %%)")


def expand_tokens(command: str, hostname: str, port: int, user: str, original: str) -> str:
    """A ProxyCommand's tokens (%h %p %r %n %%) filled in as ssh fills them,
    with the host's final settings; ValueError on any other token."""
    values = {"hostname": hostname, "port": str(port), "user": user, "original": original}

    def one(found) -> str:
        token = found.group(1)
        if token not in _PROXY_TOKENS:
            raise ValueError(f"%{token}")
        return "%" if token == "%" else values[_PROXY_TOKENS[token]]

    return re.sub(r"%(.?)", one, command)


def expand_proxy_command(command: str, hostname: str, port: int, user: str, original: str) -> str:
    """An args ProxyCommand's tokens filled in, checked again: the values
    come from the inventory, and the command must stay plain."""
    out = expand_tokens(command, hostname, port, user, original)
    if not _PLAIN_COMMAND.match(out):
        raise ValueError(f"the ProxyCommand {out!r}, once its tokens are filled in, is not a plain command")
    return out


def resolve(sources: List[Tuple[str, List[Option]]]) -> Settings:
    """The first value of each option over sources (label, options) in
    ssh's order; raises SshArgsError (its label set) where ssh would stop."""
    got = Settings()
    for label, options in sources:
        for opt in options:
            try:
                _take(got, opt, label)
            except SshArgsError as e:
                e.label = label
                raise
    return got


def _take(got: Settings, opt: Option, label: str) -> None:
    key, value = opt.key, opt.value
    if not key:
        return
    if key == "identityfile":
        if value not in got.key_files:  # ssh adds a file once
            got.key_files.append(value)
        return
    if key in ("proxyjump", "proxycommand"):
        _take_proxy(got, opt, label)
        return
    attr = {"hostname": "hostname", "port": "port", "user": "user", "userknownhostsfile": "known_hosts",
            "identitiesonly": "identities_only", "stricthostkeychecking": "host_key_checking"}[key]
    if getattr(got, attr) is not None:
        return  # ssh keeps the first
    converted = {"port": lambda: int(value), "userknownhostsfile": value.split,
                 "identitiesonly": lambda: _YES_NO[value.lower()],
                 "stricthostkeychecking": lambda: opt}.get(key, lambda: value)()
    setattr(got, attr, converted)
    got.where[key] = label


def _take_proxy(got: Settings, opt: Option, label: str) -> None:
    """ProxyJump and ProxyCommand as ssh settles them (readconf.c): a
    ProxyJump rules out any later one and a later ProxyCommand, "ProxyJump
    none" only later ProxyJumps, a ProxyCommand (none too) both; ssh stops
    at a -J after either (ssh.c)."""
    if opt.flag == "J":
        if got.proxy_jump is not None:
            raise SshArgsError(f"{opt.word!r} comes after a ProxyJump, and ssh allows a single -J "
                               "(separate jump hosts with commas)")
        if got.proxy_command is not None:
            raise SshArgsError(f"{opt.word!r} comes after a ProxyCommand, which ssh refuses "
                               "(\"Cannot specify -J with ProxyCommand\")")
    if opt.key == "proxyjump":
        if got.proxy_jump is not None or got.proxy_command is not None:
            return
        got.proxy_jump = opt.value
    else:
        # A real ProxyJump rules a later ProxyCommand out; "ProxyJump none" does not.
        if got.proxy_command is not None or (got.proxy_jump or "none").lower() != "none":
            return
        got.proxy_command = opt.value
    got.where[opt.key] = label
