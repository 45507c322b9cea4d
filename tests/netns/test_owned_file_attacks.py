"""What a hostile inventory or request could once make nictune write as
root, against the real kernel and the real /etc: the agent process runs in
a private mount namespace with an overlay over /etc, so that whatever it
writes there lands in the test's own upper directory (and goes with it),
never in this machine's /etc.  Needs root, unshare(1) and overlayfs.

Each old attack is refused with a message naming the key and why, and
nothing is written: a path an inventory chose in /etc/profile.d,
/etc/cron.d, /etc/ld.so.preload or /etc/sudoers.d; a directory the profile
lists that is a symlink to /etc/cron.d; `$(...)` in an NCCL value; NCCL
taking over NVSHMEM's profile.d file.  One request that may write (NVSHMEM's
own file) shows that the overlay does catch writes.  The controller's side
(an inventory never sets a path) is tested through the CLI at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import nictune
from nictune.cli.app import app
from nictune.control.remote.ssh import SshTarget

pytestmark = pytest.mark.netns

PACKAGE_ROOT = os.path.dirname(os.path.dirname(nictune.__file__))

# Runs in the private mount namespace: the overlay, the symlinks a case
# needs (made through the overlay, so in the upper directory), then each
# request through the agent process as sshd would start it.
RUNNER = """
import json, os, subprocess, sys
upper, work, cases = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir=/etc,upperdir={upper},workdir={work}", "/etc"], check=True)
for link, target in cases["symlinks"]:
    os.symlink(target, link)
out = []
for request in cases["requests"]:
    done = subprocess.run([sys.executable, "-m", "nictune.host.agent"], input=json.dumps(request),
                          capture_output=True, text=True, timeout=60)
    out.append({"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr})
print(json.dumps(out))
"""


def _require() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            pytest.skip("needs overlayfs")


def request(state, section: str, body: dict, source: str = "hosts.ini:3") -> dict:
    sources = {f"host/{section}/{key}": source for key in body}
    return {"nictune_request": 1, "command": "apply", "state_dir": str(state),
            "profile": {"path": "p.yaml", "sources": sources,
                        "doc": {"nictune": 1, "host": {section: body}}}}


def written(upper) -> list:
    """Every path the requests left in the overlay's upper directory."""
    found = []
    for top, dirs, files in os.walk(upper):
        for name in dirs + files:
            path = os.path.join(top, name)
            if not os.path.isdir(path) or os.path.islink(path):
                found.append("/etc/" + os.path.relpath(path, upper))
    return sorted(found)


def in_overlay(tmp_path, symlinks: list, requests: list) -> tuple:
    """(the agent's reports, the files it left under /etc) for requests run in order."""
    upper, work = tmp_path / "upper", tmp_path / "work"
    upper.mkdir()
    work.mkdir()
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps({"symlinks": symlinks, "requests": requests}))
    try:
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                               RUNNER, str(upper), str(work), str(cases)],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=PACKAGE_ROOT, LANG="C"))
        assert done.returncode == 0, done.stderr[-2000:]
        runs = json.loads(done.stdout)
        for run in runs:
            assert "Traceback" not in run["stderr"], run["stderr"][-2000:]
        return [json.loads(run["stdout"]) for run in runs], written(upper)
    finally:
        shutil.rmtree(upper, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def test_the_old_attacks_are_refused_and_write_nothing_under_etc(tmp_path):
    _require()
    tag = secrets.token_hex(3)
    state = tmp_path / "state"
    nccl = {"env": {"NCCL_IB_TC": 106}}
    attacks = [
        ("nccl", {**nccl, "path": f"/etc/profile.d/nt{tag}.sh"}, "/etc/profile.d: login and interactive shells"),
        ("ucx", {"env": {"UCX_TLS": "rc"}, "path": f"/etc/cron.d/nt{tag}"}, "/etc/cron...: cron"),
        ("nccl", {**nccl, "path": "/etc/ld.so.preload"}, "/etc/ld.so...: the dynamic loader"),
        ("mpi", {"params": {"pml": "ucx"}, "path": f"/etc/sudoers.d/nt{tag}",
                 "allowed_dirs": ["/etc/sudoers.d"]}, "/etc/sudo...: sudo"),
        ("nccl", {"env": {"NCCL_SOCKET_IFNAME": f"$(touch /tmp/nt{tag})"}},
         "host.nccl.env (hosts.ini:3): invalid value of NCCL_SOCKET_IFNAME"),
        ("nccl", {**nccl, "path": f"/etc/nt{tag}/x", "allowed_dirs": [f"/etc/nt{tag}"]},
         f"/etc/nt{tag}/x resolves to /etc/cron.d/x, where nictune never writes"),
    ]
    requests = [request(state, section, body) for section, body, _ in attacks]
    # NVSHMEM's own file may be written (the overlay catches it), and then
    # NCCL, pointed at it, may not take it over.
    requests.append(request(state, "nvshmem", {"env": {"NVSHMEM_IB_TRAFFIC_CLASS": 106}}, "p.yaml:3"))
    requests.append(request(state, "nccl", {**nccl, "path": "/etc/profile.d/nvshmem.sh"}))
    reports, left = in_overlay(tmp_path, [(f"/etc/nt{tag}", "/etc/cron.d")], requests)

    assert len(reports) == len(attacks) + 2
    for (section, _, why), report in zip(attacks, reports):
        said = json.dumps(report)
        assert report["exit_code"] != 0 and not report["changed"], (section, said)
        assert why in said, (why, said)
    nvshmem, takeover = reports[-2:]
    assert nvshmem["exit_code"] == 0 and nvshmem["changed"], nvshmem
    assert takeover["exit_code"] != 0 and "nictune never writes '/etc/profile.d/nvshmem.sh'" in \
        takeover["error"]["message"]
    assert left == [f"/etc/nt{tag}", "/etc/profile.d/nvshmem.sh"]  # the test's symlink, NVSHMEM's file
    assert not os.path.exists(f"/tmp/nt{tag}")


def test_an_inventory_path_is_refused_before_any_host_is_reached(tmp_path, monkeypatch):
    # The controller's side of the same attack: nothing is sent, and the
    # error names the inventory's file and line and the key.
    sent = []
    monkeypatch.setattr(SshTarget, "run", lambda self, req: sent.append(req))
    profile = tmp_path / "p.yaml"
    profile.write_text("nictune: 1\nhost:\n  nccl: {env: {NCCL_IB_TC: 106}}\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\ngpu01 ansible_host=198.18.0.9 "
                         "nictune='{\"host\": {\"nccl\": {\"path\": \"/etc/cron.d/x\"}}}'\n")
    result = CliRunner().invoke(app, ["apply", str(profile), "-i", str(inventory)])
    assert result.exit_code != 0 and sent == []
    assert f"{inventory}:2" in result.output
    assert "host.nccl.path cannot be set from an inventory" in result.output
    assert not os.path.exists("/etc/cron.d/x")
