"""The host side: everything that runs on the machine being tuned.

The agent (one JSON request in, one JSON report out), the engine, the knob
families and the kernel access they use (netlink, sysfs, procfs, configfs).
It imports only the standard library, `nictune` itself (the version) and
four files of pyroute2 (netlink/_pyroute2.py), and nothing of the
controller side (cli, control, profile, inventory, lab): this directory,
with nictune/__init__.py, is exactly what control/remote/agentzip.py ships to a
host.
"""
