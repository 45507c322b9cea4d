"""The fleet lab itself: real sshd per namespace host, real OpenSSH and
paramiko clients, and a teardown that leaves nothing behind."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

import paramiko
import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.lab import fleet as fleetlab
from nictune.lab import namespaces as labmod

pytestmark = pytest.mark.netns
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def inventory_vars(fleet: fleetlab.Fleet) -> dict:
    """{host: {var: value}} from the host lines of the fleet's INI inventory."""
    hosts = {}
    for line in open(fleet.inventory):
        if line.startswith(fleet.prefix):
            name, *pairs = line.split()
            hosts[name] = dict(p.split("=", 1) for p in pairs)
    return hosts


def ssh_all(fleet: fleetlab.Fleet, hosts, command) -> dict:
    """OpenSSH's own client, on every host at once: {host: CompletedProcess}.
    command: a string, or a function of the host that returns one."""
    def text(h):
        return command(h) if callable(command) else command

    procs = {h.name: subprocess.Popen(["ssh", "-F", fleet.ssh_config, "-o", "BatchMode=yes", h.name, text(h)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h in hosts}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=30)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def mgmt_addresses(ip_json: str) -> list:
    return [a["local"] for a in json.loads(ip_json)[0]["addr_info"] if a["family"] == "inet"]


def root_links() -> set:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"] for link in json.loads(out)}


def namespaces() -> set:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_fleet_is_what_was_asked(fleet):
    kinds = [h.kind for h in fleet.hosts]
    assert kinds == ["sshd"] * 4 + ["silent", "unreachable"]
    assert [h.name for h in fleet.hosts] == [f"{fleet.prefix}h{i:03d}" for i in range(1, 7)]
    bridge = json.loads(subprocess.run(["ip", "-j", "-4", "addr", "show", f"{fleet.prefix}br"],
                                       capture_output=True, text=True, check=True).stdout)[0]
    net = bridge["addr_info"][0]
    assert net["local"].startswith("198.19.") and net["prefixlen"] == 24
    base = net["local"].rsplit(".", 1)[0]
    assert [h.address for h in fleet.hosts] == [f"{base}.{i + 1}" for i in range(1, 7)]
    assert fleet.of_kind("unreachable")[0].netns == ""
    for h in fleet.hosts[:5]:
        links = {link["ifname"]: link for link in json.loads(fleetlab.run_in(h, ["ip", "-j", "link"]).stdout)}
        assert set(links) == {"lo", "mgmt0", "rail0", "rail1"}
        assert links["rail0"]["link"] == "rail1"  # the rails are each other's peers, inside the host


def test_openssh_logs_in_to_each_host_and_sees_its_own_namespace(fleet):
    python = {name: v["nictune_python"] for name, v in inventory_vars(fleet).items()}
    hosts = fleet.of_kind("sshd")
    # One login per host: its mgmt0, the identity of its /etc/nccl.conf,
    # its HOME, and whether its agent python could import nictune.
    command = ("ip -j addr show mgmt0; stat -L -c %i /etc/nccl.conf; echo $HOME; "
               "{py} -c 'import sys, importlib.util; "
               "print(sys.version_info >= (3, 9), importlib.util.find_spec(\"nictune\") is None)'")
    results = ssh_all(fleet, hosts, lambda h: command.format(py=python[h.name]))
    for h in hosts:
        r = results[h.name]
        assert r.returncode == 0, r.stderr
        ip_json, inode, home, py = r.stdout.strip().split("\n")
        assert mgmt_addresses(ip_json) == [h.address]
        assert int(inode) == os.stat(f"/etc/netns/{h.netns}/nccl.conf").st_ino  # its own file
        assert home == os.path.join(fleet.dir, h.name, "home")
        assert open(os.path.join(home, ".bashrc")).read() == open("/etc/skel/.bashrc").read()
        assert py == "True True"  # python3 >= 3.9 and no nictune: it gets the zipapp
    assert len({r.stdout.split("\n")[1] for r in results.values()}) == len(hosts)


def test_paramiko_logs_in_with_the_generated_key_and_known_hosts(fleet, tmp_path):
    h = fleet.of_kind("sshd")[1]
    client = paramiko.SSHClient()
    client.load_host_keys(fleet.known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(h.address, port=h.port, username="root", key_filename=fleet.key_file,
                       look_for_keys=False, allow_agent=False, timeout=10)
        _, stdout, _ = client.exec_command("ip -j addr show mgmt0")
        assert mgmt_addresses(stdout.read().decode()) == [h.address]
    finally:
        client.close()

    # The known_hosts file is what vouches for the host: without it, refused.
    stranger = paramiko.SSHClient()
    stranger.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        stranger.connect(h.address, username="root", key_filename=fleet.key_file,
                         look_for_keys=False, allow_agent=False, timeout=10)
    stranger.close()


def test_sshd_accepts_only_the_fleet_key(fleet, tmp_path):
    other = str(tmp_path / "other_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
    h = fleet.of_kind("sshd")[0]
    # No -F: the fleet's ssh_config would offer the fleet key as well.
    r = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", other,
                        "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                        "-F", "/dev/null", f"root@{h.address}", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 255 and "Permission denied" in r.stderr


def test_the_silent_host_accepts_tcp_and_sends_nothing(fleet):
    h = fleet.of_kind("silent")[0]
    with socket.create_connection((h.address, h.port), timeout=2) as s:
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(1)
    assert h.name in inventory_vars(fleet)


def test_nothing_answers_at_the_unreachable_address(fleet):
    h = fleet.of_kind("unreachable")[0]
    with pytest.raises(OSError):  # a timeout, or "no route to host" once ARP gives up
        socket.create_connection((h.address, h.port), timeout=0.5).close()
    neigh = json.loads(subprocess.run(["ip", "-j", "neigh", "show", h.address], capture_output=True,
                                      text=True, check=True).stdout)
    assert all("lladdr" not in n for n in neigh)  # nobody answered ARP
    assert h.name in inventory_vars(fleet) and not os.path.exists(f"/run/netns/{h.name}")


def test_inventory_groups_as_ansible_reads_them(fleet):
    ansible_inventory = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    if not os.access(ansible_inventory, os.X_OK):
        pytest.skip("ansible-inventory is not installed next to this python")
    out = subprocess.run([ansible_inventory, "-i", fleet.inventory, "--list"], capture_output=True,
                         text=True, check=True, env={**os.environ, "ANSIBLE_NOCOLOR": "1"}).stdout
    inv = json.loads(out)
    names = [h.name for h in fleet.hosts]
    assert inv["canary"]["hosts"] == names[:1]
    assert inv["rest"]["hosts"] == names[1:4]
    assert sorted(inv["fleet"]["children"]) == ["canary", "rest"]
    assert sorted(inv["broken"]["children"]) == ["silent", "unreachable"]
    assert inv["silent"]["hosts"] == names[4:5] and inv["unreachable"]["hosts"] == names[5:6]
    assert len(fleet.hosts) == 6, fleet.hosts
    for h in fleet.hosts:
        v = inv["_meta"]["hostvars"][h.name]
        assert v["ansible_host"] == h.address and v["ansible_user"] == "root"
        assert v["ansible_ssh_private_key_file"] == fleet.key_file
        assert v["nictune_state_dir"] == os.path.join(fleet.dir, h.name, "state")
    known_hosts = open(fleet.known_hosts).read().splitlines(keepends=True)
    assert known_hosts, fleet.known_hosts
    for line in known_hosts:
        assert re.match(r"^198\.19\.\d+\.\d+ ssh-ed25519 \S+$", line)


def test_a_second_fleet_gets_its_own_subnet(fleet, make_fleet, monkeypatch):
    # The first pick is the first fleet's /24, as if both were built at the
    # same moment: the check after taking it must notice and move on.
    taken = ipaddress.ip_network(fleet.hosts[0].address + "/24", strict=False)
    picks = []

    def choice(free):
        picks.append(taken if not picks else random.Random().choice(free))
        return picks[-1]

    monkeypatch.setattr(fleetlab.random, "choice", choice)
    other = make_fleet(1)
    assert len(picks) == 2
    assert other.hosts[0].address.rsplit(".", 1)[0] != fleet.hosts[0].address.rsplit(".", 1)[0]
    r = ssh_all(other, other.hosts, "ip -j addr show mgmt0")[other.hosts[0].name]
    assert r.returncode == 0 and mgmt_addresses(r.stdout) == [other.hosts[0].address]


def test_down_removes_everything_and_only_once(make_fleet):
    had_nccl = os.path.exists(labmod.NCCL)
    f = make_fleet(2, silent=1, unreachable=1)
    record = json.load(open(f.record))
    pids = [p["pid"] for p in record["processes"]]
    # A login still running when the fleet goes down: sshd's per-connection
    # child leaves the listener's process group, so it must be found anyway.
    session = subprocess.Popen(["ssh", "-F", f.ssh_config, "-o", "BatchMode=yes", f.hosts[0].name,
                                "echo started; exec sleep 60"], stdout=subprocess.PIPE, text=True)
    try:
        assert session.stdout.readline() == "started\n"
        inside = [int(p) for p in fleetlab.run_in(f.hosts[0], ["ip", "netns", "pids", f.hosts[0].netns]).stdout.split()]
        assert len(inside) >= 2  # the listener, its session children, the sleep

        removed = fleetlab.down(f.record)
        assert session.wait(timeout=10) != 0  # the server end went away under it
    finally:
        session.kill()
        session.wait()
    names = {h.name for h in f.hosts}
    assert not names & namespaces()
    assert not (names | {f"{f.prefix}br"}) & root_links()
    assert not [p for p in pids + inside if alive(p)]
    assert os.listdir(f.dir) == []  # pytest made the directory: down() empties it, pytest removes it
    assert not [h for h in f.hosts if os.path.exists(f"/etc/netns/{h.name}")]
    # The empty /etc/nccl.conf a lab made stays only while some namespace still binds over it.
    still_bound = any(os.path.exists(f"/etc/netns/{ns}/nccl.conf") for ns in os.listdir("/etc/netns"))
    assert os.path.exists(labmod.NCCL) == (had_nccl or still_bound)
    assert f"netns {f.hosts[0].name}" in removed and f"link {f.prefix}br" in removed
    assert fleetlab.down(f.record) == []  # idempotent


def test_down_after_a_crash_works_from_the_record_alone(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    directory = str(tmp_path_factory.mktemp("crash"))
    record = os.path.join(directory, "record.json")
    prefix = "nt" + os.urandom(2).hex()
    # Another process builds the fleet and dies without tearing it down.
    script = ("import sys; from nictune.lab import fleet as fleetlab; "
              "fleetlab.up(2, sys.argv[1], prefix=sys.argv[2]); print('up', flush=True); "
              "import time; time.sleep(120)")
    builder = subprocess.Popen([sys.executable, "-c", script, directory, prefix], stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout.readline() == "up\n"
        builder.send_signal(signal.SIGKILL)
        builder.wait()
        pids = [p["pid"] for p in json.load(open(record))["processes"]]
        assert all(alive(p) for p in pids)  # orphaned servers, not our children
        removed = fleetlab.down(record)
    finally:
        builder.kill()
        builder.wait()
        fleetlab.down(record)
    assert {f"process {p}" for p in pids} <= set(removed)
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # orphans are reaped by init, not by us
    assert not [p for p in pids if alive(p)]
    assert not {f"{prefix}h001", f"{prefix}h002"} & namespaces()


def test_down_leaves_alone_what_the_record_does_not_list(make_fleet):
    f = make_fleet(1)
    bystander = subprocess.Popen(["sleep", "60"])  # stands for a process that reused a recorded PID
    extra_ns = f"{f.prefix}h999"
    try:
        subprocess.run(["ip", "netns", "add", extra_ns], check=True)
        record = json.load(open(f.record))
        record["processes"].append({"pid": bystander.pid, "host": "x", "argv": record["processes"][0]["argv"],
                                    "netns": f.hosts[0].netns})
        with open(f.record, "w") as out:
            json.dump(record, out)
        removed = fleetlab.down(f.record)
        assert bystander.poll() is None and f"process {bystander.pid}" not in removed
        assert extra_ns in namespaces()
    finally:
        bystander.kill()
        bystander.wait()
        subprocess.run(["ip", "netns", "del", extra_ns], capture_output=True)


def test_up_refuses_what_is_in_use_and_cleans_up_when_a_server_fails(fleet, make_fleet, tmp_path, monkeypatch):
    with pytest.raises(fleetlab.FleetError, match="in use"):
        make_fleet(1, prefix=fleet.prefix)
    processes = json.load(open(fleet.record))["processes"]
    assert processes, fleet.record
    assert all(alive(p["pid"]) for p in processes)  # untouched
    with pytest.raises(fleetlab.FleetError, match="not empty"):
        fleetlab.up(1, fleet.dir, prefix="nt" + os.urandom(2).hex())
    with pytest.raises(fleetlab.FleetError, match=f"1 to {fleetlab.MAX_HOSTS}"):
        fleetlab.up(fleetlab.MAX_HOSTS, str(tmp_path / "big"), prefix="nt" + os.urandom(2).hex(), unreachable=1)

    monkeypatch.setattr(fleetlab, "SSHD", "/bin/false")  # a server that dies at once
    prefix = "nt" + os.urandom(2).hex()
    with pytest.raises(fleetlab.FleetError, match=rf"fleet host {prefix}h001 \(198\.19\.\d+\.2:22, sshd\)"):
        make_fleet(1, prefix=prefix)
    assert f"{prefix}h001" not in namespaces() and f"{prefix}br" not in root_links()


def test_lab_cli_builds_reports_and_removes_a_fleet(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if os.path.exists(fleetlab.LAB_POINTER) or labmod.status()["namespaces"]:
        pytest.skip("a lab is up on this machine; not touching it")
    runner = CliRunner()
    directory = str(tmp_path / "lab")
    try:
        r = runner.invoke(app, ["lab", "up", "--hosts", "2", "--dir", directory])
        assert r.exit_code == 0, r.output
        assert f"inventory:  {directory}/inventory.ini" in r.output
        assert "nictune plan profiles/lab-fleet.yaml -i" in r.output
        r = runner.invoke(app, ["lab", "up", "--hosts", "2", "--dir", str(tmp_path / "again")])
        assert r.exit_code == 1 and "already up" in r.output
        r = runner.invoke(app, ["lab", "status", "--json"])
        status = json.loads(r.stdout)["lab"]["fleet"]
        assert [h["name"] for h in status["hosts"]] == ["ntfh001", "ntfh002"]
        assert all(h["running"] for h in status["hosts"])
        r = runner.invoke(app, ["lab", "down"])
        assert r.exit_code == 0 and "removed fleet: process 2, netns 2" in r.output
    finally:
        fleetlab.lab_down()
    assert not os.path.exists(directory) and "ntfh001" not in namespaces()
    assert json.loads(runner.invoke(app, ["lab", "status", "--json"]).stdout)["lab"]["fleet"] is None


def test_a_fleet_split_across_joined_bridges_is_one_segment_and_goes_down_whole(make_fleet, monkeypatch):
    # Two hosts per bridge (1,000 hosts take 500): three sshd hosts and a
    # silent one on two bridges, their data rails likewise.
    monkeypatch.setattr(fleetlab, "HOSTS_PER_BRIDGE", 2)
    f = make_fleet(3, silent=1, data_rails=True)
    p = f.prefix
    bridges = json.load(open(f.record))["bridges"]
    assert bridges == [f"{p}br", f"{p}br2"]

    def ports(bridge):
        out = subprocess.run(["ip", "-j", "link", "show", "master", bridge], capture_output=True,
                             text=True, check=True).stdout
        return sorted(link["ifname"] for link in json.loads(out))

    assert ports(f"{p}br") == sorted([f"{p}h001", f"{p}h002", f"{p}br2b"])
    assert ports(f"{p}br2") == sorted([f"{p}h003", f"{p}h004", f"{p}br2a"])
    assert ports(f"{p}rb2") == sorted([f"{p}d003", f"{p}d004", f"{p}rb2a"])
    # The controller reaches the host behind the join through the first
    # bridge's address; host 1 reaches host 3's data rail across the join.
    far = f.hosts[2]
    r = ssh_all(f, [far], "ip -j addr show mgmt0")[far.name]
    assert r.returncode == 0 and mgmt_addresses(r.stdout) == [far.address]
    ping = fleetlab.run_in(f.hosts[0], ["ping", "-c", "1", "-W", "5", far.data_address])
    assert ping.returncode == 0, ping.stdout + ping.stderr

    fleetlab.down(f.record)
    made = {f"{p}{name}" for name in ("br", "br2", "br2a", "br2b", "rb", "rb2", "rb2a", "rb2b")}
    assert not made & root_links()
    assert not {h.name for h in f.hosts} & namespaces()
