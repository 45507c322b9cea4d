"""The zipapp shipped to SSH targets: reproducible, complete, host side only."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

from nictune.control.remote import agentzip

AGENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "src")


def test_the_archive_is_reproducible():
    first = agentzip.build()
    agentzip.build.cache_clear()
    second = agentzip.build()
    assert first.data == second.data and first.sha256 == second.sha256


def test_it_holds_the_host_side_and_nothing_of_the_controller():
    names = zipfile.ZipFile(io.BytesIO(agentzip.build().data)).namelist()
    assert "nictune/host/agent.py" in names and "nictune/host/transaction/engine.py" in names
    assert "nictune/host/transports/netlink/rtnl.py" in names and "__main__.py" in names
    nictune_files = [n for n in names if n.startswith("nictune/")]
    assert nictune_files and all(n == "nictune/__init__.py" or n.startswith("nictune/host/")
                                 for n in nictune_files)
    for package in ("cli", "control", "inventory", "profile", "lab"):
        assert not [n for n in names if n.startswith(f"nictune/{package}/")], package
    assert [n for n in names if n.startswith("pyroute2/")] == sorted(agentzip.PYROUTE2_FILES)


def test_pyroute2_files_are_exactly_what_the_host_side_loads():
    # Import every host-side module, as the agent may, and list pyroute2's.
    code = ("import importlib, json, pkgutil, sys\n"
            "import nictune.host\n"
            "for m in pkgutil.walk_packages(nictune.host.__path__, 'nictune.host.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(json.dumps(sorted(getattr(sys.modules[m], '__file__', '') or ''\n"
            "                 for m in sys.modules if m.startswith('pyroute2'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=AGENT))
    assert proc.returncode == 0, proc.stderr
    loaded = sorted(f.split("site-packages/")[-1] for f in json.loads(proc.stdout) if f)
    assert loaded == sorted(agentzip.PYROUTE2_FILES)


def test_the_archive_runs_alone_on_a_bare_python(tmp_path):
    """-I -S: no site-packages, no PYTHONPATH: only what the archive carries."""
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(agentzip.build().data)
    request = {"nictune_request": 1, "command": "plan", "state_dir": str(tmp_path / "state"),
               "profile": {"path": "p.yaml", "doc": {"nictune": 1, "interfaces": {}}}}
    proc = subprocess.run([sys.executable, "-I", "-S", str(pyz)], input=json.dumps(request),
                          capture_output=True, text=True)
    report = json.loads(proc.stdout)
    assert report["ok"], report
    assert report["command"] == "plan" and report["changes"] == []


def test_the_bootstrap_unpacks_once_then_reuses(tmp_path):
    bundle = agentzip.build()
    state = str(tmp_path / "state")
    request = json.dumps({"nictune_request": 1, "command": "show", "state_dir": state}) + "\n"
    argv = [sys.executable, "-I", "-S", "-c", agentzip.BOOTSTRAP, bundle.sha256, state]

    first = subprocess.run(argv, input=b"%d\n" % len(bundle.data) + bundle.data + request.encode(),
                           capture_output=True)
    answer, report = first.stdout.split(b"\n", 1)
    assert answer == b"need" and json.loads(report)["ok"], first.stderr
    assert os.path.isdir(os.path.join(state, "agent", bundle.sha256, "nictune", "__pycache__"))

    second = subprocess.run(argv, input=request.encode(), capture_output=True)
    answer, report = second.stdout.split(b"\n", 1)
    assert answer == b"have" and json.loads(report)["ok"], second.stderr


def test_a_damaged_archive_is_refused(tmp_path):
    bundle = agentzip.build()
    state = str(tmp_path / "state")
    damaged = bytearray(bundle.data)
    damaged[100] ^= 0xFF
    proc = subprocess.run([sys.executable, "-c", agentzip.BOOTSTRAP, bundle.sha256, state],
                          input=b"%d\n" % len(damaged) + bytes(damaged), capture_output=True)
    assert proc.returncode == 3 and b"damaged" in proc.stderr
    assert not os.path.exists(os.path.join(state, "agent", bundle.sha256))


def test_the_remote_command_quotes_every_word():
    cmd = agentzip.remote_command("python3", "ab" * 32, "/var/lib/nic tune", sudo=True)
    assert cmd.startswith("exec sudo -n -- python3 -I -S -c '")
    assert cmd.endswith(" '/var/lib/nic tune'")
