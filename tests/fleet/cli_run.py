"""The CLI, in-process, as the fleet tests run it: exit code and JSON report."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from nictune.cli.app import app


def nictune(*args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--json"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}, no JSON report: {result.output}")
