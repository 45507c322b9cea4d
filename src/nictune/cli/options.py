"""Every option of the command line, declared once (Typer's Annotated style).

Commands with few options use the aliases directly.  The host and fleet
commands (plan, apply, verify, audit, rollback, history, show), `agent` and `gate
record` share most of theirs: they take groups of them through
with_options(), and get one Options.
"""

from __future__ import annotations

import enum
import functools
import inspect
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Callable, List, Optional, Tuple

import typer

from nictune.host.transaction.journal import DEFAULT_STATE_DIR

ProfileArg = Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile YAML file.", show_default=False)]
ProfilesArg = Annotated[List[Path], typer.Argument(metavar="PROFILE...", help="Profile YAML files.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the JSON report (format: docs/reference/report-format.md).")]
NetnsOpt = Annotated[Optional[str], typer.Option("--netns", "-n", metavar="NS",
                                                 help="Run inside this network namespace.")]
StateDirOpt = Annotated[str, typer.Option("--state-dir", metavar="DIR", envvar="NICTUNE_STATE_DIR",
                                          help="Where journals and the lock live on the target.")]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Also list settings already as wanted.")]
ContentOpt = Annotated[bool, typer.Option(
    "--show-file-content",
    help="Show the text of files nictune did not write (otherwise only their size).")]
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
LldpWaitOpt = Annotated[float, typer.Option(
    "--lldp-wait", metavar="SECONDS", min=0, max=120,
    help="verify/audit of a profile with switch: checks: on a rail where no LLDP neighbour is known "
         "(no resident agent's listener, lldpd, lldpad or driver DCBX peer), listen SECONDS "
         "for frames (a switch sends one every 30 s).")]
ProbeOpt = Annotated[bool, typer.Option(
    "--probe/--no-probe",
    help="plan/verify/audit: ask the host only what the command reads, through a probe, and run "
         "it on the controller, without starting the agent (control/remote/probe.py).")]
CablingOpt = Annotated[Optional[str], typer.Option(
    "--cabling", metavar="FILE",
    help="Cabling plan (CSV: host,rail,switch,port) to check the rails' LLDP neighbours against; "
         "default: cabling.csv next to the inventory, if there.")]
JunitOpt = Annotated[Optional[str], typer.Option("--junit", metavar="FILE",
                                                 help="Also write JUnit XML (a testcase per host).")]
PrometheusOpt = Annotated[Optional[str], typer.Option(
    "--prometheus", metavar="FILE", help="Also write node_exporter textfile metrics.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Plan/apply even when nictune lint finds errors.")]
BaseOpt = Annotated[Optional[str], typer.Option(
    "--base", metavar="REF",
    help="Show what the change since this git revision of the profile's repository does "
         "(control/review/change.py).")]
BaseFileOpt = Annotated[Optional[str], typer.Option(
    "--base-file", metavar="OLD", help="Like --base, against an old profile file.")]

RollbackToOpt = Annotated[Optional[str], typer.Option(
    "--to", metavar="APPLY_ID",
    help="Undo this apply and every apply after it, newest first: the host as it was before it "
         "(`nictune history` lists the ids).")]
RollbackStepsOpt = Annotated[Optional[int], typer.Option(
    "--steps", metavar="N", min=1, max=1000,
    help="Undo the newest N applies not rolled back yet, newest first.")]


SaveOpt = Annotated[Optional[str], typer.Option(
    "--save", metavar="DIR",
    help="Also write each host's snapshot to DIR/<host>.json, for plan --from-snapshots "
         "(control/review/snapshots.py).")]
FromSnapshotsOpt = Annotated[Optional[str], typer.Option(
    "--from-snapshots", metavar="DIR",
    help="Plan from the snapshots in DIR (show/audit --save) instead of the hosts.")]
MaxAgeOpt = Annotated[str, typer.Option(
    "--max-age", metavar="AGE", help="With --from-snapshots: flag snapshots older than this "
                                     "(90s, 30m, 24h, 7d).")]


# -- the resident agent and its service (cli/resident_cmds.py) -------------------
PlaybookArg = Annotated[Path, typer.Argument(metavar="PLAYBOOK", show_default=False,
                                             help="Playbook whose plays have gate:.")]
OutFileOpt = Annotated[Optional[str], typer.Option(
    "--out", metavar="FILE", help="Write here rather than to the gate's baseline: file.")]
RunIntervalOpt = Annotated[float, typer.Option("--interval", metavar="SECONDS", min=0.05,
                                               help="How often to verify what sends no notification.")]
FlapLimitOpt = Annotated[int, typer.Option("--flap-limit", metavar="N", min=1,
                                           help="Leave a key alone at its N-th drift within the window.")]
FlapWindowOpt = Annotated[float, typer.Option("--flap-window", metavar="SECONDS", min=0.05,
                                              help="The window of --flap-limit.")]
RunMetricsAddressOpt = Annotated[str, typer.Option(
    "--metrics-address", metavar="HOST:PORT", help="Where to serve Prometheus metrics ('' for nowhere).")]
MetricsTextfileOpt = Annotated[Optional[str], typer.Option(
    "--metrics-textfile", metavar="FILE", help="Also write them to a node_exporter textfile.")]
MetricsDetailOpt = Annotated[bool, typer.Option(
    "--metrics-detail", help="Series per priority and per key rather than summed over them "
                             "(about 3x the series: docs/howto/metrics-at-scale.md).")]
UnitDirOpt = Annotated[Optional[str], typer.Option(
    "--unit-dir", metavar="DIR", help="Where the unit goes (default /etc/systemd/system; over SSH, "
                                      "the host's nictune_unit_dir variable first).")]
NoStartOpt = Annotated[bool, typer.Option(
    "--no-start", help="Only write or remove the files: no systemctl (hosts where "
                       "systemd is not running, tests).")]
InstallIntervalOpt = Annotated[float, typer.Option("--interval", metavar="SECONDS",
                                                   help="The agent's --interval.")]
InstallMetricsAddressOpt = Annotated[str, typer.Option(
    "--metrics-address", metavar="HOST:PORT", help="The agent's --metrics-address ('' for none).")]
InstallMetricsDetailOpt = Annotated[bool, typer.Option(
    "--metrics-detail", help="The agent's --metrics-detail: series per priority and per key.")]


class Format(str, enum.Enum):
    text = "text"
    markdown = "markdown"
    json = "json"


FormatOpt = Annotated[Format, typer.Option(
    "--format", metavar="FORMAT", case_sensitive=False,
    help="text, markdown (a pull-request comment) or json (as --json).")]


# -- the host and fleet commands -----------------------------------------------

@dataclass(frozen=True)
class Options:
    """The options of a host or fleet command.  A command that does not take
    an option gets the default here (verify has no --force, show no -i)."""

    netns: Optional[str] = None
    state_dir: str = DEFAULT_STATE
    as_json: bool = False
    show_all: bool = False
    show_file_content: bool = False
    inventory: Optional[str] = None
    limit: Optional[str] = None
    forks: int = 50
    junit: Optional[str] = None
    prometheus: Optional[str] = None
    cabling: Optional[str] = None
    accept_new: bool = False
    connect_timeout: float = 10.0
    timeout: float = 120.0
    ssh_config: str = "~/.ssh/config"
    probe: bool = True
    lldp_wait: float = 0.0
    # 0 here and APPLY_CONFIRM_TIMEOUT on the command line: only apply asks
    # hosts to wait for a confirmation, and only apply has the option.
    confirm_timeout: float = 0.0
    force: bool = False
    base: Optional[str] = None
    base_file: Optional[str] = None
    format: Format = Format.text
    save: Optional[str] = None
    from_snapshots: Optional[str] = None
    max_age: str = "24h"
    # agent run|install|uninstall|status, gate record
    interval: float = 30.0
    flap_limit: int = 3
    flap_window: float = 600.0
    metrics_address: str = "127.0.0.1:9463"
    metrics_textfile: Optional[str] = None
    metrics_detail: bool = False
    unit_dir: Optional[str] = None
    no_start: bool = False
    out_file: Optional[str] = None
    # rollback: how far back (engine.Engine.rollback); neither: the last apply
    rollback_to: Optional[str] = None
    rollback_steps: Optional[int] = None

    def how_far(self) -> Optional[dict]:
        """The rollback request's {"to"} or {"steps"}, or None (the last apply)."""
        if self.rollback_to is not None:
            return {"to": self.rollback_to}
        if self.rollback_steps is not None:
            return {"steps": self.rollback_steps}
        return None


APPLY_CONFIRM_TIMEOUT = 30.0

_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _param(name: str, annotation: Any, default: Any = MISSING) -> inspect.Parameter:
    """An Options field as a command parameter; on the command line it
    defaults to the field's default unless `default` says otherwise."""
    if default is MISSING:
        default = next(f.default for f in fields(Options) if f.name == name)
    return inspect.Parameter(name, _KEYWORD, annotation=annotation, default=default)


# Option groups, in the order --help lists them.
Group = Tuple[inspect.Parameter, ...]
TARGET: Group = (inspect.Parameter("target", _KEYWORD, annotation=TargetArg),)
INVENTORY: Group = (_param("inventory", InventoryOpt), _param("limit", LimitOpt))
FORKS: Group = (_param("forks", ForksOpt),)
FLEET: Group = INVENTORY + FORKS
AUDIT_FILES: Group = (_param("junit", JunitOpt), _param("prometheus", PrometheusOpt))
CABLING: Group = (_param("cabling", CablingOpt),)
JUNIT: Group = (_param("junit", JunitOpt),)  # apply: a playbook rollout's report
NETNS: Group = (_param("netns", NetnsOpt),)
STATE_DIR: Group = (_param("state_dir", StateDirOpt),)
JSON: Group = (_param("as_json", JsonOpt),)
COMMON: Group = NETNS + STATE_DIR + JSON
SHOW_ALL: Group = (_param("show_all", AllOpt),)
CONTENT: Group = (_param("show_file_content", ContentOpt),)
SSH: Group = (_param("accept_new", AcceptNewOpt), _param("connect_timeout", ConnectTimeoutOpt),
              _param("timeout", TimeoutOpt), _param("ssh_config", SshConfigOpt))
PROBE: Group = (_param("probe", ProbeOpt),)
LLDP_WAIT: Group = (_param("lldp_wait", LldpWaitOpt),)
CONFIRM: Group = (_param("confirm_timeout", ConfirmOpt, APPLY_CONFIRM_TIMEOUT),)
FORCE: Group = (_param("force", ForceOpt),)
BASE: Group = (_param("base", BaseOpt), _param("base_file", BaseFileOpt))
FORMAT: Group = (_param("format", FormatOpt),)
HOW_FAR: Group = (_param("rollback_to", RollbackToOpt), _param("rollback_steps", RollbackStepsOpt))
SAVE: Group = (_param("save", SaveOpt),)
SNAPSHOTS: Group = (_param("from_snapshots", FromSnapshotsOpt), _param("max_age", MaxAgeOpt))
PLAYBOOK: Group = (inspect.Parameter("target", _KEYWORD, annotation=PlaybookArg),)
OUT_FILE: Group = (_param("out_file", OutFileOpt),)
RESIDENT: Group = (_param("interval", RunIntervalOpt), _param("flap_limit", FlapLimitOpt),
                   _param("flap_window", FlapWindowOpt), _param("metrics_address", RunMetricsAddressOpt),
                   _param("metrics_textfile", MetricsTextfileOpt), _param("metrics_detail", MetricsDetailOpt))
UNIT_DIR: Group = (_param("unit_dir", UnitDirOpt),)
NO_START: Group = (_param("no_start", NoStartOpt),)
AGENT_SETTINGS: Group = (_param("interval", InstallIntervalOpt),
                         _param("metrics_address", InstallMetricsAddressOpt),
                         _param("metrics_detail", InstallMetricsDetailOpt))

Body = Callable[[Optional[str], Options], None]


def with_options(*groups: Group) -> Callable[[Body], Callable[..., None]]:
    """Make body(target, opts) a command that takes the options of groups.

    Typer reads a command's parameters from its function's signature, so
    the function it is given has the groups' parameters, in order, as its
    signature, and calls body with TARGET as a string (None for a command
    without one) and the rest as one Options.
    """
    params = [p for group in groups for p in group]

    def decorate(body: Body) -> Callable[..., None]:
        @functools.wraps(body)
        def command(**given: Any) -> None:
            target = given.pop("target", None)
            body(None if target is None else str(target), Options(**given))

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        # Typer also reads type hints; wraps() copied body's (target, opts).
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
