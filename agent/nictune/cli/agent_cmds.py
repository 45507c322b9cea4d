"""`nictune agent run|status`: the resident agent (host/resident.py) in the
foreground, and what it last wrote about itself.

With --netns NS, as for the other commands, the state directory is
DIR/netns/NS (control/targets.py NetnsTarget): the one `nictune apply
--netns NS --state-dir DIR` stores the desired state in.  `run` then execs
the agent under `ip netns exec NS`, so that its pid is the one started.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

import typer

from nictune.cli.options import DEFAULT_STATE, JsonOpt, NetnsOpt, StateDirOpt
from nictune.host.errors import EXIT_ERROR, EXIT_OK, NictuneError
from nictune.host.validate import NETNS, matches

agent = typer.Typer(help="The resident agent: keeps the last applied profile on this host.",
                    no_args_is_help=True)


def _state_dir(state_dir: str, netns: Optional[str]) -> str:
    if netns is None:
        return state_dir
    if not matches(NETNS, netns):
        raise typer.BadParameter(f"invalid network namespace name {netns!r}", param_hint="--netns")
    return os.path.join(state_dir, "netns", netns)


@agent.command("run")
def run(
    netns: NetnsOpt = None,
    state_dir: StateDirOpt = DEFAULT_STATE,
    interval: float = typer.Option(30.0, "--interval", metavar="SECONDS", min=0.05,
                                   help="How often to verify what sends no notification."),
    flap_limit: int = typer.Option(3, "--flap-limit", metavar="N", min=1,
                                   help="Leave a key alone at its N-th drift within the window."),
    flap_window: float = typer.Option(600.0, "--flap-window", metavar="SECONDS", min=0.05,
                                      help="The window of --flap-limit."),
    metrics_address: str = typer.Option("127.0.0.1:9463", "--metrics-address", metavar="HOST:PORT",
                                        help="Where to serve Prometheus metrics ('' for nowhere)."),
    metrics_textfile: Optional[str] = typer.Option(None, "--metrics-textfile", metavar="FILE",
                                                   help="Also write them to a node_exporter textfile."),
) -> None:
    """Keep the desired state (the last committed apply's profile), in the foreground."""
    argv = ["--state-dir", _state_dir(state_dir, netns), "--interval", repr(interval),
            "--flap-limit", str(flap_limit), "--flap-window", repr(flap_window),
            "--metrics-address", metrics_address]
    if metrics_textfile:
        argv += ["--metrics-textfile", metrics_textfile]
    if netns is None:
        from nictune.host import resident

        raise typer.Exit(resident.main(argv))
    import nictune

    package_root = os.path.dirname(os.path.dirname(nictune.__file__))
    env = dict(os.environ, PYTHONPATH=package_root, LANG="C")
    sys.stdout.flush()
    os.execvpe("ip", ["ip", "netns", "exec", netns, sys.executable, "-m", "nictune.host.resident",
                      *argv, "--netns", netns], env)


@agent.command("status")
def status(
    netns: NetnsOpt = None,
    state_dir: StateDirOpt = DEFAULT_STATE,
    as_json: JsonOpt = False,
) -> None:
    """What the resident agent last wrote: desired profile, re-applies, drift per key."""
    from nictune.host import resident
    from nictune.host.journal import Journal

    where = _state_dir(state_dir, netns)
    try:
        found = resident.load_status(where)
        desired = Journal(where).load_desired()
    except (NictuneError, ValueError, OSError) as e:
        sys.stderr.write(f"nictune agent status: {e}\n")
        raise typer.Exit(EXIT_ERROR)
    report = {"state_dir": where, "running": _running(found),
              "desired": desired and {k: desired.get(k) for k in ("path", "apply", "stored")},
              "agent": found}
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write("".join(line + "\n" for line in _lines(report)))
    raise typer.Exit(EXIT_OK if found else EXIT_ERROR)


def _running(found: Optional[dict]) -> bool:
    if not found or found.get("stopped"):
        return False
    try:
        os.kill(found["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _when(t) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "never"


def _lines(report: dict) -> list:
    found, desired = report["agent"], report["desired"]
    lines = [f"state directory: {report['state_dir']}",
             "desired profile: " + (f"{desired['path']} (apply {desired['apply'] or '-'}, "
                                    f"stored {_when(desired['stored'])})" if desired else
                                    "none: no apply has committed a profile here")]
    if not found:
        return lines + ["agent: has not run with this state directory"]
    state = ("running" if report["running"] else
             f"stopped {_when(found['stopped'])}" if found.get("stopped") else "not running (died)")
    lines += [f"agent: {state}, pid {found['pid']}, started {_when(found['started'])}, "
              f"every {found['interval']:g} s"]
    if found.get("idle"):
        lines.append(f"idle: {found['idle']}")
    last = found.get("last_reapply")
    lines.append(f"re-applies: {found['reapplies']}" + (
        f", last {_when(last['time'])} ({last['reason']}, {last['written']} written"
        + (f", journal {last['journal']}" if last.get("journal") else "")
        + (f", error: {last['error']}" if last.get("error") else "") + ")" if last else ""))
    lines.append(f"last verify: {_when(found.get('last_verify'))}, "
                 f"last without drift: {_when(found.get('last_verify_ok'))}")
    if found.get("error"):
        lines.append(f"error: {found['error']}")
    for name, rec in sorted(found.get("keys", {}).items()):
        if not (rec["drifts"] or rec["left_alone"]):
            continue
        lines.append(f"  {name}: {rec['drifts']} drift(s), {rec['restores']} restored, last "
                     f"{_when(rec['last_drift'])}, on_drift {rec.get('on_drift')}"
                     + (", LEFT ALONE (drifts too often)" if rec["left_alone"] else "")
                     + (", differs now" if rec["drifted"] and not rec["left_alone"] else ""))
    return lines
