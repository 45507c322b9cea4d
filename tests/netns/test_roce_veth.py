"""roce: keys on a real veth (no DCB ops, no RDMA device, no OFED ecn
directory) come out unsupported with the reason, and nothing is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.netns

AGENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "src")


def run_agent(pair, command: str, doc: dict, state_dir: str) -> dict:
    request = {"nictune_request": 1, "command": command, "state_dir": state_dir,
               "profile": {"path": "roce.yaml", "doc": doc, "sources": {}}}
    proc = subprocess.run(["ip", "netns", "exec", pair.ns_a, sys.executable, "-m", "nictune.host.agent"],
                          input=json.dumps(request), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=AGENT), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_roce_keys_on_veth_are_unsupported_and_nothing_is_written(veth_pair, tmp_path):
    doc = {"nictune": 1, "interfaces": {"rail": {
        "match": {"name": veth_pair.ifname}, "mtu": 1400,
        "roce": {"mode": "v2", "tos": 106, "trust": "dscp", "pfc": [3],
                 "ets": {"prio_tc": [0, 1, 2, 3, 4, 5, 6, 7]}, "ecn": {"np": [3]}}}}}
    before = veth_pair.run(veth_pair.ns_a, ["ip", "-j", "-d", "link", "show", veth_pair.ifname]).stdout
    report = run_agent(veth_pair, "apply", doc, str(tmp_path / "state"))
    notes = {(c["key"]["family"], c["key"]["name"]): (c["status"], c.get("note", ""))
             for c in report["changes"]}
    assert report["error"]["kind"] == "unsupported"
    for name in ("trust", "pfc", "ets.prio_tc"):
        status, note = notes[("dcb", name)]
        assert status == "unsupported" and note.startswith("no DCB on veth"), note
        assert "EOPNOTSUPP" in note  # what the real kernel answered
    for name in ("mode", "tos"):
        status, note = notes[("roce", name)]
        assert status == "unsupported" and note.startswith(f"no RDMA device carries {veth_pair.ifname}")
    status, note = notes[("roce", "ecn.np")]
    assert status == "unsupported" and note.startswith("not supported by veth")
    # The MTU change was pending but nothing was applied.
    assert notes[("link", "mtu")][0] == "pending"
    after = veth_pair.run(veth_pair.ns_a, ["ip", "-j", "-d", "link", "show", veth_pair.ifname]).stdout
    assert json.loads(after)[0]["mtu"] == json.loads(before)[0]["mtu"]
