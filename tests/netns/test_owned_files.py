"""Files nictune owns, against the real kernel (issue 9 items 2-4): the
namespace's own /etc file under `ip netns exec`, reads of FIFOs, devices
and symlinks by the agent process, and a crash while a bind-mounted file
is rewritten in place.  Needs root.  The rest of the rules for owned files
is tested in tests/unit/test_owned_files.py.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

import nictune
from nictune.cli.app import app
from nictune.host import agent
from nictune.host.machine import Host

pytestmark = pytest.mark.netns

PACKAGE_ROOT = os.path.dirname(os.path.dirname(nictune.__file__))
ENV = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, LANG="C")


def _require_root() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2")


CONF = "/etc/nccl.conf"


@pytest.fixture
def netns(tmp_path):
    """One namespace nt<tag>o, and the host's /etc/nccl.conf (the only
    file a namespace's own /etc file can stand for: a family writes its
    own path or below a directory the profile lists, and only a file
    directly in /etc/netns/NAME is created there) as it was: the
    namespace and its /etc/netns directory are removed, and the host's
    file put back (or removed), whatever happens."""
    _require_root()
    tag = secrets.token_hex(3)
    name = f"nt{tag}o"
    saved = open(CONF, "rb").read() if os.path.isfile(CONF) else None
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        if saved is not None:
            os.unlink(CONF)
        yield name, CONF
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        if saved is not None:
            with open(CONF, "wb") as f:
                f.write(saved)
        elif os.path.lexists(CONF):
            os.unlink(CONF)


def cli(ns: str, state, *args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--netns", ns, "--state-dir", str(state), "--json"])
    report = json.loads(result.stdout)
    return result.exit_code, report["hosts"][0]


def in_ns(ns: str, path: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "cat", path], capture_output=True,
                          text=True).stdout


def test_a_namespace_gets_its_own_file_and_the_hosts_is_untouched(netns, tmp_path):
    ns, conf = netns
    own = f"/etc/netns/{ns}/{os.path.basename(conf)}"
    profile = tmp_path / "p.yaml"
    profile.write_text(f"nictune: 1\nhost:\n  nccl:\n    path: {conf}\n    env: {{NCCL_IB_TC: 106}}\n")
    state = tmp_path / "state"

    code, host = cli(ns, state, "plan", str(profile))
    [change] = host["changes"]
    assert code == 2 and change["note"].startswith(f"the namespace's own file {own}, created; ")
    assert f"this host has none: create an empty {conf}" in change["note"]

    # As `nictune lab up` does for /etc/nccl.conf: the host has the file, empty.
    open(conf, "w").close()
    code, host = cli(ns, state, "apply", str(profile))
    assert code == 0, host
    [change] = host["changes"]
    assert change["status"] == "applied" and change["note"] == f"the namespace's own file {own}, created"
    assert os.path.getsize(conf) == 0
    assert "NCCL_IB_TC=106\n" in open(own).read()
    assert "NCCL_IB_TC=106\n" in in_ns(ns, conf)  # what programs in the namespace read

    code, host = cli(ns, state, "verify", str(profile))
    assert code == 0 and host["changes"][0]["note"] == f"the namespace's own file {own}"
    code, host = cli(ns, state, "rollback")
    assert code == 0 and not os.path.exists(own) and os.path.getsize(conf) == 0


def test_a_namespace_file_that_would_hide_someone_elses_host_file_needs_adopt(netns, tmp_path):
    # The namespace's own /etc/netns/NS/nccl.conf, once created, is what
    # `ip netns exec` binds over the host's /etc/nccl.conf for every program
    # in the namespace: it replaces, there, a file nictune did not write.
    ns, conf = netns
    own = f"/etc/netns/{ns}/{os.path.basename(conf)}"
    with open(conf, "w") as f:
        f.write("written by someone else\n")
    profile = tmp_path / "p.yaml"
    body = f"nictune: 1\nhost:\n  nccl:\n    path: {conf}\n    env: {{NCCL_IB_TC: 106}}\n"
    profile.write_text(body)
    state = tmp_path / "state"

    code, host = cli(ns, state, "apply", str(profile))
    [change] = host["changes"]
    assert code == 1 and change["status"] == "unsupported", host
    assert f"creating {own} would hide the host's {conf}, which nictune did not write" in change["note"]
    assert not os.path.exists(own) and in_ns(ns, conf) == "written by someone else\n"

    profile.write_text(body + "    adopt: true\n")
    code, host = cli(ns, state, "apply", str(profile))
    assert code == 0, host
    assert "NCCL_IB_TC=106\n" in in_ns(ns, conf)
    assert open(conf).read() == "written by someone else\n"  # the host's own, untouched
    assert cli(ns, state, "rollback")[0] == 0
    assert not os.path.exists(own) and in_ns(ns, conf) == "written by someone else\n"


def test_a_namespaces_file_keeps_its_inode_for_the_mounts_that_bind_it(netns, tmp_path):
    # A process started in the namespace earlier (an sshd of the fleet lab)
    # has the file bound over /etc/...: it sees a change only in that inode.
    ns, conf = netns
    own = f"/etc/netns/{ns}/{os.path.basename(conf)}"
    open(conf, "w").close()
    os.makedirs(os.path.dirname(own))
    open(own, "w").close()
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
    try:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{sleeper.pid}/exe").endswith("/ip"):  # until it has exec'd
            assert time.monotonic() < deadline
            time.sleep(0.01)
        profile = tmp_path / "p.yaml"
        profile.write_text(f"nictune: 1\nhost:\n  nccl:\n    path: {conf}\n    env: {{NCCL_IB_TC: 7}}\n")
        inode = os.stat(own).st_ino
        assert cli(ns, tmp_path / "state", "apply", str(profile))[0] == 0
        assert os.stat(own).st_ino == inode
        with open(f"/proc/{sleeper.pid}/root{conf}") as f:
            assert "NCCL_IB_TC=7\n" in f.read()
    finally:
        sleeper.kill()
        sleeper.wait()


# -- reads that never end -------------------------------------------------------------

def _one_gib() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def agent_plan(path, allowed) -> tuple:
    """A plan by the agent process, as `ip netns exec` or sshd starts it:
    (seconds it took, its NCCL change)."""
    req = {"nictune_request": 1, "command": "plan", "state_dir": str(allowed / "state"),
           "profile": {"path": "p.yaml", "sources": {}, "doc": {"nictune": 1, "host": {"nccl": {
               "path": str(path), "allowed_dirs": [str(allowed)], "env": {"NCCL_IB_TC": 106}}}}}}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "nictune.host.agent"], input=json.dumps(req),
                              capture_output=True, text=True, env=ENV, timeout=30,
                              preexec_fn=_one_gib)
    except subprocess.TimeoutExpired:
        pytest.fail(f"plan of {path} did not return in 30 s")
    report = json.loads(proc.stdout)
    return time.monotonic() - started, report["changes"][0] if report["changes"] else report


@pytest.mark.parametrize("kind, reason", [
    ("fifo", "is a FIFO, not a regular file"),
    ("device", "is a character device, not a regular file"),
    ("symlink", "is a symbolic link, not a regular file"),
    ("big", "is larger than 1024 KiB"),
])
def test_plan_returns_promptly_on_what_is_not_a_regular_file(tmp_path, kind, reason):
    _require_root()
    path = tmp_path / "nccl.conf"
    if kind == "fifo":
        os.mkfifo(path)  # an open for reading would wait for a writer forever
    elif kind == "device":
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers
    elif kind == "symlink":
        path.symlink_to("/dev/zero")  # reads without end
    else:
        path.write_bytes(b"NCCL_X=" + b"1" * (2 << 20) + b"\n")
    seconds, change = agent_plan(path, tmp_path)
    assert seconds < 10
    assert change.get("status") == "unsupported", change
    assert change["note"] == f"{path} {reason}" + (
        "; nictune reads and replaces only regular files" if "regular" in reason else
        ", more than any file nictune writes; it is neither read nor replaced")


# -- a crash while a bind-mounted file is rewritten ------------------------------------------

WRITER = textwrap.dedent("""\
    import subprocess, sys
    from nictune.host.knobs.nccl import NcclFamily
    from nictune.host.machine import Host
    from nictune.host.model import HOST, Key
    path, size = sys.argv[1], int(sys.argv[2])
    # A mount point cannot be renamed over (EBUSY): the file is rewritten in place.
    subprocess.run(["mount", "--bind", path, path], check=True)
    NcclFamily(Host()).apply([(Key("nccl", HOST, path), "B" * size)])
""")


def test_a_crash_mid_rewrite_never_leaves_a_bind_mounted_file_empty(tmp_path):
    _require_root()
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    old, new = 64 << 20, 48 << 20
    path = tmp_path / "nccl.conf"
    path.write_bytes(b"A" * old)
    fd = os.open(path, os.O_RDONLY)
    writer = subprocess.Popen(["unshare", "--mount", "--propagation", "private", sys.executable,
                               "-c", WRITER, str(path), str(new)], env=ENV)
    seen = []  # sizes from the moment the rewrite began
    try:
        while writer.poll() is None:
            size, first = os.fstat(fd).st_size, os.pread(fd, 1, 0)
            if size != old or first != b"A":
                seen.append(size)
                os.kill(writer.pid, signal.SIGKILL)  # the crash
                break
        writer.wait()
        final = os.fstat(fd).st_size
        assert seen, "the rewrite was never seen"
        assert min(seen) >= new and final >= new, f"the file shrank to {min(seen + [final])} bytes"
        assert os.pread(fd, 1, 0) == b"B"
    finally:
        os.close(fd)
        if writer.poll() is None:
            writer.kill()
            writer.wait()

    # Whatever temporary file the crash left goes with the next apply there.
    req = {"nictune_request": 1, "command": "apply", "state_dir": str(tmp_path / "state"),
           "profile": {"path": "p.yaml", "sources": {}, "doc": {"nictune": 1, "host": {"nccl": {
               "path": str(tmp_path / "other.conf"), "allowed_dirs": [str(tmp_path)],
               "env": {"NCCL_IB_TC": 106}}}}}}
    report = agent.run(req, host=Host())
    assert report["exit_code"] == 0, report
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".nictune-")]
