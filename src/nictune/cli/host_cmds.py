"""Commands that run the agent: plan, apply, verify, audit, rollback, history, show.

On this host, in a network namespace (--netns), or with -i on the hosts of
an inventory over SSH (cli/fleet_cmds.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import typer

from nictune.cli.lint_cmds import LINTED, lint_gate
from nictune.cli.options import (AUDIT_FILES, BASE, CABLING, COMMON, CONFIRM, CONTENT, FLEET, FORCE, FORMAT, HOW_FAR,
                                 JUNIT, LLDP_WAIT, PROBE, SAVE, SHOW_ALL, SNAPSHOTS, SSH, TARGET, Format, Options,
                                 with_options)
from nictune.cli.output import Printer, envelope
from nictune.cli.reporting import emit, load_profile, print_profile, save_snapshots
from nictune.control.remote.request import build_request
from nictune.control.remote.targets import target_for
from nictune.host.errors import EXIT_ERROR, INVALID_INPUT, NictuneError, error

AUDIT_NEEDS_INVENTORY = ("audit needs an inventory (-i): it reports drift across a fleet; "
                         "for this host, or a namespace with --netns, use verify")


def _dispatch(command: str, target: Optional[str], opts: Options) -> None:
    """Run the command where the options say; exits with its code."""
    if opts.format == Format.json:
        opts = replace(opts, as_json=True)
    if (opts.base or opts.base_file) and target:
        if opts.netns and opts.inventory:
            _usage(opts.as_json, command, "--netns and -i do not go together")
        from nictune.cli import change_cmds

        raise typer.Exit(change_cmds.run(target, opts, change_cmds.ThisHost(_label_here, run_here)))
    if opts.inventory is None:
        _local(command, target, opts)
    else:
        _fleet(command, target, opts)


def _local(command: str, target: Optional[str], opts: Options) -> None:
    if opts.limit or opts.junit or opts.prometheus:
        _usage(opts.as_json, command, "--limit, --junit and --prometheus need an inventory (-i)")
    if command == "audit":
        _usage(opts.as_json, command, AUDIT_NEEDS_INVENTORY)
    _run(command, target, opts)


def _fleet(command: str, target: Optional[str], opts: Options) -> None:
    if opts.netns:
        _usage(opts.as_json, command, "--netns and -i do not go together: a namespace host is "
                                      "reached through its own sshd, listed in the inventory")
    # paramiko, inventories and playbooks: only fleet commands pay for them.
    from nictune.cli import fleet_cmds

    raise typer.Exit(fleet_cmds.run(command, target, opts))


def _usage(as_json: bool, command: str, message: str) -> None:
    out = Printer(as_json)
    out.report(envelope(command, [], error=error(INVALID_INPUT, message)))
    raise typer.Exit(EXIT_ERROR)


def _run(command: str, profile_path: Optional[str], opts: Options) -> None:
    """The command on this host or in a namespace; exits with its code."""
    out = Printer(opts.as_json)
    findings: list = []
    try:
        profile = load_profile(profile_path) if profile_path else None
        if profile is not None and command in LINTED:
            findings = lint_gate(profile, opts.force)
        request = build_request(command, profile, opts.show_file_content,
                                opts.how_far() if command == "rollback" else None, opts.lldp_wait)
        if opts.save:
            request["record"] = True  # host/replay/snapshot.py: the report brings a snapshot
        host_report = run_here(request, opts)
    except NictuneError as e:  # ProfileError included
        report = envelope(command, [], error=e.as_dict())
    else:
        report = envelope(command, [host_report])
    if opts.save:
        save_snapshots(report, opts.save, out)
    if findings:
        report["lint"] = [f.as_dict() for f in findings]
        if not opts.as_json:
            for f in findings:
                out.warn(f"lint {f.text}")
    if command == "show" and not opts.as_json and report["hosts"]:
        print_profile(out, report["hosts"][0])
    elif not _markdown(report, opts, profile_path or ""):
        out.report(report, opts.show_all, profile_path or "")
    raise typer.Exit(report["exit_code"])


def run_here(request: dict, opts: Options) -> dict:
    """The request on this host or in --netns, or with --from-snapshots
    from the snapshot saved under that label ("local", "netns:NAME")."""
    if opts.from_snapshots:
        from nictune.control.review import snapshots

        label = f"netns:{opts.netns}" if opts.netns else "local"
        return snapshots.run(request, label, opts.from_snapshots,
                             snapshots.parse_age(opts.max_age))
    return target_for(opts.netns, opts.state_dir).run(request)


def _label_here(opts: Options) -> str:
    """The label of a report from this host or --netns (run_here's): a
    snapshot is saved under it."""
    if opts.from_snapshots:
        return f"netns:{opts.netns}" if opts.netns else "local"
    return target_for(opts.netns, opts.state_dir).label


def _markdown(report: dict, opts: Options, target: str) -> bool:
    return emit(report, opts, target)


@with_options(TARGET, FLEET, COMMON, FORMAT, BASE, SNAPSHOTS, SHOW_ALL, CONTENT, SSH, PROBE, FORCE)
def plan(target: Optional[str], opts: Options) -> None:
    """Dry run: show each setting's before -> after.  Exit 2 if anything would change.
    With --base REF: what the change since REF does, apart from today's drift.
    With --from-snapshots DIR: from the hosts' saved snapshots, reaching no host."""
    _dispatch("plan", target, opts)


@with_options(TARGET, FLEET, JUNIT, COMMON, SHOW_ALL, CONTENT, SSH, CONFIRM, FORCE)
def apply(target: Optional[str], opts: Options) -> None:
    """Apply, verify by reading back, roll everything back on any failure.
    With a playbook: batch by batch, each behind a health gate."""
    _dispatch("apply", target, opts)


@with_options(TARGET, FLEET, COMMON, FORMAT, SHOW_ALL, CONTENT, SSH, PROBE, LLDP_WAIT)
def verify(target: Optional[str], opts: Options) -> None:
    """Compare the host(s) with the profile.  Exit 2 on drift."""
    _dispatch("verify", target, opts)


@with_options(TARGET, FLEET, AUDIT_FILES, CABLING, COMMON, FORMAT, SAVE, SHOW_ALL, CONTENT, SSH, PROBE, LLDP_WAIT)
def audit(target: Optional[str], opts: Options) -> None:
    """Read-only drift report across a fleet: per host and key, expected and
    actual.  Exit 2 if any host drifted, 1 if any could not be audited."""
    _dispatch("audit", target, opts)


@with_options(HOW_FAR, FLEET, COMMON, CONTENT, SSH)
def rollback(target: Optional[str], opts: Options) -> None:
    """Restore the before-values of the last apply, from its journal; with
    --to or --steps, of several applies, newest first.  A rollback that
    restores nothing while earlier applies remain fails, naming them."""
    if opts.rollback_to is not None and opts.rollback_steps is not None:
        _usage(opts.as_json, "rollback", "--to and --steps do not go together: --to names the "
                                         "oldest apply to undo, --steps counts them")
    # Every key it restored is news, so each is listed, as --all would.
    _dispatch("rollback", None, replace(opts, show_all=True))


@with_options(FLEET, COMMON, SSH)
def history(target: Optional[str], opts: Options) -> None:
    """List the applies the host keeps, newest first: id, time, status,
    profile and what each changed (the ids rollback --to takes)."""
    _dispatch("history", None, opts)


@with_options(FLEET, COMMON, SAVE, SSH)
def show(target: Optional[str], opts: Options) -> None:
    """Print the current values of everything nictune manages, as a profile.
    With --save DIR: also write each host's snapshot (for plan --from-snapshots)."""
    if opts.inventory is None:
        if opts.limit:
            _usage(opts.as_json, "show", "--limit needs an inventory (-i)")
        _run("show", None, opts)
    _fleet("show", None, opts)


def register(app: typer.Typer) -> None:
    for command in (plan, apply, verify, audit, rollback, history, show):
        app.command()(command)
