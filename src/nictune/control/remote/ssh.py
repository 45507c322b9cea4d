"""SSH targets (paramiko): the agent runs on the host, one session per command.

Per host and command: one TCP connection, one exec channel running the
bootstrap (control/remote/agentzip.py), the archive sent only if the host lacks it,
the request as one JSON line, the report as one JSON line back (taken as
control/remote/hostreport.py says: under the inventory's name, exit code worked
out again, every field checked), and for an apply the "confirm" exchange of
nictune/host/transaction/watchdog.py.  A cached agent that fails the bootstrap's check
is sent again, with a warning in the report.

A plan or verify with no resident agent to ask goes to the probe
(control/remote/probe.py): no agent is started, the controller runs the
engine on the probe's answers, asking it in batches over one channel
("via": "probe"); one no probe can answer (a key file, a run of a tool),
or a probe that fails, goes to the agent.  Both only read: an apply,
a rollback, a request to record a snapshot always start the agent.

A plan or verify (audit, verify -i) first asks the resident agent, when one
runs on the host (host/resident/daemon.py), through the session's stream-local
forwarding to its root-only socket <state dir>/agent.sock: no process is
started on the host.  Only an agent running this controller's own archive
(the same sha256) answers; a missing socket, a refused channel, another
archive or any error falls back to the exec channel above, silently but for
the report's "via": "resident" | "zipapp".

Connection settings follow OpenSSH and Ansible: inventory variables first
(ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file,
then the options of ansible_ssh_common_args and ansible_ssh_extra_args,
control/remote/sshargs.py), then ~/.ssh/config for the address (HostName, User,
Port, IdentityFile, ProxyJump, ProxyCommand, UserKnownHostsFile), then
defaults, the first value of each winning as in ssh; keys from files and
from ssh-agent.  Host keys are checked against known_hosts: an unknown key
is refused unless the user opts in (--accept-new-host-keys; an inventory's
StrictHostKeyChecking=no is not an opt-in), a changed key always is.
"""

from __future__ import annotations

import getpass
import hmac
import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import paramiko
from paramiko.channel import Channel
from paramiko.common import MSG_GLOBAL_REQUEST, cMSG_CHANNEL_OPEN
from paramiko.message import Message

import nictune
from nictune.control.remote import agentzip, hostreport, probe, probecache, sshargs
from nictune.host import errors
from nictune.host.errors import TransportError
from nictune.host.transaction.journal import DEFAULT_STATE_DIR
from nictune.host.validate import check_path

# paramiko logs a traceback from its transport thread for every failed
# handshake; the host's report already says what went wrong.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

# paramiko checks every packet's MAC with a byte-by-byte Python loop
# (paramiko/util.py constant_time_bytes_eq, called from packet.py
# read_message): about 8% of the controller's CPU per host in a fleet
# audit.  hmac.compare_digest is the same constant-time comparison, in C.
if getattr(paramiko.util, "constant_time_bytes_eq", None) is not None:
    paramiko.util.constant_time_bytes_eq = hmac.compare_digest

PYTHON = re.compile(r"^(/[A-Za-z0-9._+/-]{1,255}|python3(\.[0-9]{1,2})?)$")
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
# The longest line a host may send: a report with every owned file whole
# fits many times over.
MAX_LINE = 64 * 2**20


@dataclass
class SshOptions:
    connect_timeout: float = 10.0
    command_timeout: float = 120.0
    accept_new_host_keys: bool = False
    confirm_timeout: float = 30.0
    ssh_config: Optional[str] = "~/.ssh/config"
    # A plan or verify asks the probe (control/remote/probe.py); False: always the agent.
    probe: bool = True
    probe_cache: Optional[str] = None  # where the questions asked are kept


@dataclass
class SshHost:
    """Where and how to reach one host; fields left None come from ssh config."""
    label: str
    address: str
    port: Optional[int] = None
    user: Optional[str] = None
    key_files: List[str] = field(default_factory=list)
    python: str = "python3"
    state_dir: str = DEFAULT_STATE_DIR
    known_hosts: List[str] = field(default_factory=list)  # before ssh config's
    proxy_jump: Optional[str] = None
    identities_only: Optional[bool] = None
    # From ansible_ssh_common_args/extra_args (control/remote/sshargs.py), first
    # over ssh config's as on ssh's command line; "none" rules config's out.
    hostname: Optional[str] = None
    proxy_command: Optional[str] = None  # its %-tokens expanded when connecting
    # Said when a host key is refused: why the inventory's
    # StrictHostKeyChecking=no did not let it through.
    host_key_note: str = ""
    # Ansible's paramiko connection reads no ~/.ssh/config.
    read_ssh_config: bool = True


class HostKeyRefused(TransportError):
    pass


# Guards the parsed-file caches below (ssh config, known_hosts) and appends
# to known_hosts: a fleet run connects from many threads.
_files_lock = threading.Lock()


# -- ssh config ---------------------------------------------------------------

@dataclass
class _Endpoint:
    hostname: str
    port: int
    user: str
    key_files: List[str]
    known_hosts: List[str]
    proxy_jump: Optional[str]
    proxy_command: Optional[str]
    identities_only: bool = False


_configs: Dict[str, tuple] = {}  # path -> (mtime, size, paramiko.SSHConfig); _files_lock


def _config(path: Optional[str]) -> paramiko.SSHConfig:
    """The ssh config at path, parsed once per run (again only if it changes)."""
    if not path:
        return paramiko.SSHConfig()
    full = os.path.expanduser(path)
    try:
        st = os.stat(full)
    except OSError:  # as os.path.exists: missing or unreadable means no config
        return paramiko.SSHConfig()
    with _files_lock:
        cached = _configs.get(full)
        if cached and cached[:2] == (st.st_mtime_ns, st.st_size):
            return cached[2]
        try:
            config = paramiko.SSHConfig.from_path(full)
        except Exception as e:  # noqa: BLE001 - paramiko raises several kinds
            raise TransportError(f"{full}: cannot read this ssh config: {e}") from None
        _configs[full] = (st.st_mtime_ns, st.st_size, config)
        return config


def _endpoint(config: paramiko.SSHConfig, address: str, port=None, user=None,
              key_files=(), known_hosts=(), proxy_jump=None, identities_only=None,
              hostname=None, proxy_command=None) -> _Endpoint:
    """Settings given here first (ssh's command line), then ssh config's for
    what they leave open, as ssh keeps the first value of each option --
    but IdentityFile, whose files it tries in order, config's after."""
    o = config.lookup(address)
    if identities_only is not None:
        o["identitiesonly"] = "yes" if identities_only else "no"
    known = [os.path.expanduser(p) for p in list(known_hosts) or
             (o.get("userknownhostsfile") or "~/.ssh/known_hosts").split()]
    jump, command, from_args = _proxy(o, proxy_jump, proxy_command)
    ep = _Endpoint(
        hostname=hostname or o.get("hostname", address),
        port=int(port or o.get("port", 22)),
        user=user or o.get("user") or getpass.getuser(),
        key_files=list(dict.fromkeys(os.path.expanduser(k)  # each once, as ssh adds them
                                     for k in list(key_files) + list(o.get("identityfile", [])))),
        known_hosts=known,
        proxy_jump=jump,
        proxy_command=command,
        identities_only=str(o.get("identitiesonly", "no")).lower() == "yes",
    )
    if command and from_args:
        try:
            ep.proxy_command = sshargs.expand_proxy_command(command, ep.hostname, ep.port, ep.user, address)
        except ValueError as e:
            raise TransportError(f"{address}: {e}") from None
    elif command:
        ep.proxy_command = _config_proxy_command(config, address, ep) or command
    return ep


def _config_proxy_command(config: paramiko.SSHConfig, address: str, ep: _Endpoint) -> Optional[str]:
    """ssh config's ProxyCommand with %h %p %r %n filled in from the final
    settings, as ssh does: paramiko fills them from the config's own Port and
    User, not the inventory's.  None (paramiko's then) when the raw text is
    out of reach or holds another token."""
    lookup = getattr(config, "_lookup", None)  # paramiko's lookup before expansion (3.x-5.x)
    try:
        raw = lookup(hostname=address).get("proxycommand") if lookup else None
        return sshargs.expand_tokens(raw, ep.hostname, ep.port, ep.user, address) if raw else None
    except (TypeError, ValueError):
        return None


def _proxy(o: dict, jump: Optional[str], command: Optional[str]) -> tuple:
    """(ProxyJump, ProxyCommand, whether the command is the given one) as ssh
    settles them (readconf.c): a ProxyJump rules out any later ProxyCommand
    and ProxyJump, "ProxyJump none" only later ProxyJumps, a ProxyCommand
    (none too) both."""
    from_args = command is not None
    if jump is None and command is None:
        jump = o.get("proxyjump")
    if command is None and (jump is None or str(jump).lower() == "none"):
        command = o.get("proxycommand")
    if jump is not None and str(jump).lower() != "none":
        return jump, None, False
    if command is None or str(command).lower() == "none":
        return None, None, False
    return None, command, from_args


# -- host keys ----------------------------------------------------------------

_known_hosts: Dict[str, tuple] = {}  # path -> (mtime, size, KnownHosts); _files_lock


class KnownHosts:
    """A known_hosts file's entries, indexed by host name.

    paramiko.HostKeys answers lookup() by matching every entry, and load()
    looks each line up among the lines before it: with one line per host,
    a fleet run was quadratic in hosts (375,000 entry matches, about a
    millisecond of controller CPU per host, at 500 hosts).  This gives what HostKeys.lookup gives,
    the first key of each type among the entries that name the host, in
    file order, from a dict of plain names plus a scan of hashed (|1|)
    entries only.  Lines paramiko cannot read are skipped, as it does."""

    def __init__(self) -> None:
        self._entries: list = []  # paramiko HostKeyEntry, file order
        self._by_name: Dict[str, list] = {}  # plain name -> positions in _entries
        self._hashed: list = []  # positions of entries with a hashed name
        self._hasher = paramiko.HostKeys()  # only for its hashed-name matching

    @classmethod
    def read(cls, path: str) -> "KnownHosts":
        table = cls()
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except paramiko.SSHException:
                    continue
                if entry is not None:
                    table._append(entry)
        return table

    def _append(self, entry) -> None:
        pos = len(self._entries)
        self._entries.append(entry)
        for name in dict.fromkeys(entry.hostnames):
            if name.startswith("|1|"):
                if not self._hashed or self._hashed[-1] != pos:
                    self._hashed.append(pos)
            else:
                self._by_name.setdefault(name, []).append(pos)

    def lookup(self, host: str) -> dict:
        """key type -> key, the first of each type for host (empty: unknown)."""
        found = set(self._by_name.get(host, ()))
        # A hashed entry matches the name it hashes (or, like any, its own text).
        found.update(p for p in self._hashed if p not in found
                     and self._hasher._hostname_matches(host, self._entries[p]))
        keys: dict = {}
        for pos in sorted(found):
            key = self._entries[pos].key
            if key is not None:
                keys.setdefault(key.get_name(), key)
        return keys

    def add(self, host: str, key) -> None:
        """As HostKeys.add: replace host's key of that type, or append one."""
        for pos in self._by_name.get(host, ()):
            entry = self._entries[pos]
            if entry.key is not None and entry.key.get_name() == key.get_name():
                entry.key = key
                return
        self._append(paramiko.hostkeys.HostKeyEntry([host], key))


def _table(path: str) -> Optional[KnownHosts]:
    """A known_hosts file, parsed once per run (and again only if it
    changes): parsing it per connection made a fleet run quadratic."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    with _files_lock:
        cached = _known_hosts.get(path)
        if cached and cached[:2] == (st.st_mtime_ns, st.st_size):
            return cached[2]
        try:
            table = KnownHosts.read(path)
        except Exception as e:  # noqa: BLE001 - paramiko raises several kinds
            raise TransportError(f"{path}: cannot read this known_hosts file: {e}") from None
        _known_hosts[path] = (st.st_mtime_ns, st.st_size, table)
        return table


def _host_id(hostname: str, port: int) -> str:
    """How known_hosts (and paramiko) name a host."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def _fingerprint(key) -> str:
    return f"{key.get_name()} SHA256:{key.fingerprint.split(':', 1)[-1]}"


def _known_keys(paths: List[str], host: str) -> dict:
    """key type -> key known for `host` ("name" or "[name]:port"), from the
    system's known_hosts and then the user's."""
    known: dict = {}
    for path in [SYSTEM_KNOWN_HOSTS] + paths:
        table = _table(path)
        for kind, key in (table.lookup(host) if table is not None else {}).items():
            known.setdefault(kind, key)
    return known


class _HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """Called for a host key paramiko found no match for: an unknown host,
    or a known host offering a key type we have no key of."""

    def __init__(self, known: dict, accept_new: bool, remember_in: str, note: str = ""):
        self.known, self.accept_new, self.remember_in = known, accept_new, remember_in
        self.note = note  # why the inventory's StrictHostKeyChecking did not apply

    def missing_host_key(self, client, host, key):
        if self.known:
            raise _changed(host, next(iter(self.known.values())), key, self.note)
        if not self.accept_new:
            raise HostKeyRefused(
                f"{host}: unknown host key ({_fingerprint(key)}), refused. Check the "
                "fingerprint and add it to known_hosts, or run again with --accept-new-host-keys"
                + (f". {self.note}" if self.note else ""))
        # OpenSSH's accept-new: trust a first-seen key, and write it down.
        path = self.remember_in
        with _files_lock:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            cached = _known_hosts.get(path)
            if cached and cached[:2] != _stamp(path):
                cached = None  # changed behind our back: parse it again next time
                del _known_hosts[path]
            with open(path, "a") as f:
                f.write(f"{host} {key.get_name()} {key.get_base64()}\n")
            stamp = _stamp(path)
            if cached and stamp:
                # Keep the parsed table in step with what we appended, or
                # every new host would re-parse the growing file.
                cached[2].add(host, key)
                _known_hosts[path] = stamp + (cached[2],)


def _stamp(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _changed(host: str, expected, offered, note: str = "") -> HostKeyRefused:
    return HostKeyRefused(
        f"{host}: the host key has CHANGED (known: {_fingerprint(expected)}, offered: "
        f"{_fingerprint(offered)}). Refused: this may be an attack. If you know why it "
        f"changed, remove the old key with `ssh-keygen -R {host}` and run again"
        + (f". {note}" if note else ""))


# -- connecting ---------------------------------------------------------------

def _prompt_transport(sock, **kw) -> paramiko.Transport:
    """paramiko's Transport on a TCP socket that sends at once and
    acknowledges the server's host-keys notice at once.  Without these,
    Nagle's algorithm and delayed ACKs cost each connection some 80 ms of
    waiting on a fast network (measured against the lab's OpenSSH 9.2,
    before/after: 64 -> 22 ms to authenticate, 43 -> 3 ms to open the
    first channel): OpenSSH sends its unsolicited hostkeys-00@openssh.com
    global request right after authentication, and holds its answer to
    the client's first channel open until that request is acknowledged,
    which the client's kernel delays by 40 ms.  A socket that is not TCP
    (a ProxyCommand, a jump host's channel) is left as it is."""
    tcp = isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6)
    if tcp:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(sock, **kw)
    if tcp:
        handle = transport._handler_table[MSG_GLOBAL_REQUEST]

        def global_request(m):
            handle(m)
            try:  # leaves delayed-ACK mode: the pending ACK goes out now
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            except OSError:
                pass

        transport._handler_table[MSG_GLOBAL_REQUEST] = global_request
    return transport


def _connect(ep: _Endpoint, options: SshOptions, sock=None, note: str = "") -> paramiko.SSHClient:
    host = _host_id(ep.hostname, ep.port)
    known = _known_keys(ep.known_hosts, host)
    client = paramiko.SSHClient()
    for kind, key in known.items():  # only this host's: paramiko then asks for that key type
        client.get_host_keys().add(host, kind, key)
    client.set_missing_host_key_policy(
        _HostKeyCheck(known, options.accept_new_host_keys, ep.known_hosts[0], note))
    t = options.connect_timeout
    try:
        client.connect(ep.hostname, port=ep.port, username=ep.user,
                       key_filename=[k for k in ep.key_files if os.path.exists(k)] or None,
                       timeout=t, banner_timeout=t, auth_timeout=t, channel_timeout=t,
                       sock=sock, look_for_keys=not ep.key_files,
                       transport_factory=_prompt_transport,
                       # IdentitiesOnly: offer only the named keys, as OpenSSH
                       # does (an agent full of keys can exhaust MaxAuthTries).
                       allow_agent=not (ep.identities_only and ep.key_files))
    except HostKeyRefused:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        raise _changed(host, e.expected_key, e.key, note) from None
    except paramiko.AuthenticationException:
        client.close()
        raise TransportError(f"{ep.user}@{ep.hostname}:{ep.port}: authentication failed "
                             "(no key was accepted; check ansible_ssh_private_key_file, "
                             "IdentityFile or ssh-agent)") from None
    except (socket.timeout, TimeoutError):
        client.close()
        raise TransportError(f"{ep.hostname}:{ep.port}: no answer within {t:g} s") from None
    except paramiko.SSHException as e:
        client.close()
        if str(e) == "No authentication methods available":
            raise TransportError(
                f"{ep.user}@{ep.hostname}:{ep.port}: authentication failed (no key to offer: "
                "set ansible_ssh_private_key_file or IdentityFile, or load a key into "
                "ssh-agent)") from None
        raise TransportError(f"{ep.hostname}:{ep.port}: cannot connect: {_why(e)}") from None
    except (OSError, EOFError) as e:
        client.close()
        raise TransportError(f"{ep.hostname}:{ep.port}: cannot connect: {_why(e)}") from None
    return client


def _why(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if "banner" in text.lower() or text == "No existing session":
        return "the server accepted the connection but never answered as SSH"
    return text


def _open(host: SshHost, options: SshOptions) -> tuple:
    """Connect, through the ProxyJump hops if configured.  Returns (client, hops)."""
    config = _config(options.ssh_config if host.read_ssh_config else None)
    ep = _endpoint(config, host.address, host.port, host.user, host.key_files,
                   host.known_hosts, host.proxy_jump, host.identities_only,
                   host.hostname, host.proxy_command)
    names = [hop.strip() for hop in ep.proxy_jump.split(",")] if ep.proxy_jump else []
    chain = [_hop(config, name) for name in names]
    sock = None
    if ep.proxy_command and not chain:
        # From the user's own ssh config, run as OpenSSH would run it.
        sock = paramiko.ProxyCommand(ep.proxy_command)
    clients: list = []
    try:
        for i, nxt in enumerate(chain + [ep]):
            if clients:
                sock = _forward(clients[-1], nxt, names[i - 1], options)
            try:
                clients.append(_connect(nxt, options, sock,
                                        host.host_key_note if i == len(chain) else ""))
            except TransportError as e:
                if i < len(chain):  # say which hop failed
                    raise type(e)(f"jump host {names[i]}: {e}") from None
                raise
    except BaseException:
        for c in clients:
            c.close()
        raise
    return clients[-1], clients[:-1]


def _forward(jump: paramiko.SSHClient, nxt: _Endpoint, name: str, options: SshOptions):
    """A channel from the jump host to the next hop's SSH port."""
    try:
        return jump.get_transport().open_channel(
            "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
            timeout=options.connect_timeout)
    except (OSError, paramiko.SSHException, EOFError) as e:
        why = getattr(e, "text", None) or _why(e)
        raise TransportError(f"{nxt.hostname}:{nxt.port}: the jump host {name} could not "
                             f"connect to it ({why})") from None


def _hop(config: paramiko.SSHConfig, hop: str) -> _Endpoint:
    """One ProxyJump element: [user@]host[:port]."""
    user, _, rest = hop.strip().rpartition("@")
    bracketed = re.fullmatch(r"\[([^]]*)\](?::(.*))?", rest)  # [2001:db8::1]:2222
    name, port = (bracketed.group(1), bracketed.group(2) or "") if bracketed else rest.partition(":")[::2]
    return _endpoint(config, name, int(port) if port.isdigit() else None, user or None)


# -- one command ----------------------------------------------------------------

_bundle_lock = threading.Lock()


def _bundle() -> agentzip.Bundle:
    """The agent archive, built once per run.  agentzip.build's lru_cache
    alone let every worker of a fleet run that started before the first
    build finished build it too: 50 builds of ~64 deflated files at 50
    forks, about 2 s of controller CPU (22 ms per host of an audit of 100)."""
    with _bundle_lock:
        return agentzip.build()


# -- the resident agent's socket (host/resident/daemon.py) ------------------------------

STREAMLOCAL = "direct-streamlocal@openssh.com"
RESIDENT_SOCKET = "agent.sock"  # host/resident/daemon.py SOCKET_NAME
RESIDENT_COMMANDS = ("plan", "verify")
# The commands that only read, so that the controller can run them on a
# probe's answers as the agent would on the host (control/remote/probe.py).
PROBE_COMMANDS = ("plan", "verify")


def streamlocal_open(chanid: int, window: int, packet: int, path: str) -> Message:
    """MSG_CHANNEL_OPEN of a stream-local forward (OpenSSH PROTOCOL,
    "2.4. connection: Unix domain socket forwarding"): after the common
    fields, string socket path, string reserved, uint32 reserved."""
    m = Message()
    m.add_byte(cMSG_CHANNEL_OPEN)
    m.add_string(STREAMLOCAL)
    m.add_int(chanid)
    m.add_int(window)
    m.add_int(packet)
    m.add_string(path)
    m.add_string("")
    m.add_int(0)
    return m


def open_streamlocal(transport: paramiko.Transport, path: str, timeout: float) -> Channel:
    """A channel to the unix socket `path` on the server.  paramiko's
    Transport.open_channel (transport.py) builds the payload of tcpip and
    x11 kinds only; this is the same method, its locking and its wait for
    the open's answer copied, with the stream-local payload.  Raises
    paramiko.SSHException (ChannelException when sshd refuses)."""
    if not transport.active:
        raise paramiko.SSHException("SSH session not active")
    with transport.lock:
        window = transport._sanitize_window_size(None)
        packet = transport._sanitize_packet_size(None)
        chanid = transport._next_channel()
        message = streamlocal_open(chanid, window, packet, path)
        chan = Channel(chanid)
        transport._channels.put(chanid, chan)
        transport.channel_events[chanid] = event = threading.Event()
        transport.channels_seen[chanid] = True
        chan._set_transport(transport)
        chan._set_window(window, packet)
    transport._send_user_message(message)
    deadline = time.monotonic() + timeout
    while not event.wait(0.1):
        if not transport.active:
            raise transport.get_exception() or paramiko.SSHException("Unable to open channel.")
        if time.monotonic() > deadline:
            raise paramiko.SSHException("Timeout opening channel.")
    chan = transport._channels.get(chanid)
    if chan is None:
        raise transport.get_exception() or paramiko.SSHException("Unable to open channel.")
    return chan


class _Lines:
    """Line reader over a channel with one deadline for the whole command."""

    def __init__(self, chan, deadline: float, label: str):
        self.chan, self.deadline, self.label = chan, deadline, label
        self.buf = b""

    def readline(self, what: str, limit: int = MAX_LINE) -> bytes:
        while self.buf.find(b"\n", 0, limit) < 0:
            if len(self.buf) > limit:  # a host must not exhaust the controller's memory
                size = f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit} bytes"
                raise hostreport.ProtocolError(f"{self.label}: the {what} is longer than {size}")
            chunk = self._more(what)
            if not chunk:
                return b""
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"

    def read(self, size: int, what: str) -> bytes:
        """Exactly size bytes; fewer only when the channel ends."""
        parts, have = [self.buf], len(self.buf)
        while have < size:
            chunk = self._more(what)
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        data, self.buf = data[:size], data[size:]
        return data

    def _more(self, what: str) -> bytes:
        """What came next before the deadline (b"": the channel ended)."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"{self.label}: no {what} in time (command timeout)")
            self.chan.settimeout(left)
            try:
                return self.chan.recv(65536)
            except socket.timeout:
                continue


class _ProbeChannel:
    """A live probe's channel as probe.Session uses it: lines and exact
    lengths read under the verify's one deadline."""

    def __init__(self, chan, deadline: float, label: str):
        self.chan = chan
        self.lines = _Lines(chan, deadline, label)

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def readline(self, limit: int) -> bytes:
        return self.lines.readline("answer from the probe", limit)

    def read(self, size: int) -> bytes:
        return self.lines.read(size, "answer from the probe")


def _stderr_tail(chan) -> str:
    data = b""
    while chan.recv_stderr_ready():
        data += chan.recv_stderr(65536)
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


class SshTarget:
    def __init__(self, host: SshHost, options: SshOptions):
        if not PYTHON.match(host.python):
            raise TransportError(f"{host.label}: nictune_python {host.python!r} is not a "
                                 "python3 command or an absolute path")
        check_path(host.state_dir, "nictune_state_dir")
        self.host, self.options = host, options
        self.label = host.label

    def run(self, request: dict) -> dict:
        request = dict(request, host=self.label, state_dir=self.host.state_dir)
        confirm = request["command"] == "apply" and self.options.confirm_timeout > 0
        if confirm:
            request["confirm"] = {"timeout": self.options.confirm_timeout}
        client, hops = _open(self.host, self.options)
        try:
            return self._exchange(client, request, confirm)
        except (socket.timeout, TimeoutError):
            raise TransportError(f"{self.label}: the agent did not answer within "
                                 f"{self.options.command_timeout:g} s") from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise TransportError(f"{self.label}: the session failed: {e}") from None
        finally:
            client.close()
            for c in hops:
                c.close()

    def _exchange(self, client: paramiko.SSHClient, request: dict, confirm: bool) -> dict:
        bundle = _bundle()
        if request["command"] in RESIDENT_COMMANDS:
            report = self._via_resident(client, request, bundle.sha256)
            if report is not None:
                return report
        user = client.get_transport().get_username()
        cache_warning = None
        if request["command"] in PROBE_COMMANDS and self.options.probe and not request.get("record"):
            report, cache_warning = self._probe_first(client, request, bundle.sha256, user)
            if report is not None:
                return report
        chan = client.get_transport().open_session(timeout=self.options.connect_timeout)
        lines = _Lines(chan, time.monotonic() + self.options.command_timeout, self.label)
        chan.exec_command(agentzip.remote_command(self.host.python, bundle.sha256,
                                                  self.host.state_dir, sudo=user != "root"))
        # "have", "need", or "need WHY" when the cached copy failed its check.
        answer, _, damaged = lines.readline("answer from the agent bootstrap").rstrip(b"\n").partition(b" ")
        if answer == b"need":
            chan.sendall(b"%d\n" % len(bundle.data) + bundle.data)
        elif answer != b"have" or damaged:
            raise self._failed(chan, "the agent did not start")
        chan.sendall(json.dumps(request).encode() + b"\n")
        line = lines.readline("report")
        try:
            report = json.loads(line)
        except (ValueError, RecursionError):
            raise self._failed(chan, "the agent sent no report",
                               self._left_behind(request["command"], confirm)) from None
        report = hostreport.accept(report, self.label, request["command"])
        report["via"] = "zipapp"
        report["transport"] = {"agent_sent": answer == b"need"}
        if cache_warning:
            report["warnings"] = report["warnings"] + [cache_warning]
        if damaged:
            why = damaged.decode("ascii", "replace")
            report["transport"]["cache_damaged"] = why
            report["warnings"] = report["warnings"] + [
                f"the agent cached in {self.host.state_dir}/agent failed its check ({why}): "
                "it was removed and a fresh copy sent"]
        if confirm and report["ok"] and report["changed"]:
            state = self._confirm(chan, lines)
            if state != "confirmed":
                report.update(ok=False, exit_code=errors.EXIT_ROLLED_BACK, error=errors.error(
                    errors.ROLLED_BACK,
                    f"the apply was not confirmed ({state or 'no answer'}): the host's watchdog "
                    f"rolls it back {self.options.confirm_timeout:g} s after it finished"))
        chan.shutdown_write()
        # Let the agent finish before the session goes: closing first would
        # orphan it away from sshd, still running when the command returns.
        chan.status_event.wait(max(0.0, lines.deadline - time.monotonic()))
        return report

    def _via_resident(self, client: paramiko.SSHClient, request: dict, archive: str):
        """The resident agent's report, or None for the zipapp path: no
        socket, a refused channel, another archive, any error."""
        path = self.host.state_dir.rstrip("/") + "/" + RESIDENT_SOCKET
        try:
            chan = open_streamlocal(client.get_transport(), path, self.options.connect_timeout)
        except Exception:  # noqa: BLE001 - whatever fails here, the zipapp path still works
            return None
        try:
            lines = _Lines(chan, time.monotonic() + self.options.command_timeout, self.label)
            chan.sendall(json.dumps(dict(request, agent_id=archive)).encode() + b"\n")
            report = json.loads(lines.readline("report from the resident agent"))
            if not isinstance(report, dict) or report.get("agent_id") != archive:
                return None  # refused, or another archive: its answer is not ours
            del report["agent_id"]  # checked: the rest is the zipapp path's report
            report = hostreport.accept(report, self.label, request["command"])
        except (errors.NictuneError, paramiko.SSHException, OSError, EOFError, ValueError):
            return None
        finally:
            chan.close()
        report["via"] = "resident"
        report["transport"] = {"agent_sent": False}
        return report

    def _probe_first(self, client: paramiko.SSHClient, request: dict, archive: str, user: str):
        """(The probe's report or None for the agent, a warning about the
        question cache or None).  The first batch asked is the host's
        cached questions, else those another host with the same request
        was asked (probecache.TEMPLATES), else none; whatever the verify
        reads beyond them is asked on demand, and what it used is kept for
        the next verify of the host.  A verify that needs a read no probe
        can answer is kept as such: the next goes to the agent at once."""
        cache = probecache.QuestionCache(self.options.probe_cache)
        key = cache.key([self.host.label, self.host.address, self.host.port, user], request, archive)
        try:
            questions, refused = cache.lookup(key)
        except probecache.CacheRefused as e:  # nothing in it is used, nothing kept
            return None, str(e)
        if refused:
            return None, None
        lead, kept = None, questions
        if questions is None:
            questions, lead = probecache.TEMPLATES.seed(cache, request, archive,
                                                       self.options.command_timeout)
        used = None
        try:
            report, used, why_not = self._via_probe(client, request, questions, user)
        finally:
            if lead is not None:
                lead.done(used)
        if used is not None and used != kept:  # the same as the host's kept: nothing to write
            cache.put(key, used)
        elif why_not is not None:
            cache.refused(key, why_not)
        return report, None

    def _via_probe(self, client: paramiko.SSHClient, request: dict, questions: Optional[dict], user: str):
        """(The verify made here on a live probe's answers or None, the
        questions it used or None, why no probe can answer it or None).
        None for the agent: the probe failed, an answer did not parse or
        passed a bound, or the verify needs a read no probe can answer."""
        deadline = time.monotonic() + self.options.command_timeout
        chan = client.get_transport().open_session(timeout=self.options.connect_timeout)
        try:
            chan.exec_command(probe.remote_command(self.host.python, sudo=user != "root"))
            session = probe.Session(_ProbeChannel(chan, deadline, self.label))
            if questions is not None:
                session.ask(probe.as_list(questions))
            report, used = probe.verify_live(session, request, self.label)
        except probe.probe_reads.ProbeLost:
            return None, None, None
        except probe.probe_reads.NotProbed as e:
            return None, None, str(e) or "a read no probe can answer"
        except (probe.BadProbe, errors.NictuneError, socket.timeout, paramiko.SSHException, OSError, EOFError):
            return None, None, None
        finally:
            chan.close()
        if (report.get("error") or {}).get("kind") in (errors.SYSTEM, errors.INVALID_INPUT):
            # A replay that went wrong here (answers no kernel would give
            # make the families fail): the agent's own answer is worth more.
            return None, None, None
        report["agent"] = nictune.__version__
        report = hostreport.accept(report, self.label, request["command"])
        report["via"] = "probe"
        report["transport"] = {"agent_sent": False, "probe_batches": session.batches}
        return report, probe.checked_questions(used), None

    def _confirm(self, chan, lines: _Lines) -> str:
        chan.sendall(b"confirm\n")
        try:
            answer = json.loads(lines.readline("confirmation"))
        except ValueError:
            return ""
        state = answer.get("nictune_confirm") if isinstance(answer, dict) else None
        return state if state in ("confirmed", "expired") else ""

    def _failed(self, chan, what: str, after: str = "") -> TransportError:
        deadline = time.monotonic() + 2
        while not chan.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        status = chan.recv_exit_status() if chan.exit_status_ready() else None
        tail = _stderr_tail(chan) or "no error output"
        # -1: no exit-status came (paramiko leaves exit-signal, which sshd
        # sends for a killed command, unread)
        how = ("no exit status: killed by a signal, or the session was cut" if status == -1
               else f"exit {status}")
        return TransportError(f"{self.label}: {what} ({how}): {tail}{after}")

    def _left_behind(self, command: str, confirm: bool) -> str:
        """What an apply or rollback that ended without its report may have
        left on the host, and what undoes it.  Not asked of the host (a
        second session to a host whose agent just died): what the journal
        and the watchdog guarantee."""
        where = f"{self.host.state_dir}/journal.json"
        again = f"`nictune rollback -i INVENTORY --limit {self.label}`"
        if command == "rollback":
            return (f"; the rollback may have stopped part-way: {again} restores the "
                    f"before-values in {where} again (after --to or --steps, `nictune history` "
                    "shows which applies it restored: finish with --to, which --steps would "
                    "count past)")
        if command != "apply":
            return ""
        if confirm:
            return (f"; if it had begun writing, the host's watchdog restores the before-values "
                    f"it journaled in {where} (confirmed commit: at once when the apply was cut "
                    f"off mid-write, {self.options.confirm_timeout:g} s after it finished "
                    "otherwise, as nothing confirms it)")
        return (f"; if it had begun writing, the host may be partly changed: {where} holds the "
                f"before-values, and {again} restores them (an apply there is refused until "
                "then)")
