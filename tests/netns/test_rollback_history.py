"""Rollback through the apply history, on the real kernel (a veth pair in
namespaces): two applies, as in the ASAP2 how-to (the first sets up the
port, the second the settings that only exist after it), undone newest
first with `rollback --to` / `--steps`, listed by `nictune history`.

Every state is read back with the system's tools (`ip -j`, `sysctl`) and
compared with a snapshot taken before the first apply.  The second apply
drops the MTU below IPv6's minimum, which removes the link's IPv6 settings
(transaction/aside.py): its record's aside must go back between the two
restores, or the chain does not reach the original state.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from netns_helpers import nictune

pytestmark = pytest.mark.netns


@pytest.fixture
def lab(veth_pair, tmp_path):
    veth_pair.state = tmp_path / "state"
    veth_pair.dir = tmp_path
    # A hand-set IPv6 setting: an MTU below 1280 takes it away with IPv6.
    veth_pair.run(veth_pair.ns_a, ["sysctl", "-w", "net.ipv6.conf.ntv0.hop_limit=33"])
    return veth_pair


# The first apply: the port (as switchdev and VFs would be).
FIRST = textwrap.dedent("""\
    nictune: 1
    host:
      sysctl:
        net.ipv4.tcp_ecn: 1
    interfaces:
      rail:
        match: {name: ntv0}
        mtu: 9000
        sysctl: {ipv4.arp_ignore: 1}
""")

# The second: what only the first made possible (as representors), and a
# change of a key the first set.
SECOND = textwrap.dedent("""\
    nictune: 1
    host:
      sysctl:
        net.ipv4.tcp_ecn: 2
    interfaces:
      rail:
        match: {name: ntv0}
        mtu: 1200
        txqueuelen: 4000
""")


def write(lab, name: str, body: str) -> str:
    path = lab.dir / name
    path.write_text(body)
    return str(path)


def snapshot(lab) -> dict:
    [dev] = json.loads(lab.run(lab.ns_a, ["ip", "-j", "-d", "link", "show", "ntv0"]).stdout)
    dev.pop("operstate", None)  # follows carrier asynchronously
    sysctl = lambda key: lab.run(lab.ns_a, ["sysctl", "-n", key]).stdout.strip()  # noqa: E731
    return {"link": dev, "tcp_ecn": sysctl("net.ipv4.tcp_ecn"),
            "arp_ignore": sysctl("net.ipv4.conf.ntv0.arp_ignore"),
            "hop_limit": sysctl("net.ipv6.conf.ntv0.hop_limit")}


def last_id(lab) -> str:
    """The last apply's id, from its journal (read here, not by nictune)."""
    return json.loads((lab.state / "netns" / lab.ns_a / "journal.json").read_text())["id"]


def two_applies(lab) -> tuple:
    """(snapshot before, after the first; the first's id, the second's)."""
    original = snapshot(lab)
    code, report = nictune(lab, "apply", write(lab, "first.yaml", FIRST))
    assert code == 0, report
    after_first, first = snapshot(lab), last_id(lab)
    code, report = nictune(lab, "apply", write(lab, "second.yaml", SECOND))
    assert code == 0, report
    assert snapshot(lab)["link"]["mtu"] == 1200
    assert last_id(lab) != first
    return original, after_first, first, last_id(lab)


def test_rollback_to_the_first_apply_walks_back_through_both(lab):
    original, _, first, second = two_applies(lab)
    code, history = nictune(lab, "history")
    assert code == 0, history
    entries = history["hosts"][0]["history"]
    assert [(e["id"], e["status"]) for e in entries] == [(second, "committed"), (first, "committed")]
    assert entries[0]["profile"].endswith("second.yaml") and entries[1]["profile"].endswith("first.yaml")
    assert "link mtu on ntv0" in entries[0]["summary"]
    # The second apply's MTU below 1280 took the link's IPv6 settings with it.
    assert entries[0].get("aside") is True

    code, report = nictune(lab, "rollback", "--to", first)
    assert code == 0, report
    host = report["hosts"][0]
    assert host["rolled_back"] == [second, first]
    assert {c["status"] for c in host["changes"]} <= {"reverted", "ok"}
    assert snapshot(lab) == original
    code, history = nictune(lab, "history")
    assert [e["status"] for e in history["hosts"][0]["history"]] == ["rolled-back", "rolled-back"]


def test_a_second_plain_rollback_does_not_pass_silently_over_the_first_apply(lab):
    original, after_first, first, second = two_applies(lab)
    code, report = nictune(lab, "rollback")
    assert code == 0 and report["hosts"][0]["journal"] == second, report
    assert snapshot(lab) == after_first
    # Restoring nothing while the first apply is still in place: an error
    # that names it, and the host left as it is.
    code, report = nictune(lab, "rollback")
    error = report["hosts"][0]["error"]
    assert code == 1 and error["kind"] == "no-journal", report
    assert first in error["message"] and "--steps 1" in error["message"]
    assert snapshot(lab) == after_first
    code, report = nictune(lab, "rollback", "--steps", "1")
    assert code == 0 and report["hosts"][0]["rolled_back"] == [first], report
    assert snapshot(lab) == original
    # Nothing left: that is no error.
    code, report = nictune(lab, "rollback")
    assert code == 0 and report["hosts"][0]["warnings"], report
    assert snapshot(lab) == original


def test_a_walk_cut_off_part_way_is_finished_by_running_it_again(lab):
    original, _, first, second = two_applies(lab)
    code, report = nictune(lab, "apply", write(lab, "third.yaml", FIRST.replace("9000", "8000")))
    assert code == 0, report
    # As if a rollback --to FIRST had restored the third apply and died in
    # the middle of the second: its record still says committed, and one
    # of its keys is back already.
    assert nictune(lab, "rollback")[0] == 0
    lab.run(lab.ns_a, ["sysctl", "-w", "net.ipv4.tcp_ecn=1"])
    code, report = nictune(lab, "rollback", "--to", first)
    assert code == 0, report
    assert report["hosts"][0]["rolled_back"] == [second, first]
    assert snapshot(lab) == original


def test_steps_beyond_the_history_and_unknown_ids_restore_nothing(lab):
    _, _, first, second = two_applies(lab)
    state = snapshot(lab)
    code, report = nictune(lab, "rollback", "--steps", "3")
    assert code == 1 and "holds 2 apply(s) not rolled back" in report["hosts"][0]["error"]["message"]
    code, report = nictune(lab, "rollback", "--to", "20000101T000000Z-1")
    message = report["hosts"][0]["error"]["message"]
    assert code == 1 and first in message and second in message, report
    assert snapshot(lab) == state
