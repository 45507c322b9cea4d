"""Commands that only read profiles: validate, schema."""

from __future__ import annotations

import sys

import typer

from nictune.cli.options import JsonOpt, ProfilesArg
from nictune.cli.output import Printer, envelope
from nictune.host.errors import EXIT_ERROR, EXIT_OK


def validate(profiles: ProfilesArg, as_json: JsonOpt = False) -> None:
    """Check profiles against the schema, with their extends: chains."""
    from nictune.profile.errors import ProfileError
    from nictune.profile.loader import load_profile

    results = []
    for path in profiles:
        try:
            loaded = load_profile(str(path))
            results.append({"path": str(path), "ok": True, "files": loaded.files})
        except ProfileError as e:
            results.append({"path": str(path), "ok": False, "error": e.as_dict()})
    code = EXIT_ERROR if any(not r["ok"] for r in results) else EXIT_OK
    out = Printer(as_json)
    if as_json:
        report = envelope("validate", [], profiles=results)
        report["exit_code"] = code
        out.json(report)
    else:
        for r in results:
            if r["ok"]:
                out.line(f"ok: {r['path']}")
            else:
                out.error(r["error"]["message"])
    raise typer.Exit(code)


def schema(as_json: JsonOpt = False) -> None:
    """Print the profile JSON Schema (2020-12), for editors and CI."""
    from nictune.profile import SCHEMA, schema_json

    if as_json:  # the report every --json prints, the schema in it
        Printer(as_json).json(envelope("schema", [], schema=SCHEMA))
    else:  # the schema alone, the file editors and validators take
        sys.stdout.write(schema_json() + "\n")


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(schema)
