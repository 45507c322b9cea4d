"""plan / apply / verify / audit / rollback / history on an inventory of SSH hosts.

TARGET is a profile, or a playbook (a YAML list of plays): with a profile,
every selected host gets it (plus its inventory overrides); with a
playbook, each play's hosts get the play's profile, and `apply` rolls out
batch by batch behind a health gate (control/rollout/playbook.py).

Only fleet commands import this module (cli/host_cmds.py), so paramiko
(control/remote/fleet.py) is imported at the top; inventories, playbooks and the
profile loader still only when a command needs them.
"""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

from nictune.cli.lint_cmds import LINTED, lint_gate
from nictune.cli.options import Options
from nictune.cli.output import Printer, envelope
from nictune.cli.reporting import emit, print_profile, save_snapshots
from nictune.control.remote import fleet
from nictune.control.remote.ssh import SshOptions
from nictune.host.errors import EXIT_ERROR, NictuneError, combined_exit
from nictune.profile.errors import ProfileError
from nictune.profile.yamlpos import Parsed, read_target


def run(command: str, target: Optional[str], opts: Options) -> int:
    """The whole fleet command; returns the exit code."""
    out = Printer(opts.as_json)
    try:
        cabling = _cabling_plan(opts) if command == "audit" else None
        report = _run(command, target, opts, out)
        if cabling is not None:
            _check_cabling(report, *cabling)
    except NictuneError as e:  # ProfileError included
        report = envelope(command, [], error=e.as_dict())
    if opts.save:
        save_snapshots(report, opts.save, out)
    if command in ("audit", "apply"):  # apply takes --junit only: a rollout's batches and gates
        _write_audit_files(report, opts, out)
    if command == "show" and not opts.as_json and report["hosts"]:
        for host in report["hosts"]:  # each host's settings as a profile, as a local show
            print_profile(out, host)
    elif not emit(report, opts, target or ""):
        out.fleet(report, opts.show_all, target or "")
    return report["exit_code"]


def _run(command: str, target: Optional[str], opts: Options, out: Printer) -> dict:
    from nictune.inventory import load_inventory

    inventory = load_inventory(opts.inventory)
    for warning in inventory.warnings:
        out.warn(warning)
    kind, document = _read(target) if target else (None, None)
    if kind == "playbook":
        return _run_playbook(command, target, document, inventory, opts, out)
    # Every host the limit allows, in inventory order (Ansible's), not the limit's.
    hosts = inventory.select(None, limit=opts.limit)
    profiles = fleet.Profiles(target, _gate(command, opts), document) if kind else None
    # An audit's fabrics before any host is reached: a bad nictune_fabric stops it.
    members = fabric_members([(hosts, profiles)]) if command == "audit" else None
    report = envelope(command, _pool(_agent_command(command), hosts, profiles, opts, out))
    if members:
        _agree(report, members)
    return report


def fabric_members(plays: list):
    """The fabric of each host (control/review/agreement.py) and its
    profile's agreement: section; `plays` is [(inventory hosts, their
    Profiles)].  Raises InventoryError, naming the variable's file and
    line, for a nictune_fabric that cannot name a fabric."""
    from nictune.control.review import agreement
    from nictune.inventory.errors import InventoryError

    members = agreement.Membership()
    for hosts, profiles in plays:
        for host in hosts:
            value = fleet._plain(host, agreement.FABRIC_VARIABLE)  # no vault, no template
            try:
                name = agreement.fabric_name(value)
            except ValueError as e:
                file, line = host.where_of(agreement.FABRIC_VARIABLE) or (None, None)
                raise InventoryError(file, line, f"{agreement.FABRIC_VARIABLE} of host "
                                                 f"{host.name!r} {e}") from None
            profile = _profile_or_none(profiles, host) if name is not None else None
            members.add(host.name, name, getattr(profile, "doc", None))
    return members


def _agree(report: dict, members) -> None:
    """An audit's fabric agreement, from the reports it read.  A
    disagreement is drift of the fabric: exit code 2 at least."""
    from nictune.control.review import agreement
    from nictune.host.errors import EXIT_PENDING

    for r in report["hosts"]:
        if r["host"] in members.fabric:
            r["fabric"] = members.fabric[r["host"]]
    report["agreement"] = doc = agreement.agreement(report["hosts"], members)
    if doc["summary"]["disagreeing"]:
        report["exit_code"] = combined_exit([report["exit_code"], EXIT_PENDING])


def _profile_or_none(profiles, host):
    """The host's profile, already built for its request; None for a host
    whose profile failed (its report carries the error)."""
    try:
        return profiles.for_host(host) if profiles else None
    except Exception:  # noqa: BLE001 - the same error is in the host's report
        return None


def _cabling_plan(opts: Options):
    """(path, rows) of the audit's cabling plan, read before any host is
    contacted (a bad plan is the command's error); None without one."""
    from nictune.control.review import cabling

    path = opts.cabling or cabling.default_path(opts.inventory)
    return None if path is None else (path, cabling.load_plan(path))


def _check_cabling(report: dict, path: str, rows: list) -> None:
    """The plan against the neighbours in the hosts' reports: no host is
    asked again.  A rail not as planned is drift: exit code 2 at least."""
    from nictune.control.review import cabling
    from nictune.host.errors import EXIT_PENDING

    report["cabling"] = doc = cabling.for_audit(report["hosts"], rows, path)
    if doc["summary"]["failing"]:
        report["exit_code"] = combined_exit([report["exit_code"], EXIT_PENDING])


def _agent_command(command: str) -> str:
    return "verify" if command == "audit" else command  # an audit is verify on each host


def _read(target: str) -> Tuple[str, Union[Parsed, ProfileError]]:
    """read_target, except that a profile that does not read is returned,
    not raised: like every other profile error it is each selected host's
    error (none at all when no host is selected), not the command's."""
    try:
        return read_target(target)
    except ProfileError as e:
        return "profile", e


def _pool(command: str, hosts: list, profiles, opts: Options, out: Printer,
          play=None) -> List[dict]:
    jobs = fleet.jobs_for(command, hosts, profiles, _ssh_options(opts), opts.show_file_content,
                          opts.how_far() if command == "rollback" else None, opts.lldp_wait)
    if opts.save:
        for job in jobs:
            if job.request is not None:
                job.request["record"] = True  # host/replay/snapshot.py: the report brings a snapshot
    label = f" ({play.name})" if play else ""
    with out.progress(f"{command}{label}", len(jobs)) as tick:
        return run_jobs(command, jobs, opts, tick)


def run_jobs(command: str, jobs: list, opts: Options, tick) -> List[dict]:
    """On the hosts, or with --from-snapshots from their snapshots."""
    if opts.from_snapshots:
        from nictune.control.review import snapshots

        return snapshots.run_jobs(jobs, opts.from_snapshots, snapshots.parse_age(opts.max_age),
                                  tick)
    return fleet.run_jobs(command, jobs, opts.forks, tick)


def _ssh_options(opts: Options) -> SshOptions:
    return SshOptions(connect_timeout=opts.connect_timeout, command_timeout=opts.timeout,
                      accept_new_host_keys=opts.accept_new, confirm_timeout=opts.confirm_timeout,
                      ssh_config=opts.ssh_config, probe=opts.probe)


def _run_playbook(command: str, path: str, parsed: Parsed, inventory, opts: Options,
                  out: Printer) -> dict:
    from nictune.control.rollout import playbook

    plays = playbook.load_playbook_parsed(parsed, path)
    # Every play's gate before the first play writes: a bad gate in play 2
    # must not be found after play 1 rolled out.  plan checks them too.
    # One name per play's rollout, for its hooks' and its gate's {rollout}.
    names = [playbook.rollout_id() for _ in plays]
    gates = [_gate_for(play, inventory, opts, name) if play.gate is not None and command in ("plan", "apply")
             else None for play, name in zip(plays, names)]
    limit = None if opts.limit is None else {h.name for h in inventory.select(None, limit=opts.limit)}
    # Every play's hosts before the first play writes: they read the
    # playbook's group_vars/ and host_vars/, whose mistakes stop the command.
    read_before = len(inventory.warnings)
    play_hosts = [[play.host(h) for h in inventory.select(play.hosts) if limit is None or h.name in limit]
                  for play in plays]
    for warning in inventory.warnings[read_before:]:
        out.warn(warning)
    reports: List[dict] = []
    rollouts = []
    every = [(hosts, fleet.PlayProfiles(play, _gate(command, opts)))
             for play, hosts in zip(plays, play_hosts)]
    members = fabric_members(every) if command == "audit" else None
    for play, gate, (hosts, profiles), name in zip(plays, gates, every, names):
        if command != "apply":
            reports += _pool(_agent_command(command), hosts, profiles, opts, out, play)
            continue

        def run_some(cmd: str, some: list, profiles=profiles, play=play) -> List[dict]:
            # rollout hands back some of the inventory hosts given to it
            return _pool(cmd, some, profiles if cmd != "rollback" else None, opts, out, play)

        result = playbook.rollout(play, hosts, run_some, out.batch_done, gate=gate, name=name)
        rollouts.append(result)
        # A host whose apply the rollout undid says so in the host table.
        undone = {n: listed for listed in ("rolled_back", "rollback_failed") for n in result[listed]}
        for r in (r for batch in result["batches"] for r in batch.get("reports", [])):
            if r.get("host") in undone:
                r["rollout"] = undone[r["host"]]
            reports.append(r)
        if result["stopped"]:
            break  # a stopped play stops the playbook, as in Ansible
    report = envelope(command, reports, **({"rollouts": rollouts} if rollouts else {}))
    if members:
        _agree(report, members)
    if rollouts:
        # The same order as for hosts (4, 3, 1, 2): a plain max would rank drift over error.
        report["exit_code"] = combined_exit([report["exit_code"]] + [r["exit_code"] for r in rollouts])
    return report


def _gate_for(play, inventory, opts: Options, rollout_name: str = ""):
    """The traffic gate for a play with a gate: key, as rollout() calls it:
    gate(batch number, hosts) -> {"passed", "message", "results"}
    (control/rollout/playbook.py Gate), built by control/rollout/gate/runner.py over the fleet's
    own SSH settings; a bad gate: raises ProfileError before any write."""
    from nictune.control.rollout.gate.runner import for_play
    from nictune.control.rollout.gate.spec import gate_of_play

    spec = gate_of_play(play)
    return for_play(play, spec, inventory, _ssh_options(opts), rollout_name=rollout_name) if spec is not None \
        else None


def _gate(command: str, opts: Options):
    if command not in LINTED:
        return None
    return lambda profile: lint_gate(profile, opts.force)


def _write_audit_files(report: dict, opts: Options, out: Printer) -> None:
    import time

    from nictune.control.review import audit_formats as fmt

    junit = fmt.junit_rollouts if report.get("rollouts") else fmt.junit
    for path, render in ((opts.junit, lambda: junit(report)),
                         (opts.prometheus, lambda: fmt.prometheus(report, time.time()))):
        if not path:
            continue
        try:
            fmt.write_report_file(path, render())
        except NictuneError as e:
            out.error(str(e))
            report["exit_code"] = combined_exit([report["exit_code"], EXIT_ERROR])
