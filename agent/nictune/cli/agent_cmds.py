"""`nictune agent run|status`: the resident agent (host/resident.py) in the
foreground, and what it last wrote about itself.

With --netns NS, as for the other commands, the state directory is
DIR/netns/NS (control/targets.py NetnsTarget): the one `nictune apply
--netns NS --state-dir DIR` stores the desired state in.  `run` then execs
the agent under `ip netns exec NS`, so that its pid is the one started.

`install|uninstall` put the agent in place as a systemd service, here or on
an inventory's hosts over SSH (control/agent_install.py); `status -i` asks
those hosts for the service's state and the agent's status file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

import typer

from nictune.cli.options import (DEFAULT_STATE, AcceptNewOpt, ConnectTimeoutOpt, ForksOpt,
                                  InventoryOpt, JsonOpt, LimitOpt, NetnsOpt, SshConfigOpt,
                                  StateDirOpt, TimeoutOpt)
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


UnitDirOpt = typer.Option(None, "--unit-dir", metavar="DIR",
                          help="Where the unit goes (default /etc/systemd/system; over SSH, "
                               "the host's nictune_unit_dir variable first).")
NoStartOpt = typer.Option(False, "--no-start",
                          help="Only write or remove the files: no systemctl (hosts where "
                               "systemd is not running, tests).")


def _fleet_hosts(inventory: str, limit: Optional[str]) -> list:
    from nictune.inventory import load_inventory

    return load_inventory(inventory).select(None, limit=limit)


def _service(action: str, state_dir: str, netns: Optional[str], inventory: Optional[str],
             limit: Optional[str], unit_dir: Optional[str], no_start: bool, interval: float,
             metrics_address: str, ssh: tuple, forks: int, as_json: bool) -> None:
    from nictune.control import agent_install
    from nictune.control.ssh import SshOptions
    from nictune.inventory.errors import InventoryError

    try:
        if inventory:
            if netns is not None:
                raise typer.BadParameter("--netns is for this host, not with -i", param_hint="--netns")
            accept_new, connect_timeout, timeout, ssh_config = ssh
            options = SshOptions(connect_timeout=connect_timeout, command_timeout=timeout,
                                 accept_new_host_keys=accept_new, ssh_config=ssh_config)
            hosts = agent_install.run_fleet(_fleet_hosts(inventory, limit), options, action,
                                            unit_dir, not no_start, interval, metrics_address, forks)
        else:
            if limit:
                raise typer.BadParameter("--limit needs an inventory (-i)", param_hint="--limit")
            hosts = [agent_install.run_local(action, _state_dir(state_dir, netns),
                                             unit_dir or agent_install.UNIT_DIR, not no_start,
                                             interval, metrics_address)]
    except (NictuneError, InventoryError) as e:
        sys.stderr.write(f"nictune agent {action}: {e}\n")
        raise typer.Exit(EXIT_ERROR)
    ok = all(h["ok"] for h in hosts)
    if as_json:
        sys.stdout.write(json.dumps({"command": f"agent {action}", "ok": ok, "hosts": hosts},
                                    indent=2, sort_keys=True) + "\n")
    else:
        for h in hosts:
            sys.stdout.write(_service_line(action, h) + "\n")
    raise typer.Exit(EXIT_OK if ok else EXIT_ERROR)


def _unit_words(h: dict) -> str:
    state = f"{h.get('active')}, {h.get('enabled')}" if h.get("systemd") else "systemd not running"
    return (f"unit {'installed' if h['unit_installed'] else 'absent'} ({state}), "
            f"zipapp {'installed' if h['zipapp_installed'] else 'absent'}")


def _service_line(action: str, h: dict) -> str:
    if not h["ok"]:
        return f"{h['host']}: FAILED: {h.get('error')}"
    if action == "status":
        agent_state = h.get("agent")
        return (f"{h['host']}: {_unit_words(h)}, agent "
                + (f"pid {agent_state.get('pid')}, {agent_state.get('reapplies')} re-applies"
                   if agent_state else "has not run"))
    verb = "installed" if action == "install" else "uninstalled"
    what = ", ".join(h.get("changed") or []) or "nothing changed"
    return f"{h['host']}: {verb} ({what})" + (", service started" if h.get("started") else "")


@agent.command("install")
def install(
    state_dir: StateDirOpt = DEFAULT_STATE,
    inventory: InventoryOpt = None,
    limit: LimitOpt = None,
    unit_dir: Optional[str] = UnitDirOpt,
    no_start: bool = NoStartOpt,
    interval: float = typer.Option(30.0, "--interval", metavar="SECONDS",
                                   help="The agent's --interval."),
    metrics_address: str = typer.Option("127.0.0.1:9463", "--metrics-address", metavar="HOST:PORT",
                                        help="The agent's --metrics-address ('' for none)."),
    forks: ForksOpt = 50,
    accept_new: AcceptNewOpt = False,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    timeout: TimeoutOpt = 120.0,
    ssh_config: SshConfigOpt = "~/.ssh/config",
    as_json: JsonOpt = False,
) -> None:
    """Install the agent as a systemd service (nictune-agent.service), enabled and started.
    It runs in the host's own network namespace: for a namespace, use `agent run --netns`."""
    _service("install", state_dir, None, inventory, limit, unit_dir, no_start, interval,
             metrics_address, (accept_new, connect_timeout, timeout, ssh_config), forks, as_json)


@agent.command("uninstall")
def uninstall(
    state_dir: StateDirOpt = DEFAULT_STATE,
    inventory: InventoryOpt = None,
    limit: LimitOpt = None,
    unit_dir: Optional[str] = UnitDirOpt,
    no_start: bool = NoStartOpt,
    forks: ForksOpt = 50,
    accept_new: AcceptNewOpt = False,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    timeout: TimeoutOpt = 120.0,
    ssh_config: SshConfigOpt = "~/.ssh/config",
    as_json: JsonOpt = False,
) -> None:
    """Stop, disable and remove the service and its zipapp; the desired state and journal stay."""
    _service("uninstall", state_dir, None, inventory, limit, unit_dir, no_start, 30.0,
             "127.0.0.1:9463", (accept_new, connect_timeout, timeout, ssh_config), forks, as_json)


@agent.command("status")
def status(
    netns: NetnsOpt = None,
    state_dir: StateDirOpt = DEFAULT_STATE,
    inventory: InventoryOpt = None,
    limit: LimitOpt = None,
    unit_dir: Optional[str] = UnitDirOpt,
    forks: ForksOpt = 50,
    accept_new: AcceptNewOpt = False,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    timeout: TimeoutOpt = 120.0,
    ssh_config: SshConfigOpt = "~/.ssh/config",
    as_json: JsonOpt = False,
) -> None:
    """What the resident agent last wrote: desired profile, re-applies, drift per key;
    and its service's state."""
    from nictune.control import agent_install
    from nictune.host import resident
    from nictune.host.journal import Journal

    if inventory or limit:
        _service("status", state_dir, netns, inventory, limit, unit_dir, True, 30.0,
                 "127.0.0.1:9463", (accept_new, connect_timeout, timeout, ssh_config), forks,
                 as_json)
    where = _state_dir(state_dir, netns)
    try:
        found = resident.load_status(where)
    except (NictuneError, ValueError, OSError) as e:
        sys.stderr.write(f"nictune agent status: {e}\n")
        raise typer.Exit(EXIT_ERROR)
    # A desired state that cannot be read is part of the status, not a
    # reason to show none of it (the agent idles then: say why).
    journal, desired_error = Journal(where), None
    try:
        desired = journal.load_desired()
    except NictuneError as e:
        desired, desired_error = None, str(e)
    report = {"state_dir": where, "running": _running(found),
              "service": agent_install.service_status(where, unit_dir or agent_install.UNIT_DIR),
              "desired": desired and {k: desired.get(k) for k in ("path", "apply", "stored")},
              "desired_error": desired_error or "; ".join(journal.desired_warnings) or None,
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
