"""What both fleet test files need: the CLI in-process (exit code and JSON
report) and a host's link MTU read back with `ip`, never through nictune."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.lab.fleet import run_in


def nictune(*args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--json"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}, no JSON report: {result.output}")


def profile_file(tmp_path, text: str, name: str) -> str:
    """A profile written into the test's directory; its path."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def mtu(host, ifname="rail0") -> int:
    return json.loads(run_in(host, ["ip", "-j", "link", "show", ifname]).stdout)[0]["mtu"]


def audit(fleet, profile: str, *extra: str) -> dict:
    """`nictune audit` of the whole fleet: host reports by name."""
    code, report = nictune("audit", profile, "-i", fleet.inventory, "--limit", "fleet", *extra)
    assert code in (0, 1, 2), [(h["host"], h.get("via"), h["error"]) for h in report["hosts"]]
    return {h["host"]: h for h in report["hosts"]}


def comparable(host_report: dict) -> dict:
    """A host report without what differs between the paths that answer it."""
    return {k: v for k, v in host_report.items() if k not in ("seconds", "via", "transport")}


def drift_of(host_report: dict) -> set:
    return {(c["key"]["target"], c["key"]["name"]) for c in host_report["changes"]
            if c["status"] == "drift"}
