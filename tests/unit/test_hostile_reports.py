"""What a host says is not trusted (issue 9, item 10), at the unit level:
the controller's reading of a report (control/remote/hostreport.py) and every
printer of names and values (terminal tables, plain text, JUnit,
Prometheus).  End to end over real SSH: tests/fleet/test_hostile_hosts.py.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from nictune.cli.output import Printer, envelope
from nictune.control.remote import hostreport
from nictune.control.review.audit_formats import junit, prometheus
from nictune.control.remote.hostreport import ProtocolError
from nictune.host.text import printable, shown_name

# What a terminal acts on: C0 but newline, DEL, C1.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
ESC_NAME = "node\x1b]0;pwned\x07\x9b2J"


def change(target="ens1", status="drift", before=1500, **extra):
    return {"key": {"family": "link", "target": target, "name": "mtu"}, "before": before,
            "after": 9000, "status": status, "source": "p.yaml:3", "note": "", "bound": None, **extra}


def claimed(**fields):
    """An honest-looking verify report, with fields changed."""
    report = {"host": "someone-else", "command": "verify", "ok": True, "exit_code": 0, "changed": False,
              "summary": {}, "changes": [change(status="ok", before=9000)], "warnings": [],
              "error": None, "seconds": 0.2, "agent": "0.1.0"}
    report.update(fields)
    return report


# -- the report ------------------------------------------------------------------

def test_the_name_and_outcome_are_the_controllers():
    report = hostreport.accept(claimed(changes=[change(), change("ens2", "ok")], unreachable=True,
                                       transport={"agent_sent": False}, extra={"kept": 1}),
                               "node07", "verify")
    assert report["host"] == "node07" and report["command"] == "verify"
    assert (report["ok"], report["exit_code"], report["changed"]) == (True, 2, False)
    assert report["summary"] == {"drift": 1, "ok": 1}
    assert "unreachable" not in report and "transport" not in report
    assert report["extra"] == {"kept": 1}  # unknown fields pass to JSON, never printed


@pytest.mark.parametrize("fields, command, outcome", [
    ({"error": {"kind": "rolled-back", "message": "x"}, "ok": True, "exit_code": 0}, "apply",
     (False, 3, False)),
    ({"error": {"kind": "made-up", "message": "x"}, "exit_code": 0}, "verify", (False, 1, False)),
    ({"changes": [change(status="pending")], "exit_code": 0}, "plan", (True, 2, False)),
    ({"changes": [change(status="applied")], "changed": False}, "apply", (True, 0, True)),
    ({"changes": [], "ok": False, "exit_code": 4, "changed": True}, "verify", (True, 0, False)),
    ({"changes": [change(status="reverted")], "exit_code": 4}, "rollback", (True, 0, True)),
])
def test_exit_codes_are_worked_out_again(fields, command, outcome):
    report = hostreport.accept(claimed(**fields), "n", command)
    assert (report["ok"], report["exit_code"], report["changed"]) == outcome


@pytest.mark.parametrize("report, why", [
    ("a string", "the report is a JSON string"),
    ([], "the report is a JSON array"),
    (claimed(changes="none"), "changes is not a list"),
    ({k: v for k, v in claimed().items() if k != "changes"}, "changes is not a list"),
    (claimed(changes=["x"]), "changes is not a list"),
    (claimed(changes=[dict(change(), key=["link", "ens1", "mtu"])]), "changes[0].key"),
    (claimed(changes=[dict(change(), key={"family": "link", "target": 7, "name": "mtu"})]), "changes[0].key"),
    (claimed(changes=[dict(change(), status=None)]), "changes[0].status"),
    (claimed(changes=[{k: v for k, v in change().items() if k != "before"}]), "no before or after"),
    (claimed(changes=[dict(change(), note=["x"])]), "changes[0].note is not text"),
    (claimed(changes=[dict(change(), bound=["min"])]), "changes[0].bound"),
    (claimed(warnings="careful"), "warnings is not a list"),
    (claimed(warnings=[{"w": 1}]), "warnings is not a list"),
    (claimed(error="it broke"), "error is not"),
    (claimed(error={"kind": "system"}), "error is not"),
    (claimed(seconds="0.2"), "seconds is not a number"),
    (claimed(seconds=True), "seconds is not a number"),
    (claimed(seconds=float("nan")), "seconds is not a number"),
    (claimed(facts={"ens1": "fast"}), "facts is not"),
    (claimed(journal=12), "journal is not"),
])
def test_a_malformed_report_is_a_protocol_error(report, why):
    with pytest.raises(ProtocolError) as raised:
        hostreport.accept(report, "node07", "verify")
    assert raised.value.kind == "transport"
    assert raised.value.message.startswith("node07: the agent's report cannot be used (")
    assert why in raised.value.message


# -- printing what hosts said ----------------------------------------------------

def hostile(label=ESC_NAME):
    report = hostreport.accept(claimed(
        changes=[change("ens1\x1b[2J", before="15\x1b[8m00", note="\r\x1b[Kfine"), change("ens2", "ok")],
        warnings=["\x1b[31mred\x1b[0m\nerror: forged line"]), label, "verify")
    return report


def test_plain_output_shows_control_characters_escaped(capsys):
    Printer(False).report(envelope("verify", [hostile()]), show_ok=True)
    out, err = capsys.readouterr()
    assert not CONTROL.search(out + err)
    assert out.startswith("node\\x1b]0;pwned\\x07\\x9b2J: verify\n")
    assert "ens1\\x1b[2J" in out and "15\\x1b[8m00" in out and "\\x0d\\x1b[Kfine" in out
    assert err.splitlines() == ["warning: \\x1b[31mred\\x1b[0m\\x0aerror: forged line"]
    # Columns line up on what is shown, not on the raw text.
    header, first, second = out.splitlines()[1:4]
    assert first.index("mtu") == second.index("mtu") == header.index("setting") + len("link ")


def test_terminal_output_shows_them_escaped_and_no_markup(capsys, monkeypatch):
    monkeypatch.setattr(Printer, "rich", property(lambda self: True))
    report = hostile("[bold red]node:smile:[/]")
    report["changes"][0]["status"] = "[blink]made-up"
    Printer(False).report(envelope("verify", [report]), show_ok=True)
    Printer(False).fleet(envelope("audit", [hostile(), report]), show_ok=True)
    out, err = capsys.readouterr()
    assert not CONTROL.search(out + err)
    assert "[bold red]node:smile:[/]" in out and "[blink]made-up" in out
    assert "ens1\\x1b[2J" in out and "node\\x1b]0;pwned\\x07\\x9b2J" in out


def test_fleet_warnings_are_grouped_and_escaped(capsys):
    Printer(False).fleet(envelope("audit", [hostile("a"), hostile("b"), hostile("c\x1b")]))
    out, err = capsys.readouterr()
    assert not CONTROL.search(out + err)
    assert "warning: \\x1b[31mred\\x1b[0m\\x0aerror: forged line (3 host(s): a, b, c\\x1b)\n" in err
    assert "c\\x1b" in out


def test_junit_and_prometheus_show_them_escaped():
    hosts = [hostile(), hostile("node\x85"), hostile("node\\x85")]
    text = junit(envelope("audit", hosts))
    assert not CONTROL.search(text)
    names = [c.get("name") for c in ET.fromstring(text.encode()).iter("testcase")]
    assert names == ["node\\x1b]0;pwned\\x07\\x9b2J", "node\\x85", "node\\x85"]
    failure = next(ET.fromstring(text.encode()).iter("failure")).text
    assert "link ens1\\x1b[2J mtu: expected 9000, actual \"15\\u001b[8m00\"" in failure

    metrics = prometheus(envelope("audit", hosts), 1764500000.0)
    assert not CONTROL.search(metrics)
    # "node\x85" and a host literally named "node\\x85" read the same once
    # escaped: one series, or node_exporter drops the whole file.
    assert metrics.count('nictune_audit_up{host="node\\\\x85"}') == 1
    parser = pytest.importorskip("prometheus_client.parser")
    drift = {tuple(sorted(s.labels.items())) for f in parser.text_string_to_metric_families(metrics)
             if f.name == "nictune_audit_drift" for s in f.samples}
    assert (("family", "link"), ("host", "node\\x1b]0;pwned\\x07\\x9b2J"), ("key", "mtu"),
            ("target", "ens1\\x1b[2J")) in drift


def test_printable_and_shown_name():
    assert printable("a\x00b\tc\nd\x7fe\x80f\x9fg\xa0h") == "a\\x00b\\x09c\\x0ad\\x7fe\\x80f\\x9fg\xa0h"
    assert printable(7) == "7" and printable("plain ünïcode") == "plain ünïcode"
    assert shown_name("rt#1") == "'rt#1'"
    assert shown_name(b"u\xff\x1b1") == "'u\\xff\\x1b1'"
