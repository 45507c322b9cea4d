"""Option aliases shared by every command (Typer's Annotated style)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from nictune.host.journal import DEFAULT_STATE_DIR

ProfileArg = Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile YAML file.", show_default=False)]
ProfilesArg = Annotated[List[Path], typer.Argument(metavar="PROFILE...", help="Profile YAML files.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the JSON report (format: docs/report-format.md).")]
NetnsOpt = Annotated[Optional[str], typer.Option("--netns", "-n", metavar="NS",
                                                 help="Run inside this network namespace.")]
StateDirOpt = Annotated[str, typer.Option("--state-dir", metavar="DIR", envvar="NICTUNE_STATE_DIR",
                                          help="Where journals and the lock live on the target.")]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Also list settings already as wanted.")]
DEFAULT_STATE = DEFAULT_STATE_DIR

# -- fleets (over SSH) ------------------------------------------------------
TargetArg = Annotated[Path, typer.Argument(metavar="TARGET", show_default=False,
                                           help="Profile YAML, or with -i a playbook.")]
InventoryOpt = Annotated[Optional[str], typer.Option(
    "--inventory", "-i", metavar="INVENTORY",
    help="Ansible inventory (INI or YAML): run on its hosts over SSH.")]
LimitOpt = Annotated[Optional[str], typer.Option(
    "--limit", "-l", metavar="PATTERN", help="Only these hosts (Ansible patterns: web:&rack1:!web03).")]
ForksOpt = Annotated[int, typer.Option("--forks", "-f", min=1, max=1000,
                                       help="Hosts worked on at once.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-keys", help="Trust and remember unknown host keys (changed keys stay refused).")]
ConnectTimeoutOpt = Annotated[float, typer.Option("--connect-timeout", min=0.1, metavar="SECONDS",
                                                  help="Per host: connect, SSH handshake, login.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, metavar="SECONDS",
                                           help="Per host: the whole command once connected.")]
ConfirmOpt = Annotated[float, typer.Option(
    "--confirm-timeout", min=0, max=3600, metavar="SECONDS",
    help="Remote apply: the host undoes it unless confirmed within this time (0: off).")]
SshConfigOpt = Annotated[str, typer.Option("--ssh-config", metavar="FILE",
                                           help="OpenSSH client config to honour.")]
JunitOpt = Annotated[Optional[str], typer.Option("--junit", metavar="FILE",
                                                 help="Also write JUnit XML (a testcase per host).")]
PrometheusOpt = Annotated[Optional[str], typer.Option(
    "--prometheus", metavar="FILE", help="Also write node_exporter textfile metrics.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Plan/apply even when nictune lint finds errors.")]
