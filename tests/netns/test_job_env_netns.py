"""nictune's lines of /etc/environment reach `ssh host command` (host/knobs/jobenv.py):
applied through the CLI in a network namespace (its own /etc/netns/NAME/environment,
which `ip netns exec` binds over /etc/environment), then read back by a real
sshd with UsePAM yes, started in the namespace, whose pam_env session module
(Debian's /etc/pam.d/sshd) puts the file's variables into the environment of
a non-interactive `ssh root@127.0.0.1 printenv`: what mpirun's remote daemons
get.  A change and its rollback are rewritten in place, so sshd's bind of the
file sees them.  Every process started here is stopped in a finally, before the
namespace and its /etc/netns directory are removed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.host.knobs.envfile import header_of
from nictune.host.knobs.jobenv import END_LINE

pytestmark = pytest.mark.netns

SSHD = "/usr/sbin/sshd"
PROFILE = """\
nictune: 1
host:
  environment:
    env: {UCX_IB_TRAFFIC_CLASS: 106, NVSHMEM_IB_TRAFFIC_CLASS: 106}
    # The namespace's own file hides the host's /etc/environment from the
    # namespace (ip netns exec binds it over the whole file).
    adopt: true
"""


@pytest.fixture
def netns():
    name = f"nt{secrets.token_hex(3)}e"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


def cli(ns: str, state, *args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--netns", ns, "--state-dir", str(state), "--json"])
    report = json.loads(result.stdout)
    assert report["hosts"], (result.stdout, result.stderr)
    return result.exit_code, report["hosts"][0]


def sshd_config(tmp_path) -> str:
    conf = tmp_path / "sshd_config"
    conf.write_text("\n".join([
        "ListenAddress 127.0.0.1", "Port 2222", f"HostKey {tmp_path / 'hostkey'}",
        f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM yes",  # the session's pam_env reads /etc/environment
        "StrictModes no", "UseDNS no", "PidFile none", ""]))
    return str(conf)


def ssh_printenv(ns: str, tmp_path, *names: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "ssh", "-i", str(tmp_path / "userkey"), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "-p", "2222", "root@127.0.0.1", "printenv", *names],
        capture_output=True, text=True, timeout=30)


def test_etc_environment_lines_reach_ssh_host_command(netns, tmp_path):
    for key in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / key)],
                       check=True, capture_output=True)
    shutil.copy(tmp_path / "userkey.pub", tmp_path / "authorized_keys")
    profile = tmp_path / "jobs.yaml"
    profile.write_text(PROFILE)
    state = tmp_path / "state"
    host_file = open("/etc/environment", "rb").read() if os.path.exists("/etc/environment") else None

    code, report = cli(netns, state, "plan", str(profile))
    [change] = report["changes"]
    assert code == 2 and "`ssh host command`" in change["note"] and "mpirun" in change["note"]
    assert f"/etc/netns/{netns}/environment" in change["note"]
    code, report = cli(netns, state, "apply", str(profile))
    assert code == 0, report
    own = f"/etc/netns/{netns}/environment"
    assert open(own).read() == (header_of("environment") + "UCX_IB_TRAFFIC_CLASS=106\n"
                                "NVSHMEM_IB_TRAFFIC_CLASS=106\n" + END_LINE)

    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    sshd = subprocess.Popen(["ip", "netns", "exec", netns, SSHD, "-D", "-f", sshd_config(tmp_path),
                             "-E", str(tmp_path / "sshd.log")])
    try:
        deadline = time.monotonic() + 20
        out = ssh_printenv(netns, tmp_path, "UCX_IB_TRAFFIC_CLASS", "NVSHMEM_IB_TRAFFIC_CLASS")
        while out.returncode == 255 and time.monotonic() < deadline:  # not listening yet
            time.sleep(0.2)
            out = ssh_printenv(netns, tmp_path, "UCX_IB_TRAFFIC_CLASS", "NVSHMEM_IB_TRAFFIC_CLASS")
        log = (tmp_path / "sshd.log").read_text() if (tmp_path / "sshd.log").exists() else ""
        assert out.returncode == 0, (out.stderr, log[-2000:])
        assert out.stdout.split() == ["106", "106"]
        # A change is rewritten in place (the file is the source of the bind
        # mount sshd's namespace holds), so the running sshd's next session
        # sees it; so does it see the rollback.
        profile.write_text(PROFILE.replace(": 106", ": 98"))  # both: lint wants them to agree
        code, report = cli(netns, state, "apply", str(profile))
        assert code == 0, report
        assert ssh_printenv(netns, tmp_path, "UCX_IB_TRAFFIC_CLASS").stdout == "98\n"
        code, _ = cli(netns, state, "rollback")
        assert code == 0
        assert ssh_printenv(netns, tmp_path, "UCX_IB_TRAFFIC_CLASS").stdout == "106\n"
    finally:
        sshd.terminate()
        try:
            sshd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sshd.kill()
            sshd.wait(timeout=10)
    # The host's own /etc/environment was never touched.
    now = open("/etc/environment", "rb").read() if os.path.exists("/etc/environment") else None
    assert now == host_file
