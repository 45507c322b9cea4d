"""Helpers the namespace tests share (not collected: no test_ prefix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from typer.testing import CliRunner

import nictune as nictune_pkg
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


class ResidentAgent:
    """`nictune agent run --netns` of the lab's namespace A as a subprocess,
    its output in the lab's agent.log; stop() always ends it."""

    def __init__(self, lab, interval: float, *extra: str):
        root = os.path.dirname(os.path.dirname(nictune_pkg.__file__))
        self.log = open(lab.dir / "agent.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from nictune.cli.app import main; main()", "agent", "run",
             "--netns", lab.ns_a, "--state-dir", str(lab.state), "--interval", str(interval),
             *extra],
            env=dict(os.environ, PYTHONPATH=root), stdout=self.log, stderr=subprocess.STDOUT)
        self.lab = lab

    def stop(self) -> str:
        """End the agent (TERM, then KILL); its output."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.seek(0)
        return self.log.read()

    def report(self) -> dict:
        """`nictune agent status --json` of the namespace ({} when none)."""
        result = CliRunner().invoke(app, ["agent", "status", "--netns", self.lab.ns_a,
                                          "--state-dir", str(self.lab.state), "--json"])
        return json.loads(result.stdout) if result.stdout.startswith("{") else {}
