"""Changes that interrupt traffic are marked in plans, verify and apply
reports (Family.disruptive -> Change.disruptive), in text and in --json,
and a host's report that carries the mark is checked like any field.

The families' own reasons are tested with them; here one family's
disruptive() is replaced by the test, so that the wiring is tested alone.
The host is the fake mlx5 kernel (tests/fakes.py)."""

from __future__ import annotations

import pytest

from fakes import FakeHost
from shipped import CX7, P0
from nictune.cli.output import Printer, envelope
from nictune.control.remote.hostreport import ProtocolError, accept
from nictune.host import agent
from nictune.host.transaction.engine import Engine
from nictune.host.knobs import REGISTERED


@pytest.fixture
def marked(monkeypatch):
    def disruptive(self, key, before, after):
        if key.family == "link" and key.name == "mtu":
            return f"test: MTU {before} -> {after} drops the link"
        return ""
    for family in REGISTERED:
        monkeypatch.setattr(family, "disruptive", disruptive)


def _report(tmp_path, command: str, host=None) -> dict:
    engine = Engine(host or FakeHost("cx7-host", tmp_path / "root"), str(tmp_path / "state"))
    if command == "apply":
        out = engine.apply(CX7.doc, CX7.sources, CX7.path)
    else:
        out = engine.plan(CX7.doc, CX7.sources, command)
    return agent.report(out, "fake", 0.0)


def _mtu(report: dict, ifname: str = P0) -> dict:
    return next(c for c in report["changes"]
                if c["key"] == {"family": "link", "target": ifname, "name": "mtu"})


@pytest.mark.parametrize("command, status", [("plan", "pending"), ("verify", "drift"),
                                             ("apply", "applied")])
def test_the_mark_travels_with_the_change(marked, tmp_path, command, status):
    report = _report(tmp_path, command)
    mtu = _mtu(report)
    assert (mtu["status"], mtu["disruptive"]) == (status, "test: MTU 1500 -> 9000 drops the link")
    # Only changes that would be written carry it.
    assert not [c for c in report["changes"] if "disruptive" in c and c["key"]["name"] != "mtu"]


def test_a_change_already_as_wanted_is_not_marked(marked, tmp_path):
    host = FakeHost("cx7-host", tmp_path / "root")
    assert "disruptive" in _mtu(_report(tmp_path, "apply", host))
    again = _report(tmp_path, "plan", host)
    assert _mtu(again)["status"] == "ok" and "disruptive" not in _mtu(again)


def test_text_leads_the_note_with_it_and_the_summary_counts(marked, tmp_path, capsys):
    report = _report(tmp_path, "plan")
    Printer(False).report(envelope("plan", [report]), False, "p.yaml")
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if P0 in line and "link mtu" in line)
    assert "DISRUPTIVE: test: MTU 1500 -> 9000 drops the link" in line
    assert out.splitlines()[-1].endswith("2 of them disruptive (the link drops or queues are "
                                         "reset: see DISRUPTIVE).")


def test_json_carries_it(marked, tmp_path, capsys):
    Printer(True).report(envelope("plan", [_report(tmp_path, "plan")]), False, "p.yaml")
    assert '"disruptive": "test: MTU 1500 -> 9000 drops the link"' in capsys.readouterr().out


def test_a_host_report_whose_mark_is_not_text_is_refused(marked, tmp_path):
    report = _report(tmp_path, "plan")
    accept(dict(report), "h1", "plan")
    _mtu(report)["disruptive"] = ["\x1b[2J"]
    with pytest.raises(ProtocolError, match="disruptive is not text"):
        accept(report, "h1", "plan")
