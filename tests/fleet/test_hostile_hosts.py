"""Hosts that cannot be trusted, over real SSH (issue 9, items 7 and 10).

A cached agent that was damaged or edited on the host is found by the
bootstrap, not run, and sent again.  Something else answering in the
agent's place (a stub "python" named by nictune_python that prints a report
of its choosing) gets no say over its own name or exit code, no escape
sequence onto the controller's screen or into the audit files, and no
traceback out of the controller when its report is malformed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import textwrap
from xml.etree import ElementTree

import pytest
from fleet_helpers import nictune
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.remote import agentzip

pytestmark = pytest.mark.netns

# What a terminal would act on: C0 but newline, DEL, C1.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def cached_agent(fleet, host) -> str:
    return os.path.join(fleet.dir, host.name, "state", "agent", agentzip.build().sha256)


def plan_one(fleet, profile, host) -> dict:
    # --no-probe: the agent's own plan (a plan otherwise starts no agent).
    code, report = nictune("plan", profile, "-i", fleet.inventory, "--limit", host.name, "--no-probe")
    [result] = report["hosts"]
    assert code == 2 and result["ok"], result
    assert {c["key"]["target"] for c in result["changes"]} == {"rail0", "rail1"}
    return result


# -- the cached agent (item 7) -----------------------------------------------------

def test_a_damaged_cache_is_sent_again_and_the_plan_still_works(fleet, profile):
    host = fleet.of_kind("sshd")[0]
    plan_one(fleet, profile, host)
    with open(os.path.join(cached_agent(fleet, host), "nictune/host/transaction/engine.py"), "r+b") as f:
        f.truncate(100)  # as a full disk or a crash mid-copy would leave it

    result = plan_one(fleet, profile, host)
    assert result["transport"]["agent_sent"] is True
    assert "nictune/host/transaction/engine.py differs" in result["transport"]["cache_damaged"]
    assert any("failed its check" in w and "a fresh copy sent" in w for w in result["warnings"])
    assert plan_one(fleet, profile, host)["transport"] == {"agent_sent": False}


def test_edited_cache_code_is_detected_and_not_run(fleet, profile, tmp_path):
    host = fleet.of_kind("sshd")[1]
    plan_one(fleet, profile, host)
    marker = tmp_path / "edited-code-ran"
    with open(os.path.join(cached_agent(fleet, host), "nictune/host/agent.py"), "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').close()\n")

    result = plan_one(fleet, profile, host)
    assert not marker.exists()
    assert result["transport"]["agent_sent"] is True
    assert result["transport"]["cache_damaged"] == "nictune/host/agent.py differs from the copy unpacked"


# -- something else answering (item 10) --------------------------------------------

def stub_python(tmp_path, name: str, report) -> str:
    """An executable that the controller takes for python3: it answers the
    bootstrap's "have" and then prints `report` (a str as it is), whatever
    it was asked."""
    data = tmp_path / f"{name}.json"
    data.write_text(report if isinstance(report, str) else json.dumps(report))
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        sys.stdout.write("have\\n")
        sys.stdout.flush()
        sys.stdin.readline()
        sys.stdout.write(open({str(data)!r}).read() + "\\n")
        sys.stdout.flush()
        """))
    path.chmod(stat.S_IRWXU)
    return str(path)


def inventory_with(fleet, tmp_path, pythons: dict) -> str:
    """The fleet's inventory, with nictune_python set per host name."""
    lines = []
    for line in open(fleet.inventory).read().splitlines():
        name = line.split(" ", 1)[0]
        if name in pythons:
            line = re.sub(r"nictune_python=\S+", f"nictune_python={pythons[name]}", line)
        lines.append(line)
    path = tmp_path / "inventory.ini"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def liar(claimed_name: str) -> dict:
    """A report that claims another host's name, no drift by its exit code
    and yet a drifted key, with terminal escapes in every text field."""
    return {
        "host": claimed_name, "command": "verify", "ok": True, "exit_code": 0, "changed": False,
        "summary": {"ok": 1}, "unreachable": True,
        "changes": [{"key": {"family": "link", "target": "rail0\x1b[2J\x1b]0;owned\x07",
                             "name": "mtu\x9b31m"},
                     "before": "1500\x1b[8m", "after": 9000, "status": "drift",
                     "source": "\x1b[1A", "note": "\r\x1b[Kall good", "bound": None}],
        "warnings": ["\x1b[32mall good\x1b[0m"], "error": None, "seconds": 0.01,
    }


def test_a_lying_host_gets_its_inventory_name_and_a_true_exit_code(fleet, profile, tmp_path):
    honest, lying = fleet.of_kind("sshd")[:2]
    stub = stub_python(tmp_path, "liar", liar(honest.name))
    inventory = inventory_with(fleet, tmp_path, {lying.name: stub})
    limit = f"{honest.name},{lying.name}"
    junit, prom = tmp_path / "audit.xml", tmp_path / "audit.prom"

    code, report = nictune("audit", profile, "-i", inventory, "--limit", limit,
                           "--junit", str(junit), "--prometheus", str(prom))
    hosts = {h["host"]: h for h in report["hosts"]}
    assert sorted(hosts) == sorted([honest.name, lying.name])
    told = hosts[lying.name]
    assert (told["exit_code"], told["ok"], told["summary"]) == (2, True, {"drift": 1})
    assert "unreachable" not in told  # the controller's word, not the host's
    assert code == 2 and report["exit_code"] == 2

    suite = ElementTree.parse(junit).getroot()
    assert sorted(tc.get("name") for tc in suite.iter("testcase")) == sorted([honest.name, lying.name])
    for text in (junit.read_text(), prom.read_text()):
        assert not CONTROL.search(text)
    metrics = prom.read_text()
    assert (f'nictune_audit_drift{{host="{lying.name}",family="link",'
            f'target="rail0\\\\x1b[2J\\\\x1b]0;owned\\\\x07",key="mtu\\\\x9b31m"}} 1') in metrics

    # And on the screen: the same, made visible.
    result = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--limit", limit])
    assert result.exit_code == 2
    for text in (result.stdout, result.stderr):
        assert not CONTROL.search(text), text
    assert "rail0\\x1b[2J\\x1b]0;owned\\x07" in result.stdout
    assert f"warning: \\x1b[32mall good\\x1b[0m (1 host(s): {lying.name})" in result.stderr


@pytest.mark.parametrize("report, why", [
    (dict(liar("x"), changes="all good"), "changes is not a list"),
    (dict(liar("x"), changes=[{"key": "link mtu", "before": 1, "after": 2, "status": "ok"}]),
     "changes[0].key"),
    (dict(liar("x"), error={"kind": 3}), "error is not"),
    (dict(liar("x"), seconds="fast"), "seconds is not a number"),
    ([liar("x")], "the report is a JSON array"),
])
def test_a_malformed_report_is_that_hosts_protocol_error(fleet, profile, tmp_path, report, why):
    host = fleet.of_kind("sshd")[0]
    inventory = inventory_with(fleet, tmp_path, {host.name: stub_python(tmp_path, "garbage", report)})
    code, envelope = nictune("audit", profile, "-i", inventory, "--limit", host.name)
    [result] = envelope["hosts"]
    assert code == 1 and result["host"] == host.name and result["ok"] is False
    assert result["error"]["kind"] == "transport" and result["unreachable"] is False
    assert result["error"]["message"].startswith(f"{host.name}: the agent's report cannot be used")
    assert why in result["error"]["message"]

    result = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--limit", host.name])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_report_nested_too_deep_to_read_is_that_hosts_error_not_a_traceback(fleet, profile, tmp_path):
    # A verify's report is read before anything else is done with it (the
    # questions it teaches the probe are taken out of it): JSON nested
    # deeper than Python recurses is "no report", as any other non-JSON.
    host = fleet.of_kind("sshd")[0]
    nested = "[" * 100_000 + "]" * 100_000
    inventory = inventory_with(fleet, tmp_path, {host.name: stub_python(tmp_path, "deep", nested)})
    result = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--limit", host.name, "--json"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output[-2000:]
    [told] = json.loads(result.stdout)["hosts"]
    assert told["error"]["kind"] == "transport" and "the agent sent no report" in told["error"]["message"]
