"""An audit's kernel reads, taken apart into questions and answers.

The agentless audit's cost on a host is the Python it starts, not the
reads (issue 13): so the controller asks the host only for the reads a
verify makes, through a probe of a few dozen lines
(control/remote/probe.py), and runs the verify itself on the answers.

Replaying (controller side): ProbedHost is a plain Host whose port serves
netlink sockets, ioctls and file reads from the probe's answers, so the
same engine and families run unchanged on the controller.  A read the
answers do not hold is asked of the live probe (ProbeReplayer's `ask`, one
round trip), unless a listing it holds already says the path is absent:

- a netlink request: the protocol and the bytes sent (sequence number and
  port id zeroed: they are the socket's, not the question's);
- a SIOCETHTOOL call: the interface and the buffer handed in;
- the file operations host/replay/snapshot.py records (open for reading,
  stat, lstat, listdir, readlink, access), and whether an open is made
  with O_NOFOLLOW (owned files, host/files.py);
- the page size, with the probe's first batch.

What the verify used is noted (used_questions): the controller asks it
first the next time.  A read of any other kind (a run of a tool, a unix
socket, a counter's rise, a key file, a write) raises NotProbed, and a
probe that fails to answer ProbeLost: BaseExceptions, so that no family's
`except OSError`/`except Exception` turns them into "unsupported"; the
replay is dropped and the host asked through its agent.

Learning (host side, a request with "learn": true) is the older way, kept
for the agent's request format: the command runs with every read recorded
below the knob families, through the host's port (Host.io,
host/transports/io.py; the learner is a session of host/replay/snapshot.py's
SessionIO, wrapping the port the host had), and the report brings back
the questions and why a probe cannot ask them (`questions()`).  The
controller no longer asks for it.
"""

from __future__ import annotations

import array
import os
import socket
import struct

from nictune.host.replay import decoded, snapshot
from nictune.host.machine import Host

FORMAT = 1
READ_OPS = ("open", "stat", "lstat", "listdir", "readlink", "access")
_HDR = struct.Struct("=IHHII")  # netlink: len, type, flags, seq, pid
MSG_PEEK, MSG_TRUNC = socket.MSG_PEEK, socket.MSG_TRUNC


class NotProbed(BaseException):
    """The replay needs a read no probe can answer (a run of a tool, a
    unix socket, a counter's rise, a key file): the agent answers."""


class ProbeLost(NotProbed):
    """The live probe failed to answer a read asked on demand (it stopped,
    its answer did not parse or passed a bound, the deadline passed): the
    agent answers, and nothing is concluded about the verify."""


def normalized(request: bytes) -> bytes:
    """A netlink request as a question: sequence number and port id zeroed."""
    return bytes(request[:8]) + bytes(8) + bytes(request[16:])


# -- learning ---------------------------------------------------------------------

class _RecordingSocket:
    """A netlink socket whose requests are noted on their way out."""

    def __init__(self, real: socket.socket, protocol: int, asked: list):
        self._real, self._protocol, self._asked = real, protocol, asked

    def send(self, data, *args):
        self._asked.append(("netlink", self._protocol, normalized(data)))
        return self._real.send(data, *args)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _Learner(snapshot._Recorder):
    """host/replay/snapshot.py's file recorder, plus raw sockets and ioctls."""

    def __init__(self, root: str, inner=None):
        super().__init__(root, snapshot.Log(), inner)
        self.asked: list = []
        self.why_not: list = []
        self.nofollow: set = set()
        self._in_os_open = False

    def os_open(self, path, flags, mode=0o777):
        # Owned files (host/files.py) are opened with O_NOFOLLOW, through
        # os_open: the probe must open them the same way.
        self._in_os_open = True
        try:
            return super().os_open(path, flags, mode)
        finally:
            self._in_os_open = False

    def _opened(self, ident: str, path, opener):
        if self._in_os_open:
            self.nofollow.add(ident)
        return super()._opened(ident, path, opener)

    def netlink(self, protocol: int):
        return _RecordingSocket(super().netlink(protocol), protocol, self.asked)

    def unix_connect(self, path: str, timeout: float):
        self.why_not.append(f"a socket of family {int(socket.AF_UNIX)}")
        return super().unix_connect(path, timeout)

    def run(self, argv: list, timeout: float) -> tuple:
        self.why_not.append(f"a run of {argv[0] if argv else 'a tool'}")
        return super().run(argv, timeout)

    def ioctl(self, sock, ifname: str, buf):
        self.asked.append(("ioctl", ifname, buf.tobytes()))
        return self.inner.ioctl(sock, ifname, buf)

    def write(self, op: str, path, args: tuple, kwargs: dict):
        self.why_not.append(f"{op} of {path}")
        return super().write(op, path, args, kwargs)


class _NoWaiting:
    """The counter source while learning: a counter's rise is two readings
    seconds apart, which a probe cannot ask in one round trip."""

    def __init__(self, inner, why_not: list):
        self._inner, self._why_not = inner, why_not

    def ethtool_stats(self, ifname: str):
        return self._inner.ethtool_stats(ifname)

    def now(self) -> float:
        return self._inner.now()

    def sleep(self, seconds: float) -> None:
        self._why_not.append("a counter's rise (two readings apart in time)")
        self._inner.sleep(seconds)


def learn(host: Host, run):
    """run() on host with its reads noted; (its result, the questions)."""
    from nictune.host.facts import health

    live = host.io
    learner = _Learner(host.root, live)
    host.io = snapshot.SessionIO(learner, live)
    host.counter_source = _NoWaiting(health.counter_source(host), learner.why_not)
    host.learning = True  # engine.Families: a drifted key's reads are asked too
    try:
        result = run()
    finally:
        host.io = live
    return result, questions(learner)


def questions(learner: _Learner) -> dict:
    """The questions of a learned run, as a report carries them (JSON)."""
    import base64

    why_not = list(learner.why_not)
    if learner.log.calls:  # key files: their fingerprint is never asked for by a probe
        why_not.append("a key file")
    files = []
    for ident in learner.log.files:
        op = ident.partition(" ")[0]
        if op in READ_OPS:
            files.append(ident)
        else:
            why_not.append(ident)
    asked, seen = [], set()
    for q in learner.asked:
        if q not in seen:
            seen.add(q)
            asked.append([q[0], q[1], base64.b64encode(q[2]).decode()])
    return {"format": FORMAT, "files": files, "kernel": asked,
            "nofollow": sorted(learner.nofollow & set(files)), "why_not": sorted(set(why_not))[:20]}


# -- replaying ----------------------------------------------------------------------

def _with_seq(datagram: bytes, seq: bytes) -> bytes:
    """A recorded answer as the answer to a request numbered seq."""
    out = bytearray(datagram)
    off = 0
    while off + _HDR.size <= len(out):
        length = _HDR.unpack_from(out, off)[0]
        if length < _HDR.size:
            break
        out[off + 8:off + 12] = seq
        off += (length + 3) & ~3
    return bytes(out)


class _ReplaySocket:
    # netlink/socket.py decodes what this socket serves once for all hosts
    decoded = decoded.SHARED

    def __init__(self, protocol: int, replayer: "ProbeReplayer"):
        self._protocol, self._replayer = protocol, replayer
        self._queue: list = []

    def setsockopt(self, *args) -> None:
        pass

    def bind(self, *args) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, data, *args) -> int:
        found = self._replayer.kernel_answer("netlink", self._protocol, normalized(data))
        self._queue = [_with_seq(d, bytes(data[8:12])) for d in found]
        return len(data)

    def recv_into(self, buf, nbytes: int = 0, flags: int = 0) -> int:
        if not self._queue:
            raise NotProbed("a netlink answer past the end of the probe's")
        datagram = self._queue[0]
        n = min(len(datagram), nbytes or len(buf))
        buf[:n] = datagram[:n]
        if not flags & MSG_PEEK:
            self._queue.pop(0)
        return len(datagram) if flags & MSG_TRUNC else n


class _IoctlSocket:
    """Where ioctls would go: they are answered in ProbeReplayer.ioctl."""

    def close(self) -> None:
        pass

    def fileno(self) -> int:
        raise NotProbed("a raw use of the ioctl socket")


class ProbeReplayer(snapshot._Replayer):
    """Serves a probe's answers to the reads of its host's port; a read
    they lack is asked of the live probe through `ask` (one round trip),
    and every read of any other kind is refused (NotProbed).  Which
    answers the verify used is noted: the questions a later verify of
    the host asks first (used_questions)."""

    def __init__(self, answers: "Answers", where: str, ask=None):
        super().__init__({"files": answers.files}, "/", where)
        self.files = answers.files  # the same dict, even empty: answers asked later land there
        self.answers = answers
        self.ask = ask  # ask([question]): adds its answer to `answers`, or raises
        self._nofollow = False  # in os_open: owned files (host/files.py) are opened so
        self.used_files: dict = {}   # ident -> whether opened with O_NOFOLLOW
        self.used_kernel: dict = {}  # (kind, arg, request) -> None, in order

    def not_recorded(self, what: str) -> BaseException:
        return NotProbed(what)

    def _result(self, ident: str, what: str, rel):
        if rel is not None and self.ask is not None and ident.partition(" ")[0] in READ_OPS:
            answered = self.answers.files.get(ident)
            if answered is None:
                missing = self._missing(what, rel)
                if not isinstance(missing, NotProbed):
                    raise missing  # a listing read of the host says it is not there
                self._ask(("file", ident, self._nofollow))
            elif ident.startswith("open ") and self._nofollow != (ident in self.answers.nofollow):
                # Asked the other way (a seed from another host): an owned
                # file must not be read through a link, nor a link refused
                # where the families follow it.
                self._ask(("file", ident, self._nofollow))
        if rel is not None and ident in self.answers.files:
            self.used_files[ident] = self._nofollow  # an error answered is used too
        return super()._result(ident, what, rel)

    def os_open(self, path, flags, mode=0o777):
        self._nofollow = True
        try:
            return super().os_open(path, flags, mode)
        finally:
            self._nofollow = False

    def _ask(self, question: tuple) -> None:
        self.ask([question])
        if question[0] == "file" and question[1].startswith("listdir "):
            found = self.answers.files.get(question[1]) or {}
            if "value" in found:
                self._listed[question[1][len("listdir "):]] = set(found["value"])

    def kernel_answer(self, kind: str, arg, request: bytes):
        """The answer to a netlink request or ioctl, asked if need be."""
        table = self.answers.netlink if kind == "netlink" else self.answers.ioctls
        found = table.get((arg, request))
        if found is None and self.ask is not None:
            self._ask((kind, arg, request))
            found = table.get((arg, request))
        if found is None:
            what = f"protocol {arg}" if kind == "netlink" else f"an ethtool ioctl on {arg}"
            raise NotProbed(f"a {kind} request ({what}) the probe was not asked")
        self.used_kernel[(kind, arg, request)] = None
        return found

    def netlink(self, protocol: int):
        return _ReplaySocket(protocol, self)

    def inet_socket(self):
        return _IoctlSocket()

    def unix_connect(self, path: str, timeout: float):
        raise NotProbed(f"a socket of family {int(socket.AF_UNIX)}")

    def ioctl(self, sock, ifname: str, buf) -> int:
        code, data = self.kernel_answer("ioctl", ifname, buf.tobytes())
        if isinstance(code, tuple):  # (errno,): the ioctl failed
            raise OSError(code[0], os.strerror(code[0]))
        buf[:len(data)] = array.array("B", data)
        return code

    def used_questions(self) -> dict:
        """The reads this verify made, as questions (the form a learned
        report carries, checked again by control/remote/probe.py)."""
        import base64

        files = list(self.used_files)
        return {"format": FORMAT, "files": files,
                "kernel": [[kind, arg, base64.b64encode(raw).decode()]
                           for kind, arg, raw in self.used_kernel],
                "nofollow": [f for f in files if self.used_files[f] and f.startswith("open ")],
                "why_not": []}


class Answers:
    """A probe's answers, decoded (control/remote/probe.py parse_answers)."""

    def __init__(self, page_size, files: dict, netlink: dict, ioctls: dict, nofollow=()):
        self.page_size = page_size  # None until the probe's first batch is in
        self.files = files        # snapshot.py's file entries, by ident
        self.netlink = netlink    # (protocol, normalized request) -> [datagram]
        self.ioctls = ioctls      # (ifname, buffer in) -> (result, buffer out) | ((errno,), b"")
        self.nofollow = set(nofollow)  # the opens answered with O_NOFOLLOW


class _Counters:
    """Counters read once; a wait for a second reading is not answerable."""

    def __init__(self, host: Host):
        from nictune.host.facts import health

        self._inner = health.CounterSource(host)

    def ethtool_stats(self, ifname: str):
        return self._inner.ethtool_stats(ifname)

    def now(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        raise NotProbed("a counter's rise")


class ProbedHost(Host):
    """The host as the probe's answers show it, read-only, on the controller.
    With `ask`, a read the answers lack is asked of the live probe."""

    def __init__(self, answers: Answers, label: str, ask=None):
        super().__init__("/")
        self.answers = answers
        self.where = f"{label}: the probe"
        self.replayer = ProbeReplayer(answers, self.where, ask)
        self.io = snapshot.SessionIO(self.replayer)
        self.counter_source = _Counters(self)

    def page_size(self) -> int:
        if self.answers.page_size is None and self.replayer.ask is not None:
            self.replayer.ask([])  # an empty batch: the probe's header says it
        if self.answers.page_size is None:
            raise NotProbed("the page size")
        return self.answers.page_size

    def replaying(self):
        """Kept for callers: the answers serve through self.io already."""
        import contextlib

        return contextlib.nullcontext(self)
