"""load_inventory: an inventory file, a directory of them, or "host1,host2"."""

from __future__ import annotations

import os
import re
from typing import Optional

from .errors import InventoryError
from .ini import read_ini_inventory
from .model import Inventory, VarsFileLoader
from .ranges import split_port, unread_ipv6
from .varsdirs import BOM, VarsDirs, read_text
from .yamlinv import NotYamlInventory, read_yaml_inventory

YAML_EXTENSIONS = ("", ".yml", ".yaml", ".json")
# What Ansible skips in an inventory directory (its INVENTORY_IGNORE_EXTS default).
_IGNORED = re.compile(r"^\.|^host_vars$|^group_vars$|^vars_plugins$|"
                      r"(\.pyc|\.pyo|\.swp|\.bak|~|\.rpm|\.md|\.txt|\.rst|\.orig|\.cfg|\.retry)$")


def load_inventory(path: str) -> Inventory:
    """Read an Ansible inventory: hosts, groups and every host's variables.

    path is an INI or YAML file, a directory of them (read in name order,
    as Ansible does), or a comma-separated host list such as "a,b:2222,".
    group_vars/ and host_vars/ beside the file (or in the directory) are read.
    """
    if "," in path and not os.path.exists(path):
        return _host_list(path)
    inv = Inventory(path, _vars_dirs)
    if os.path.isdir(path):
        if _read_directory(inv, path) == 0:
            raise InventoryError(path, None, "the directory holds no inventory file")
        base = path
    elif os.path.exists(path):
        _read_file(inv, path)
        base = os.path.dirname(path) or "."
    else:
        raise InventoryError(path, None, "no such inventory file or directory")
    inv.use_vars_files(VarsDirs(base, inv.warn).layers, base)
    inv.finish()
    for host in inv.hosts.values():
        host.nictune_overrides()  # reads every variables file now, and checks 'nictune' is a mapping
    return inv


def _vars_dirs(directory: str, warn) -> VarsFileLoader:
    """group_vars/ and host_vars/ in a directory (beside a playbook), as Inventory reads them."""
    return VarsDirs(directory, warn).layers


def _host_list(text: str) -> Inventory:
    # As Ansible's host_list plugin: "name", "name:port" or "[v6 address]:port";
    # anything else, ranges included, is one host named as written.
    inv = Inventory(text, _vars_dirs)
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            name, port = split_port(item)
        except ValueError:
            name, port = item, None
            why = unread_ipv6(item, f"would name a host {item!r}, which nothing can reach")
            if why:
                raise InventoryError("host list", None, why)
        if "[" in name:
            name, port = item, None
        inv.add_host(name, "ungrouped", port, ("host list", None))
    inv.finish()
    return inv


def _read_directory(inv: Inventory, directory: str) -> int:
    try:
        entries = sorted(os.listdir(directory))
    except OSError as e:
        raise InventoryError(directory, None, f"cannot list it: {e.strerror}") from None
    count = 0
    for entry in entries:
        if _IGNORED.search(entry):
            continue
        path = os.path.join(directory, entry)
        if os.path.isdir(path):
            count += _read_directory(inv, path)
        else:
            _read_file(inv, path)
            count += 1
    return count


def _read_file(inv: Inventory, path: str) -> None:
    ext = os.path.splitext(path)[1]
    if ext == ".toml":
        raise InventoryError(path, None, "TOML inventories are not supported; use INI or YAML")
    text = read_text(path, keep_bom=True)
    bom = text.startswith(BOM)
    text = text[len(BOM):] if bom else text  # YAML and JSON take a BOM, as in Ansible
    if text.startswith("#!") and os.access(path, os.X_OK):
        raise InventoryError(path, 1, "this is a dynamic inventory script; nictune does not run "
                             "inventory scripts (run `ansible-inventory --list -y` and save its output)")
    not_yaml: Optional[NotYamlInventory] = None
    if ext in YAML_EXTENSIONS:
        try:
            read_yaml_inventory(inv, text, path)
            return
        except NotYamlInventory as e:
            not_yaml = e
    try:
        _read_ini(inv, text, path, bom)
    except InventoryError as e:
        if not_yaml is None or ext in (".yml", ".yaml", ".json"):
            if not_yaml is not None:  # a .yml file is meant to be YAML: its YAML error is the useful one
                raise InventoryError(path, not_yaml.line, f"not a YAML inventory: {not_yaml.reason}") from None
            raise
        at = f" at line {not_yaml.line}" if not_yaml.line else ""
        raise InventoryError(path, e.line, f"neither a YAML inventory ({not_yaml.reason}{at}) "
                             f"nor an INI one: {e.reason}") from None


def _read_ini(inv: Inventory, text: str, path: str, bom: bool) -> None:
    if bom:
        # Ansible's INI parser takes the mark for text: "[group]" on the first
        # line is then a bad host range, and "web1" a host named "\ufeffweb1".
        raise InventoryError(path, 1, "the file starts with a UTF-8 byte-order mark (BOM), which Ansible's INI "
                             "parser reads as part of the first line (it fails on a [section] there, and names "
                             "a host with the mark in front); save the file as UTF-8 without a BOM")
    try:
        read_ini_inventory(inv, text, path)
    except InventoryError as e:
        if not text.startswith("#!"):
            raise
        # A script without its executable bit: Ansible does not run it and
        # reads it as INI, which fails (it warns "Unable to parse" and skips it).
        raise InventoryError(path, e.line, f"{e.reason}: this file starts with '#!' like an inventory script "
                             "but is not executable, so it is read as an INI inventory, as Ansible reads it; "
                             "nictune does not run inventory scripts: save the script's output "
                             "(`ansible-inventory -i SCRIPT --list -y > FILE`) and read that, or move the "
                             "script out of the inventory") from None
