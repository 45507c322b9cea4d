"""The switch checks' plumbing without a wire: the listener's bounds, how
frames of one switch port's agents merge, and what a switch-mismatch makes
of the verdict, JUnit and Prometheus (the daemons themselves are in
tests/netns/test_lldp_switch_netns.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from nictune.control.review import audit_formats
from nictune.host import agent
from nictune.host.facts import lldp
from nictune.host.transports import lldpsock


def neighbour(port: str, **fields) -> lldp.Neighbour:
    return lldp.Neighbour(chassis_id="0c:42:a1:00:00:01", chassis_subtype="mac", port_id=port,
                          port_subtype="local", ttl=120, **fields)


def test_the_listener_keeps_the_last_frame_of_each_agent_and_at_most_four():
    listener = lldpsock.RailListener()
    for i in range(6):
        assert listener.keep("rail0", lldp.encode(neighbour(f"p{i}")), 100.0 + i)
    assert listener.keep("rail0", lldp.encode(neighbour("p5", system_name="leaf")), 200.0)
    assert not listener.keep("rail0", b"\x01\x80\xc2\x00\x00\x0e" + b"\x00" * 60, 201.0)
    kept = listener.stored()["rails"]["rail0"]
    assert len(kept) == lldpsock.AGENTS_PER_RAIL and listener.refused == 1
    newest = lldp.decode(bytes.fromhex(kept[0]["frame"]))
    assert (newest.port_id, newest.system_name, kept[0]["received"]) == ("p5", "leaf", 200.0)
    assert sorted(lldp.decode(bytes.fromhex(e["frame"])).port_id for e in kept) == ["p2", "p3", "p4", "p5"]


def test_frames_of_one_chassis_merge_under_the_one_that_names_the_system():
    dcbx = neighbour("0c:42:a1:00:00:01", pfc=lldp.PfcTlv((3,), False, False, 8), age=1.0)
    ident = neighbour("swp1", system_name="leaf03", max_frame_size=9216, age=5.0)
    other = lldp.Neighbour(chassis_id="other", chassis_subtype="local", port_id="x", port_subtype="local",
                           ttl=120, apps=(), age=0.5)
    merged = lldp.merge([other, dcbx, ident])
    assert (merged.port_id, merged.system_name, merged.pfc.enabled, merged.apps) == ("swp1", "leaf03", (3,), None)
    assert lldp.merge([]) is None


def _host(status: str) -> dict:
    change = {"key": {"family": "switch", "target": "rail0", "name": "pfc"}, "before": [3, 4],
              "after": "agree", "status": status, "source": "p.yaml:14",
              "note": "leaf03 port swp1's PFC Configuration TLV enables PFC on priorities 3, 4"}
    return {"host": "gpu01", "command": "verify", "ok": True, "exit_code": 2, "changed": False,
            "summary": {status: 1}, "changes": [change], "warnings": [], "error": None, "seconds": 0.1}


def test_a_switch_mismatch_exits_2_and_is_its_own_failure_and_series():
    assert agent.verdict("verify", ["switch-mismatch", "ok"], None)["exit_code"] == 2
    assert agent.verdict("verify", ["ok"], None)["exit_code"] == 0
    report = {"nictune_report": 1, "command": "audit", "exit_code": 2, "hosts": [_host("switch-mismatch")]}
    suite = ET.fromstring(audit_formats.junit(report))
    failures = suite.findall(".//failure")
    assert [f.get("type") for f in failures] == ["switch-mismatch"]
    assert "priorities 3, 4" in failures[0].text and suite.get("failures") == "1"
    metrics = audit_formats.prometheus(report, 0.0)
    assert 'nictune_audit_switch_mismatch{host="gpu01",family="switch",target="rail0",key="pfc"} 1' in metrics
    assert 'nictune_audit_drift{host="gpu01",family="switch"' not in metrics
    agreeing = audit_formats.prometheus({**report, "hosts": [_host("ok")]}, 0.0)
    assert 'nictune_audit_switch_mismatch{host="gpu01",family="switch",target="rail0",key="pfc"} 0' in agreeing
