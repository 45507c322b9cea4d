"""`nictune agent run|status`: the resident agent (host/resident/daemon.py) in the
foreground, and what it last wrote about itself.

With --netns NS, as for the other commands, the state directory is
DIR/netns/NS (control/remote/targets.py NetnsTarget): the one `nictune apply
--netns NS --state-dir DIR` stores the desired state in.  `run` execs the
resident agent (`python3 -m nictune.host.resident`), under `ip netns exec NS`
with --netns, so that its pid is the one started and none of the CLI's
modules stays in its memory.

`install|uninstall` put the resident agent in place as a systemd service, here or on
an inventory's hosts over SSH (control/install/agent_install.py); `status -i` asks
those hosts for the service's state and the resident agent's status file.

The command group keeps its name, `nictune agent`: "the agent" alone is the
program one request runs on a host (host/agent.py, the zipapp), "the resident
agent" the same program kept running as a service (host/resident/).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from typing import List, Optional

import typer

from nictune.cli.options import (AGENT_SETTINGS, FORKS, INVENTORY, JSON, NETNS, NO_START, RESIDENT,
                                 SSH, STATE_DIR, UNIT_DIR, Options, with_options)
from nictune.cli.output import Printer
from nictune.host.errors import EXIT_ERROR, EXIT_OK, NictuneError
from nictune.host.validate import NETNS as NETNS_NAME, matches

agent = typer.Typer(help="The resident agent: keeps the last applied profile on this host.",
                    no_args_is_help=True)


def _state_dir(state_dir: str, netns: Optional[str]) -> str:
    if netns is None:
        return state_dir
    if not matches(NETNS_NAME, netns):
        raise typer.BadParameter(f"invalid network namespace name {netns!r}", param_hint="--netns")
    return os.path.join(state_dir, "netns", netns)


@agent.command("run")
@with_options(NETNS, STATE_DIR, RESIDENT)
def run(target: Optional[str], opts: Options) -> None:
    """Keep the desired state (the last committed apply's profile), in the foreground."""
    argv = ["--state-dir", _state_dir(opts.state_dir, opts.netns), "--interval", repr(opts.interval),
            "--flap-limit", str(opts.flap_limit), "--flap-window", repr(opts.flap_window),
            "--metrics-address", opts.metrics_address]
    if opts.metrics_textfile:
        argv += ["--metrics-textfile", opts.metrics_textfile]
    if opts.metrics_detail:
        argv += ["--metrics-detail"]
    import nictune

    package_root = os.path.dirname(os.path.dirname(nictune.__file__))
    env = dict(os.environ, PYTHONPATH=package_root, LANG="C")
    # Exec'd, never run inside this process: the resident agent keeps none
    # of the CLI's modules (typer, rich, yaml, jsonschema) in its memory.
    # With site, unlike the unit's zipapp (python3 -s -S): from an installed
    # nictune, pyroute2 (netlink/dcb.py's message classes) is in site-packages.
    resident = [sys.executable, "-m", "nictune.host.resident", *argv]
    sys.stdout.flush()
    if opts.netns is None:
        os.execve(sys.executable, resident, env)
    os.execvpe("ip", ["ip", "netns", "exec", opts.netns, *resident, "--netns", opts.netns], env)


def _fleet_hosts(inventory: str, limit: Optional[str]) -> list:
    from nictune.inventory import load_inventory

    return load_inventory(inventory).select(None, limit=limit)


def _service(action: str, opts: Options) -> None:
    """install, uninstall or status -i: here or on an inventory's hosts."""
    out = Printer(opts.as_json)
    try:
        hosts = _service_hosts(action, opts)
    except NictuneError as e:  # InventoryError included
        out.error(str(e), prefix=f"nictune agent {action}")
        raise typer.Exit(EXIT_ERROR)
    ok = all(h["ok"] for h in hosts)
    if opts.as_json:
        out.json({"command": f"agent {action}", "ok": ok, "hosts": hosts}, sort_keys=True)
    else:
        for h in hosts:
            out.line(_service_line(action, h))
    raise typer.Exit(EXIT_OK if ok else EXIT_ERROR)


def _service_hosts(action: str, opts: Options) -> List[dict]:
    from nictune.control.install import agent_install
    from nictune.control.remote.ssh import SshOptions

    if opts.inventory:
        if opts.netns is not None:
            raise typer.BadParameter("--netns is for this host, not with -i", param_hint="--netns")
        options = SshOptions(connect_timeout=opts.connect_timeout, command_timeout=opts.timeout,
                             accept_new_host_keys=opts.accept_new, ssh_config=opts.ssh_config)
        return agent_install.run_fleet(_fleet_hosts(opts.inventory, opts.limit), options, action,
                                       opts.unit_dir, not opts.no_start, opts.interval,
                                       opts.metrics_address, opts.forks, opts.metrics_detail)
    if opts.limit:
        raise typer.BadParameter("--limit needs an inventory (-i)", param_hint="--limit")
    return [agent_install.run_local(action, _state_dir(opts.state_dir, opts.netns),
                                    opts.unit_dir or agent_install.UNIT_DIR, not opts.no_start,
                                    opts.interval, opts.metrics_address,
                                    metrics_detail=opts.metrics_detail)]


def _unit_words(h: dict) -> str:
    state = f"{h.get('active')}, {h.get('enabled')}" if h.get("systemd") else "systemd not running"
    return (f"unit {'installed' if h['unit_installed'] else 'absent'} ({state}), "
            f"zipapp {'installed' if h['zipapp_installed'] else 'absent'}")


def _service_line(action: str, h: dict) -> str:
    if not h["ok"]:
        return f"{h['host']}: FAILED: {h['error']['message']}"
    if action == "status":
        agent_state = h.get("agent")
        return (f"{h['host']}: {_unit_words(h)}, agent "
                + (f"pid {agent_state.get('pid')}, {agent_state.get('reapplies')} re-applies"
                   if agent_state else "has not run"))
    verb = "installed" if action == "install" else "uninstalled"
    what = ", ".join(h.get("changed") or []) or "nothing changed"
    return f"{h['host']}: {verb} ({what})" + (", service started" if h.get("started") else "")


@agent.command("install")
@with_options(STATE_DIR, INVENTORY, UNIT_DIR, NO_START, AGENT_SETTINGS, FORKS, SSH, JSON)
def install(target: Optional[str], opts: Options) -> None:
    """Install the resident agent as a systemd service (nictune-agent.service), enabled and started.
    It runs in the host's own network namespace: for a namespace, use `agent run --netns`."""
    _service("install", opts)


@agent.command("uninstall")
@with_options(STATE_DIR, INVENTORY, UNIT_DIR, NO_START, FORKS, SSH, JSON)
def uninstall(target: Optional[str], opts: Options) -> None:
    """Stop, disable and remove the service and its zipapp; the desired state and journal stay."""
    _service("uninstall", opts)


@agent.command("status")
@with_options(NETNS, STATE_DIR, INVENTORY, UNIT_DIR, FORKS, SSH, JSON)
def status(target: Optional[str], opts: Options) -> None:
    """What the resident agent last wrote: desired profile, re-applies, drift per key;
    and its service's state."""
    if opts.inventory or opts.limit:
        _service("status", replace(opts, no_start=True))
    out = Printer(opts.as_json)
    report = _status_here(_state_dir(opts.state_dir, opts.netns), opts.unit_dir, out)
    if opts.as_json:
        out.json(report, sort_keys=True)
    else:
        for line in _lines(report):
            out.line(line)
    raise typer.Exit(EXIT_OK if report["agent"] else EXIT_ERROR)


def _status_here(where: str, unit_dir: Optional[str], out: Printer) -> dict:
    from nictune.control.install import agent_install
    from nictune.host.resident import daemon
    from nictune.host.transaction.journal import Journal

    try:
        found = daemon.load_status(where)
    except (NictuneError, ValueError, OSError) as e:
        out.error(str(e), prefix="nictune agent status")
        raise typer.Exit(EXIT_ERROR)
    # A desired state that cannot be read is part of the status, not a
    # reason to show none of it (the agent idles then: say why).
    journal, desired_error = Journal(where), None
    try:
        desired = journal.load_desired()
    except NictuneError as e:
        desired, desired_error = None, str(e)
    return {"state_dir": where, "running": _running(found),
            "service": agent_install.service_status(where, unit_dir or agent_install.UNIT_DIR),
            "desired": desired and {k: desired.get(k) for k in ("path", "apply", "stored")},
            "desired_error": desired_error or "; ".join(journal.desired_warnings) or None,
            "agent": found}


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
    error = report.get("desired_error")
    lines = [f"state directory: {report['state_dir']}",
             "service: " + _unit_words(report["service"]),
             "desired profile: " + (f"{desired['path']} (apply {desired['apply'] or '-'}, "
                                    f"stored {_when(desired['stored'])})" if desired else
                                    f"CANNOT BE READ: {error}" if error else
                                    "none: no apply has committed a profile here")]
    if desired and error:  # its copy stood in for a damaged desired.json
        lines.append(f"desired state: {error}")
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
