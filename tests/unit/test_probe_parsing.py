"""control/remote/probe.py takes nothing on trust: the questions a host's agent
sends back are checked before they are kept or asked, the probe's answers
before any is used, and the probe itself imports only C modules."""

from __future__ import annotations

import array
import base64
import errno
import shutil
import struct
import subprocess
import tracemalloc

import pytest

from nictune.control.remote import probe
from nictune.host.facts import health
from nictune.host.replay import probe_reads
from nictune.host.transports.netlink import ethtool, ioctl
from nictune.host.transports.netlink.errors import NetlinkError

QUESTIONS = {"format": probe_reads.FORMAT, "files": ["open /proc/sys/net/ipv4/tcp_ecn", "stat /sys/class/net",
                                                  "listdir /sys/class/net", "access /proc/sys/net/ipv4/tcp_ecn 2"],
             "kernel": [["netlink", 0, base64.b64encode(bytes(20)).decode()],
                        ["ioctl", "eth0", base64.b64encode(bytes(8)).decode()]],
             "why_not": []}


def answer(body: bytes, value: int = 0) -> bytes:
    return b"o %d %d\n" % (value, len(body)) + body


STAT = b"16877 1 2 3 0 0 0 1700000000 1700000000 1"
ANSWERS = (answer(b"1\n") + answer(STAT) + answer(b"lo\0eth0") + answer(b"", 1)
           + answer((20).to_bytes(4, "little") + bytes(20)) + answer(bytes(8)))
GOOD = b"nictune-probe 2 4096\n" + b"a 6 %d\n" % len(ANSWERS) + ANSWERS


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
    GOOD.replace(b"nictune-probe 2", b"nictune-probe 1"),  # the probe of another protocol
    GOOD.replace(b"\na 6 ", b"\na 5 "),           # another number of answers than asked
    GOOD.replace(b"\na 6 ", b"\nb 6 "),           # not a batch's frame
    GOOD[:-1],                                   # the last answer cut short
    GOOD + b"o 0 0\n",                           # more answers than questions
    GOOD.replace(b"o 1 0\n", b"x 1 0\n"),        # not o/e
    GOOD.replace(b"o 0 2\n1\n", b"o 0 -2\n1\n"),  # a negative size
    GOOD.replace(b"nictune-probe 2 4096", b"nictune-probe 2 x"),
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

    extra = imported(probe.PROBE, probe.HEADER + b"\n") - imported("pass")
    # array only once an ioctl is asked; never socket.py, os.py, json, re, enum...
    assert extra == {"_socket", "_struct", "fcntl"}, extra


# -- what a host's answers may make the controller allocate ---------------------------

class _SsetInfoSocket:
    """A socket as the host's port makes it (host/transports/io.py), whose SIOCETHTOOL
    answers GSSET_INFO with `count`; every call noted."""

    def __init__(self, count: int, calls: list):
        self.siocethtool = _sset_info_answering(count, calls)


def _sset_info_answering(count: int, calls: list):
    def kernel(ifname, buf):
        calls.append(len(buf))
        raw = bytearray(buf.tobytes())
        if struct.unpack_from("=I", raw)[0] == ioctl.ETHTOOL_GSSET_INFO:
            struct.pack_into("=IIQI", raw, 0, ioctl.ETHTOOL_GSSET_INFO, 0,
                             struct.unpack_from("=Q", raw, 8)[0], count)
            buf[:] = array.array("B", raw)
        return 0
    return kernel


@pytest.mark.parametrize("count", [(1 << 16) + 1, 1 << 22])
def test_a_string_set_claimed_too_big_is_refused_before_a_buffer_is_sized_from_it(count):
    calls: list = []
    sock = _SsetInfoSocket(count, calls)
    tracemalloc.start()
    try:
        with pytest.raises(OSError) as caught:
            health.ethtool_stats("eth0", sock=sock)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.errno == errno.EPROTO and f"claims {count} strings" in str(caught.value)
    assert calls == [20] and peak < 1 << 20  # GSSET_INFO alone; the unbounded code sized 268 MB


def test_a_string_set_within_the_bound_is_still_read():
    calls: list = []
    assert ioctl.string_set(_SsetInfoSocket(3, calls), "eth0", health.ETH_SS_STATS) == ["", "", ""]
    assert calls == [20, 12 + 3 * 32]


def test_feature_bitsets_are_read_no_further_than_the_feature_names():
    class Bitset:
        def get_attr(self, name):
            return b"\xff" * (1 << 16)  # as long as an attribute goes: 524,288 bits set
    assert len(ethtool._bits(Bitset())) == 1024  # the unbounded code: a set of 524,288
    assert ethtool._bits(Bitset(), limit=40) == set(range(64))  # whole words, never the rest


# -- what a learning report may make every later audit cost ---------------------------

def _questions(**change) -> dict:
    q = {k: (list(v) if isinstance(v, list) else v) for k, v in QUESTIONS.items()}
    q.update(change)
    return q


def test_questions_past_the_bounds_are_not_kept():
    big = base64.b64encode(bytes(probe.MAX_REQUEST)).decode()
    fits = probe.MAX_QUESTION_BYTES // probe.MAX_REQUEST - 1  # and the file questions
    assert probe.checked_questions(_questions(kernel=[["ioctl", "eth0", big]] * fits)) is not None
    assert probe.checked_questions(_questions(kernel=[["ioctl", "eth0", big]] * (fits + 2))) is None
    assert probe.MAX_QUESTIONS <= 2000
    files = ["open /proc/sys/net/ipv4/tcp_ecn"] * (probe.MAX_QUESTIONS - 2)
    assert probe.checked_questions(_questions(files=files)) is not None
    assert probe.checked_questions(_questions(files=files + ["stat /sys"])) is None


@pytest.mark.parametrize("change", [
    {"files": ["open /dev/watchdog"]},
    {"files": ["open /dev"]},
    {"files": ["open /sys/../dev/watchdog"]},
    {"files": ["open /sys/./class"]},
    {"files": ["open //dev/watchdog"]},
    {"files": ["open /sys/class/net/"]},
    {"kernel": [["netlink", True, base64.b64encode(bytes(20)).decode()]]},
    {"nofollow": [["open /proc/sys/net/ipv4/tcp_ecn"]]},   # unhashable: once a TypeError
    {"nofollow": {"open /x": 1}},
])
def test_questions_that_would_open_a_device_or_are_not_of_the_form_are_refused(change):
    assert probe.checked_questions(_questions(**change)) is None


def test_reads_under_dev_that_open_nothing_are_still_asked():
    q = _questions(files=["lstat /dev", "stat /dev/shm", "readlink /dev/stdin"])
    assert probe.checked_questions(q) is not None


def test_answers_past_the_bound_are_refused_before_they_are_parsed():
    q = probe.checked_questions(QUESTIONS)
    with pytest.raises(probe.BadProbe, match="too large"):
        probe.parse_answers(GOOD + bytes(probe.MAX_ANSWERS), q)
    assert probe.MAX_ANSWERS <= 16 << 20


@pytest.mark.parametrize("count", [1025, 1 << 20])
def test_a_feature_count_claimed_too_big_is_refused_before_a_list_is_made_of_it(count):
    sent = ethtool.strset_msg()
    stringset = {"attrs": [("ETHTOOL_A_STRINGSET_ID", ethtool.ETH_SS_FEATURES), ("ETHTOOL_A_STRINGSET_COUNT", count)]}
    sent["attrs"] = [("ETHTOOL_A_STRSET_STRINGSETS", {"attrs": [("ETHTOOL_A_STRINGSETS_STRINGSET", stringset)]})]
    sent.encode()
    reply = ethtool.strset_msg(sent.data)
    reply.decode()

    class Answering:
        def request(self, *args):
            return [reply]

    nl = object.__new__(ethtool.Ethtool)
    nl._nl, nl._family, nl._feature_names = Answering(), 20, None
    tracemalloc.start()
    try:
        with pytest.raises(NetlinkError, match=f"claims {count} feature bits"):
            nl.feature_names()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
