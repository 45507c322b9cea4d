"""What the host, fleet and change commands share below them: a profile
read for a local command, and the ways a report leaves besides the
terminal table (Markdown, a show as a profile, snapshots to files).

Kept apart so that cli/host_cmds.py, cli/fleet_cmds.py and
cli/change_cmds.py import it and not one another in a circle.
"""

from __future__ import annotations

import sys

from nictune.cli.options import Format, Options
from nictune.cli.output import Printer
from nictune.host.errors import EXIT_ERROR, InvalidInput, combined_exit


def emit(report: dict, opts: Options, target: str = "") -> bool:
    """Print the report as Markdown when asked; False: the caller prints."""
    if opts.format != Format.markdown or opts.as_json:
        return False
    from nictune.control.review import markdown

    sys.stdout.write(markdown.report(report, target, opts.show_all))
    return True


def load_profile(path: str):
    """The profile a command runs here; a playbook is refused (it needs -i)."""
    from nictune.profile.yamlpos import read_target

    kind, parsed = read_target(path)
    if kind == "playbook":
        raise InvalidInput(f"{path} is a playbook: it runs on the hosts of an "
                           "inventory, so add -i INVENTORY")
    # Only commands that take a profile pay for the loader and jsonschema.
    from nictune.profile.loader import load_profile_parsed

    return load_profile_parsed(parsed, path)


def print_profile(out: Printer, host: dict) -> None:
    import yaml

    from nictune.host.text import printable

    if host.get("error"):
        out.error(host["error"]["message"])
        return
    for w in host.get("warnings", []):
        out.warn(w)
    sys.stdout.write(f"# Current settings of {printable(host['host'])}, as a nictune profile.\n")
    for name, facts in sorted(host.get("facts", {}).items()):
        sys.stdout.write(printable(f"# {name}: " + ", ".join(f"{k} {v}" for k, v in facts.items())) + "\n")
    sys.stdout.write(yaml.safe_dump(host["profile"], sort_keys=False, default_flow_style=False))


def save_snapshots(report: dict, directory: str, out: Printer) -> None:
    """show/audit --save: the hosts' snapshots to files, out of the report."""
    from nictune.control.review import snapshots

    try:
        warnings = snapshots.save(report["hosts"], directory)
    except OSError as e:
        out.error(f"--save {directory}: {e.strerror or e}")
        report["exit_code"] = combined_exit([report["exit_code"], EXIT_ERROR])
        return
    for w in warnings:
        out.warn(w)
    saved = sum(1 for h in report["hosts"] if h.get("snapshot_file"))
    out.note(f"saved {saved} snapshot(s) to {directory}")
