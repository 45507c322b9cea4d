"""`nictune gate record PLAYBOOK -i INVENTORY`: the traffic gate's
measurements (control/gate/), without applying anything, written to
the gate's baseline file for later rollouts to compare with.

For each play with a `gate:`, its hosts (narrowed by --limit) are split
into the play's batches and each batch is measured as its rollout would
measure it (the same pairs, rails and tools), so the figures' keys are
the ones the gate later looks up.  The figures are merged into the file
(--out, else the gate's `baseline:`): entries of other pairs stay.  The
exit code is 1 when a measurement did not give figures.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from nictune.cli.options import (AcceptNewOpt, ConnectTimeoutOpt, InventoryOpt, JsonOpt, LimitOpt,
                                  SshConfigOpt, TimeoutOpt)
from nictune.host.errors import EXIT_ERROR, EXIT_OK, NictuneError

gate = typer.Typer(help="The traffic gate of playbooks: record baselines.", no_args_is_help=True)


@gate.command("record")
def record(
    playbook_path: str = typer.Argument(..., metavar="PLAYBOOK", help="Playbook whose plays have gate:."),
    inventory: InventoryOpt = None,
    limit: LimitOpt = None,
    out_file: Optional[str] = typer.Option(None, "--out", metavar="FILE",
                                           help="Write here rather than to the gate's baseline: file."),
    accept_new: AcceptNewOpt = False,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    timeout: TimeoutOpt = 120.0,
    ssh_config: SshConfigOpt = "~/.ssh/config",
    as_json: JsonOpt = False,
) -> None:
    """Measure the gate's traffic on the play's hosts (nothing applied) and store the figures."""
    if not inventory:
        raise typer.BadParameter("gate record runs on an inventory's hosts: give -i", param_hint="-i")
    from nictune.control.ssh import SshOptions

    options = SshOptions(connect_timeout=connect_timeout, command_timeout=timeout,
                         accept_new_host_keys=accept_new, ssh_config=ssh_config)
    try:
        report = run_record(playbook_path, inventory, limit, out_file, options)
    except NictuneError as e:  # ProfileError and InventoryError included
        report = {"command": "gate record", "ok": False, "error": str(e), "plays": []}
    _print(report, as_json)
    raise typer.Exit(EXIT_OK if report["ok"] else EXIT_ERROR)


def run_record(path: str, inventory_path: str, limit: Optional[str], out_file: Optional[str],
               options) -> dict:
    from nictune.control import playbook
    from nictune.control.gate.baselines import write_baseline
    from nictune.control.gate.runner import for_play
    from nictune.control.gate.spec import load_play_gates
    from nictune.inventory import load_inventory
    from nictune.profile.errors import ProfileError

    inventory = load_inventory(inventory_path)
    plays = playbook.load_playbook(path)
    specs = load_play_gates(path)
    allowed = None if limit is None else {h.name for h in inventory.select(None, limit=limit)}
    report: dict = {"command": "gate record", "ok": True, "plays": []}
    for play, spec in zip(plays, specs):
        if spec is None:
            continue
        target = out_file or spec.baseline
        if not target:
            file, _, line = spec.source.rpartition(":")
            raise ProfileError(file, int(line), "gate", "the gate names no baseline: file "
                                       "to record into (or give --out)")
        hosts = [play.host(h) for h in inventory.select(play.hosts) if allowed is None or h.name in allowed]
        runner = for_play(play, spec, inventory, options, compare=False)
        rows, messages = [], []
        for number, batch in enumerate(playbook.make_batches(play.serial, hosts), start=1):
            result = runner(number, batch)
            runner.kept += [h.name for h in batch if h.name not in runner.kept]  # as if it passed
            rows += result["results"]
            messages.append(result["message"])
        unmeasured = [r for r in rows if r["tool"] not in ("counters",) and not r.get("figures")]
        written = write_baseline(target, rows)
        report["plays"].append({"play": play.name, "baseline": target, "entries": written,
                                "results": rows, "messages": messages})
        if unmeasured or not rows:
            report["ok"] = False
    return report


def _print(report: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
        return
    if report.get("error"):
        sys.stderr.write(f"nictune gate record: {report['error']}\n")
        return
    for play in report["plays"]:
        sys.stdout.write(f"{play['play']}: {play['entries']} entries in {play['baseline']}\n")
        for r in play["results"]:
            who = f"{r['client']} > {r['server']}" if r["server"] else r["client"]
            figures = ", ".join(f"{k} {v:g}" for k, v in r["figures"].items())
            mark = "ok  " if r["figures"] or r["passed"] else "FAIL"
            sys.stdout.write(f"  {mark} {who} {r['rail']} {r['tool']}: {figures or r['why']}\n")
