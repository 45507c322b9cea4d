"""docs/reference/cli.md is generated from the Typer app and kept current."""

from __future__ import annotations

import os

from nictune.cli import reference

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI_REFERENCE = os.path.join(REPO, "docs", "reference", "cli.md")


def test_the_checked_in_cli_reference_is_current():
    with open(CLI_REFERENCE) as f:
        assert f.read() == reference.render(), (
            "docs/reference/cli.md is stale: regenerate it with "
            "`.venv/bin/python -m nictune.cli.reference > docs/reference/cli.md`")


def test_every_command_and_option_of_the_app_is_in_the_reference():
    text = reference.render()
    found = list(reference.commands())
    names = [full for full, _ in found]
    assert len(found) >= 15 and "nictune plan" in names and "nictune agent install" in names
    for full, command in found:
        assert f"# `{full}`\n" in text, full
        section = text.split(f"# `{full}`\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("-"):
                    assert f"`{opt}`" in section, (full, opt)


def test_the_exit_codes_come_from_the_code():
    text = reference.render()
    table = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code, meaning in ((2, "changes pending"), (3, "rolled back"), (4, "a human must look")):
        row = next(line for line in table.splitlines() if line.startswith(f"| {code} |"))
        assert meaning in row
