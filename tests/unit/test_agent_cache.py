"""The agent cached on a host is checked on every run (issue 9, item 7).

The bootstrap runs here as it runs on a host (python -I -S -c BOOTSTRAP),
against a state directory in tmp_path: a cache that is damaged, edited, not
this user's or writable by others is removed and the archive asked for
again; a state directory others can write is refused.  Over real SSH:
tests/fleet/test_hostile_hosts.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from nictune.control.remote import agentzip

BUNDLE = agentzip.build()


def request(state: str) -> bytes:
    # A plan of nothing: the agent starts, imports the engine and answers
    # without reading the machine's network settings or its journal.
    profile = {"path": "p.yaml", "doc": {"nictune": 1, "interfaces": {}}}
    return json.dumps({"nictune_request": 1, "command": "plan", "state_dir": state,
                       "profile": profile}).encode() + b"\n"


def ran(report) -> bool:
    """The agent ran and answered the plan."""
    return report is not None and report["command"] == "plan" and report["ok"]


def bootstrap(state: str, send_archive: bool, umask=None) -> tuple:
    """(first line, report or None, process) of one run of the bootstrap."""
    archive = b"%d\n" % len(BUNDLE.data) + BUNDLE.data if send_archive else b""
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", agentzip.BOOTSTRAP, BUNDLE.sha256, state],
                          input=archive + request(state), capture_output=True,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    answer, _, rest = proc.stdout.partition(b"\n")
    report = json.loads(rest) if rest.strip() else None
    return answer.decode(), report, proc


@pytest.fixture
def cached(tmp_path):
    """A state directory whose cache holds the agent, unpacked and sealed."""
    state = str(tmp_path / "state")
    answer, report, proc = bootstrap(state, send_archive=True)
    assert answer == "need" and ran(report), proc.stderr
    answer, report, _ = bootstrap(state, send_archive=False)
    assert answer == "have" and ran(report)
    return state, os.path.join(state, "agent", BUNDLE.sha256)


def pyc_of(home: str, module: str) -> str:
    folder = os.path.join(home, os.path.dirname(module), "__pycache__")
    stem = os.path.basename(module)[:-3]
    return os.path.join(folder, next(n for n in os.listdir(folder) if n.startswith(stem + ".")))


def garble(home):
    with open(os.path.join(home, "nictune/host/transaction/engine.py"), "a") as f:
        f.write("\n)))) not python\n")
    return "nictune/host/transaction/engine.py differs"


def truncate_pyc(home):
    path = pyc_of(home, "nictune/host/transaction/journal.py")
    os.truncate(path, 20)
    return os.path.relpath(path, home) + " differs"


def remove_a_module(home):
    os.unlink(os.path.join(home, "nictune/host/errors.py"))
    return "1 of its files are missing"


def add_a_module(home):
    with open(os.path.join(home, "nictune/host/sitecustomize.py"), "w") as f:
        f.write("print('hello')\n")
    os.chmod(os.path.join(home, "nictune/host/sitecustomize.py"), 0o600)
    return "nictune/host/sitecustomize.py is not part of the agent"


def drop_the_manifest(home):
    os.unlink(os.path.join(home, "MANIFEST"))
    return "its MANIFEST is missing"  # as the cache of an older nictune has none


def other_python(home):
    path = os.path.join(home, "MANIFEST")
    with open(path) as f:
        lines = f.read().split("\n", 1)
    with open(path, "w") as f:
        f.write("nictune-agent-manifest 1 cpython-39\n" + lines[1])
    return "its MANIFEST is not"


def symlink_a_module(home, tmp_path):
    path = os.path.join(home, "nictune/host/model.py")
    elsewhere = str(tmp_path / "model.py")
    os.rename(path, elsewhere)
    os.symlink(elsewhere, path)
    return "nictune/host/model.py is not a regular file"


def group_writable(home):
    os.chmod(os.path.join(home, "nictune/host/agent.py"), 0o620)
    return "nictune/host/agent.py is writable by group or others"


def world_writable_folder(home):
    os.chmod(os.path.join(home, "nictune/host/knobs"), 0o777)
    return "nictune/host/knobs/ is writable by group or others"


def foreign_owner(home):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file away")
    os.chown(os.path.join(home, "nictune/host/transaction/engine.py"), 4321, 4321)
    return "nictune/host/transaction/engine.py is owned by uid 4321"


@pytest.mark.parametrize("damage", [garble, truncate_pyc, remove_a_module, add_a_module,
                                    drop_the_manifest, other_python, symlink_a_module,
                                    group_writable, world_writable_folder, foreign_owner])
def test_a_cache_that_fails_its_check_is_replaced(cached, tmp_path, damage):
    state, home = cached
    args = (home, tmp_path) if damage is symlink_a_module else (home,)
    reason = damage(*args)
    answer, report, proc = bootstrap(state, send_archive=True)
    assert answer.startswith("need ") and reason in answer, (answer, proc.stderr)
    assert ran(report), report  # the agent ran, from a fresh copy
    answer, report, _ = bootstrap(state, send_archive=False)
    assert answer == "have" and ran(report)


def test_edited_code_is_detected_and_not_run(cached, tmp_path):
    state, home = cached
    marker = tmp_path / "ran-edited-code"
    with open(os.path.join(home, "nictune/host/agent.py"), "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').close()\n")
    answer, report, proc = bootstrap(state, send_archive=True)
    assert answer == "need nictune/host/agent.py differs from the copy unpacked", proc.stderr
    assert ran(report)
    assert not marker.exists()


def test_a_cache_folder_others_can_write_is_replaced_whole(cached):
    state, home = cached
    os.chmod(os.path.dirname(home), 0o777)
    answer, report, _ = bootstrap(state, send_archive=True)
    assert answer.startswith("need ") and "agent is writable by group or others" in answer
    assert stat.S_IMODE(os.stat(os.path.dirname(home)).st_mode) == 0o700
    assert ran(report)


def test_a_cache_that_is_a_symlink_is_replaced(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, state / "agent")
    answer, report, _ = bootstrap(str(state), send_archive=True)
    assert answer.startswith("need ") and "agent is not a directory" in answer
    assert not os.path.islink(state / "agent") and os.listdir(elsewhere) == []
    assert ran(report)


def test_a_state_directory_others_can_write_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    answer, report, proc = bootstrap(str(state), send_archive=True)
    assert proc.returncode == 3 and answer == "" and report is None
    err = proc.stderr.decode()
    assert f"will not run the agent from {state}" in err and "writable by group or others" in err
    assert not os.path.exists(state / "agent")


def test_what_the_bootstrap_creates_is_private_whatever_the_umask(tmp_path):
    state = str(tmp_path / "var" / "state")
    answer, report, proc = bootstrap(state, send_archive=True, umask=0)
    assert answer == "need" and report is not None, proc.stderr
    home = os.path.join(state, "agent", BUNDLE.sha256)
    for path in (os.path.dirname(state), state, os.path.dirname(home), home):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    created = [os.path.join(folder, name) for folder, _, files in os.walk(home) for name in files]
    assert created, home
    for path in created:
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, os.path.basename(path)
    answer, _, _ = bootstrap(state, send_archive=False, umask=0)
    assert answer == "have"



def rewrite_keeping_stat(path: str, text: bytes) -> None:
    """`path` holds `text` (of its size), with its mtime put back."""
    st = os.stat(path)
    assert len(text) == st.st_size
    with open(path, "r+b") as f:
        f.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_source_is_checked_by_its_stat_and_its_checked_pyc_is_what_runs(cached, tmp_path):
    # The check hashes a module's .pyc, which is what Python runs while the
    # source's size and mtime are those it records; the source itself is
    # compared by size and mtime.  A source rewritten with both put back
    # (only its owner can) passes, and still does not run: its .pyc does.
    state, home = cached
    marker = tmp_path / "ran-edited-source"
    source = os.path.join(home, "nictune/host/agent.py")
    evil = f"open({str(marker)!r}, 'w').close()\n".encode()
    rewrite_keeping_stat(source, evil + b"#" * (os.path.getsize(source) - len(evil)))
    answer, report, proc = bootstrap(state, send_archive=False)
    assert answer == "have" and ran(report), proc.stderr
    assert not marker.exists()
    with open(os.path.join(home, "MANIFEST")) as f:
        head = f.readline()
    assert head == f"nictune-agent-manifest 2 {sys.implementation.cache_tag}\n"


def test_a_manifest_of_the_format_before_is_checked_as_it_says(cached):
    # A cache sealed by the bootstrap before (every file hashed, no stat):
    # still used, every file still hashed.
    state, home = cached
    path = os.path.join(home, "MANIFEST")
    with open(path) as f:
        lines = f.read().splitlines()
    with open(path, "w") as f:
        f.write("\n".join([f"nictune-agent-manifest 1 {sys.implementation.cache_tag}"]
                          + [" ".join(line.split(" ")[::3]) for line in lines[1:]]) + "\n")
    answer, report, _ = bootstrap(state, send_archive=False)
    assert answer == "have" and ran(report)
    source = os.path.join(home, "nictune/host/errors.py")
    rewrite_keeping_stat(source, b"#" * os.path.getsize(source))
    answer, report, _ = bootstrap(state, send_archive=True)
    assert answer == "need nictune/host/errors.py differs from the copy unpacked" and ran(report)
