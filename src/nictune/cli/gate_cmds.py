"""`nictune gate record PLAYBOOK -i INVENTORY`: the traffic gate's
measurements (control/rollout/gate/), without applying anything, written to
the gate's baseline file for later rollouts to compare with.

For each play with a `gate:`, its hosts (narrowed by --limit) are split
into the play's batches and each batch is measured as its rollout would
measure it (the same pairs, rails and tools), so the figures' keys are
the ones the gate later looks up.  The play's hooks run around each batch
as in a rollout (before_batch, after_batch, cleanup, with the same
{rollout} for the gate's launcher): a batch is measured on nodes the hooks
took out of service, in the reservation its launcher names.  The figures are merged into the file
(--out, else the gate's `baseline:`): entries of other pairs stay.  The
exit code is 1 when a measurement did not give figures.
"""

from __future__ import annotations

from typing import Optional

import typer

from nictune.cli.options import INVENTORY, JSON, OUT_FILE, PLAYBOOK, SSH, Options, with_options
from nictune.cli.output import Printer
from nictune.host.errors import EXIT_ERROR, EXIT_OK, NictuneError

gate = typer.Typer(help="The traffic gate of playbooks: record baselines.", no_args_is_help=True)


@gate.command("record")
@with_options(PLAYBOOK, INVENTORY, OUT_FILE, SSH, JSON)
def record(playbook_path: Optional[str], opts: Options) -> None:
    """Measure the gate's traffic on the play's hosts (nothing applied) and store the figures."""
    if not opts.inventory:
        raise typer.BadParameter("gate record runs on an inventory's hosts: give -i", param_hint="-i")
    from nictune.control.remote.ssh import SshOptions

    options = SshOptions(connect_timeout=opts.connect_timeout, command_timeout=opts.timeout,
                         accept_new_host_keys=opts.accept_new, ssh_config=opts.ssh_config)
    try:
        report = run_record(str(playbook_path), opts.inventory, opts.limit, opts.out_file, options)
    except NictuneError as e:  # ProfileError and InventoryError included
        report = {"command": "gate record", "ok": False, "error": e.as_dict(), "plays": []}
    _print(report, Printer(opts.as_json))
    raise typer.Exit(EXIT_OK if report["ok"] else EXIT_ERROR)


def run_record(path: str, inventory_path: str, limit: Optional[str], out_file: Optional[str],
               options) -> dict:
    from nictune.control.rollout import playbook
    from nictune.control.rollout.gate.baselines import write_baseline
    from nictune.control.rollout.gate.runner import for_play
    from nictune.control.rollout.gate.spec import load_play_gates
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
        name = playbook.rollout_id()
        runner = for_play(play, spec, inventory, options, compare=False, rollout_name=name)
        rows, messages, hook_failed = [], [], False
        for number, batch in enumerate(playbook.make_batches(play.serial, hosts), start=1):
            result = _measure(play, runner, number, batch, name)
            hook_failed = hook_failed or bool(result.get("hook_failed"))
            runner.kept += [h.name for h in batch if h.name not in runner.kept]  # as if it passed
            rows += result["results"]
            messages.append(result["message"])
        unmeasured = [r for r in rows if r["tool"] not in ("counters",) and not r.get("figures")]
        if hook_failed:
            report["ok"] = False
        written = write_baseline(target, rows)
        report["plays"].append({"play": play.name, "baseline": target, "entries": written,
                                "results": rows, "messages": messages})
        if unmeasured or not rows:
            report["ok"] = False
    return report


def _measure(play, runner, number: int, batch: list, name: str) -> dict:
    """The gate's answer for one batch, between the play's hooks as a
    rollout runs them; a hook that fails is the batch's failure."""
    from nictune.control.rollout import hooks as hooklib
    from nictune.control.rollout.playbook import hook_words

    names = [h.name for h in batch]
    result = {"passed": False, "message": "", "results": []}
    try:
        _, failed = hooklib.run_hooks(play.hooks, "before_batch", number, names, rollout=name)
        if failed is None:
            result = runner(number, batch)
            _, failed = hooklib.run_hooks(play.hooks, "after_batch", number, names, "",
                                          {n: "unchanged" for n in names}, name)
    finally:
        _, cleanup_failed = hooklib.run_hooks(play.hooks, "cleanup", number, names, "",
                                              {n: "unchanged" for n in names}, name)
    words = [hook_words(f) for f in (failed, cleanup_failed) if f is not None]
    if words:
        result = dict(result, message="; ".join(filter(None, [result["message"], *words])), hook_failed=True)
    return result


def _print(report: dict, out: Printer) -> None:
    if out.as_json:
        out.json(report, sort_keys=True)
        return
    if report.get("error"):
        out.error(report["error"]["message"], prefix="nictune gate record")
        return
    for play in report["plays"]:
        out.line(f"{play['play']}: {play['entries']} entries in {play['baseline']}")
        for r in play["results"]:
            who = f"{r['client']} > {r['server']}" if r["server"] else r["client"]
            figures = ", ".join(f"{k} {v:g}" for k, v in r["figures"].items())
            mark = "ok  " if r["figures"] or r["passed"] else "FAIL"
            out.line(f"  {mark} {who} {r['rail']} {r['tool']}: {figures or r['why']}")
