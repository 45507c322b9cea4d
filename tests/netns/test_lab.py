"""`nictune lab up|down` and the README demo flow on it, on the real kernel."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.lab import namespaces as labmod

pytestmark = pytest.mark.netns
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def run(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout


@pytest.fixture
def lab(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if any(os.path.exists(f"/run/netns/{ns}") for ns in labmod.NAMESPACES):
        pytest.skip("a lab is already up on this machine; not touching it")
    had_nccl = os.path.exists("/etc/nccl.conf")
    try:
        yield tmp_path / "state"
    finally:
        labmod.down(str(tmp_path / "state"))
        assert not any(os.path.exists(f"/run/netns/{ns}") for ns in labmod.NAMESPACES)
        assert os.path.exists("/etc/nccl.conf") == had_nccl


def test_lab_demo_flow(lab):
    code, out = run("lab", "up", "--json")
    assert code == 0, out
    assert json.loads(out)["lab"]["namespaces"] == ["ntlab1", "ntlab2"]
    addrs = json.loads(subprocess.run(["ip", "-n", "ntlab1", "-j", "addr", "show", "lab0"],
                                      capture_output=True, text=True).stdout)
    assert [a["local"] for a in addrs[0]["addr_info"] if a["family"] == "inet"] == ["198.18.0.1"]
    assert run("lab", "up")[0] == 1  # already up: refused, nothing half-made

    profile = os.path.join(ROOT, "profiles", "lab-veth.yaml")
    common = ["--netns", "ntlab1", "--state-dir", str(lab)]
    assert run("plan", profile, *common)[0] == 2
    code, out = run("apply", profile, *common)
    assert code == 0, out
    assert run("verify", profile, *common)[0] == 0
    # Each namespace has its own NCCL file; the host's stays as it was.
    nccl = subprocess.run(["ip", "netns", "exec", "ntlab1", "cat", "/etc/nccl.conf"],
                          capture_output=True, text=True).stdout
    assert "NCCL_SOCKET_IFNAME==lab0" in nccl
    assert "lab0" not in open("/etc/nccl.conf").read()
    assert run("verify", profile, "--netns", "ntlab2", "--state-dir", str(lab))[0] == 2

    code, out = run("lab", "down")
    assert code == 0 and "ntlab1" in out
