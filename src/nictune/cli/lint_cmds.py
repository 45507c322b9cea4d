"""`nictune lint PROFILE`, and the gate plan/apply pass a profile through."""

from __future__ import annotations

import typer

from nictune.cli.options import JsonOpt, ProfileArg
from nictune.cli.output import Printer, envelope
from nictune.host.errors import EXIT_ERROR, EXIT_OK, PROFILE, NictuneError

# Commands that refuse an inconsistent profile unless --force (nictune lint).
LINTED = ("plan", "apply")


class LintFailed(NictuneError):
    """The profile is inconsistent (lint errors) and --force was not given."""
    kind = PROFILE

    def __init__(self, findings: list):
        self.findings = findings
        errors = [f for f in findings if f.severity == "error"]
        super().__init__(
            f"the profile is inconsistent ({len(errors)} lint error(s)); fix it, or pass --force: "
            + "; ".join(f.text for f in errors))


def lint_gate(profile, force: bool) -> list:
    """Lint a loaded profile before plan/apply.  Returns every finding (to
    print as warnings); raises LintFailed on errors unless `force`."""
    from nictune.profile.lint import lint as run_lint

    findings = run_lint(profile)
    if not force and any(f.severity == "error" for f in findings):
        raise LintFailed(findings)
    return findings


def lint(profile: ProfileArg, as_json: JsonOpt = False) -> None:
    """Check that ToS, DSCP, priorities, PFC/ECN, ETS, NCCL and MTU agree.
    Exit 1 on errors; warnings alone exit 0."""
    from nictune.profile.errors import ProfileError
    from nictune.profile.lint import lint_file

    out = Printer(as_json)
    try:
        findings = lint_file(str(profile))
    except ProfileError as e:
        out.report(envelope("lint", [], error=e.as_dict()))
        raise typer.Exit(EXIT_ERROR)
    errors = [f for f in findings if f.severity == "error"]
    code = EXIT_ERROR if errors else EXIT_OK
    if as_json:
        report = envelope("lint", [], profile=str(profile),
                          findings=[f.as_dict() for f in findings])
        report["exit_code"] = code
        out.json(report)
    else:
        for f in findings:
            (out.error if f.severity == "error" else out.warn)(f.text)
        warnings = len(findings) - len(errors)
        out.line(f"{profile}: {len(errors)} error(s), {warnings} warning(s)" if findings
                 else f"{profile}: consistent")
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command()(lint)
