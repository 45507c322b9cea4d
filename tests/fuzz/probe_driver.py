"""Hostile probe answers, learning reports and question-cache files against
the controller (test helper; tests/unit/test_fuzz_probe.py runs it in a
subprocess under RLIMIT_AS and reads the one JSON line it prints).

The seed material is real: a lab host's learned verify and the probe's
answers to it (tests/fixtures/probe/lab-fleet.json).  Every case is made by
one random.Random from the seed, so a seed and a case number name a case.

- answers: the probe's output, mutated structurally (a record's size or
  value made huge or negative, cut short, bytes flipped), in the kernel's
  answers (an ethtool string-set count, a GSTRINGS or GSTATS count, a
  netlink message or attribute length, a u32 attribute such as a string
  set's count made huge, datagrams cut, attributes nested a thousand deep)
  and in the files' (stat fields not numbers or huge, a directory listing
  of 20,000 names, text that is not UTF-8).  What the controller does with
  them (probe.parse_answers, then probe.verify) must end in a report, in a
  report whose error sends the host to its agent (control/remote/ssh.py: answers
  no kernel gives can make a family fail), or in BadProbe / NotProbed (the
  host goes to its agent): anything else is a traceback.
- live: the same answers served by a live probe (probe.Session over a
  channel of the fuzzer's) asked on demand, one read at a time, from an
  empty first batch: probe.verify_live must end in a report, a report
  whose error sends the host to its agent, or ProbeLost / NotProbed; a
  hostile answer must never be taken for a family's "unsupported".
- questions: a learning report's "questions", mutated (hostile values for
  any field, too many or too big questions, paths out of /dev or with ..,
  unhashable entries, deep nesting): probe.checked_questions must return
  None or questions within the bounds, which encode to one line each.
- cache: files in a question cache (random bytes, JSON cut, nested 100,000
  deep, over the size cap, hostile questions; a FIFO, a symbolic link to
  /dev/zero or elsewhere, a directory, mode 0644, another owner):
  QuestionCache.lookup must answer within a second, and never with what a
  file not fit to be read holds.

Each case's allocations are measured with tracemalloc (the peak of the case
alone); the largest is printed.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import signal
import struct
import sys
import tempfile
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(os.path.dirname(HERE), "fixtures", "probe", "lab-fleet.json")
HUGE = [2**32 - 1, 2**31, 2**31 - 1, 1 << 24, (1 << 16) + 1, 1025, 0]
GSSET_INFO, GSTRINGS, GSTATS = 0x37, 0x1B, 0x1D

from nictune.control.remote import probe, probecache  # noqa: E402
from nictune.host.replay import probe_reads  # noqa: E402

sys.path.insert(0, HERE)
from mutate import HOSTILE_VALUES  # noqa: E402


CURRENT = [""]  # the mutation of the case running, for its failure's message


class Hung(Exception):
    pass


# -- the probe's answers ----------------------------------------------------------------

def split(data: bytes, count: int) -> tuple:
    """(first line, [[tag, value, body]]) of well-formed answers (the
    fixture's, of the probe's first protocol: no batch frame)."""
    pos = data.index(b"\n") + 1
    head, records = data[:pos].replace(b"nictune-probe 1 ", b"nictune-probe 2 "), []
    for _ in range(count):
        end = data.index(b"\n", pos)
        tag, value, size = data[pos:end].split(b" ")
        body = data[end + 1:end + 1 + int(size)]
        records.append([tag, int(value), body])
        pos = end + 1 + int(size)
    return head, records


def encoded(records: list, sizes: dict | None = None, first: int = 0) -> list:
    return [b"%s %d %d\n" % (tag, value, (sizes or {}).get(first + i, len(body))) + body
            for i, (tag, value, body) in enumerate(records)]


def join(head: bytes, records: list, sizes: dict | None = None) -> bytes:
    """The probe's output for one batch of them all."""
    payload = b"".join(encoded(records, sizes))
    return head + b"a %d %d\n" % (len(records), len(payload)) + payload


class LiveChannel:
    """A probe's channel (probe.Session) that answers each question with its
    record: the verify asks everything on demand, one batch per read."""

    def __init__(self, a: "Answers", records: list, sizes: dict):
        self.head, self.out = a.head, b""
        lines = probe.encode_batch(probe.as_list(a.q)).split(b"\n")
        self.by_line = dict(zip(lines, encoded(records, sizes)))

    def send(self, data: bytes) -> None:
        if data.startswith(probe.HEADER):
            data, self.out = data[len(probe.HEADER):], self.head
        answers = []
        for line in data.split(b"\n")[:-2]:
            if line not in self.by_line:
                raise probe_reads.NotProbed("a question the fixture has no answer to")
            answers.append(self.by_line[line])
        payload = b"".join(answers)
        self.out += b"a %d %d\n" % (len(answers), len(payload)) + payload

    def readline(self, limit: int) -> bytes:
        end = self.out.find(b"\n", 0, limit) + 1
        line, self.out = (self.out[:end], self.out[end:]) if end else (b"", b"")
        return line

    def read(self, size: int) -> bytes:
        data, self.out = self.out[:size], self.out[size:]
        return data


def datagrams(body: bytes) -> list:
    out, pos = [], 0
    while pos + 4 <= len(body):
        size = int.from_bytes(body[pos:pos + 4], "little")
        out.append(bytearray(body[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return out


def framed(grams: list) -> bytes:
    return b"".join(len(g).to_bytes(4, "little") + bytes(g) for g in grams)


def nested(depth: int) -> bytes:
    """Attributes nested `depth` deep, each claiming the rest as its own."""
    out = b"\0" * 4
    for _ in range(depth):
        out = struct.pack("=HH", 4 + len(out), 0x8001) + out
    return out


class Answers:
    def __init__(self, fixture: dict):
        self.q = fixture["questions"]
        self.request = fixture["request"]
        self.data = base64.b64decode(fixture["answers"])
        self.n_files = len(self.q["files"])
        self.head, self.records = split(self.data, self.n_files + len(self.q["kernel"]))
        self.data = join(self.head, self.records)  # as the probe answers one batch of them all
        self.kernel = [(i + self.n_files, k) for i, k in enumerate(self.q["kernel"])]

    def of_kind(self, kind: str) -> list:
        return [i for i, k in self.kernel if k[0] == kind]

    def ioctl_cmd(self, i: int) -> int:
        asked = base64.b64decode(self.q["kernel"][i - self.n_files][2])
        return struct.unpack_from("=I", asked)[0]

    def mutate(self, rnd: random.Random) -> tuple:
        records = copy.deepcopy(self.records)
        name = rnd.choice(MUTATIONS)
        CURRENT[0] = name.__name__
        sizes: dict = {}
        raw = name(self, rnd, records, sizes)
        return name.__name__, raw if raw is not None else join(self.head, records, sizes)

    def mutate_records(self, rnd: random.Random) -> tuple:
        """A mutation that keeps one record per question: (name, records, sizes)."""
        records = copy.deepcopy(self.records)
        name = rnd.choice([m for m in MUTATIONS if m not in (flip, truncate)])
        CURRENT[0] = name.__name__
        sizes: dict = {}
        name(self, rnd, records, sizes)
        return name.__name__, records, sizes


def flip(a, rnd, records, sizes):
    data = bytearray(join(a.head, records))
    for _ in range(rnd.randint(1, 8)):
        data[rnd.randrange(len(data))] = rnd.randrange(256)
    return bytes(data)


def truncate(a, rnd, records, sizes):
    data = join(a.head, records)
    return data[:rnd.randrange(len(data))]


def record_size(a, rnd, records, sizes):
    sizes[rnd.randrange(len(records))] = rnd.choice([2**40, 10**30, -1, -(2**63), 2**31])


def record_value(a, rnd, records, sizes):
    records[rnd.randrange(len(records))][1] = rnd.choice([2**64, -(2**63), 10**40, -1])


def record_tag(a, rnd, records, sizes):
    records[rnd.randrange(len(records))][0] = rnd.choice([b"e", b"o", b"x", b"", b"o o"])


def ioctl_count(a, rnd, records, sizes):
    # The counts a host answers, that buffers are sized from: GSSET_INFO's
    # set size, GSTRINGS' and GSTATS' numbers written.
    i = rnd.choice(a.of_kind("ioctl"))
    body = bytearray(records[i][2])
    offset = {GSSET_INFO: 16, GSTRINGS: 8, GSTATS: 4}.get(a.ioctl_cmd(i), 4)
    if offset + 4 <= len(body):
        struct.pack_into("=I", body, offset, rnd.choice(HUGE))
    records[i][2] = bytes(body)


def gsset_count(a, rnd, records, sizes):
    for i in a.of_kind("ioctl"):
        if a.ioctl_cmd(i) == GSSET_INFO:
            body = bytearray(records[i][2])
            struct.pack_into("=I", body, 16, rnd.choice(HUGE[:4]))
            records[i][2] = bytes(body)


def _netlink_record(a, rnd, records):
    i = rnd.choice(a.of_kind("netlink"))
    grams = datagrams(records[i][2])
    return i, grams


def netlink_u32(a, rnd, records, sizes):
    # A u32 attribute (length 8) made huge: a string set's count, an
    # ifindex, an MTU, a VF count...
    i, grams = _netlink_record(a, rnd, records)
    spots = [(g, off) for g in grams for off in range(16, len(g) - 7, 4)
             if struct.unpack_from("=H", g, off)[0] == 8]
    for g, off in rnd.sample(spots, min(len(spots), rnd.randint(1, 4))):
        struct.pack_into("=I", g, off + 4, rnd.choice(HUGE))
    records[i][2] = framed(grams)


def netlink_length(a, rnd, records, sizes):
    i, grams = _netlink_record(a, rnd, records)
    if grams:
        g = rnd.choice(grams)
        off = rnd.randrange(0, max(1, len(g) - 3), 4)
        struct.pack_into("=H" if off % 8 else "=I", g, off, rnd.choice([0, 1, 3, 0xFFFF, len(g) + 4])
                         & (0xFFFF if off % 8 else 0xFFFFFFFF))
    records[i][2] = framed(grams)


def netlink_cut(a, rnd, records, sizes):
    i, grams = _netlink_record(a, rnd, records)
    if grams:
        k = rnd.randrange(len(grams))
        grams[k] = grams[k][:rnd.randrange(len(grams[k]) + 1)]
    records[i][2] = framed(grams)


def netlink_frame(a, rnd, records, sizes):
    i, grams = _netlink_record(a, rnd, records)
    body = bytearray(framed(grams))
    if body:
        struct.pack_into("=I", body, 0, rnd.choice([2**32 - 1, len(body), len(body) - 3]))
    records[i][2] = bytes(body)


def netlink_nest(a, rnd, records, sizes):
    i, grams = _netlink_record(a, rnd, records)
    if grams:
        k = rnd.randrange(len(grams))
        g = bytearray(grams[k][:20]) + nested(rnd.choice([100, 1000, 10000]))
        struct.pack_into("=I", g, 0, len(g))
        grams[k] = g
    records[i][2] = framed(grams)


def netlink_many(a, rnd, records, sizes):
    # A dump answered with thousands of copies of one message.
    i, grams = _netlink_record(a, rnd, records)
    if grams:
        records[i][2] = framed([grams[0]] * rnd.choice([20, 100]) + grams[-1:])


def file_answer(a, rnd, records, sizes):
    i = rnd.randrange(a.n_files)
    op = a.q["files"][i].partition(" ")[0]
    records[i][0] = b"o"
    records[i][2] = rnd.choice({
        "stat": [b"x " * 9 + b"x", b"9" * 5000 + b" 1" * 9, b" ".join([b"%d" % 10**50] * 10), b"1 2 3"],
        "lstat": [b"-1 " * 9 + b"-1", b"1\n2", b""],
        "listdir": [b"\0".join(b"n%d" % n for n in range(20_000)), b"\0\0\0", b"../../x\0/"],
        "open": [b"\xff\xfe" * 1000, b"9" * 100_000, b"\0" * 4096],
    }.get(op, [b"\xff", b"x" * 70_000, b""]))


MUTATIONS = [flip, truncate, record_size, record_value, record_tag, ioctl_count, gsset_count,
             netlink_u32, netlink_length, netlink_cut, netlink_frame, netlink_nest, netlink_many,
             file_answer]


def answer_case(a: Answers, rnd: random.Random) -> tuple:
    name, data = a.mutate(rnd)
    try:
        report = probe.verify(probe.parse_answers(data, a.q), a.request, "fuzz")
    except probe.BadProbe:
        return name, "refused"
    except probe_reads.NotProbed:
        return name, "not probed"
    return name, _outcome(report)


def live_case(a: Answers, rnd: random.Random) -> tuple:
    """The same answers asked on demand of a live probe (probe.Session):
    a hostile one ends the verify (ProbeLost: the host goes to its agent),
    it is never taken for the family's "unsupported"."""
    name, records, sizes = a.mutate_records(rnd)
    session = probe.Session(LiveChannel(a, records, sizes))
    failed, ask = [], session.ask

    def noted(questions):
        try:
            return ask(questions)
        except BaseException as e:
            failed.append(e)
            raise
    session.ask = noted
    try:
        report, _ = probe.verify_live(session, a.request, "fuzz")
    except probe_reads.ProbeLost:
        return "live " + name, "refused"
    except probe_reads.NotProbed:
        return "live " + name, "not probed"
    if failed:
        raise AssertionError(f"the verify went on past an answer that failed: {failed[0]!r}")
    return "live " + name, _outcome(report)


def _outcome(report) -> str:
    if not isinstance(report, dict):
        raise TypeError(f"verify answered {type(report).__name__}")
    error = report.get("error") or {}
    if "MemoryError" in str(error.get("message")):  # what agent.run made of an unbounded allocation
        raise MemoryError(error["message"])
    if error.get("kind") in ("system", "invalid-input"):  # control/remote/ssh.py: the agent answers instead
        return "to the agent"
    return "report"


# -- learning reports ----------------------------------------------------------------

def hostile_questions(q: dict, rnd: random.Random):
    q = copy.deepcopy(q)
    what = rnd.randrange(9)
    if what == 0:
        q[rnd.choice(["format", "files", "kernel", "nofollow", "why_not"])] = rnd.choice(HOSTILE_VALUES)
    elif what == 1 and q["files"]:
        q["files"][rnd.randrange(len(q["files"]))] = rnd.choice(
            HOSTILE_VALUES + ["open /dev/watchdog", "open /sys/../dev/mem", "open //dev/sda", "open /x\nf open /y",
                              "access /x 1 2", "listdir " + "/x" * 3000])
    elif what == 2 and q["kernel"]:
        item = q["kernel"][rnd.randrange(len(q["kernel"]))]
        item[rnd.randrange(3)] = rnd.choice(HOSTILE_VALUES + ["A" * 100_000, "=" * 8, True, 2**70])
    elif what == 3:
        q["files"] = q["files"] * (probe.MAX_QUESTIONS // max(1, len(q["files"])) + 1)
    elif what == 4:
        q["kernel"] = q["kernel"] + [["netlink", 16, base64.b64encode(bytes(probe.MAX_REQUEST)).decode()]] * 17
    elif what == 5:
        deep: list = []
        for _ in range(10_000):
            deep = [deep]
        q[rnd.choice(["files", "kernel", "nofollow"])] = deep
    elif what == 6:
        q["nofollow"] = rnd.choice([[[1]], [{}], [None], "open /x", {"a": 1}, q["files"][:1] * 100_000])
    elif what == 7:
        return rnd.choice(HOSTILE_VALUES)
    else:
        q["why_not"] = rnd.choice([[], None, "", ["x" * 100_000] * 100, [[1]]])
    return q


def question_case(q: dict, rnd: random.Random) -> tuple:
    checked = probe.checked_questions(hostile_questions(q, rnd))
    if checked is None:
        return "questions", "refused"
    if len(checked["files"]) + len(checked["kernel"]) > probe.MAX_QUESTIONS:
        raise AssertionError("more questions than the bound were kept")
    lines = probe.encode_questions(checked).split(b"\n")
    if len(lines) != len(checked["files"]) + len(checked["kernel"]) + 3:
        raise AssertionError("a question encoded as more than one line")
    return "questions", "kept"


# -- cache files ---------------------------------------------------------------------

def _text(value) -> str:
    """value as JSON; nested too deep for json.dumps, a nesting as deep."""
    try:
        return json.dumps(value, default=str)
    except RecursionError:
        return "[" * 10_000 + "]" * 10_000


def cache_case(q: dict, rnd: random.Random, root: str, n: int) -> tuple:
    cache = probecache.QuestionCache(os.path.join(root, f"c{n}"))
    key = cache.key(["fuzz", n], {"command": "verify"}, "a" * 64)
    cache.put(key, q)
    path = os.path.join(cache.directory, key + ".json")
    text = json.dumps(q)
    spoils = {
        "bytes": lambda: open(path, "wb").write(rnd.randbytes(rnd.randint(0, 4096))),
        "cut": lambda: open(path, "w").write(text[:rnd.randrange(len(text))]),
        "nested": lambda: open(path, "w").write("[" * 100_000 + "]" * 100_000),
        "too big": lambda: open(path, "w").write(" " * probecache.MAX_FILE + text),
        "hostile": lambda: open(path, "w").write(_text(hostile_questions(q, rnd))),
        "fifo": lambda: (os.unlink(path), os.mkfifo(path, 0o600)),
        "link to /dev/zero": lambda: (os.unlink(path), os.symlink("/dev/zero", path)),
        "link": lambda: (os.rename(path, path + ".x"), os.symlink(path + ".x", path)),
        "directory": lambda: (os.unlink(path), os.mkdir(path, 0o700)),
        "mode 0644": lambda: os.chmod(path, 0o644),
    }
    if os.geteuid() == 0:
        spoils["other owner"] = lambda: os.chown(path, 65534, -1)
    name = rnd.choice(sorted(spoils))
    spoils[name]()
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        found, _ = cache.lookup(key)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if name not in ("bytes", "cut", "hostile") and found is not None:
        raise AssertionError(f"a cache file ({name}) was used")
    return f"cache {name}", "used" if found is not None else "not used"


# -- the run -------------------------------------------------------------------------

def run(seed: int, counts: dict) -> dict:
    fixture = json.load(open(FIXTURE))
    answers = Answers(fixture)
    rnd = random.Random(seed)
    out = {"cases": {}, "outcomes": {}, "tracebacks": 0, "failures": [], "peak_bytes": 0, "peaks": {},
           "seconds": {}}

    def alarm(*_):
        raise Hung("a case did not end within a second")
    signal.signal(signal.SIGALRM, alarm)
    # The verify's own first run pays for its imports: not a case's.
    probe.verify(probe.parse_answers(answers.data, answers.q), answers.request, "warm-up")
    tracemalloc.start()
    with tempfile.TemporaryDirectory(prefix="nt-fuzz-probe-") as root:
        os.chmod(root, 0o700)
        cases = [("answers", lambda n: answer_case(answers, rnd))] * counts["answers"] + \
                [("live", lambda n: live_case(answers, rnd))] * counts["live"] + \
                [("questions", lambda n: question_case(answers.q, rnd))] * counts["questions"] + \
                [("cache", lambda n: cache_case(answers.q, rnd, root, n))] * counts["cache"]
        for n, (kind, case) in enumerate(cases):
            out["cases"][kind] = out["cases"].get(kind, 0) + 1
            tracemalloc.reset_peak()
            started, what, CURRENT[0] = time.monotonic(), kind, kind
            try:
                what, outcome = case(n)
            except BaseException as e:  # noqa: BLE001 - what the fuzzer counts
                out["tracebacks"] += 1
                if len(out["failures"]) < 10:
                    out["failures"].append(f"{kind} case {n} ({CURRENT[0]}): {type(e).__name__}: {str(e)[:300]}")
                continue
            finally:
                peak = tracemalloc.get_traced_memory()[1]
                out["peak_bytes"] = max(out["peak_bytes"], peak)
                out["peaks"][what] = max(out["peaks"].get(what, 0), peak)
                out["seconds"][what] = round(out["seconds"].get(what, 0) + time.monotonic() - started, 2)
            key = f"{what}: {outcome}"
            out["outcomes"][key] = out["outcomes"].get(key, 0) + 1
    return out


if __name__ == "__main__":
    seed = int(sys.argv[1])
    counts = dict(zip(("answers", "live", "questions", "cache"), (int(v) for v in sys.argv[2:6])))
    print(json.dumps(run(seed, counts), sort_keys=True))
