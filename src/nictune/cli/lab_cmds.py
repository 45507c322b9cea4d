"""`nictune lab up|down|status`: a local lab of namespaces for demos and tests.

Without --hosts, two namespaces joined by veth (lab/namespaces.py); with
--hosts N, a fleet of N namespace hosts each running its own sshd, with an
Ansible inventory to drive them over SSH (lab/fleet.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Optional

import typer

from nictune.cli.options import JsonOpt
from nictune.cli.output import Printer, envelope
from nictune.lab import namespaces as labmod
from nictune.host.errors import SYSTEM, NictuneError, error

lab = typer.Typer(help="A local lab of network namespaces (no NIC needed): two joined by veth, "
                       "or a fleet of SSH hosts.", no_args_is_help=True)

HostsOpt = Annotated[Optional[int], typer.Option(
    "--hosts", min=1, max=labmod.FLEET_MAX_HOSTS, metavar="N",
    help="Build a fleet of N namespace hosts, each with its own sshd, instead of the two-namespace lab.")]
DirOpt = Annotated[str, typer.Option("--dir", metavar="DIR",
                                     help="With --hosts: where the inventory, keys and logs go.")]
SilentOpt = Annotated[int, typer.Option("--silent", min=0, metavar="K",
                                        help="With --hosts: K more hosts that accept TCP and never answer.")]
UnreachableOpt = Annotated[int, typer.Option("--unreachable", min=0, metavar="K",
                                             help="With --hosts: K more inventory hosts nobody answers for.")]
DataRailsOpt = Annotated[bool, typer.Option(
    "--data-rails/--no-data-rails",
    help="With --hosts: give each host data0, a rail to the others on one bridge (198.18.Y.0/24), "
         "for the traffic gate of playbooks/lab-fleet.yaml.")]

MAX_LISTED = 8  # hosts listed by `lab up`; the inventory has them all


def _finish(command: str, as_json: bool, work) -> None:
    out = Printer(as_json)
    try:
        result = work()
        report = envelope(command, [], lab=result)
    except (NictuneError, OSError) as e:
        report = envelope(command, [], error=error(SYSTEM, str(e)))
    if as_json:
        out.json(report)
    elif report.get("error"):
        out.error(report["error"]["message"])
    else:
        _describe(out, command, report["lab"])
    raise typer.Exit(report["exit_code"])


def _describe(out: Printer, command: str, result: dict) -> None:
    if command == "lab up" and "fleet" in result:
        _describe_fleet(out, result["fleet"])
    elif command == "lab up":
        for ns in result["namespaces"]:
            out.line(f"{ns}: {result['interface']} {result['addresses'][ns]}")
        out.line(f"Try: nictune plan profiles/lab-veth.yaml --netns {result['namespaces'][0]}")
    elif command == "lab down":
        fleet_removed = result["fleet_removed"]
        if result["removed"] or not fleet_removed:
            out.line("removed: " + (", ".join(result["removed"]) or "nothing"))
        if fleet_removed:
            # "process 123", "netns ntfh001", "link ntfbr", or a path
            counts = Counter("paths" if item.startswith("/") else item.split()[0] for item in fleet_removed)
            out.line("removed fleet: " + ", ".join(f"{kind} {n}" for kind, n in counts.items()))
    else:
        namespaces = result["lab"]["namespaces"]
        out.line("lab: " + (", ".join(namespaces) + " up" if namespaces else "not up"))
        fleet = result["fleet"]
        if fleet is None:
            out.line("fleet: not up")
            return
        running = sum(1 for h in fleet["hosts"] if h["running"])
        servers = sum(1 for h in fleet["hosts"] if h["kind"] != "unreachable")
        out.line(f"fleet {fleet['prefix']}: {len(fleet['hosts'])} hosts on {fleet['bridge']} {fleet['subnet']}, "
                 f"{running} of {servers} servers running; inventory {fleet['inventory']}")


def _describe_fleet(out: Printer, fleet: dict) -> None:
    hosts = fleet["hosts"]
    for h in hosts[:MAX_LISTED]:
        rail = f"  data0 {h['data_address']}" if h.get("data_address") else ""
        out.line(f"{h['name']}  {h['address']}  {h['kind']}{rail}")
    if len(hosts) > MAX_LISTED:
        out.line(f"... and {len(hosts) - MAX_LISTED} more (see the inventory)")
    first = hosts[0]["name"]
    out.line(f"inventory:  {fleet['inventory']}")
    out.line(f"ssh config: {fleet['ssh_config']}   (ssh -F {fleet['ssh_config']} {first})")
    out.line(f"Try: nictune plan profiles/lab-fleet.yaml -i {fleet['inventory']} --limit fleet")


@lab.command()
def up(hosts: HostsOpt = None, dir: DirOpt = labmod.FLEET_DIR, silent: SilentOpt = 0,
       unreachable: UnreachableOpt = 0, data_rails: DataRailsOpt = True, as_json: JsonOpt = False) -> None:
    """Create namespaces ntlab1 and ntlab2 joined by a veth pair (198.18.0.0/30),
    or with --hosts N a fleet of SSH hosts ntfh001... on bridge ntfbr (198.19.X.0/24), each with
    data0 on bridge ntfrb (198.18.Y.0/24) unless --no-data-rails."""
    if hosts is None:
        if silent or unreachable or dir != labmod.FLEET_DIR:
            _finish("lab up", as_json, _needs_hosts)
        _finish("lab up", as_json, labmod.up)
    from nictune.lab import fleet as fleetlab  # sshd fleets: imported only when used

    _finish("lab up", as_json,
            lambda: {"fleet": fleetlab.lab_up(hosts, dir, silent=silent, unreachable=unreachable,
                                              data_rails=data_rails).as_dict()})


def _needs_hosts() -> dict:
    raise NictuneError("--dir, --silent and --unreachable go with --hosts N (the fleet lab)")


@lab.command()
def down(as_json: JsonOpt = False) -> None:
    """Remove whichever lab is up (both if both are) and everything it created."""
    from nictune.lab import fleet as fleetlab

    def work() -> dict:
        result = labmod.down()
        result["fleet_removed"] = fleetlab.lab_down()
        return result

    _finish("lab down", as_json, work)


@lab.command()
def status(as_json: JsonOpt = False) -> None:
    """Show which lab is up: the two namespaces, the fleet and its servers."""
    from nictune.lab import fleet as fleetlab

    _finish("lab status", as_json, lambda: {"lab": labmod.status(), "fleet": fleetlab.lab_status()})
