"""The agent runs on the target's python3, which may be as old as 3.9: the
archive an SSH target receives, through the same bootstrap, on each Python
this machine has."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess

import pytest

from nictune.control.remote import agentzip

pytestmark = pytest.mark.netns


def interpreters() -> list:
    """Other Pythons on this machine: on PATH, or installed by pyenv."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = []
    for version in ("3.9", "3.10", "3.12", "3.13"):
        candidates = [shutil.which(f"python{version}")] + sorted(
            glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin", f"python{version}")))
        for exe in filter(None, candidates):
            if subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
                found.append(pytest.param(exe, id=f"python{version}"))
                break
    return found or [pytest.param(None, marks=pytest.mark.skip(reason="no other python3 here"))]


@pytest.mark.parametrize("python", interpreters())
def test_agent_plans_and_applies_on_other_pythons(veth_pair, tmp_path, python):
    request = {
        "nictune_request": 1, "command": "apply", "state_dir": str(tmp_path / "state"),
        "profile": {"path": "p.yaml", "sources": {}, "doc": {
            "nictune": 1,
            "host": {"sysctl": {"net.ipv4.tcp_ecn": 1},
                     "nccl": {"path": str(tmp_path / "nccl.conf"), "allowed_dirs": [str(tmp_path)],
                              "env": {"NCCL_IB_TC": 106}}},
            "interfaces": {"rail": {"match": {"name": "ntv0"}, "mtu": 9000,
                                    "features": {"gro": True}, "channels": {"rx": 2}}}}}}
    bundle = agentzip.build()
    state = str(tmp_path / "state")
    proc = subprocess.run(
        ["ip", "netns", "exec", veth_pair.ns_a, python, "-I", "-S", "-c", agentzip.BOOTSTRAP,
         bundle.sha256, state],
        input=b"%d\n" % len(bundle.data) + bundle.data + json.dumps(request).encode() + b"\n",
        capture_output=True)
    answer, _, line = proc.stdout.partition(b"\n")
    assert answer == b"need", proc.stderr
    report = json.loads(line)
    assert report["exit_code"] == 0, (report, proc.stderr)
    assert report["summary"] == {"applied": 5}
    link = json.loads(veth_pair.run(veth_pair.ns_a, ["ip", "-j", "link", "show", "ntv0"]).stdout)[0]
    assert link["mtu"] == 9000
