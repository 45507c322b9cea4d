"""The probe (control/remote/probe.py, host/replay/probe_reads.py) on a real kernel: the
agent learns a verify's questions inside a namespace, the probe asks them
there with the system's python3 -I -S, and the verify made on the
controller from its answers equals the agent's own, clean and after drift
injected with ip, ethtool and sysctl.  A read the questions lack, and a
verify that waits for counters, send the host back to the agent.
Namespaces nt<tag>{a,b} (conftest.py veth_pair), addresses from
198.18.0.0/15, removed whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from nictune.control.remote import probe
from nictune.control.remote.request import build_request
from nictune.host.replay import probe_reads
from nictune.profile.loader import load_profile

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
host:
  sysctl:
    net.ipv4.tcp_mtu_probing: 1
    net.ipv4.tcp_ecn: 1
interfaces:
  v:
    match: {name: "ntv*"}
    mtu: 9000
    state: up
    features: {gro: false, tso: true}
    sysctl:
      ipv4.arp_ignore: 1
"""
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


def request(tmp_path, text: str = PROFILE, **extra) -> dict:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    req = build_request("verify", load_profile(str(path)))
    return dict(req, state_dir=str(tmp_path / "state"), host="probe-test", **extra)


def agent_in(ns: str, req: dict) -> dict:
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "nictune.host.agent"],
                         input=json.dumps(req).encode(), capture_output=True, check=True)
    return json.loads(out.stdout)


def probe_in(ns: str, questions: dict) -> bytes:
    out = subprocess.run(["ip", "netns", "exec", ns, SYSTEM_PYTHON, "-I", "-S", "-c", probe.PROBE],
                         input=probe.encode_questions(questions), capture_output=True, check=True,
                         timeout=60)
    return out.stdout


def comparable(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("seconds", "questions", "agent", "via")}


def learned(ns: str, req: dict) -> tuple:
    report = agent_in(ns, dict(req, learn=True))
    questions = probe.checked_questions(report.get("questions"))
    assert questions is not None, report.get("questions")
    return report, questions


def by_probe(ns: str, req: dict, questions: dict) -> dict:
    answers = probe.parse_answers(probe_in(ns, questions), questions)
    return probe.verify(answers, req, req["host"])


def drift(report: dict) -> set:
    return {(c["key"]["target"], c["key"]["name"]) for c in report["changes"] if c["status"] == "drift"}


def test_the_probes_verify_is_the_agents_clean_and_after_drift(veth_pair, tmp_path):
    ns, run = veth_pair.ns_a, veth_pair.run
    for argv in (["ip", "link", "set", "ntv0", "mtu", "9000"], ["ethtool", "-K", "ntv0", "gro", "off"],
                 ["sysctl", "-qw", "net.ipv4.tcp_mtu_probing=1", "net.ipv4.tcp_ecn=1",
                  "net.ipv4.conf.ntv0.arp_ignore=1"]):
        assert run(ns, argv).returncode == 0
    req = request(tmp_path)
    agent_report, questions = learned(ns, req)
    assert agent_report["summary"] == {"ok": 7}, agent_report
    # The questions are reads: netlink, ioctls, files; never an answer.
    assert {q[0] for q in questions["kernel"]} <= {"netlink", "ioctl"} and questions["files"]
    assert comparable(by_probe(ns, req, questions)) == comparable(agent_report)

    # Drift made by hand: the same questions read it, and both verifies agree.
    for argv in (["ip", "link", "set", "ntv0", "mtu", "1500"], ["ethtool", "-K", "ntv0", "gro", "on"],
                 ["sysctl", "-qw", "net.ipv4.tcp_ecn=2"]):
        assert run(ns, argv).returncode == 0
    after = by_probe(ns, req, questions)
    assert drift(after) == {("ntv0", "mtu"), ("ntv0", "rx-gro"), ("host", "net.ipv4.tcp_ecn")}
    assert comparable(after) == comparable(agent_in(ns, req))


def test_a_read_the_questions_lack_sends_the_host_back_to_its_agent(veth_pair, tmp_path):
    ns, run = veth_pair.ns_a, veth_pair.run
    req = request(tmp_path)
    _, questions = learned(ns, req)
    # A second matching interface: its reads were never asked.
    assert run(ns, ["ip", "link", "add", "ntv1", "type", "veth", "peer", "name", "ntw1"]).returncode == 0
    answers = probe.parse_answers(probe_in(ns, questions), questions)
    with pytest.raises(probe_reads.NotProbed):
        probe.verify(answers, req, req["host"])
    # The agent, learning again, covers it.
    report, again = learned(ns, req)
    assert comparable(by_probe(ns, req, again)) == comparable(report)
    assert any(c["key"]["target"] == "ntv1" for c in report["changes"])


def test_a_verify_that_waits_for_counters_is_not_asked_by_a_probe(veth_pair, tmp_path):
    text = ("nictune: 1\ninterfaces:\n  v:\n    match: {name: ntv0}\n    expect:\n"
            "      counters_interval: 1\n      counters: {rx_packets: {max: 1000000}}\n")
    report = agent_in(veth_pair.ns_a, dict(request(tmp_path, text), learn=True))
    assert report["questions"]["why_not"] == ["a counter's rise (two readings apart in time)"]
    assert probe.checked_questions(report["questions"]) is None


def test_learning_goes_with_verify_alone(veth_pair, tmp_path):
    req = dict(request(tmp_path), command="plan", learn=True)
    report = agent_in(veth_pair.ns_a, req)
    assert report["error"]["kind"] == "invalid-input" and "learn" in report["error"]["message"]


def test_an_owned_file_swapped_for_a_fifo_or_a_symlink_is_never_waited_on_or_followed(veth_pair, tmp_path):
    ns = veth_pair.ns_a
    nccl = tmp_path / "nccl.conf"
    nccl.write_text("NCCL_DEBUG=WARN\n")
    text = (f"nictune: 1\nhost:\n  nccl:\n    path: {nccl}\n    allowed_dirs: [{tmp_path}]\n"
            "    env: {NCCL_DEBUG: WARN}\n")
    req = request(tmp_path, text)
    report, questions = learned(ns, req)
    assert report["summary"] == {"ok": 1}, report
    assert f"open {nccl}" in questions["nofollow"]
    assert comparable(by_probe(ns, req, questions)) == comparable(report)

    target = tmp_path / "elsewhere.conf"
    target.write_text("NCCL_DEBUG=INFO\n")
    for swap in (lambda: os.mkfifo(nccl), lambda: os.symlink(target, nccl)):
        nccl.unlink()
        swap()
        # The probe answers at once (a reader of a FIFO would wait for a
        # writer for ever), and the verify is the agent's: not followed.
        probed = by_probe(ns, req, questions)
        assert comparable(probed) == comparable(agent_in(ns, req))
        assert probed["summary"] != {"ok": 1}


# -- what the probe program opens on the host -----------------------------------------

OPENAT = {"x86_64": 257, "aarch64": 56}.get(os.uname().machine)


def _blocked_writer(fifo: str):
    """A thread opening `fifo` for writing: it blocks until some reader
    opens it, so whether it got through tells whether anything opened it."""
    through, started = threading.Event(), threading.Event()
    tid = []

    def write():
        tid.append(threading.get_native_id())
        started.set()
        os.close(os.open(fifo, os.O_WRONLY))
        through.set()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    started.wait(5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # until it waits inside open()
        with open(f"/proc/self/task/{tid[0]}/syscall") as f:
            if OPENAT is not None and f.read().split()[0] == str(OPENAT):
                break
        time.sleep(0.01)
    else:
        time.sleep(0.5)

    def release() -> bool:
        opened = through.wait(0.5)
        if not opened:
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(5)
        return opened
    return release


def probe_answers(*files: str) -> bytes:
    asked = probe.HEADER + b"".join(b"f %s\n" % f.encode() for f in files) + b"\n"
    out = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", probe.PROBE], input=asked, capture_output=True,
                         check=True, timeout=30).stdout
    _, frame, answers = out.split(b"\n", 2)  # the probe's header, the batch's "a COUNT LENGTH"
    assert frame == b"a %d %d" % (len(files), len(answers)), out
    return answers


@pytest.fixture
def shm_fifo():
    path = f"/dev/shm/nt-probe-{os.getpid()}"
    os.mkfifo(path, 0o600)
    try:
        yield path
    finally:
        os.unlink(path)


def test_the_probe_never_opens_under_dev(shm_fifo):
    # Whatever a cache asks: the controller refuses such questions, and the
    # probe on the host refuses them again, before opening anything.
    release = _blocked_writer(shm_fifo)
    answer = probe_answers(f"open {shm_fifo}")
    assert not release(), "the probe opened a FIFO under /dev"
    assert answer == b"e 1 0\n"
    assert probe_answers("open /dev/null", "open-nofollow /dev/zero") == b"e 1 0\ne 1 0\n"


@pytest.mark.parametrize("op, via_link, errno_", [("open", False, 29), ("open", True, 29),
                                                  ("open-nofollow", True, 40)])
def test_the_probe_looks_at_a_files_type_before_opening_it(tmp_path, op, via_link, errno_):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo, 0o600)
    asked = fifo
    if via_link:
        asked = str(tmp_path / "link")
        os.symlink(fifo, asked)
    release = _blocked_writer(fifo)
    answer = probe_answers(f"{op} {asked}")
    assert not release(), "the probe opened a FIFO"
    assert answer == b"e %d 0\n" % errno_


def test_the_probe_still_reads_regular_files_and_through_links(tmp_path):
    (tmp_path / "f").write_text("42\n")
    os.symlink(tmp_path / "f", tmp_path / "l")
    assert probe_answers(f"open {tmp_path}/f", f"open {tmp_path}/l", f"open-nofollow {tmp_path}/f") == \
        b"o 0 3\n42\n" * 3
