"""The host side: everything that runs on the machine being tuned.

Here, the agent (agent.py: one JSON request in, one JSON report out) and
what every room below shares: the Host (machine.py), the model, the errors,
the checks on input, files written whole, text made safe to print.  The
rooms: transaction/ (engine, journal, rollback), facts/ (read-only facts of
the host), transports/ (the port Host.io, netlink, OVSDB, key files),
knobs/ (the knob families), resident/ (the resident agent and its metrics),
replay/ (snapshots and the probe: hosts that are not the live one).

It imports only the standard library, `nictune` itself (the version) and
four files of pyroute2 (transports/netlink/_pyroute2.py), and nothing of the
controller side (cli, control, profile, inventory, lab): this directory,
with nictune/__init__.py, is exactly what control/remote/agentzip.py ships to a
host.
"""
