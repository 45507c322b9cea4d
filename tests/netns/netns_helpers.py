"""Helpers the namespace tests share (not collected: no test_ prefix)."""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from nictune.cli.app import app


def nictune(lab, *args: str) -> tuple:
    """Run the CLI against the lab's namespace A with its state directory;
    returns (exit code, JSON report)."""
    result = CliRunner().invoke(
        app, [*args, "--netns", lab.ns_a, "--state-dir", str(lab.state), "--json"])
    try:
        report = json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"no JSON report: {result.output}")
    return result.exit_code, report


def wait_for(predicate, seconds: float = 10.0) -> bool:
    """Poll predicate until it holds or the time is up; its last answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
