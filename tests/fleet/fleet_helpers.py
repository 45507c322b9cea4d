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
