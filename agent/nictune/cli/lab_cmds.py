"""`nictune lab up|down`: a local lab of namespaces for demos and tests."""

from __future__ import annotations

import typer

from nictune.cli.options import JsonOpt
from nictune.cli.output import Printer, envelope
from nictune.control import lab as labmod
from nictune.errors import NictuneError

lab = typer.Typer(help="A local lab of network namespaces joined by veth (no NIC needed).",
                  no_args_is_help=True)


def _finish(command: str, as_json: bool, work) -> None:
    out = Printer(as_json)
    try:
        result = work()
        report = envelope(command, [], lab=result)
    except (NictuneError, OSError) as e:
        report = envelope(command, [], error={"kind": "system", "message": str(e)})
    if as_json:
        out.json(report)
    elif report.get("error"):
        out.error(report["error"]["message"])
    else:
        _describe(out, command, report["lab"])
    raise typer.Exit(report["exit_code"])


def _describe(out: Printer, command: str, result: dict) -> None:
    if command == "lab up":
        for ns in result["namespaces"]:
            out.line(f"{ns}: {result['interface']} {result['addresses'][ns]}")
        out.line(f"Try: nictune plan profiles/lab-veth.yaml --netns {result['namespaces'][0]}")
    else:
        out.line("removed: " + (", ".join(result["removed"]) or "nothing"))


@lab.command()
def up(as_json: JsonOpt = False) -> None:
    """Create namespaces ntlab1 and ntlab2 joined by a veth pair (198.18.0.0/30)."""
    _finish("lab up", as_json, labmod.up)


@lab.command()
def down(as_json: JsonOpt = False) -> None:
    """Remove the lab and everything it created."""
    _finish("lab down", as_json, labmod.down)
