"""`nictune slurm-health PROFILE`: the node health check Slurm runs
(HealthCheckProgram, or a prolog); control/slurmhealth.py does the work."""

from __future__ import annotations

import json
import os
import socket
from typing import Optional

import typer

from nictune.cli.options import JsonOpt, NetnsOpt, StateDirOpt
from nictune.host.errors import NictuneError
from nictune.host.transaction.journal import DEFAULT_STATE_DIR


def slurm_health(
    profile: str = typer.Argument(..., help="The profile this node must match."),
    node: Optional[str] = typer.Option(None, "--node", help="This node's Slurm name (default: "
                                       "$SLURMD_NODENAME, else the short host name)."),
    budget: float = typer.Option(10.0, "--budget", min=0.001, max=600,
                                 help="Seconds the verify may take; past it nothing is drained (exit 2)."),
    max_drained: float = typer.Option(10.0, "--max-drained", min=0, max=100,
                                      help="Drain-storm threshold: the most nodes, in percent of the "
                                      "cluster, nictune drains for one and the same reason (one node "
                                      "always may); past it the drift is reported, not drained."),
    netns: NetnsOpt = None,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Verify this node for Slurm: drain it on drift (reason "nictune: ..."), resume it once
    clean if nictune drained it, never a drain storm.  Exit 0 clean or left as is, 1 drained,
    2 the check could not run."""
    from nictune.cli.reporting import load_profile
    from nictune.control import slurmhealth
    from nictune.control.remote.request import build_request

    name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        request = build_request("verify", load_profile(profile))
    except NictuneError as e:
        outcome = slurmhealth.Outcome(name, "failed", message=str(e), exit_code=slurmhealth.EXIT_FAILED)
    else:
        outcome = slurmhealth.check(request, name, state_dir, netns, budget, max_drained)
    print(json.dumps(outcome.as_dict(), indent=2) if as_json else outcome.line())
    raise typer.Exit(outcome.exit_code)


def register(app: typer.Typer) -> None:
    app.command("slurm-health")(slurm_health)
