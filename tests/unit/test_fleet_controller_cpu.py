"""Controller CPU of a fleet run that must not grow with the fleet (issue 13):
the agent archive built once however many workers start at once, and
known_hosts looked up by name, as paramiko would answer, without scanning
every entry per host.  Also the fleet lab's sizing for 500 hosts."""

from __future__ import annotations

import json
import threading
import time

import paramiko
import pytest

from nictune.control.remote import agentzip, ssh
from nictune.lab import fleet as fleetlab


def _key(seed: int) -> paramiko.PKey:
    blob = paramiko.Message()
    blob.add_string("ssh-ed25519")
    blob.add_string(bytes([seed]) * 32)
    return paramiko.Ed25519Key(data=blob.asbytes())


def _line(names: str, key: paramiko.PKey) -> str:
    return f"{names} {key.get_name()} {key.get_base64()}\n"


# -- the archive ------------------------------------------------------------------

class _Channel:
    """An exec channel whose agent has the archive cached and answers at once."""

    def __init__(self):
        self.out = b"have\n"
        self.status_event = threading.Event()
        self.status_event.set()

    def exec_command(self, command):
        pass

    def settimeout(self, t):
        pass

    def recv(self, n):
        data, self.out = self.out, b""
        return data

    def sendall(self, data):
        if data.startswith(b"{"):
            self.out = json.dumps({"changes": [], "warnings": [], "error": None, "seconds": 0.01}).encode() + b"\n"

    def shutdown_write(self):
        pass


class _Client:
    def get_transport(self):
        return self

    def get_username(self):
        return "root"

    def open_session(self, timeout=None):
        return _Channel()


def test_the_agent_archive_is_built_once_when_many_sessions_start_together(monkeypatch):
    builds = []
    real_add = agentzip._add

    def slow_add(z, name, data):
        if name == "__main__.py":
            builds.append(name)
        time.sleep(0.001)  # a real build takes tens of ms: the race is wide
        real_add(z, name, data)

    monkeypatch.setattr(agentzip, "_add", slow_add)
    agentzip.build.cache_clear()
    # probe=False: the agent's path, the one that sends the archive (a verify
    # would ask the probe first).
    targets = [ssh.SshTarget(ssh.SshHost(label=f"h{i}", address="198.18.0.2"), ssh.SshOptions(probe=False))
               for i in range(8)]
    start = threading.Barrier(len(targets))
    reports = []

    def one(target):
        start.wait()
        reports.append(target._exchange(_Client(), {"command": "verify"}, confirm=False))

    threads = [threading.Thread(target=one, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agentzip.build.cache_clear()
    assert len(reports) == 8 and all(r["ok"] for r in reports)
    assert builds == ["__main__.py"]


def test_packet_macs_are_compared_in_c_with_the_same_answers():
    import hmac

    from paramiko import packet

    compare = packet.util.constant_time_bytes_eq
    assert compare is hmac.compare_digest
    assert compare(b"\x01" * 32, b"\x01" * 32) and not compare(b"\x01" * 32, b"\x01" * 31 + b"\x02")
    assert not compare(b"\x01" * 32, b"\x01" * 20)


# -- known_hosts ------------------------------------------------------------------

def test_known_hosts_lookups_answer_as_paramiko_does(tmp_path):
    a, b, c, d = (_key(i) for i in (1, 2, 3, 4))
    hashed = paramiko.HostKeys.hash_host("198.18.0.9")
    path = tmp_path / "known_hosts"
    path.write_text(
        "# a comment\n\n"
        + _line("198.18.0.2", a)
        + _line("gpu01,198.18.0.3", b)
        + _line("[198.18.0.4]:2222", c)
        + _line(hashed, d)
        + _line("198.18.0.2", b)            # a second ed25519 key: the first wins
        + "198.18.0.5 ssh-ed25519\n"  # no key: skipped by both
        + _line("198.18.0.3", a)
    )
    ours = ssh.KnownHosts.read(str(path))
    theirs = paramiko.HostKeys(str(path))
    for host in ("198.18.0.2", "gpu01", "198.18.0.3", "[198.18.0.4]:2222", "198.18.0.4",
                 "198.18.0.9", "198.18.0.5", "198.18.0.99", hashed):
        want = {k: v.get_base64() for k, v in (theirs.lookup(host) or {}).items()}
        assert {k: v.get_base64() for k, v in ours.lookup(host).items()} == want, host


def test_known_hosts_add_replaces_a_key_of_the_same_type_or_appends():
    table = ssh.KnownHosts()
    table.add("198.18.0.2", _key(1))
    table.add("198.18.0.2", _key(2))
    table.add("198.18.0.3", _key(3))
    assert table.lookup("198.18.0.2")["ssh-ed25519"].get_base64() == _key(2).get_base64()
    assert table.lookup("198.18.0.3")["ssh-ed25519"].get_base64() == _key(3).get_base64()


def test_known_hosts_of_a_big_fleet_are_not_scanned_per_host(tmp_path, monkeypatch):
    """500 hosts in one file, each looked up once: no entry-by-entry match
    (paramiko's HostKeys did 375,000 of them: quadratic in hosts)."""
    hosts = [f"198.18.{i // 250}.{i % 250 + 2}" for i in range(500)]
    path = tmp_path / "known_hosts"
    path.write_text("".join(_line(h, _key(i % 250 + 1)) for i, h in enumerate(hosts)))
    calls = []
    real = paramiko.HostKeys._hostname_matches

    def counting(self, hostname, entry):
        calls.append(1)
        return real(self, hostname, entry)

    monkeypatch.setattr(paramiko.HostKeys, "_hostname_matches", counting)
    monkeypatch.setattr(ssh, "_known_hosts", {})
    assert hosts
    for i, h in enumerate(hosts):
        assert ssh._known_keys([str(path)], h)["ssh-ed25519"].get_base64() == _key(i % 250 + 1).get_base64()
    assert len(calls) == 0


# -- the fleet lab at 500 hosts ----------------------------------------------------

@pytest.mark.parametrize("hosts, prefix", [(1, 24), (253, 24), (254, 23), (500, 23), (509, 23), (510, 22)])
def test_the_fleet_subnet_holds_bridge_hosts_and_broadcast(hosts, prefix):
    assert fleetlab.subnet_prefix(hosts) == prefix
    assert hosts + 3 <= 2 ** (32 - prefix)


def test_a_fleet_of_500_is_allowed_and_raises_the_neighbour_limits_only_when_needed():
    assert fleetlab.MAX_HOSTS >= 500
    assert fleetlab.neigh_limits_for(200) is None
    low, soft, hard = fleetlab.neigh_limits_for(500)
    assert 500 < low < soft < hard


def test_neighbour_limits_are_restored_unless_changed_since(tmp_path, monkeypatch):
    for i, value in ((1, 128), (2, 512), (3, 1024)):
        (tmp_path / f"t{i}").write_text(f"{value}\n")
    monkeypatch.setattr(fleetlab, "NEIGH_SYSCTL", str(tmp_path / "t{}"))
    record = fleetlab._Record(str(tmp_path / "record.json"), {})
    fleetlab._raise_neigh_limits(record, 500)
    assert [int((tmp_path / f"t{i}").read_text()) for i in (1, 2, 3)] == fleetlab.neigh_limits_for(500)
    saved = json.loads((tmp_path / "record.json").read_text())["neigh"]
    (tmp_path / "t3").write_text("99999\n")  # someone else's since
    fleetlab._restore_neigh_limits(saved and {"neigh": saved})
    assert [int((tmp_path / f"t{i}").read_text()) for i in (1, 2, 3)] == [128, 512, 99999]


# -- the bench's own audit (bench/fleet/checks.py: pyinfra facts-only, ssh floor) --

def _bench_checks():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "fleet" / "checks.py"
    spec = importlib.util.spec_from_file_location("bench_fleet_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ETHTOOL_K = """Features for rail0:
rx-checksumming: on
tx-checksumming: on
\ttx-checksum-ip-generic: on
generic-segmentation-offload: on
generic-receive-offload: on
large-receive-offload: off [fixed]
rx-udp-gro-forwarding: on
"""


def test_the_bench_floor_finds_each_kind_of_drift_once_and_nothing_on_a_good_host():
    checks = _bench_checks()
    good = dict(checks.SYSCTLS)
    assert checks.drifts(good, "9000", "up", ETHTOOL_K, checks.NCCL) == []
    spoiled = dict(good, **{"net.ipv4.tcp_ecn": "2"})
    found = checks.drifts(spoiled, "1500", "up", ETHTOOL_K.replace("generic-receive-offload: on",
                                                                   "generic-receive-offload: off"),
                          checks.NCCL.replace("NCCL_IB_TIMEOUT=22", "NCCL_IB_TIMEOUT=23"))
    assert [f.split()[0] for f in found] == ["sysctl", "rail0", "rail0", "NCCL"]
    assert "net.ipv4.tcp_ecn" in found[0] and "mtu=1500" in found[1] and "generic-receive-offload" in found[2]
    assert checks.drifts(good, "9000", "down", ETHTOOL_K, checks.NCCL) == ["rail0 link mtu=9000 operstate=down"]
