"""plan / apply / verify / audit / rollback on an inventory of SSH hosts.

TARGET is a profile, or a playbook (a YAML list of plays): with a profile,
every selected host gets it (plus its inventory overrides); with a
playbook, each play's hosts get the play's profile, and `apply` rolls out
batch by batch behind a health gate (control/playbook.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from nictune.cli.output import Printer, envelope
from nictune.host.errors import combined_exit
from nictune.host.errors import NictuneError

# paramiko, inventories and playbooks are imported only by fleet commands:
# a local plan does not pay for them.


@dataclass
class FleetArgs:
    inventory: str
    limit: Optional[str]
    forks: int
    ssh: dict                   # control.ssh.SshOptions fields
    as_json: bool
    show_ok: bool = False
    junit: Optional[str] = None
    prometheus: Optional[str] = None
    force: bool = False


# Commands that refuse an inconsistent profile unless --force (nictune lint).
LINTED = ("plan", "apply")


def is_playbook(path: str) -> bool:
    """Ansible's rule: a playbook is a list of plays, a profile a mapping."""
    from nictune.profile.yamlpos import parse_file

    try:
        parse_file(path, "playbook")
    except Exception:  # noqa: BLE001 - the profile loader reports it properly
        return False
    return True


def run(command: str, target: Optional[str], args: FleetArgs) -> int:
    """The whole fleet command; returns the exit code."""
    out = Printer(args.as_json)
    try:
        report = _run(command, target, args, out)
    except NictuneError as e:  # ProfileError included
        report = envelope(command, [], error=e.as_dict())
    if command == "audit":
        _write_audit_files(report, args, out)
    out.fleet(report, args.show_ok, target or "")
    return report["exit_code"]


def _run(command: str, target: Optional[str], args: FleetArgs, out: Printer) -> dict:
    from nictune.control import fleet
    from nictune.inventory import load_inventory

    inventory = load_inventory(args.inventory)
    for warning in inventory.warnings:
        out.warn(warning)
    agent_command = "verify" if command == "audit" else command
    if target and is_playbook(target):
        return _run_playbook(command, agent_command, target, inventory, args, out)
    hosts = inventory.select(args.limit)
    profiles = fleet.Profiles(target, gate=_gate(command, args)) if target else None
    reports = _pool(agent_command, hosts, profiles, args, out)
    return envelope(command, reports)


def _pool(command: str, hosts: list, profiles, args: FleetArgs, out: Printer,
          play=None) -> List[dict]:
    from nictune.control import fleet
    from nictune.control.ssh import SshOptions

    jobs = fleet.jobs_for(command, hosts, profiles, SshOptions(**args.ssh), play)
    label = f" ({play.name})" if play else ""
    with out.progress(f"{command}{label}", len(jobs)) as tick:
        return fleet.run_jobs(command, jobs, args.forks, tick)


def _run_playbook(command: str, agent_command: str, path: str, inventory, args: FleetArgs,
                  out: Printer) -> dict:
    from nictune.control import playbook
    from nictune.control.fleet import PlayProfiles

    plays = playbook.load_playbook(path)
    limit = set(h.name for h in inventory.select(args.limit)) if args.limit else None
    reports: List[dict] = []
    rollouts = []
    for play in plays:
        hosts = [h for h in inventory.select(play.hosts) if limit is None or h.name in limit]
        profiles = PlayProfiles(play, _gate(command, args))
        if command != "apply":
            reports += _pool(agent_command, hosts, profiles, args, out, play)
            continue

        def run_some(cmd: str, some: list, profiles=profiles, play=play) -> List[dict]:
            # rollout hands back some of the inventory hosts given to it
            return _pool(cmd, some, profiles if cmd != "rollback" else None, args, out, play)

        result = playbook.rollout(play, hosts, run_some, out.batch_done)
        rollouts.append(result)
        reports += [r for batch in result["batches"] for r in batch.get("reports", [])]
        if result["stopped"]:
            break  # a stopped play stops the playbook, as in Ansible
    report = envelope(command, reports, **({"rollouts": rollouts} if rollouts else {}))
    if rollouts:
        # The same order as for hosts (4, 3, 1, 2): a plain max would rank drift over error.
        report["exit_code"] = combined_exit([report["exit_code"]] + [r["exit_code"] for r in rollouts])
    return report


def _gate(command: str, args: FleetArgs):
    if command not in LINTED:
        return None
    from nictune.cli.lint_cmds import lint_gate

    return lambda profile: lint_gate(profile, args.force)


def _write_audit_files(report: dict, args: FleetArgs, out: Printer) -> None:
    import time

    from nictune.control import audit_formats as fmt

    for path, render in ((args.junit, lambda: fmt.junit(report)),
                         (args.prometheus, lambda: fmt.prometheus(report, time.time()))):
        if not path:
            continue
        try:
            fmt.write_report_file(path, render())
        except NictuneError as e:
            out.error(str(e))
            report["exit_code"] = combined_exit([report["exit_code"], 1])

