"""Ansible-compatible inventories (controller side).

    inv = load_inventory("hosts.ini")        # INI or YAML file, directory, or "a,b"
    for host in inv.select("rails:&rack1", limit="node0*"):
        host.address, host.port, host.user, host.key_file, host.vars
        host.nictune_overrides()             # [(mapping, "file:line")], lowest first

Hosts, groups and variables resolve as `ansible-inventory --list` resolves
them (tests/inventory compares the two).  Jinja is not rendered: what
nictune uses of a host's variables (its `nictune:` layers, connection
values) is refused when it holds a template (inventory/templates.py).
"""

from __future__ import annotations

from .errors import InventoryError
from .loader import load_inventory
from .model import Group, Host, Inventory, Vaulted
from .templates import Unsafe

__all__ = ["Group", "Host", "Inventory", "InventoryError", "Unsafe", "Vaulted", "load_inventory"]
