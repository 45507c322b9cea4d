"""host.ovs against a real ovsdb-server (Debian's openvswitch-switch):
plan, apply, verify and rollback through the CLI on this host (LocalTarget,
a temporary state directory), each read back by ovsdb-client, OVS's own
client, not by nictune.

Each test starts its own ovsdb-server (tests/ovsdb.py), killed when the
test ends, whatever happened.  No ovs-vswitchd runs:
these tests prove what reaches the database, not what the daemon does with
it (that needs a NIC with an eswitch).

Without the OVS tools the tests skip, loudly; under CI (CI=true) they fail
instead (tests/skips.py), so that CI never passes having tested nothing.
"""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.host.knobs.ovs import OvsFamily
from nictune.host.machine import Host
from nictune.host.model import HOST, Key
from ovsdb import OTHER, running_ovsdb


@pytest.fixture
def ovs(tmp_path):
    with running_ovsdb(tmp_path) as db:
        yield db


def nictune(tmp_path, *args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--state-dir", str(tmp_path / "state"), "--json"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"no JSON report: {result.output}")


def profile(tmp_path, ovs_section: str, on_unsupported: str = "fail") -> str:
    path = tmp_path / "ovs.yaml"
    path.write_text(f"nictune: 1\non_unsupported: {on_unsupported}\nhost:\n  ovs:\n"
                    + "".join(f"    {line}\n" for line in ovs_section.strip().splitlines()))
    return str(path)


def changes(report: dict) -> dict:
    (host,) = report["hosts"]
    return {c["key"]["name"].partition("@")[0]: c for c in host["changes"]}


def test_apply_sets_both_keys_alone_and_rollback_restores_their_absence(ovs, tmp_path):
    path = profile(tmp_path, f"hw_offload: true\ntc_policy: skip_sw\ndb: {ovs.sock}")

    code, report = nictune(tmp_path, "plan", path)
    assert code == 2, report
    plan = changes(report)
    assert {n: (c["before"], c["after"], c["status"]) for n, c in plan.items()} == {
        "hw_offload": (None, True, "pending"), "tc_policy": (None, "skip_sw", "pending")}
    assert "turns offload on at once" in plan["hw_offload"]["note"]
    assert plan["tc_policy"]["source"].endswith("ovs.yaml:6")
    assert ovs.other_config() == OTHER  # a plan writes nothing

    code, report = nictune(tmp_path, "apply", path)
    assert code == 0, report
    assert {c["status"] for c in changes(report).values()} == {"applied"}
    assert ovs.other_config() == {**OTHER, "hw-offload": "true", "tc-policy": "skip_sw"}

    assert nictune(tmp_path, "verify", path)[0] == 0
    ovs.set_other(**{"tc-policy": "none"})  # drift, by hand
    code, report = nictune(tmp_path, "verify", path)
    assert code == 2 and changes(report)["tc_policy"]["status"] == "drift"
    assert changes(report)["tc_policy"]["before"] == "none"
    ovs.set_other(**{"tc-policy": "skip_sw"})

    code, report = nictune(tmp_path, "rollback")
    assert code == 0, report
    assert ovs.other_config() == OTHER  # absent again, and the other key as it was


def test_rollback_restores_the_exact_previous_entries(ovs, tmp_path):
    # What an operator left: an odd spelling OVS reads as off, and a policy.
    ovs.set_other(**{"hw-offload": "False", "tc-policy": "skip_hw"})
    before = ovs.other_config()
    path = profile(tmp_path, f"hw_offload: true\ntc_policy: none\ndb: {ovs.sock}")

    code, report = nictune(tmp_path, "plan", path)
    assert code == 2
    assert changes(report)["hw_offload"]["before"] == "False"
    code, report = nictune(tmp_path, "apply", path)
    assert code == 0, report
    assert ovs.other_config() == {**OTHER, "hw-offload": "true", "tc-policy": "none"}

    # Now on: the plan of turning it off says it waits for a restart.
    off = profile(tmp_path, f"hw_offload: false\ndb: {ovs.sock}")
    code, report = nictune(tmp_path, "plan", off)
    assert "until it restarts" in changes(report)["hw_offload"]["note"]

    assert nictune(tmp_path, "rollback")[0] == 0
    assert ovs.other_config() == before


def test_a_concurrent_change_is_not_overwritten(ovs):
    fam = OvsFamily(Host("/"))
    hw = Key("ovs", HOST, f"hw_offload@{ovs.sock}")
    assert fam.read([hw]) == {hw: None}
    # Another key of other_config moves after the read: written all the same.
    ovs.set_other(**{"vlan-limit": "2"})
    fam.apply([(hw, True)])
    assert ovs.other_config() == {**OTHER, "vlan-limit": "2", "hw-offload": "true"}
    # Our own key moves after the read: refused, and left as the other set it.
    assert fam.read([hw]) == {hw: True}
    ovs.set_other(**{"hw-offload": "false"})
    with pytest.raises(ValueError, match="changed since nictune read it"):
        fam.apply([(hw, None)])
    assert ovs.other_config()["hw-offload"] == "false"


def test_without_ovs_the_keys_are_unsupported_with_the_reason(tmp_path):
    nowhere = tmp_path / "no-ovs" / "db.sock"
    path = profile(tmp_path, f"hw_offload: true\ndb: {nowhere}")
    code, report = nictune(tmp_path, "plan", path)
    assert code == 1
    hw = changes(report)["hw_offload"]
    assert hw["status"] == "unsupported"
    assert hw["note"].startswith("OVS is not running here") and str(nowhere) in hw["note"]

    path = profile(tmp_path, f"hw_offload: true\ndb: {nowhere}", on_unsupported="warn")
    code, report = nictune(tmp_path, "apply", path)
    assert code == 0 and changes(report)["hw_offload"]["status"] == "skipped"


def test_a_socket_nobody_listens_on_reads_as_ovs_not_running(tmp_path):
    import socket

    stale = tmp_path / "db.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))  # bound, never listening: ovsdb-server died
    try:
        fam = OvsFamily(Host("/"))
        key = Key("ovs", HOST, f"tc_policy@{stale}")
        assert "nothing listens on it" in fam.read([key])[key].reason
    finally:
        s.close()


@pytest.mark.parametrize("line, said", [
    ("tc_policy: skip_both", "tc_policy"),
    ("hw_offload: yes please", "hw_offload"),
    ("db: run/openvswitch/db.sock", "db"),
    ("db: /var/run/../run/db.sock", "db"),
])
def test_bad_values_are_refused_with_file_and_line(tmp_path, line, said):
    path = profile(tmp_path, f"hw_offload: true\n{line}")
    code, report = nictune(tmp_path, "plan", path)
    assert code == 1
    message = json.dumps(report)
    assert "ovs.yaml:6" in message and said in message, message


def test_nic_support():
    assert OvsFamily.nic_support("mana", "ovs.hw_offload").startswith("not supported by mana")
    assert OvsFamily.nic_support("mana", "ovs.tc_policy").startswith("not supported by mana")
    assert "switchdev" in OvsFamily.nic_support("mlx5_core", "ovs.hw_offload")
    assert OvsFamily.nic_support("ixgbe", "ovs.hw_offload") is None
    assert OvsFamily.nic_support("mana", "ovs.db") is None


def test_the_client_answers_echo_and_reads_split_replies(tmp_path):
    """A scripted peer, not ovsdb-server: what a short session with the real
    server never shows (its keepalive echo; a reply cut inside a UTF-8
    character by the stream)."""
    import socket
    import threading

    from nictune.host.transports import ovsdb

    path = str(tmp_path / "peer.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    seen = []

    def peer():
        conn, _ = listener.accept()
        with conn:
            request = json.loads(conn.recv(65536))
            conn.sendall(b'{"method":"echo","params":["x"],"id":"e1"}')
            seen.append(json.loads(conn.recv(65536)))
            reply = json.dumps({"id": request["id"], "error": None,
                                "result": ["Open_vSwitch", "caf\u00e9"]}, ensure_ascii=False)
            data = reply.encode()
            cut = data.index("\u00e9".encode()) + 1  # inside the two bytes of é
            conn.sendall(data[:cut])
            time.sleep(0.05)
            conn.sendall(data[cut:])

    thread = threading.Thread(target=peer)
    thread.start()
    try:
        with ovsdb.Client(path) as client:
            assert client.databases() == ["Open_vSwitch", "caf\u00e9"]
    finally:
        thread.join(10)
        listener.close()
    assert seen == [{"result": ["x"], "error": None, "id": "e1"}]
