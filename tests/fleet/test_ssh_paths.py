"""The other ways into a host: a login user that is not root (the agent runs
under `sudo -n`), a ProxyJump chain, and keys held by ssh-agent.

Real sshd, real sudo, real ssh-agent.  A host's own users and sudoers are
files in /etc/netns/<ns>/, which `ip netns exec` binds over /etc/* for the
sshd it starts (and so for sudo in its sessions): the machine's own
/etc/passwd, /etc/shadow, /etc/group and /etc/sudoers are never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest
from fleet_helpers import mtu, nictune

from nictune.lab import fleet as fleetlab
from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

OPS_USER = "ntops"
OPS_UID = 4242  # the first free uid from here on is used


def logins(fleet, host, user="root") -> list:
    """The addresses host's sshd accepted a key login for `user` from, oldest first."""
    marker = f"Accepted publickey for {user} from "
    with open(os.path.join(fleet.dir, host.name, "sshd.log")) as f:
        return [line.split(marker, 1)[1].split()[0] for line in f if marker in line]


def write_inventory(fleet, path, hosts, drop=(), **changes) -> str:
    """The fleet's inventory cut down to `hosts`, with host variables changed
    (var=value) or dropped (names in `drop`); group sections and [all:vars] kept."""
    names = {h.name for h in hosts}
    out = []
    for line in open(fleet.inventory).read().splitlines():
        name, *variables = line.split() or [""]
        if variables and not line.startswith(("[", "#", "ansible_ssh_common_args")):
            if name not in names:
                continue
            pairs = [v.split("=", 1) for v in variables]
            line = " ".join([name] + [f"{var}={changes.get(var, value)}"
                                      for var, value in pairs if var not in drop])
        out.append(line)
    path.write_text("\n".join(out) + "\n")
    return str(path)


# -- a login user that is not root -----------------------------------------------

def _free_uid() -> int:
    with open("/etc/passwd") as f:
        entries = [line.split(":") for line in f if line.strip()]
    if any(e[0] == OPS_USER for e in entries):
        pytest.skip(f"this machine already has a user {OPS_USER}")
    taken = {int(e[2]) for e in entries} | {int(line.split(":")[2]) for line in open("/etc/group")}
    return next(uid for uid in range(OPS_UID, OPS_UID + 1000) if uid not in taken)


def _give_host_an_ops_user(fleet, host, home: str, uid: int, may_sudo: bool) -> None:
    """Copies of the machine's passwd, group, shadow and sudoers plus the
    user, in /etc/netns/<ns>/ (removed by the fleet's down()); the host's sshd
    reads that user's key from its home, which the user can read (sshd reads
    keys as the user, and the fleet directory is root's alone)."""
    etc = f"/etc/netns/{host.netns}"

    def copy_plus(name: str, line: str, mode: int) -> None:
        with open(f"/etc/{name}") as f:
            text = f.read().rstrip("\n") + "\n" + line
        path = os.path.join(etc, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)

    copy_plus("passwd", f"{OPS_USER}:x:{uid}:{uid}:nictune fleet test:{home}:/bin/sh\n", 0o644)
    copy_plus("group", f"{OPS_USER}:x:{uid}:\n", 0o644)
    # "*": no password, but not locked ("!"), which sshd refuses under UsePAM no.
    copy_plus("shadow", f"{OPS_USER}:*:19000:0:99999:7:::\n", 0o640)
    rule = f"{OPS_USER} ALL=(root) NOPASSWD: ALL\n" if may_sudo else ""
    copy_plus("sudoers", rule, 0o440)
    with open(os.path.join(fleet.dir, host.name, "sshd_config"), "a") as f:
        f.write(f"Match User {OPS_USER}\n    AuthorizedKeysFile %h/.ssh/authorized_keys\n")
    fleetlab.restart_sshd(fleet, host)


@pytest.fixture
def ops_home():
    """The test user's home: outside the (root-only) pytest directory."""
    home = tempfile.mkdtemp(prefix="nt-ntops-")
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_non_root_login_runs_the_agent_under_sudo(make_fleet, profile, tmp_path, ops_home):
    if shutil.which("sudo") is None:
        pytest.skip("needs sudo (scripts/setup installs it)")
    fleet = make_fleet(2)
    allowed, denied = fleet.of_kind("sshd")
    uid = _free_uid()
    os.chmod(ops_home, 0o755)
    os.makedirs(os.path.join(ops_home, ".ssh"))
    shutil.copy(os.path.join(fleet.dir, "authorized_keys"), os.path.join(ops_home, ".ssh"))
    for path in (ops_home, os.path.join(ops_home, ".ssh"),
                 os.path.join(ops_home, ".ssh", "authorized_keys")):
        os.chown(path, uid, uid)
    _give_host_an_ops_user(fleet, allowed, ops_home, uid, may_sudo=True)
    _give_host_an_ops_user(fleet, denied, ops_home, uid, may_sudo=False)
    inventory = write_inventory(fleet, tmp_path / "inv.ini", [allowed, denied],
                                ansible_user=OPS_USER)
    state = {h.name: os.path.join(fleet.dir, h.name, "state") for h in (allowed, denied)}

    code, report = nictune("apply", profile, "-i", inventory, "--limit", allowed.name)
    assert code == 0, report
    assert logins(fleet, allowed, OPS_USER) and not logins(fleet, allowed, "root")
    assert mtu(allowed) == 9000 and mtu(allowed, "rail1") == 9000
    # What the agent wrote is root's: it ran as root, not as the login user.
    journal = os.stat(os.path.join(state[allowed.name], "journal.json"))
    cache = os.stat(os.path.join(state[allowed.name], "agent"))
    assert journal.st_uid == 0 and cache.st_uid == 0
    assert cache.st_mode & 0o777 == 0o700

    code, report = nictune("apply", profile, "-i", inventory, "--limit", denied.name)
    [host] = report["hosts"]
    assert code == 1 and host["error"]["kind"] == "transport", host
    message = host["error"]["message"]
    assert message.startswith(denied.name) and "sudo" in message and "password is required" in message
    assert logins(fleet, denied, OPS_USER)  # the login worked: sudo refused
    assert mtu(denied) == 1500 and mtu(denied, "rail1") == 1500
    assert not os.path.exists(os.path.join(state[denied.name], "agent"))
    assert not os.path.exists(os.path.join(state[denied.name], "journal.json"))


# -- ProxyJump -------------------------------------------------------------------

def test_proxyjump_reaches_a_host_through_another(fleet, profile, tmp_path):
    jump, far = fleet.of_kind("sshd")[:2]
    run_in(far, ["ip", "link", "set", "rail0", "mtu", "1400"])  # only far has this
    config = tmp_path / "ssh_config"
    # paramiko, like OpenSSH, takes each option from the first block that sets it.
    config.write_text(f"Host {far.address}\n  ProxyJump {jump.name}\n\n"
                      + open(fleet.ssh_config).read())
    seen = len(logins(fleet, far))

    code, report = nictune("plan", profile, "-i", fleet.inventory, "--limit", far.name,
                           "--ssh-config", str(config))
    [host] = report["hosts"]
    assert code == 2 and host["ok"], host  # 2: changes to make
    rail0 = next(c for c in host["changes"] if c["key"]["target"] == "rail0")
    assert (rail0["before"], rail0["after"]) == (1400, 9000)
    # far's sshd saw the login come from the jump host, not from the controller.
    assert logins(fleet, far)[seen:] == [jump.address]

    empty = tmp_path / "known_hosts.empty"
    empty.write_text("")
    config.write_text(f"Host {jump.name}\n  UserKnownHostsFile {empty}\n\n" + config.read_text())
    code, report = nictune("plan", profile, "-i", fleet.inventory, "--limit", far.name,
                           "--ssh-config", str(config))
    [host] = report["hosts"]
    assert code == 1 and host["error"]["kind"] == "transport", host
    message = host["error"]["message"]
    assert jump.address in message and "unknown host key" in message
    assert far.address not in message
    assert len(logins(fleet, far)) == seen + 1  # never reached far


def test_a_jump_host_that_cannot_reach_the_target_is_a_transport_error(fleet, profile, tmp_path):
    jump, far = fleet.of_kind("sshd")[:2]
    config = tmp_path / "ssh_config"
    # Nothing listens on far's port 2222: the jump host's sshd refuses to forward.
    config.write_text(f"Host {far.address}\n  ProxyJump {jump.name}\n  Port 2222\n\n"
                      + open(fleet.ssh_config).read())
    code, report = nictune("plan", profile, "-i", fleet.inventory, "--limit", far.name,
                           "--ssh-config", str(config))
    [host] = report["hosts"]
    assert code == 1 and host["error"]["kind"] == "transport" and host["unreachable"], host
    assert jump.name in host["error"]["message"] and "2222" in host["error"]["message"]


# -- ssh-agent -------------------------------------------------------------------

@pytest.fixture
def ssh_agent(tmp_path):
    """A private ssh-agent (its socket in tmp_path), stopped when the test ends."""
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("needs OpenSSH's ssh-agent and ssh-add")
    sock = str(tmp_path / "agent.sock")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.exists(sock), "ssh-agent did not start"
        yield sock
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=5)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def test_keys_from_ssh_agent(fleet, profile, tmp_path, ssh_agent, monkeypatch):
    host = fleet.of_kind("sshd")[2]
    inventory = write_inventory(fleet, tmp_path / "inv.ini", [host],
                                drop=("ansible_ssh_private_key_file",))
    # IdentitiesOnly=yes would, in OpenSSH, keep the agent's keys out.
    text = open(inventory).read().replace(" -o IdentitiesOnly=yes", "")
    open(inventory, "w").write(text)
    # No ssh config either: the key can only come from the agent.
    args = ("plan", profile, "-i", inventory, "--limit", host.name, "--ssh-config", "/dev/null")

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    code, report = nictune(*args)
    error = report["hosts"][0]["error"]
    assert code == 1 and error["kind"] == "transport" and "authentication" in error["message"]

    add = subprocess.run(["ssh-add", "-q", fleet.key_file], capture_output=True, text=True,
                         env={**os.environ, "SSH_AUTH_SOCK": ssh_agent})
    assert add.returncode == 0, add.stderr
    monkeypatch.setenv("SSH_AUTH_SOCK", ssh_agent)
    code, report = nictune(*args)
    assert code == 2 and report["hosts"][0]["ok"], report  # 2: changes to make
