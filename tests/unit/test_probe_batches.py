"""The probe's batches (control/remote/probe.py Session, PROBE) and the
controller's replay that asks them on demand (host/replay/probe_reads.py
ProbeReplayer): each batch answered at its empty line over one open pipe,
every question checked before it is sent, the bounds held over the whole
session, and a read no probe can answer refused without asking."""

from __future__ import annotations

import array
import base64
import errno
import os
import subprocess
import sys

import pytest

from nictune.control.remote import probe
from nictune.host.replay import probe_reads


class PipeChannel:
    """The real PROBE in a local python3 -I -S, as ssh.py's _ProbeChannel
    drives it over SSH: bytes in, lines and exact lengths out."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", probe.PROBE],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.sent: list = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def readline(self, limit: int) -> bytes:
        return self.proc.stdout.readline(limit)

    def read(self, size: int) -> bytes:
        return self.proc.stdout.read(size)

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(10)


@pytest.fixture
def channel():
    chan = PipeChannel()
    try:
        yield chan
    finally:
        chan.proc.kill()
        chan.proc.wait()


def test_a_probe_answers_each_batch_at_its_empty_line_and_ends_at_eof(channel, tmp_path):
    (tmp_path / "a").write_text("1\n")
    (tmp_path / "b").write_text("2\n")
    session = probe.Session(channel)
    session.ask([("file", f"open {tmp_path}/a", False), ("file", f"listdir {tmp_path}", False)])
    assert session.answers.page_size == os.sysconf("SC_PAGE_SIZE")
    assert session.answers.files[f"open {tmp_path}/a"] == {"text": "1\n"}
    assert sorted(session.answers.files[f"listdir {tmp_path}"]["value"]) == ["a", "b"]
    # The probe waits, its process alive, for the next batch: asked later
    # over the same pipe, answered as fresh reads.
    (tmp_path / "b").write_text("3\n")
    session.ask([("file", f"open {tmp_path}/b", True), ("file", f"stat {tmp_path}/none", False)])
    assert session.answers.files[f"open {tmp_path}/b"] == {"text": "3\n"}
    assert f"open {tmp_path}/b" in session.answers.nofollow
    assert session.answers.files[f"stat {tmp_path}/none"]["errno"] == errno.ENOENT
    session.ask([])  # a batch of nothing is a frame of nothing
    assert session.batches == 3
    assert channel.sent[0].startswith(probe.HEADER) and not channel.sent[1].startswith(probe.HEADER)
    assert channel.sent[1] == b"f open-nofollow %s/b\nf stat %s/none\n\n" % (
        str(tmp_path).encode(), str(tmp_path).encode())
    assert channel.close() == 0


@pytest.mark.parametrize("question", [
    ("file", "open /dev/zero", False),                  # opening a device acts on it
    ("file", "open /etc/passwd\nf open /etc/shadow", False),  # a second question smuggled in
    ("file", "open relative", False),
    ("file", "write /etc/passwd", False),
    ("ioctl", "eth0 1", bytes(8)),
    ("netlink", 99, bytes(20)),
    ("netlink", 0, bytes(8)),                           # no netlink header
    ("netlink", 0, bytes(probe.MAX_REQUEST + 1)),
])
def test_a_question_asked_on_demand_is_checked_before_anything_is_sent(question):
    class Refusing:
        def send(self, data):
            raise AssertionError(f"sent {data!r}")

    with pytest.raises(probe_reads.NotProbed, match="no probe may ask"):
        probe.Session(Refusing()).ask([("file", "open /proc/sys/net/ipv4/tcp_ecn", False), question])


class Scripted:
    """A channel whose probe says `frames` (one per batch), after its header."""

    def __init__(self, *frames: bytes):
        self.out = b"nictune-probe 2 4096\n" + b"".join(frames)
        self.sent: list = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def readline(self, limit: int) -> bytes:
        end = self.out.find(b"\n", 0, limit) + 1
        line, self.out = (self.out[:end], self.out[end:]) if end else (self.out[:limit], b"")
        return line

    def read(self, size: int) -> bytes:
        if size > 1 << 20:
            raise AssertionError(f"read {size} bytes a frame claimed")
        data, self.out = self.out[:size], self.out[size:]
        return data


def test_the_answers_bound_holds_over_the_whole_session_before_a_frame_is_read():
    body = b"x" * 1000
    answer = b"o 0 %d\n" % len(body) + body
    session = probe.Session(Scripted(b"a 1 %d\n" % len(answer) + answer,
                                     b"a 1 %d\n" % probe.MAX_ANSWERS))
    session.ask([("file", "open /proc/a", False)])
    with pytest.raises(probe.BadProbe, match="too large"):
        session.ask([("file", "open /proc/b", False)])


def test_the_questions_bound_holds_over_the_whole_session():
    session = probe.Session(Scripted())
    session.asked = probe.MAX_QUESTIONS
    with pytest.raises(probe.BadProbe, match="more questions"):
        session.ask([("file", "open /proc/a", False)])
    assert session.channel.sent == []


@pytest.mark.parametrize("frames, why", [
    ((b"a 2 0\n",), "another number"),
    ((b"a 1 3\no 0 5\n",), "malformed|cut short"),
    ((b"a 1 9\no 0 0\nxyz",), "said more"),
    ((b"",), "malformed"),                  # the probe ended
    ((b"a 1\n",), "malformed"),
])
def test_a_batch_that_is_not_its_questions_answers_is_refused(frames, why):
    with pytest.raises(probe.BadProbe, match=why):
        probe.Session(Scripted(*frames)).ask([("file", "open /proc/a", False)])


# -- the replay: what it asks, and what it does not ----------------------------------

def replayer(answers=None, asked=None):
    answers = answers or probe_reads.Answers(4096, {}, {}, {})
    asked = [] if asked is None else asked

    def ask(questions):
        asked.append(questions)
        for kind, arg, extra in questions:
            if kind == "file":
                answers.files[arg] = {"text": "7\n"} if arg.startswith("open ") else {
                    "value": ["rail0"]}
                (answers.nofollow.add if extra else answers.nofollow.discard)(arg)
            elif kind == "netlink":
                answers.netlink[(arg, extra)] = []
            else:
                answers.ioctls[(arg, extra)] = (0, extra)
    return probe_reads.ProbeReplayer(answers, "test: the probe", ask), asked


def test_a_read_the_answers_lack_is_asked_and_noted_as_used():
    rep, asked = replayer()
    with rep.open("/proc/sys/net/ipv4/tcp_ecn", "r") as f:
        assert f.read() == "7\n"
    with rep.open("/proc/sys/net/ipv4/tcp_ecn", "r") as f:  # asked once
        assert f.read() == "7\n"
    sock = rep.netlink(0)
    sock.send(bytes(20))
    buf = array.array("B", bytes(8))
    rep.ioctl(rep.inet_socket(), "rail0", buf)
    assert asked == [[("file", "open /proc/sys/net/ipv4/tcp_ecn", False)],
                     [("netlink", 0, bytes(20))], [("ioctl", "rail0", bytes(8))]]
    used = probe.checked_questions(rep.used_questions())
    assert used["files"] == ["open /proc/sys/net/ipv4/tcp_ecn"]
    assert used["kernel"] == [["netlink", 0, base64.b64encode(bytes(20)).decode()],
                              ["ioctl", "rail0", base64.b64encode(bytes(8)).decode()]]


def test_a_path_a_listing_lacks_is_absent_without_asking():
    rep, asked = replayer()
    assert rep.simple("listdir", "/sys/class/net", (), {}) == ["rail0"]
    with pytest.raises(FileNotFoundError):
        rep.open("/sys/class/net/rail9/mtu", "r")
    assert len(asked) == 1


def test_an_owned_file_answered_through_a_link_is_asked_again_without_following():
    answers = probe_reads.Answers(4096, {"open /etc/nccl.conf": {"text": "X=1\n"}}, {}, {})
    rep, asked = replayer(answers)
    os.close(rep.os_open("/etc/nccl.conf", os.O_RDONLY | os.O_NOFOLLOW))
    assert asked == [[("file", "open /etc/nccl.conf", True)]]
    assert rep.used_questions()["nofollow"] == ["open /etc/nccl.conf"]


@pytest.mark.parametrize("read", [
    lambda rep: rep.run(["mstconfig", "q"], 5),            # a run of a tool
    lambda rep: rep.unix_connect("/run/openvswitch/db.sock", 1),
    lambda rep: rep.key_load("/etc/nictune/macsec.key"),
    lambda rep: rep.scandir("/sys/class/net"),
])
def test_a_read_no_probe_can_answer_is_refused_without_asking(read):
    rep, asked = replayer()
    with pytest.raises(probe_reads.NotProbed) as got:
        read(rep)
    assert not isinstance(got.value, probe_reads.ProbeLost) and asked == []
