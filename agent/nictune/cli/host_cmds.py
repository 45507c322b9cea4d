"""Commands that run the agent on a target: plan, apply, verify, rollback, show."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from nictune.cli.options import DEFAULT_STATE, AllOpt, JsonOpt, NetnsOpt, ProfileArg, StateDirOpt
from nictune.cli.output import Printer, envelope
from nictune.control.request import build_request
from nictune.control.targets import target_for
from nictune.errors import NictuneError


def _run(command: str, profile_path: Optional[str], netns: Optional[str], state_dir: str,
         as_json: bool, show_ok: bool = False) -> None:
    # Only commands that take a profile pay for yaml and jsonschema.
    from nictune.profile.loader import ProfileError, load_profile

    out = Printer(as_json)
    try:
        profile = load_profile(profile_path) if profile_path else None
        target = target_for(netns, state_dir)
        host_report = target.run(build_request(command, profile))
    except ProfileError as e:
        report = envelope(command, [], error={"kind": "profile", "message": str(e)})
    except NictuneError as e:
        report = envelope(command, [], error=e.as_dict())
    else:
        report = envelope(command, [host_report])
    if command == "show" and not as_json and report["hosts"]:
        _print_profile(out, report["hosts"][0])
    else:
        out.report(report, show_ok, profile_path or "")
    raise typer.Exit(report["exit_code"])


def _print_profile(out: Printer, host: dict) -> None:
    import yaml

    if host.get("error"):
        out.error(host["error"]["message"])
        return
    sys.stdout.write(f"# Current settings of {host['host']}, as a nictune profile.\n")
    for name, facts in sorted(host.get("facts", {}).items()):
        sys.stdout.write(f"# {name}: " + ", ".join(f"{k} {v}" for k, v in facts.items()) + "\n")
    sys.stdout.write(yaml.safe_dump(host["profile"], sort_keys=False, default_flow_style=False))


def plan(profile: ProfileArg, netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
         as_json: JsonOpt = False, show_all: AllOpt = False) -> None:
    """Dry run: show each setting's before -> after.  Exit 2 if anything would change."""
    _run("plan", str(profile), netns, state_dir, as_json, show_all)


def apply(profile: ProfileArg, netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
          as_json: JsonOpt = False, show_all: AllOpt = False) -> None:
    """Apply, verify by reading back, roll everything back on any failure."""
    _run("apply", str(profile), netns, state_dir, as_json, show_all)


def verify(profile: ProfileArg, netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
           as_json: JsonOpt = False, show_all: AllOpt = False) -> None:
    """Compare the host with the profile.  Exit 2 on drift."""
    _run("verify", str(profile), netns, state_dir, as_json, show_all)


def rollback(netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
             as_json: JsonOpt = False) -> None:
    """Restore the before-values of the last apply, from its journal."""
    _run("rollback", None, netns, state_dir, as_json, True)


def show(netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
         as_json: JsonOpt = False) -> None:
    """Print the current values of everything nictune manages, as a profile."""
    _run("show", None, netns, state_dir, as_json)


def register(app: typer.Typer) -> None:
    for command in (plan, apply, verify, rollback, show):
        app.command()(command)
