"""control/probe.py takes nothing on trust: the questions a host's agent
sends back are checked before they are kept or asked, the probe's answers
before any is used, and the probe itself imports only C modules."""

from __future__ import annotations

import base64
import shutil
import subprocess

import pytest

from nictune.control import probe
from nictune.host import rawreads

QUESTIONS = {"format": rawreads.FORMAT, "files": ["open /proc/sys/net/ipv4/tcp_ecn", "stat /sys/class/net",
                                                  "listdir /sys/class/net", "access /proc/sys/net/ipv4/tcp_ecn 2"],
             "kernel": [["netlink", 0, base64.b64encode(bytes(20)).decode()],
                        ["ioctl", "eth0", base64.b64encode(bytes(8)).decode()]],
             "why_not": []}


def answer(body: bytes, value: int = 0) -> bytes:
    return b"o %d %d\n" % (value, len(body)) + body


STAT = b"16877 1 2 3 0 0 0 1700000000 1700000000 1"
GOOD = (b"nictune-probe 1 4096\n" + answer(b"1\n") + answer(STAT) + answer(b"lo\0eth0")
        + answer(b"", 1) + answer((20).to_bytes(4, "little") + bytes(20)) + answer(bytes(8)))


def test_good_answers_decode_into_the_replayers_entries():
    q = probe.checked_questions(QUESTIONS)
    answers = probe.parse_answers(GOOD, q)
    assert answers.page_size == 4096
    assert answers.files["open /proc/sys/net/ipv4/tcp_ecn"] == {"text": "1\n"}
    assert answers.files["listdir /sys/class/net"] == {"value": ["lo", "eth0"]}
    assert answers.files["access /proc/sys/net/ipv4/tcp_ecn 2"] == {"value": True}
    assert answers.files["stat /sys/class/net"]["stat"][0] == 16877
    assert answers.netlink[(0, bytes(20))] == [bytes(20)]
    assert answers.ioctls[("eth0", bytes(8))] == (0, bytes(8))


@pytest.mark.parametrize("data", [
    b"",
    b"nictune-probe 2 4096\n",
    GOOD[:-1],                                   # the last answer cut short
    GOOD + b"o 0 0\n",                           # more answers than questions
    GOOD.replace(b"o 1 0\n", b"x 1 0\n"),        # not o/e
    GOOD.replace(b"o 0 2\n1\n", b"o 0 -2\n1\n"),  # a negative size
    GOOD.replace(b"nictune-probe 1 4096", b"nictune-probe 1 x"),
    GOOD.replace(b"16877 1 2 3", b"16877 1 2 x"),  # a stat that is not numbers
    GOOD.replace(b"o 0 24\n" + (20).to_bytes(4, "little"), b"o 0 24\n" + (99).to_bytes(4, "little")),
    GOOD[:-8] + bytes(7),                        # an ioctl buffer of another size
])
def test_malformed_answers_are_refused(data):
    with pytest.raises(probe.BadProbe):
        probe.parse_answers(data, probe.checked_questions(QUESTIONS))


@pytest.mark.parametrize("change", [
    lambda q: q["files"].append("mkdir /sys/kernel/config/rdma_cm/x"),   # a write
    lambda q: q["files"].append("open relative/path"),
    lambda q: q["files"].append("open /etc/passwd\nf open /etc/shadow"),   # a second question
    lambda q: q["files"].append("open /etc/passwd\n"),
    lambda q: q["files"].append("access /proc/sys/x 9"),
    lambda q: q["kernel"].append(["netlink", 99, base64.b64encode(bytes(20)).decode()]),
    lambda q: q["kernel"].append(["netlink", 0, base64.b64encode(bytes(8)).decode()]),  # no header
    lambda q: q["kernel"].append(["ioctl", "../../x", base64.b64encode(bytes(8)).decode()]),
    lambda q: q["kernel"].append(["ioctl", "eth0 1", "AAAA"]),
    lambda q: q["kernel"].append(["ioctl", "eth0\n", "AAAA"]),
    lambda q: q["kernel"].append(["exec", "sh", "AAAA"]),
    lambda q: q["kernel"].append(["netlink", 0, "not base64!"]),
    lambda q: q["files"].extend(["open /x"] * probe.MAX_QUESTIONS),
    lambda q: q.update(why_not=["a key file"]),
    lambda q: q.update(format=2),
])
def test_questions_that_are_not_reads_are_never_kept_or_asked(change):
    q = {k: (list(v) if isinstance(v, list) else v) for k, v in QUESTIONS.items()}
    change(q)
    assert probe.checked_questions(q) is None


def test_the_probe_imports_nothing_but_c_modules():
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3")

    def imported(code: str, stdin: bytes = b"") -> set:
        err = subprocess.run([python, "-I", "-S", "-X", "importtime", "-c", code], input=stdin,
                             capture_output=True, check=True).stderr.decode()
        return {line.split("|")[-1].strip() for line in err.splitlines() if "|" in line}

    extra = imported(probe.PROBE, b"nictune-probe 1\n") - imported("pass")
    # array only once an ioctl is asked; never socket.py, os.py, json, re, enum...
    assert extra == {"_socket", "_struct", "fcntl"}, extra
