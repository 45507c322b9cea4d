"""The resident agent: keeps a host at its desired state (issue 14).

The desired state is the profile of the last committed apply, stored under
the state directory (journal.py desired.json).  Run in the foreground, as a
systemd unit's ExecStart would (`python3 -m nictune.host.resident
--state-dir DIR`, or `nictune agent run`), it

- at start, verifies the desired state: keys that differ are drift, put
  back or only reported as on_drift says (below), so a restart never
  undoes what an operator is looking into.  Only its first start since the
  kernel booted, before anything of this boot applied that state, applies
  all of it through the same Engine as `nictune apply` (journal,
  read-back, rollback on failure): the kernel's defaults are back;
- listens to rtnetlink link notifications (RTMGRP_LINK): a matched
  interface that appears with a new ifindex (deleted and made again, a
  driver reload) is re-tuned at once (SETTLE), whatever on_drift says; one that
  comes back up (IFF_UP) has the keys of the families the kernel resets
  then (IRQ placement, knobs/irq.py) written again, whatever on_drift
  says; any other change of a link is verified at once (a storm of
  events at the pace of Pacer);
- listens to the ethtool generic netlink family's "monitor" group
  (netlink/ethmonitor.py): an ethtool setting changed by anyone (features,
  rings, channels, coalesce, pause), most of which make no rtnetlink
  event, is verified at once too.  A kernel without the group leaves
  ethtool settings to the poll, and the status says so (ethtool_monitor);
- verifies every --interval seconds what sends no notification (sysctls,
  sysfs, owned files, ethtool settings); the families it never writes
  (firmware configuration: mstconfig) only at start, when it takes up a
  desired state and every SLOW_POLL seconds;
- serves its metrics endpoint from the same select() (start_metrics): between
  events, polls and scrapes nothing in it wakes;
- records each key's drift as it happens; on_drift (profile top level and
  per entry, read like on_unsupported: engine.Policy) says whether it is
  put back: `report` (the default) or `restore`.  A key that drifts
  FLAP_LIMIT times within FLAP_WINDOW seconds is left alone and reported,
  never fought over in a loop.

Every apply it makes is journaled like any other (its record's profile is
the stored one's path), marked "by": "agent", and does not replace the
stored desired state.  `nictune rollback` passes over those records to the
user's last apply (engine.Engine.rollback), and an apply of a desired state
that was replaced after the agent read it writes nothing (engine.Superseded,
checked under the journal's lock): the agent follows a rollback, never
fights it.

The fast audit (control/remote/ssh.py): the agent listens on SOCKET_NAME in the
state directory (0600, the directory 0700, the agent root), where the
controller reaches it through its SSH session's stream-local forwarding.
Per connection, in the loop between its own cycles (never at the same time
as its own work): ONE request line, at most MAX_REQUEST bytes within
REQUEST_TIMEOUT seconds, the same JSON request host/agent.py takes, but
only plan or verify, for this state directory, carrying "agent_id" equal to
the sha256 of the archive this agent runs from (control/remote/agentzip.py; None
when not run from one: then every request is refused); the peer must be
uid 0 (SO_PEERCRED) besides the file's mode.  It runs through agent.run
with a fresh Host (the kernel is read again for each request, never a
cached answer) and answers the same one-line report plus "agent_id"; a
refused request gets {"nictune_resident": 1, "refused": WHY, "agent_id": ID}.

Its status, for `nictune agent status` and the metrics exporter
(host/resident/metrics.py), is STATUS_FILE in the state directory, replaced whole
(0600) after each cycle; load_status() reads it.  Its shape (format 1, kept
stable; fields are only ever added):

    {"nictune_agent_status": 1,
     "pid": int, "started": float, "updated": float,   # unix times
     "boot_id": str | None,         # the kernel's boot id when it started
     "stopped": float | None,                          # set on a clean exit
     "interval": float, "flap_limit": int, "flap_window": float,
     "desired": {"path": str | None, "apply": str | None, "stored": float} | None,
     "idle": str | None,            # why nothing is kept (no desired state ...)
     "desired_state": {"ok": bool,  # False: desired.json and its copy unusable
                       "reason": "damaged" | "refused" | None,  # refused: not
                                    # nictune's (owner, mode, a link)
                       "message": str | None,  # the error, or what the copy
                                               # stood in for
                       "from_copy": bool} | None,  # its copy stands in
     "ethtool_monitor": str | None, # "subscribed", or why ethtool changes wait
                                    # for the poll (None before the agent ran)
     "reapplies": int,              # applies this agent made that wrote something
     "last_reapply": {"time": float, "reason": str, "journal": str | None,
                      "written": int, "error": str | None} | None,
     "last_verify": float | None,   # the last verify that ran
     "last_verify_ok": float | None,  # the last one that left no key differing
     "error": str | None,           # the last cycle's error, if any
     "keys": {"family:target:name": {
         "drifts": int, "restores": int, "last_drift": float | None,
         "left_alone": bool, "drifted": bool, "on_drift": "report" | "restore"}}}
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import time

from nictune.host import model as m
from nictune.host.transaction.engine import Engine, Policy, Superseded, _path_of
from nictune.host.errors import JournalDamaged, NictuneError
from nictune.host.transaction.journal import (
    DEFAULT_STATE_DIR,
    Journal,
    _open_checked,
    _replace,
    desired_stamp,
)
from nictune.host.machine import Host
from nictune.host.model import HOST
from nictune.host.transports.netlink.ethmonitor import Subscription
from nictune.host.transports.netlink.rtnl import ifinfmsg

STATUS_FORMAT = 1
STATUS_FILE = "agent-status.json"
DEFAULT_INTERVAL = 30.0
FLAP_LIMIT = 3
FLAP_WINDOW = 600.0
DEFAULT_ON_DRIFT = "report"

# include/uapi/linux/rtnetlink.h: RTMGRP_LINK (the userspace multicast
# group of link events), RTM_NEWLINK and RTM_DELLINK (RTM_BASE 16 + 0, + 1).
# The kernel sends them from net/core/rtnetlink.c rtmsg_ifinfo() on every
# link change, creation and deletion; an overrun is ENOBUFS on recv.
RTMGRP_LINK = 0x1
RTM_NEWLINK = 16
RTM_DELLINK = 17
IFF_UP = 0x1  # include/uapi/linux/if.h
_HDR = struct.Struct("=IHHII")
# A burst of link events (many VFs at once) settles before the re-tune of
# a link that appeared: until no event came for QUIET seconds, SETTLE at
# most.  A change of a link is verified without waiting.
SETTLE = 0.05
QUIET = 0.01
# Link events ask for a verify at once: VERIFY_BURST of them at once, then
# one every MIN_GAP seconds (Pacer): a flapping carrier must not keep the
# agent reading the host, and a drift must not wait behind the verify that
# the event of the agent's own last write asked for.
MIN_GAP = 0.25
VERIFY_BURST = 4
# Families the resident agent never writes (Family.resident_writes: the
# firmware's stored configuration, read with mstconfig, seconds per device)
# are read at start, when a desired state is taken up, and by the poll at
# most every SLOW_POLL seconds, never on an event nor by the agent's own
# applies: a stored value changes only when a tool writes it, runs only
# after a reset, and is only ever reported.
SLOW_POLL = 3600.0
# What the stdlib modules of the metrics endpoint (http.server) import when
# they can, and nothing the resident agent runs uses: ssl (http.client's,
# for HTTPS: OpenSSL's libraries, about 5 MB of RSS for an endpoint that
# speaks plain HTTP), bz2 and lzma (shutil's, for archive formats: 0.3 MB).
# The agent's process never loads them (start_metrics).
NOT_LOADED = ("ssl", "bz2", "lzma")
SOCKET_NAME = "agent.sock"
MAX_REQUEST = 4 * 2**20  # a profile and its sources, many times over
REQUEST_TIMEOUT = 10.0
SOCKET_COMMANDS = ("plan", "verify")
_UCRED = struct.Struct("iII")  # include/linux/socket.h struct ucred: pid, uid, gid


def archive_id():
    """sha256 of the zipapp this code was imported from (agent install puts
    it at <state dir>/resident/nictune-agent.pyz), or None."""
    import nictune

    archive = getattr(getattr(nictune, "__loader__", None), "archive", None)
    if not archive:
        return None
    with open(archive, "rb") as f:
        return _sha256()(f.read()).hexdigest()


def _sha256():
    """Python's own sha256, not hashlib's: hashlib loads OpenSSL's libcrypto,
    about 4 MB of the resident agent's RSS, for one hash at start."""
    try:
        from _sha256 import sha256  # Python <= 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # 3.12 and later
        except ImportError:  # a Python built without its own: OpenSSL's, then
            from hashlib import sha256
    return sha256


def peer_uid(conn: socket.socket) -> int:
    """The connecting process's uid, from the kernel (SO_PEERCRED,
    net/core/sock.c sk_getsockopt), not from anything it says."""
    return _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                         _UCRED.size))[1]


def read_request(conn: socket.socket, limit: int = MAX_REQUEST,
                 timeout: float = REQUEST_TIMEOUT) -> bytes:
    """One line, bounded in size and time; ValueError otherwise."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError(f"no request line within {timeout:g} s")
        conn.settimeout(left)
        try:
            chunk = conn.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            raise ValueError("the connection closed before a request line")
        data += chunk
        if len(data) > limit:
            raise ValueError(f"the request is longer than {limit} bytes")
    return data.partition(b"\n")[0]


def refusal(request, state_dir: str, own_id) -> str | None:
    """Why the socket does not run `request`, or None."""
    if not isinstance(request, dict):
        return "not a request"
    if request.get("command") not in SOCKET_COMMANDS:
        return "only " + " and ".join(SOCKET_COMMANDS) + " through the socket"
    if own_id is None or request.get("agent_id") != own_id:
        return "version"
    if os.path.realpath(str(request.get("state_dir"))) != os.path.realpath(state_dir):
        return "another state directory"
    return None


class AuditSocket:
    """The listening socket; serve() answers one connection."""

    def __init__(self, state_dir: str, own_id, allowed_uid: int = 0, log=None):
        self.state_dir, self.own_id, self.allowed_uid = state_dir, own_id, allowed_uid
        self.log = log or (lambda line: None)
        self.path = os.path.join(state_dir, SOCKET_NAME)
        try:
            os.unlink(self.path)  # a dead agent's
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # 0600 from the start: no window where others may connect
        try:
            self.sock.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.sock.listen(16)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            try:
                self._answer(conn)
            except (OSError, ValueError) as e:
                self.log(f"socket: {e}")

    def _answer(self, conn: socket.socket) -> None:
        from nictune import __version__
        from nictune.host import agent

        uid = peer_uid(conn)
        if uid != self.allowed_uid:
            self._send(conn, {"nictune_resident": 1, "refused": f"uid {uid} is not allowed",
                              "agent_id": None})
            _drain(conn)
            return
        try:
            request = json.loads(read_request(conn))
        except ValueError as e:
            self._send(conn, {"nictune_resident": 1, "refused": str(e), "agent_id": None})
            return
        why = refusal(request, self.state_dir, self.own_id)
        if why:
            self._send(conn, {"nictune_resident": 1, "refused": why, "agent_id": self.own_id})
            return
        request.pop("agent_id")
        result = agent.run(request)  # its own Host: everything read again
        result.update(agent=__version__, agent_id=self.own_id)
        self._send(conn, result)

    @staticmethod
    def _send(conn: socket.socket, answer: dict) -> None:
        conn.settimeout(REQUEST_TIMEOUT)
        conn.sendall(json.dumps(answer).encode() + b"\n")


def _drain(conn: socket.socket, limit: int = 1 << 16) -> None:
    """Read (and drop) what a refused peer sends, briefly: closing while it
    still writes would hand it EPIPE instead of the refusal it is sent."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(1.0)
        taken = 0
        while taken < limit:
            chunk = conn.recv(4096)
            if not chunk:
                break
            taken += len(chunk)
    except OSError:
        pass


class FlapLimiter:
    """Counts each key's drifts in a sliding window; at the limit-th within
    the window the key is left alone (until the desired state changes)."""

    def __init__(self, limit: int = FLAP_LIMIT, window: float = FLAP_WINDOW):
        self.limit, self.window = limit, window
        self.times: dict = {}
        self.left: set = set()

    def drifted(self, key: str, now: float) -> bool:
        """Record a drift of `key`; True when it is (now) to be left alone."""
        recent = [t for t in self.times.get(key, []) if now - t < self.window] + [now]
        self.times[key] = recent
        if len(recent) >= self.limit:
            self.left.add(key)
        return key in self.left

    def reset(self) -> None:
        self.times.clear()
        self.left.clear()


class Pacer:
    """When an event-driven verify may run: at once while the bucket holds a
    token (`burst` of them, one back every `gap` seconds)."""

    def __init__(self, burst: int = VERIFY_BURST, gap: float = MIN_GAP):
        self.burst, self.gap = burst, gap
        self.tokens, self.at = float(burst), time.monotonic()

    def _refill(self, now: float) -> None:
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) / self.gap)
        self.at = now

    def next_at(self, now: float) -> float:
        """The monotonic time from which the next verify may run."""
        self._refill(now)
        return now if self.tokens >= 1 else now + (1 - self.tokens) * self.gap

    def spend(self, now: float) -> None:
        self._refill(now)
        self.tokens = max(0.0, self.tokens - 1)


def slow_key(key) -> bool:
    """Whether `key` belongs to a family the resident agent never writes
    (SLOW_POLL)."""
    from nictune.host.knobs import family_named

    family = family_named(key.family)
    return family is not None and not family.resident_writes


def fast_key(key) -> bool:
    return not slow_key(key)


class LinkMonitor(Subscription):
    """rtnetlink link notifications: (event, ifindex, name), event "new" or
    "del", or ("resync", 0, "") when the kernel dropped some (ENOBUFS)."""

    def __init__(self):
        super().__init__(socket.NETLINK_ROUTE, groups=RTMGRP_LINK)
        # Names whose link was reported down (IFF_UP clear) since the agent
        # last looked: a down and an up heard in one turn are a link come up.
        self.downs: set = set()

    def parse(self, data: bytes) -> list:
        return parse_link_events(data, self.downs)


def parse_link_events(data: bytes, downs: set | None = None) -> list:
    """The events in `data`; the names of links reported without IFF_UP
    are added to `downs` when given."""
    events = []
    off = 0
    while off + _HDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _HDR.unpack_from(data, off)
        if length < _HDR.size or off + length > len(data):
            break
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            msg = ifinfmsg(data[off:off + length])
            msg.decode()
            events.append(("new" if kind == RTM_NEWLINK else "del", msg["index"],
                           msg.get_attr("IFLA_IFNAME") or ""))
            if downs is not None and kind == RTM_NEWLINK and not msg["flags"] & IFF_UP:
                downs.add(events[-1][2])
        off += (length + 3) & ~3
    return events


def drift_policy(doc: dict, owner: str, path: str) -> str:
    """on_drift for a key asked for at `path` by `owner` ("host" or
    "interfaces.NAME"): the entry's word or mapping, then the profile's."""
    top = doc.get("on_drift")
    if owner == "host":
        return Policy(top, DEFAULT_ON_DRIFT).of("host." + path)
    entry = (doc.get("interfaces") or {}).get(owner.split(".", 1)[1]) or {}
    return Policy(entry.get("on_drift"), top, DEFAULT_ON_DRIFT).of(path)


def _shown(key, value) -> str:
    """A value as a log may carry it: what stays on the host (Family.shown)
    is its placeholder."""
    from nictune.host.knobs import family_named

    family = family_named(key.family)
    text = repr(family.shown(value) if family is not None else value)
    return text if len(text) <= 60 else text[:57] + "..."


def boot_time() -> float:
    """When the kernel booted, in unix seconds (/proc/stat btime,
    fs/proc/stat.c), or 0.0 when it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def boot_id():
    """This boot's random id (/proc/sys/kernel/random/boot_id), or None."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


def status_path(state_dir: str) -> str:
    return os.path.join(state_dir, STATUS_FILE)


def load_status(state_dir: str):
    """The running (or last) agent's status, or None when none was written."""
    path = status_path(state_dir)
    try:
        fd = _open_checked(path, "agent status", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, 16 << 20)
    finally:
        os.close(fd)
    status = json.loads(data)
    if not isinstance(status, dict) or status.get("nictune_agent_status") != STATUS_FORMAT:
        raise ValueError(f"{path} is not a nictune agent status (format {STATUS_FORMAT})")
    return status


class Resident:
    def __init__(self, state_dir: str, netns=None, interval: float = DEFAULT_INTERVAL,
                 flap_limit: int = FLAP_LIMIT, flap_window: float = FLAP_WINDOW, log=None,
                 listen: bool = True):
        self.state_dir = state_dir
        self.listen = listen
        self.host = Host()
        self.host.netns = netns
        self.journal = Journal(state_dir)
        self.interval = interval
        self.limiter = FlapLimiter(flap_limit, flap_window)
        self.log = log or (lambda line: sys.stderr.write(f"nictune agent: {line}\n"))
        self.desired = None
        self.ifindex: dict = {}   # name -> ifindex, to tell a re-created link
        self.link_up: dict = {}   # name -> IFF_UP when last seen, to tell a link come up
        self.drifted: set = set()  # keys differing since their drift was counted
        self.verify_at = float("inf")  # monotonic time of an event-driven verify
        self.pacer = Pacer()
        self._said = None              # the status last written, but its time
        self.slow_at = 0.0             # monotonic time the slow families are read again
        self.slow_names: set = set()   # their keys' names, as last read
        # The LLDP listener of the rails whose entries have switch: checks
        # (transports/lldpsock.py; imported with the first such rail): its
        # frames go to lldpsock.STORE_FILE.
        self.lldp = None
        # The metrics endpoint's server (host/resident/metrics.py), served
        # from run()'s select (main(): start_metrics), or None.
        self.metrics_server = None
        self.status = {
            "nictune_agent_status": STATUS_FORMAT, "pid": os.getpid(), "started": time.time(),
            "updated": None, "stopped": None, "interval": interval, "flap_limit": flap_limit,
            "flap_window": flap_window, "desired": None, "idle": None, "reapplies": 0,
            "last_reapply": None, "last_verify": None, "last_verify_ok": None, "error": None,
            "ethtool_monitor": None, "desired_state": None, "boot_id": boot_id(), "keys": {},
        }
        # The last agent's status, read before this one replaces it: was
        # there an agent since the kernel booted (first_start_since_boot)?
        try:
            self._previous_status = load_status(state_dir)
        except (NictuneError, ValueError, OSError):
            self._previous_status = {"started": float("inf"), "boot_id": "?"}  # unknown

    # -- the desired state ------------------------------------------------------

    def refresh_desired(self) -> bool:
        """Re-read desired.json; True when a (new) desired state is there.
        A damaged one gives way to its copy (journal.load_desired); when
        neither can be read, the agent idles and status["desired_state"]
        says why (the metrics' nictune_desired_state_ok 0)."""
        state = {"ok": True, "reason": None, "message": None, "from_copy": False}
        try:
            desired = self.journal.load_desired()
        except NictuneError as e:
            desired, why = None, f"the desired state cannot be read: {e}"
            state.update(ok=False, message=str(e),
                         reason="damaged" if isinstance(e, JournalDamaged) else "refused")
        else:
            why = None if desired else ("no desired state: nothing to keep until "
                                        "`nictune apply` commits a profile")
            if self.journal.desired_warnings:
                state.update(from_copy=True, message="; ".join(self.journal.desired_warnings))
        said = (self.status["desired_state"] or {}).get("message")
        if state["from_copy"] and state["message"] != said:  # once, not every turn
            self.log(state["message"])
        self.status["desired_state"] = state
        new = desired_stamp(desired) != desired_stamp(self.desired)
        if new:
            self.desired = desired
            self.drifted.clear()
            self.limiter.reset()
            self.status["keys"] = {}
            self.status["desired"] = desired and {k: desired.get(k)
                                                  for k in ("path", "apply", "stored")}
        if why and why != self.status["idle"]:
            self.log(why)
        self.status["idle"] = why
        return bool(new and desired)

    def take_up(self, cause: str, at_start: bool = False) -> None:
        """Keep a desired state just read (at start, or a new one): its
        keys are verified, report-only ones (on_drift: report, the
        default) reported and restore ones put back, as any drift: a
        restart or a re-read never undoes what an operator is looking into.
        Only the first start since the kernel booted, when nothing of this
        boot has applied that state yet (its settings are the kernel's
        defaults again), applies the whole of it, as `nictune apply`."""
        if at_start and self.first_start_since_boot():
            self.reapply("boot")
        self.verify(cause, slow=True)
        self.verify_at = float("inf")

    def first_start_since_boot(self) -> bool:
        """Whether the desired state, the last journaled apply and the last
        agent's start all come from before the kernel booted.  When
        unsure (nothing read), no: writing is what is to be avoided."""
        booted = boot_time()
        before = self._previous_status
        if not booted or (before or {}).get("boot_id") in (self.status["boot_id"], "?"):
            return False  # unknown, or an agent already ran in this boot (the clock may step)
        try:
            last = self.journal.load()
        except (NictuneError, ValueError):
            return False
        times = [(self.desired or {}).get("stored"), (last or {}).get("started"),
                 (before or {}).get("started")]
        return all(t is None or (isinstance(t, (int, float)) and t < booted) for t in times) \
            and times[0] is not None

    # -- applying ------------------------------------------------------------------

    def _engine(self) -> Engine:
        return Engine(self.host, self.state_dir)

    def reapply(self, reason: str, only=None, name_targets: bool = False) -> object:
        """Apply the desired state (only the keys `only` accepts); journaled
        and counted when it writes anything.  With `name_targets`, the
        reason names the interfaces written to."""
        d = self.desired
        left = self.limiter.left

        def wanted(key) -> bool:
            return str(key) not in left and (only is None or only(key))

        try:
            out = self._engine().apply(d["doc"], d.get("sources") or {}, d.get("path"),
                                       remember=False, only=wanted, keeping=d, scope=fast_key)
        except Superseded:
            # An apply or a rollback replaced it meanwhile: the next turn
            # takes the new one up (refresh_desired).
            self.log(f"{reason}: the desired state was replaced meanwhile; following it")
            return None
        except NictuneError as e:
            self._failed(f"{reason}: {e}")
            return None
        written = [c for c in out.changes if c.status in (m.APPLIED, m.REVERTED, m.FAILED,
                                                           m.REVERT_FAILED)]
        error = out.error and out.error.get("message")
        if name_targets:
            reason += ": " + ", ".join(sorted({c.key.target for c in written}))
        if written or error:
            self.status["reapplies"] += bool(written)
            journal = self.journal.load() if written else None
            self.status["last_reapply"] = {
                "time": time.time(), "reason": reason, "written": len(written),
                "journal": journal and journal.get("id"), "error": error}
            self.log(f"re-applied ({reason}): {len(written)} key(s) written"
                     + (f"; {error}" if error else ""))
        if error:
            self.status["error"] = error
        return out

    def _failed(self, message: str) -> None:
        self.status["error"] = message
        self.log(message)

    # -- watching ------------------------------------------------------------------

    def verify(self, cause: str = "", slow: bool = False) -> None:
        """Read every key (those of the slow families only with `slow`:
        SLOW_POLL); count new drift; put back what on_drift says (the
        re-apply's reason starts with `cause` when given)."""
        d = self.desired
        engine = self._engine()
        try:
            desire, changes = engine._plan(d["doc"], d.get("sources") or {}, read_only=True,
                                           scope=None if slow else fast_key)
        except NictuneError as e:
            self._failed(f"verify: {e}")
            return
        if slow:
            self.slow_at = time.monotonic() + SLOW_POLL
            self.slow_names = {str(c.key) for c in changes if slow_key(c.key)}
        now = time.time()
        keys = self.status["keys"]
        differ, restore = {}, []
        for c in changes:
            if c.status in (m.SKIPPED, m.UNSUPPORTED):
                continue
            name = str(c.key)
            policy = drift_policy(d["doc"], desire.owner[c.key], _path_of(desire.items[c.key]))
            rec = keys.setdefault(name, {"drifts": 0, "restores": 0, "last_drift": None,
                                         "left_alone": False, "drifted": False})
            rec["on_drift"] = policy
            if c.status == m.OK:
                self.drifted.discard(name)
                rec["drifted"] = False
                continue
            differ[name] = c
            rec["drifted"] = True
            if name not in self.drifted:
                self.drifted.add(name)
                rec["drifts"] += 1
                rec["last_drift"] = now
                if policy == "restore" and c.status == m.PENDING:
                    if self.limiter.drifted(name, now) and not rec["left_alone"]:
                        rec["left_alone"] = True
                        self.log(f"{name} drifted {self.limiter.limit} times in "
                                 f"{self.limiter.window:g} s: left alone")
                self.log(f"drift: {name} is {_shown(c.key, c.before)}, wants "
                         f"{_shown(c.key, c.after)} ({policy})")
            if policy == "restore" and c.status == m.PENDING and not rec["left_alone"]:
                restore.append(name)
        self.status["last_verify"] = now
        # A slow family's key left out of this verify differs still if it did.
        ok = not differ and (slow or not self.drifted & self.slow_names)
        if restore:
            out = self.reapply((f"{cause}: " if cause else "") + "restore " + ", ".join(restore),
                               only=lambda key: str(key) in restore)
            back = {str(c.key) for c in (out.changes if out else ()) if c.status == m.APPLIED}
            for name in restore:
                # Put back or not, the next difference is a drift again.
                self.drifted.discard(name)
                if name in back:
                    keys[name]["restores"] += 1
                    keys[name]["drifted"] = False
            ok = out is not None and not out.error and set(differ) <= back
        if ok:
            self.status["last_verify_ok"] = now

    def lldp_rails(self) -> list:
        """The interfaces matched by the desired profile's entries with a switch: section."""
        doc = (self.desired or {}).get("doc") or {}
        entries = [e for e in (doc.get("interfaces") or {}).values()
                   if isinstance(e, dict) and "switch" in e and isinstance(e.get("match"), dict)]
        if not entries:
            return []
        return [i.name for i in self.host.interfaces() if any(i.matches(e["match"]) for e in entries)]

    def listen_lldp(self, reopen=()) -> None:
        """Listen on the switch-checked rails; a re-created link's socket is opened again."""
        try:
            rails = self.lldp_rails()
        except (OSError, NictuneError) as e:
            self.log(f"LLDP listener: {e}")
            return
        if self.lldp is None:
            if not rails:
                return
            from nictune.host.transports import lldpsock

            self.lldp = lldpsock.RailListener(log=self.log)
        self.lldp.watch([r for r in rails if r not in reopen])
        self.lldp.watch(rails)

    def keep_lldp(self, ready) -> None:
        """Frames that arrived, kept in STORE_FILE for verify (knobs/switch.py)."""
        from nictune.host.transports.lldpsock import STORE_FILE

        if self.lldp.read(ready):
            with self.journal._state(create=True) as fd:
                _replace(fd, STORE_FILE, json.dumps(self.lldp.stored(), sort_keys=True))

    def learn_links(self) -> None:
        links = self.host.rtnl().links()
        self.ifindex = {link.name: link.index for link in links}
        self.link_up = {link.name: link.up for link in links}

    def came_up(self, names: set, downs: set = frozenset()) -> set:
        """Those of `names` (links an event was about) that are up now and
        were down when last seen or reported down since (`downs`): a
        driver's open requests its interrupts again, or sets their affinity
        to its own default."""
        if not names:
            return set()
        now = {link.name: link.up for link in self.host.rtnl().links()}
        up = {name for name in names
              if now.get(name) and (name in downs or not self.link_up.get(name, True))}
        self.link_up.update(now)
        return up

    def reassert(self, names: set) -> None:
        """Write again, whatever on_drift says, the keys of the families the
        kernel resets when a link comes up (Family.reassert_on_link_up:
        IRQ placement) on the links `names`."""
        from nictune.host import knobs

        def resets(key) -> bool:
            family = knobs.family_named(key.family)
            return key.target in names and bool(family and family.reassert_on_link_up)

        self.reapply("link up", only=resets, name_targets=True)

    def on_links(self, events: list) -> tuple:
        """(names that came with a new ifindex, whether to verify now)."""
        appeared, check = set(), False
        for event, index, name in events:
            if event == "resync":
                self.learn_links()  # what the lost events said is unknown: look at all
                check = True
            elif event == "del":
                if self.ifindex.get(name) == index:
                    del self.ifindex[name]
            elif event == "ethtool":  # a setting of `name` changed: no new link
                check = True
            elif name:
                if self.ifindex.get(name) != index:
                    appeared.add(name)
                self.ifindex[name] = index
                check = True
        return appeared, check

    # -- the loop --------------------------------------------------------------

    def write_status(self, if_changed: bool = False) -> None:
        """STATUS_FILE, replaced; with `if_changed`, only when it says
        something new besides the time (a turn that only heard of a link
        going away spends no fsync before the next event's work)."""
        said = json.dumps({k: v for k, v in self.status.items() if k != "updated"}, sort_keys=True)
        if if_changed and said == self._said:
            return
        self.status["updated"] = time.time()
        with self.journal._state(create=True) as fd:
            _replace(fd, STATUS_FILE, json.dumps(self.status, sort_keys=True))
        self._said = said

    def cycle(self, monitors, due: bool) -> None:
        """One turn: the events of the monitors that are ready first (a
        re-created link is re-tuned before anything else), then, when due or
        a link or an ethtool setting changed, a verify."""
        self.status["error"] = None
        appeared, check, up = set(), False, set()
        if monitors:
            events = self.read_events(monitors)
            appeared, check = self.on_links(events)
            downs = set()
            for mon in monitors:
                downs |= getattr(mon, "downs", set())
                getattr(mon, "downs", set()).clear()
            up = self.came_up({name for event, _, name in events if event == "new" and name}, downs)
        # Every turn: an apply or a rollback that replaced the desired state
        # is followed from the next event on, not fought until the next poll.
        verified = False
        if self.refresh_desired():
            self.take_up("desired state changed")
            verified = True
        if verified or appeared:
            self.listen_lldp(reopen=appeared)
        if not self.desired:
            self.verify_at = float("inf")
            return
        if appeared:
            self.reapply("appeared", only=lambda key: key.target in appeared,
                         name_targets=True)
        if up - appeared:
            self.reassert(up - appeared)
        if check:
            self.verify_at = min(self.verify_at, self.pacer.next_at(time.monotonic()))
        if (due or time.monotonic() >= self.verify_at) and not verified:
            self.verify(slow=due and time.monotonic() >= self.slow_at)
            self.pacer.spend(time.monotonic())
            self.verify_at = float("inf")

    def read_events(self, monitors) -> list:
        """What the ready monitors say.  When a link appeared (a name with a
        new ifindex), the burst it comes in (many VFs, a driver's reload)
        settles first (QUIET, SETTLE), to be re-tuned by one apply."""
        events = [e for mon in monitors for e in mon.read()]
        if any(event == "new" and name and self.ifindex.get(name) != index
               for event, index, name in events):
            deadline = time.monotonic() + SETTLE
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select(monitors, [], [], min(QUIET, left))[0]:
                    break
                events += [e for mon in monitors for e in mon.read()]
        return events

    def serve(self, ready: list, rails: list, server) -> None:
        """What the sockets beside the monitors that are `ready` ask for."""
        if any(sock in ready for sock in rails):
            self.keep_lldp(ready)  # the kernel queued a frame: nothing polls for them
        if server is not None and server in ready:
            server.serve()  # between cycles: never beside the agent's own work
        if self.metrics_server is not None and self.metrics_server in ready:
            # A scrape is answered in a thread of its own (ThreadingHTTPServer).
            self.metrics_server.handle_request()

    def ethtool_monitor(self):
        """The ethtool monitor group's socket, or None (the status says why)."""
        from nictune.host.transports.netlink.ethmonitor import EthtoolMonitor, Unavailable

        try:
            mon = EthtoolMonitor()
        except (Unavailable, OSError) as e:
            self.status["ethtool_monitor"] = (
                f"not available ({e}): ethtool settings changed by others are seen "
                f"at the next poll, every {self.interval:g} s")
            self.log(self.status["ethtool_monitor"])
            return None
        self.status["ethtool_monitor"] = "subscribed"
        return mon

    def run(self, wake_fd: int) -> None:
        """Until a byte arrives on wake_fd (signal.set_wakeup_fd)."""
        monitor = LinkMonitor()  # before the first apply: no event is missed
        ethmon = self.ethtool_monitor()
        monitors = [monitor] + ([ethmon] if ethmon else [])
        server = None
        try:
            try:
                self.learn_links()
                if self.refresh_desired():
                    self.take_up("start", at_start=True)
                self.listen_lldp()
            except Exception as e:  # noqa: BLE001 - the next turn tries again
                self._failed(f"start: {type(e).__name__}: {e}")
            self.write_status()
            # What start-up made lives as long as the agent: out of the
            # collector's way, which would otherwise walk it at every
            # collection of the oldest generation.
            gc.collect()
            gc.freeze()
            if self.listen:  # after write_status: the state directory exists, 0700
                try:
                    server = AuditSocket(self.state_dir, archive_id(), log=self.log)
                except OSError as e:  # a path too long for AF_UNIX...: audits take the zipapp
                    self.log(f"no audit socket in {self.state_dir}: {e}")
            next_poll = time.monotonic() + self.interval
            while True:
                timeout = max(0.0, min(next_poll, self.verify_at) - time.monotonic())
                rails = self.lldp.sockets() if self.lldp else []
                side = rails + [s for s in (server, self.metrics_server) if s is not None]
                ready, _, _ = select.select(monitors + [wake_fd] + side, [], [], timeout)
                if wake_fd in ready:
                    return
                self.serve(ready, rails, server)
                if (not any(mon in ready for mon in monitors)
                        and time.monotonic() < min(next_poll, self.verify_at)):
                    continue
                due = time.monotonic() >= next_poll
                if due:
                    next_poll = time.monotonic() + self.interval
                try:
                    self.cycle([mon for mon in monitors if mon in ready], due)
                except Exception as e:  # noqa: BLE001 - a resident agent outlives one bad cycle
                    self._failed(f"{type(e).__name__}: {e}")
                self.host.forget(facts=True)
                self.write_status(if_changed=True)
        finally:
            for mon in monitors:
                mon.close()
            if self.lldp is not None:
                self.lldp.close()
            if server is not None:
                server.close()
            self.status["stopped"] = time.time()
            try:
                self.write_status()
            except (OSError, NictuneError):
                pass


def start_metrics(agent: Resident, address: str, textfile, **options):
    """The metrics (host/resident/metrics.py) of `agent`: its endpoint on
    `address` (when given) becomes agent.metrics_server, which the agent's
    loop serves from its own select(): socketserver's serve_forever would
    wake a thread twice a second on an idle host (100 ms of CPU every 10
    minutes).  The textfile writer (when `textfile`) is the exporter
    returned, started, or None.  `options` go to both metrics.Exporter's."""
    for name in NOT_LOADED:
        sys.modules.setdefault(name, None)  # `import name` fails, as where Python lacks it
    # Here, not at the top: only the resident agent serves metrics.
    from nictune.host.resident import metrics

    def status() -> dict:
        return agent.status

    try:
        if address:
            agent.metrics_server = metrics.Exporter(status, address, log=agent.log, **options).server
        return metrics.start(status, None, textfile, log=agent.log, **options) if textfile else None
    except (OSError, ValueError) as e:
        if agent.metrics_server is not None:
            agent.metrics_server.server_close()
        raise NictuneError(f"metrics on {address}: {e}") from None


def _HelpFormatter(prog: str) -> argparse.HelpFormatter:
    """argparse's, with a width: without one it imports shutil (and with it
    zlib, bz2 and lzma) for the terminal's, at every add_argument."""
    return argparse.HelpFormatter(prog, width=80)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="nictune-agent", description=__doc__.split("\n")[0],
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--netns", default=None,
                        help="the namespace this runs in (its /etc/netns files)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL)
    parser.add_argument("--flap-limit", type=int, default=FLAP_LIMIT)
    parser.add_argument("--flap-window", type=float, default=FLAP_WINDOW)
    parser.add_argument("--metrics-address", default="127.0.0.1:9463",
                        help="HOST:PORT of the Prometheus endpoint; '' for none")
    parser.add_argument("--metrics-textfile", default=None,
                        help="also write the metrics to this node_exporter textfile")
    parser.add_argument("--metrics-detail", action="store_true",
                        help="series per priority and per key (metrics.DETAIL_LABELS), not summed")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.flap_limit < 1 or args.flap_window <= 0:
        parser.error("--interval and --flap-window must be > 0, --flap-limit >= 1")
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(w)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    exporter = agent = None
    try:
        agent = Resident(args.state_dir, args.netns, args.interval, args.flap_limit,
                         args.flap_window)
        if args.metrics_address or args.metrics_textfile:
            exporter = start_metrics(agent, args.metrics_address, args.metrics_textfile,
                                     detail=args.metrics_detail)
        agent.log(f"started (state directory {args.state_dir}, every {args.interval:g} s"
                  + (f", metrics on http://{args.metrics_address}/metrics" if args.metrics_address else "")
                  + ")")
        agent.run(r)
    except NictuneError as e:
        sys.stderr.write(f"nictune agent: {e}\n")
        return 1
    finally:
        if exporter is not None:
            exporter.stop()
        if agent is not None and agent.metrics_server is not None:
            agent.metrics_server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
