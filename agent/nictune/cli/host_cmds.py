"""Commands that run the agent: plan, apply, verify, audit, rollback, show.

On this host, in a network namespace (--netns), or with -i on the hosts of
an inventory over SSH (cli/fleet_cmds.py).
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from nictune.cli.options import (
    DEFAULT_STATE,
    AcceptNewOpt,
    AllOpt,
    ConfirmOpt,
    ConnectTimeoutOpt,
    ForceOpt,
    ForksOpt,
    InventoryOpt,
    JsonOpt,
    JunitOpt,
    LimitOpt,
    NetnsOpt,
    PrometheusOpt,
    SshConfigOpt,
    StateDirOpt,
    TargetArg,
    TimeoutOpt,
)
from nictune.cli.output import Printer, envelope
from nictune.cli.fleet_cmds import LINTED, is_playbook
from nictune.cli.lint_cmds import lint_gate
from nictune.control.request import build_request
from nictune.control.targets import target_for
from nictune.host.errors import InvalidInput, NictuneError


def _run(command: str, profile_path: Optional[str], netns: Optional[str], state_dir: str,
         as_json: bool, show_ok: bool = False, force: bool = False) -> None:
    out = Printer(as_json)
    findings: list = []
    try:
        profile = None
        if profile_path:
            if is_playbook(profile_path):
                raise InvalidInput(f"{profile_path} is a playbook: it runs on the hosts of an "
                                     "inventory, so add -i INVENTORY")
            # Only commands that take a profile pay for the loader and jsonschema.
            from nictune.profile.loader import load_profile

            profile = load_profile(profile_path)
        if profile is not None and command in LINTED:
            findings = lint_gate(profile, force)
        target = target_for(netns, state_dir)
        host_report = target.run(build_request(command, profile))
    except NictuneError as e:  # ProfileError included
        report = envelope(command, [], error=e.as_dict())
    else:
        report = envelope(command, [host_report])
    if findings:
        report["lint"] = [f.as_dict() for f in findings]
        if not as_json:
            for f in findings:
                out.warn(f"lint {f.text}")
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


def _dispatch(command: str, target: Optional[str], netns: Optional[str], state_dir: str,
              as_json: bool, show_ok: bool, inventory: Optional[str], limit: Optional[str],
              forks: int, ssh, junit: Optional[str] = None, prometheus: Optional[str] = None,
              force: bool = False) -> None:
    if inventory is None:
        if limit or junit or prometheus:
            _usage(as_json, command, "--limit, --junit and --prometheus need an inventory (-i)")
        _run("verify" if command == "audit" else command, target, netns, state_dir, as_json,
             show_ok, force)
    if netns:
        _usage(as_json, command, "--netns and -i do not go together: a namespace host is "
                                 "reached through its own sshd, listed in the inventory")
    from nictune.cli import fleet_cmds

    args = fleet_cmds.FleetArgs(inventory, limit, forks, ssh, as_json, show_ok, junit, prometheus,
                                force)
    raise typer.Exit(fleet_cmds.run(command, target, args))


def _usage(as_json: bool, command: str, message: str) -> None:
    out = Printer(as_json)
    out.report(envelope(command, [], error={"kind": "invalid-input", "message": message}))
    raise typer.Exit(1)


def _ssh(accept_new: bool, connect_timeout: float, timeout: float, ssh_config: str,
         confirm_timeout: float = 0.0) -> dict:
    """control.ssh.SshOptions fields (built only when there is an inventory)."""
    return dict(connect_timeout=connect_timeout, command_timeout=timeout,
                accept_new_host_keys=accept_new, confirm_timeout=confirm_timeout,
                ssh_config=ssh_config)


FORKS = 50
CONNECT = 10.0
TIMEOUT = 120.0
CONFIRM = 30.0
SSH_CONFIG = "~/.ssh/config"


def plan(target: TargetArg, inventory: InventoryOpt = None, limit: LimitOpt = None,
         forks: ForksOpt = FORKS, netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
         as_json: JsonOpt = False, show_all: AllOpt = False, accept_new: AcceptNewOpt = False,
         connect_timeout: ConnectTimeoutOpt = CONNECT, timeout: TimeoutOpt = TIMEOUT,
         ssh_config: SshConfigOpt = SSH_CONFIG, force: ForceOpt = False) -> None:
    """Dry run: show each setting's before -> after.  Exit 2 if anything would change."""
    _dispatch("plan", str(target), netns, state_dir, as_json, show_all, inventory, limit, forks,
              _ssh(accept_new, connect_timeout, timeout, ssh_config), force=force)


def apply(target: TargetArg, inventory: InventoryOpt = None, limit: LimitOpt = None,
          forks: ForksOpt = FORKS, netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
          as_json: JsonOpt = False, show_all: AllOpt = False, accept_new: AcceptNewOpt = False,
          connect_timeout: ConnectTimeoutOpt = CONNECT, timeout: TimeoutOpt = TIMEOUT,
          ssh_config: SshConfigOpt = SSH_CONFIG, confirm_timeout: ConfirmOpt = CONFIRM,
          force: ForceOpt = False) -> None:
    """Apply, verify by reading back, roll everything back on any failure.
    With a playbook: batch by batch, each behind a health gate."""
    _dispatch("apply", str(target), netns, state_dir, as_json, show_all, inventory, limit, forks,
              _ssh(accept_new, connect_timeout, timeout, ssh_config, confirm_timeout), force=force)


def verify(target: TargetArg, inventory: InventoryOpt = None, limit: LimitOpt = None,
           forks: ForksOpt = FORKS, netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
           as_json: JsonOpt = False, show_all: AllOpt = False, accept_new: AcceptNewOpt = False,
           connect_timeout: ConnectTimeoutOpt = CONNECT, timeout: TimeoutOpt = TIMEOUT,
           ssh_config: SshConfigOpt = SSH_CONFIG) -> None:
    """Compare the host(s) with the profile.  Exit 2 on drift."""
    _dispatch("verify", str(target), netns, state_dir, as_json, show_all, inventory, limit, forks,
              _ssh(accept_new, connect_timeout, timeout, ssh_config))


def audit(target: TargetArg, inventory: InventoryOpt = None, limit: LimitOpt = None,
          forks: ForksOpt = FORKS, junit: JunitOpt = None, prometheus: PrometheusOpt = None,
          netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
          as_json: JsonOpt = False, show_all: AllOpt = False, accept_new: AcceptNewOpt = False,
          connect_timeout: ConnectTimeoutOpt = CONNECT, timeout: TimeoutOpt = TIMEOUT,
          ssh_config: SshConfigOpt = SSH_CONFIG) -> None:
    """Read-only drift report across a fleet: per host and key, expected and
    actual.  Exit 2 if any host drifted, 1 if any could not be audited."""
    _dispatch("audit", str(target), netns, state_dir, as_json, show_all, inventory, limit, forks,
              _ssh(accept_new, connect_timeout, timeout, ssh_config), junit, prometheus)


def rollback(inventory: InventoryOpt = None, limit: LimitOpt = None, forks: ForksOpt = FORKS,
             netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
             as_json: JsonOpt = False, accept_new: AcceptNewOpt = False,
             connect_timeout: ConnectTimeoutOpt = CONNECT, timeout: TimeoutOpt = TIMEOUT,
             ssh_config: SshConfigOpt = SSH_CONFIG) -> None:
    """Restore the before-values of the last apply, from its journal."""
    _dispatch("rollback", None, netns, state_dir, as_json, True, inventory, limit, forks,
              _ssh(accept_new, connect_timeout, timeout, ssh_config))


def show(netns: NetnsOpt = None, state_dir: StateDirOpt = DEFAULT_STATE,
         as_json: JsonOpt = False) -> None:
    """Print the current values of everything nictune manages, as a profile."""
    _run("show", None, netns, state_dir, as_json)


def register(app: typer.Typer) -> None:
    for command in (plan, apply, verify, audit, rollback, show):
        app.command()(command)
