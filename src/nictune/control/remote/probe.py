"""The probe: an agentless verify that starts no agent on the host.

A verify over SSH costs the host an interpreter, the agent's imports and
its JSON far more than the reads themselves (issue 13).  So a verify runs
PROBE on the host instead, a few dozen lines of Python that read what they
are asked and print it, nothing else imported, and the controller runs the
same engine and knob families on the answers (probe_reads.ProbedHost).
Nothing is kept on the host between audits, and no answer is ever reused:
only which questions to ask.

The probe answers in batches over the one channel (protocol 2): the
questions of a batch, one line each, then an empty line, and the probe
answers them all at once, framed ("a COUNT LENGTH"), and waits for the
next batch until its input ends.  Session drives it from the controller.
The first batch is what that host's last verify read (kept by
control/remote/probecache.py, keyed by host, request and agent archive),
else what another host with the same request read (probecache.TEMPLATES),
else nothing; every read the engine makes that the answers lack is asked
there and then, one round trip (ProbeReplayer's `ask`): the families' own
reads are the questions, no list of them is kept anywhere else.  So no
verify needs a learning run of the agent, the first of a host neither.

A plan goes the same way (control/remote/ssh.py PROBE_COMMANDS): it only
reads, as a verify does, and the engine makes the same report on the
answers as the agent on the host.

Every question is checked before it is sent, every answer as it comes,
and the bounds below hold over the whole session.  A probe that fails or
answers what does not parse sends the host to its agent (ProbeLost); so
does a read no probe can answer (a run of a tool, a unix socket, a
counter's rise, a key file: NotProbed), which is kept as such.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
from typing import Optional

from nictune.host.replay import probe_reads
from nictune.host.files import MAX_OWNED_BYTES

# Runs as `python3 -I -S -c PROBE`: reads the questions on stdin, and at
# each empty line writes the answers to those since the last, one each,
# framed, and flushes; ends at the end of its input.  Kept import-light: the C modules under os and socket
# (posix, _socket, _struct), not those two, whose imports cost as much as
# the interpreter's start; no json.  It only reads: files, netlink requests (each on a
# socket of its own, retried when the kernel marks a dump interrupted),
# SIOCETHTOOL with the buffer it is given plus room for a string set that
# grew since.
PROBE = r"""
import sys, posix, _socket, _struct, fcntl
inp, out = sys.stdin.buffer, sys.stdout.buffer
if inp.readline() != b"nictune-probe 2\n":
    sys.exit(3)
head = b"nictune-probe 2 %d\n" % posix.sysconf("SC_PAGE_SIZE")
res, asked = [], 0
H = _struct.Struct("=IHHII")
buf = bytearray(65536)
ioctl_sock = None
READ = posix.O_RDONLY | posix.O_NONBLOCK | posix.O_NOCTTY | posix.O_CLOEXEC
CAP = @CAP@
LIMIT = @LIMIT@
def regular(path, nofollow):
    # ((st_dev, st_ino), whether path itself is the file, not a link to it)
    if path == b"/dev" or path.startswith(b"/dev/"):
        raise OSError(1, "under /dev")
    st = posix.lstat(path)
    direct = st.st_mode & 0o170000 != 0o120000
    if not direct:
        if nofollow:
            raise OSError(40, "a symbolic link")
        st = posix.stat(path)
    if st.st_mode & 0o170000 != 0o100000:
        raise OSError(29, "not a regular file")
    return (st.st_dev, st.st_ino), direct
said = [0]
def ok(value, data=b""):
    said[0] += len(data)
    if said[0] > LIMIT:  # the controller would refuse it all: stop reading
        posix._exit(4)
    res.append(b"o %d %d\n" % (value, len(data)))
    res.append(data)
def netlink(proto, req):
    global buf
    s = _socket.socket(16, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, proto)
    try:
        s.setsockopt(270, 11, 1)
        s.setsockopt(270, 10, 1)
        s.bind((0, 0))
        for _ in range(3):
            s.send(req)
            got, intr, end = [], 0, 0
            while not end and len(got) < 100000:
                n = s.recv_into(buf, len(buf), _socket.MSG_PEEK | _socket.MSG_TRUNC)
                if n > len(buf):
                    buf = bytearray(n)
                n = s.recv_into(buf)
                off = 0
                while off + 16 <= n:
                    size, kind, flags, seq, _ = H.unpack_from(buf, off)
                    if size < 16:
                        break
                    if seq == 0:
                        intr |= flags & 0x10
                        end |= kind in (2, 3)
                    off += (size + 3) & ~3
                got.append(_struct.pack("=I", n) + bytes(buf[:n]))
            if not intr:
                break
        return b"".join(got)
    finally:
        s.close()
def ethtool(name, data):
    global ioctl_sock, array
    if ioctl_sock is None:
        import array  # only here: it costs a third of the probe's imports
        ioctl_sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
    b = array.array("B", data + bytes(65536))
    req = bytearray(_struct.pack("16sP", name, b.buffer_info()[0]).ljust(40, b"\0"))
    code = fcntl.ioctl(ioctl_sock.fileno(), 0x8946, req, True)
    return code, b.tobytes()[:len(data)]
for line in inp:
    if line == b"\n":  # the end of a batch: its answers, framed, at once
        data = b"".join(res)
        out.write(b"%sa %d %d\n%s" % (head, asked, len(data), data))
        out.flush()
        head, res, asked = b"", [], 0
        continue
    asked += 1
    kind, _, rest = line.rstrip(b"\n").partition(b" ")
    try:
        if kind == b"n":
            proto, hexed = rest.split(b" ")
            ok(0, netlink(int(proto), bytes.fromhex(hexed.decode())))
        elif kind == b"i":
            name, hexed = rest.split(b" ")
            ok(*ethtool(name, bytes.fromhex(hexed.decode())))
        elif kind == b"f":
            op, _, path = rest.partition(b" ")
            if op == b"access":
                path, _, mode = path.rpartition(b" ")
                ok(int(posix.access(path, int(mode))))
            elif op in (b"open", b"open-nofollow"):
                # Never wait for a writer, never take a terminal, never open
                # what is not a regular file (sysfs and procfs files are):
                # its type is looked at first, for opening a device is
                # already acting on it; nothing under /dev is ever opened.
                st = regular(path, op == b"open-nofollow")
                fd = posix.open(path, (READ | posix.O_NOFOLLOW) if st[1] else READ)
                try:
                    got = posix.fstat(fd)
                    if got.st_mode & 0o170000 != 0o100000 or (got.st_dev, got.st_ino) != st[0]:
                        raise OSError(29, "not a regular file")
                    data, size = [], 0
                    while size <= CAP:
                        chunk = posix.read(fd, CAP + 1 - size)
                        if not chunk:
                            break
                        data.append(chunk)
                        size += len(chunk)
                finally:
                    posix.close(fd)
                ok(0, b"".join(data))
            elif op in (b"stat", b"lstat"):
                st = (posix.stat if op == b"stat" else posix.lstat)(path)
                ok(0, b" ".join(b"%d" % int(v) for v in (st.st_mode, st.st_ino, st.st_dev, st.st_nlink,
                   st.st_uid, st.st_gid, st.st_size, st.st_atime, st.st_mtime, st.st_ctime)))
            elif op == b"listdir":
                ok(0, b"\0".join(posix.listdir(path)))
            elif op == b"readlink":
                ok(0, posix.readlink(path))
            else:
                sys.exit(3)
        else:
            sys.exit(3)
    except OSError as e:
        res.append(b"e %d 0\n" % (e.errno or 0))
posix._exit(0)
"""

# What one verify may ask, and what its answers may weigh.  Measured
# on the lab (lab/fleet.py hosts: two veth rails, mgmt0), the biggest
# shipped profile's verify (profiles/lab-fleet.yaml) asks 74 questions of
# 13 KB as kept, its largest request 2.7 KB, and is answered in 20 KB; the
# others 26-47 questions, 3 KB, 8 KB.  The bounds leave room for hosts with
# dozens of matched ports, some 25 times that, while a host's report can
# no longer make every later audit of it cost seconds and hundreds of MB.
# The answers' bound fits a link dump of some 2,400 links (3.3 KB each: a
# switchdev host's 1,024 VF representors and more).  What answers of that
# size cost the controller's verify was measured by filling each of the lab
# verify's dump answers with copies of one of its messages: 17 to 223 MiB
# at the peak and 1 to 17 s of CPU (under tracemalloc), the worst a hostile
# host can make one audit of it cost.
MAX_QUESTIONS = 2000
MAX_QUESTION_BYTES = 1 << 20  # paths and requests of one verify together
MAX_REQUEST = 1 << 16         # bytes of one netlink request or ioctl buffer
MAX_ANSWERS = 8 << 20         # bytes of all answers together
PROBE = PROBE.replace("@CAP@", str(MAX_OWNED_BYTES)).replace("@LIMIT@", str(MAX_ANSWERS))
_IFNAME = re.compile(r"^[^\x00-\x20\x7f/:]{1,15}$")
_PATH = re.compile(r"^/[^\x00-\x1f\x7f]{0,4095}$")


class BadProbe(Exception):
    """Questions or answers that cannot be used: the agent answers instead."""


def remote_command(python: str, sudo: bool) -> str:
    argv = [python, "-I", "-S", "-c", PROBE]
    if sudo:
        argv = ["sudo", "-n", "--"] + argv
    return "exec " + " ".join(shlex.quote(a) for a in argv)


# -- questions ----------------------------------------------------------------------

def checked_questions(q) -> Optional[dict]:
    """Questions kept (a cache file, a learned report), checked; None when the host's
    verify cannot be asked this way (or the report's questions are not
    questions, or more than a verify asks)."""
    if not isinstance(q, dict) or q.get("format") != probe_reads.FORMAT or q.get("why_not"):
        return None
    files, kernel, nofollow = q.get("files"), q.get("kernel"), q.get("nofollow", [])
    if not (isinstance(files, list) and isinstance(kernel, list) and isinstance(nofollow, list)):
        return None
    if len(files) + len(kernel) > MAX_QUESTIONS:
        return None
    weight = 0
    for ident in files:
        if not _file_question(ident):
            return None
        weight += len(ident)
    for item in kernel:
        size = _kernel_question(item)
        if size is None:
            return None
        weight += size
    if weight > MAX_QUESTION_BYTES:
        return None
    if not all(isinstance(f, str) for f in nofollow) or not set(nofollow) <= {
            f for f in files if f.startswith("open ")}:
        return None
    return {"format": probe_reads.FORMAT, "files": files, "kernel": kernel, "nofollow": nofollow}


def _file_question(ident) -> bool:
    """A file operation from the fixed set, on a normalised absolute path;
    no open under /dev (no agent reads there, and opening a device acts on
    it: a stat does not)."""
    if not isinstance(ident, str) or len(ident) > 4200:
        return False
    op, _, path = ident.partition(" ")
    if op == "access":
        path, _, mode = path.rpartition(" ")
        if mode not in ("0", "1", "2", "4", "6", "7"):
            return False
    if op not in probe_reads.READ_OPS or not _PATH.fullmatch(path):
        return False
    parts = path.split("/")[1:]
    if path != "/" and any(p in ("", ".", "..") for p in parts):
        return False
    return not (op == "open" and parts[0] == "dev")


def _kernel_question(item) -> Optional[int]:
    """The size of a netlink request or ethtool ioctl asked, None for
    anything else."""
    if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], str)):
        return None
    if len(item[2]) > (MAX_REQUEST + 2) // 3 * 4:
        return None  # longer than any request, without decoding it
    try:
        raw = base64.b64decode(item[2], validate=True)
    except ValueError:
        return None
    if len(raw) > MAX_REQUEST:
        return None
    if item[0] == "netlink":
        ok = type(item[1]) is int and 0 <= item[1] < 32 and len(raw) >= 16
    elif item[0] == "ioctl":
        ok = isinstance(item[1], str) and bool(_IFNAME.fullmatch(item[1]))
    else:
        ok = False
    return len(raw) if ok else None


def refusal(q) -> Optional[list]:
    """Why a learned verify cannot be asked by a probe (the questions'
    why_not: a counter's rise, a key file...), or None."""
    why = q.get("why_not") if isinstance(q, dict) and q.get("format") == probe_reads.FORMAT else None
    if not (isinstance(why, list) and why and all(isinstance(w, str) for w in why)):
        return None
    return [w[:200] for w in why[:20]]


HEADER = b"nictune-probe 2\n"


def as_list(q: dict) -> list:
    """Checked questions (checked_questions) as the list asked: ("file",
    ident, nofollow), ("netlink", protocol, request), ("ioctl", ifname, buffer)."""
    nofollow = set(q["nofollow"])
    return ([("file", ident, ident in nofollow) for ident in q["files"]]
            + [(kind, arg, base64.b64decode(data)) for kind, arg, data in q["kernel"]])


def question_weight(question: tuple) -> Optional[int]:
    """What a question asked on demand weighs, checked as a kept one is;
    None when a probe must not be asked it."""
    kind, arg, extra = question
    if kind == "file":
        return len(arg) if _file_question(arg) else None
    if not isinstance(extra, bytes):
        return None
    return _kernel_question([kind, arg, base64.b64encode(extra).decode()])


def encode_batch(questions: list) -> bytes:
    """One batch: a line per question, then the empty line that has the
    probe answer them all."""
    lines = []
    for kind, arg, extra in questions:
        if kind == "file":
            ident = "open-nofollow" + arg[len("open"):] if extra else arg
            lines.append(b"f " + os.fsencode(ident) + b"\n")
        else:
            tag = b"n" if kind == "netlink" else b"i"
            lines.append(b"%s %s %s\n" % (tag, str(arg).encode(), extra.hex().encode()))
    return b"".join(lines) + b"\n"


def encode_questions(q: dict) -> bytes:
    """The whole of a one-batch probe's input: the checked questions q."""
    return HEADER + encode_batch(as_list(q))


# -- answers --------------------------------------------------------------------------

def parse_header(line: bytes) -> int:
    """The probe's first line: its protocol and the host's page size."""
    head = line.rstrip(b"\n").split(b" ") if line.endswith(b"\n") else []
    if len(head) != 3 or head[:2] != [b"nictune-probe", b"2"] or not head[2].isdigit():
        raise BadProbe("the probe did not answer")
    page_size = int(head[2][:8])
    if not 1024 <= page_size <= 1 << 20:
        raise BadProbe("the probe's page size is out of range")
    return page_size


def parse_frame(line: bytes, asked: int, room: int) -> int:
    """A batch's first line, "a COUNT LENGTH": the length of its answers."""
    parts = line.rstrip(b"\n").split(b" ") if line.endswith(b"\n") else []
    if len(parts) != 3 or parts[0] != b"a" or not (parts[1].isdigit() and parts[2].isdigit()) \
            or len(parts[2]) > 12:
        raise BadProbe("a batch of answers is malformed")
    if int(parts[1]) != asked:
        raise BadProbe("the probe answered another number of questions than it was asked")
    if int(parts[2]) > room:
        raise BadProbe("the answers are too large")
    return int(parts[2])


def add_batch(answers: probe_reads.Answers, questions: list, data: bytes) -> None:
    """One batch's answers to `questions`, checked and added; BadProbe for
    anything else."""
    parsed, pos = [], 0
    for _ in questions:
        end = data.find(b"\n", pos, pos + 64)
        parts = data[pos:end].split(b" ") if end > 0 else []
        if len(parts) != 3 or parts[0] not in (b"o", b"e") or not all(
                p.lstrip(b"-").isdigit() for p in parts[1:]):
            raise BadProbe("an answer is malformed")
        value, size = int(parts[1]), int(parts[2])
        # An ioctl's result is a C int, an errno below 4096: a value past
        # them is no answer (and would overflow what it is handed to).
        if not (0 <= value < 4096 if parts[0] == b"e" else -2**31 <= value < 2**31):
            raise BadProbe("an answer's value is out of range")
        body = data[end + 1:end + 1 + size]
        if size < 0 or len(body) != size:
            raise BadProbe("an answer is cut short")
        parsed.append((parts[0] == b"o", value, body))
        pos = end + 1 + size
    if pos != len(data):
        raise BadProbe("the probe said more than it was asked")
    for (kind, arg, extra), (good, value, body) in zip(questions, parsed):
        if kind == "file":
            answers.files[arg] = _file_answer(arg, good, value, body)
            (answers.nofollow.add if extra else answers.nofollow.discard)(arg)
        elif kind == "netlink":
            if not good:
                raise BadProbe("the probe could not open a netlink socket")
            answers.netlink[(arg, extra)] = _datagrams(body)
        else:
            if good and len(body) != len(extra):
                raise BadProbe("an ioctl answer has the wrong size")
            answers.ioctls[(arg, extra)] = (value, body) if good else ((value,), b"")


def parse_answers(data: bytes, q: dict) -> probe_reads.Answers:
    """A one-batch probe's whole output (encode_questions) as Answers;
    BadProbe for anything else."""
    if len(data) > MAX_ANSWERS + 128:  # the two lines before the answers: 64 bytes each at most
        raise BadProbe("the answers are too large")
    questions = as_list(q)
    first = data.find(b"\n") + 1
    second = data.find(b"\n", first, first + 64) + 1
    if not first or not second:
        raise BadProbe("the probe did not answer")
    answers = probe_reads.Answers(parse_header(data[:first]), {}, {}, {})
    size = parse_frame(data[first:second], len(questions), MAX_ANSWERS)
    if len(data) - second != size:
        raise BadProbe("an answer is cut short" if len(data) - second < size
                       else "the probe said more than it was asked")
    add_batch(answers, questions, data[second:])
    return answers


class Session:
    """One live probe, asked in batches over a channel kept open: each
    batch one round trip, every question checked before it is sent, every
    answer as it comes, and the bounds (MAX_QUESTIONS, MAX_QUESTION_BYTES,
    MAX_ANSWERS) on the session as a whole.  `channel` sends bytes and
    reads lines and exact lengths under the command's deadline
    (control/remote/ssh.py); what goes wrong there raises."""

    def __init__(self, channel):
        self.channel = channel
        self.answers = probe_reads.Answers(None, {}, {}, {})
        self.asked = self.weight = self.received = self.batches = 0

    def ask(self, questions: list) -> None:
        """Asks `questions` (and, the first time, the page size); their
        answers are added to self.answers.  NotProbed for a question a
        probe must not be asked, BadProbe for a probe that fails."""
        for question in questions:
            weight = question_weight(question)
            if weight is None:
                raise probe_reads.NotProbed(f"a read no probe may ask ({question[0]} {question[1]!r:.80})")
            self.weight += weight
        self.asked += len(questions)
        if self.asked > MAX_QUESTIONS or self.weight > MAX_QUESTION_BYTES:
            raise BadProbe("more questions than a verify asks")
        first = self.batches == 0
        self.batches += 1
        self.channel.send((HEADER if first else b"") + encode_batch(questions))
        if first:
            self.answers.page_size = parse_header(self.channel.readline(80))
        size = parse_frame(self.channel.readline(80), len(questions), MAX_ANSWERS - self.received)
        self.received += size
        add_batch(self.answers, questions, self.channel.read(size))


def _file_answer(ident: str, good: bool, value: int, body: bytes) -> dict:
    if not good:
        return {"$raise": "os", "errno": value, "strerror": os.strerror(value) if value else ""}
    op = ident.partition(" ")[0]
    if op == "open":
        try:
            return {"text": body.decode("utf-8")}
        except UnicodeDecodeError:
            return {"$bytes": base64.b64encode(body).decode()}
    if op in ("stat", "lstat"):
        fields = body.split(b" ")
        if len(fields) != 10 or not all(f.lstrip(b"-").isdigit() and len(f) <= 20 for f in fields):
            raise BadProbe("a stat answer is malformed")
        values = [int(f) for f in fields]
        if not all(-2**63 <= v < 2**64 for v in values):
            raise BadProbe("a stat answer is out of range")
        return {"stat": values}
    if op == "listdir":
        return {"value": [os.fsdecode(n) for n in body.split(b"\0")] if body else []}
    if op == "readlink":
        return {"value": os.fsdecode(body)}
    return {"value": bool(value)}  # access


def _datagrams(body: bytes) -> list:
    out, pos = [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise BadProbe("a netlink answer is malformed")
        size = int.from_bytes(body[pos:pos + 4], "little")
        if size > len(body) - pos - 4:
            raise BadProbe("a netlink answer is cut short")
        out.append(body[pos + 4:pos + 4 + size])
        pos += 4 + size
    return out


def verify(answers: probe_reads.Answers, request: dict, label: str) -> dict:
    """The verify the agent would have made, made here on the answers.
    Raises probe_reads.NotProbed when it needs a read they do not hold."""
    from nictune.host import agent

    return agent.run(request, host=probe_reads.ProbedHost(answers, label), label=label)


def verify_live(session: Session, request: dict, label: str) -> tuple:
    """The same on a live probe: a read the answers lack is asked of it
    (one round trip).  (The report, the questions the verify used.)
    Raises probe_reads.NotProbed when the verify needs a read no probe can
    answer, probe_reads.ProbeLost when the probe fails."""
    from nictune.host import agent

    def ask(questions: list) -> None:
        try:
            session.ask(questions)
        except probe_reads.NotProbed:
            raise
        except Exception as e:  # noqa: BLE001 - the channel's, the parser's: all mean the probe failed
            raise probe_reads.ProbeLost(f"{label}: the probe: {e}") from None

    host = probe_reads.ProbedHost(session.answers, label, ask)
    report = agent.run(request, host=host, label=label)
    return report, host.replayer.used_questions()
