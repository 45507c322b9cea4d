"""`plan --base REF | --base-file OLD`, and `--format markdown` output.

The change's effect (control/review/change.py): each host plans the profile and
its base in one request; the base comes from git (control/review/gitrev.py, never
a checkout) or from a file.  With an inventory inside the profile's
repository, the hosts' inventory layers are taken at the base too; a host
the base inventory does not have wanted nothing before the change.  With
--from-snapshots the hosts' plans come from their snapshots
(control/review/snapshots.py): no host is reached.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional

from nictune.cli.options import Options
from nictune.cli.output import Printer, envelope
from nictune.cli.reporting import emit, load_profile as load_local_profile
from nictune.host.errors import InvalidInput, NictuneError


class ThisHost(NamedTuple):
    """How the host commands run a request on this host or in --netns:
    cli/host_cmds.py hands its own in, so that this module need not import
    the module that dispatches to it."""
    label: Callable[[Options], str]            # the label of its report (and snapshot)
    run: Callable[[dict, Options], dict]       # the request there -> the host report


def run(target: str, opts: Options, here: ThisHost) -> int:
    """plan with a base, on this host, a namespace or an inventory's hosts."""
    out = Printer(opts.as_json)
    revision = None
    try:
        if opts.base and opts.base_file:
            raise InvalidInput("--base and --base-file do not go together: give one base")
        report, revision = _run(target, opts, out, here)
    except NictuneError as e:
        report = envelope("plan", [], error=e.as_dict())
    finally:
        if revision is not None:
            revision.close()
    _print(report, opts, target, out)
    return report["exit_code"]


def _print(report: dict, opts: Options, target: str, out: Printer) -> None:
    from nictune.control.review.change import text_lines

    if opts.as_json:
        out.json(report)
    elif emit(report, opts, target):
        pass
    elif report.get("error") and not report["hosts"]:
        out.error(report["error"]["message"])
    else:
        for line in text_lines(report["change"]):
            out.line(line)
        for f in report.get("lint") or []:
            out.warn(f"lint {f['code']}: {f['message']} ({', '.join(f['locations'])})")


def _run(target: str, opts: Options, out: Printer, here: ThisHost):
    from nictune.control.review import change
    from nictune.profile.yamlpos import read_target

    kind, _parsed = read_target(target)
    if kind == "playbook":
        raise InvalidInput(f"{target} is a playbook; --base takes a profile (plan each play's "
                           "profile with its own --base)")
    revision = None
    if opts.base:
        from nictune.control.review.gitrev import checkout_free

        revision = checkout_free(target, opts.base)
        try:
            base_path = revision.path_of(target) if revision.has(target) else None
        except BaseException:
            revision.close()
            raise
        if revision.refused_links():
            out.warn(revision.refused_links())
        if base_path is None:
            out.warn(f"{target} does not exist at {opts.base}: every setting it asks for is new")
        base_doc = {"ref": opts.base, "commit": revision.commit}
        root, label = revision.root, opts.base

        def relabelled(profile):
            return change.relabel(profile, root, label)
    else:
        base_path, base_doc = opts.base_file, {"file": opts.base_file}

        def relabelled(profile):
            return profile
    try:
        lint = _lint_change(target, base_path, relabelled)
        members = None
        if opts.inventory is None:
            hosts, base_errors, findings = _local(target, base_path, relabelled, opts, here)
        else:
            hosts, base_errors, findings, members = _fleet(target, base_path, relabelled, revision,
                                                           opts, out)
    except BaseException:
        if revision is not None:
            revision.close()
        raise
    report = envelope("plan", hosts, change=change.effect(hosts, base_doc, lint, base_errors))
    if members:
        from nictune.control.review.agreement import change_effect

        report["change"]["agreement"] = change_effect(hosts, members)
    if findings:
        report["lint"] = [f.as_dict() for f in findings]
    return report, revision


def _lint_change(target: str, base_path: Optional[str], relabelled) -> dict:
    """Lint of both sides, as `nictune lint` sees each file (inventory layers
    are per host; the gate lints those before each host's plan)."""
    from nictune.control.review.change import lint_change
    from nictune.profile.lint import lint
    from nictune.profile.loader import load_profile

    new = lint(load_profile(target))
    old = []
    if base_path is not None:
        try:
            old = lint(relabelled(load_profile(base_path)))
        except NictuneError:
            old = []  # a base that does not load is reported per host, as an error
    return lint_change(new, old)


def _local(target: str, base_path: Optional[str], relabelled, opts: Options, here: ThisHost):
    from nictune.cli.lint_cmds import lint_gate
    from nictune.control.review.change import with_base
    from nictune.control.remote.request import build_request
    from nictune.profile.loader import load_profile

    profile = load_local_profile(target)
    findings = lint_gate(profile, opts.force)
    # The same target as a plain plan (host_cmds.run_here): a snapshot's
    # label is the one the host or namespace would have.
    label = here.label(opts)
    request = build_request("plan", profile, opts.show_file_content)
    base_errors: Dict[str, dict] = {}
    base = None
    if base_path is not None:
        try:
            base = relabelled(load_profile(base_path))
        except NictuneError as e:
            base_errors[label] = e.as_dict()
    if label not in base_errors:
        request = with_base(request, base)
    return [here.run(request, opts)], base_errors, findings


def _fleet(target: str, base_path: Optional[str], relabelled, revision, opts: Options,
           out: Printer):
    from nictune.cli.fleet_cmds import _gate, _ssh_options, fabric_members, run_jobs
    from nictune.control.remote import fleet
    from nictune.control.review.change import BaseProfiles, with_base
    from nictune.inventory import load_inventory
    from nictune.profile.yamlpos import read_target

    inventory = load_inventory(opts.inventory)
    for warning in inventory.warnings:
        out.warn(warning)
    hosts = inventory.select(None, limit=opts.limit)
    _, document = read_target(target)
    profiles = fleet.Profiles(target, _gate("plan", opts), document)
    bases = BaseProfiles(base_path, _base_layers(revision, opts.inventory, out), relabelled)
    members = fabric_members([(hosts, profiles)])  # before any host: a bad nictune_fabric stops here
    jobs = fleet.jobs_for("plan", hosts, profiles, _ssh_options(opts), opts.show_file_content)
    by_name = {h.name: h for h in hosts}
    base_errors: Dict[str, dict] = {}
    for job in jobs:
        if job.request is None:
            continue
        try:
            base = bases.for_host(job.label, by_name[job.label].nictune_overrides())
        except NictuneError as e:
            base_errors[job.label] = e.as_dict()
            continue
        job.request = with_base(job.request, base)
    with out.progress("plan", len(jobs)) as tick:
        reports = run_jobs("plan", jobs, opts, tick)  # on the hosts, or from their snapshots
    # As for every fleet plan, the gate's lint warnings are not in the report.
    return reports, base_errors, [], members


def _base_layers(revision, inventory_path: str, out: Printer):
    """host name -> its inventory layers at the base, when the inventory is
    in the profile's repository; None: use today's layers."""
    if revision is None or revision.path_of(inventory_path) is None:
        return None
    if not revision.has(inventory_path):
        out.warn(f"{inventory_path} does not exist at {revision.ref}: every host is new")
        return lambda name: None
    from nictune.inventory import load_inventory

    try:
        old = load_inventory(revision.path_of(inventory_path))
    except NictuneError as e:
        raise InvalidInput(f"the inventory at {revision.ref} does not load: {e}") from None

    def layers(name: str):
        host = old.hosts.get(name)
        return None if host is None else host.nictune_overrides()
    return layers
