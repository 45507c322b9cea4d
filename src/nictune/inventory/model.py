"""Inventory, Group and Host: built the way Ansible builds them.

The parsers call add_group / add_host / add_child / set_variable in file
order; finish() then does what Ansible's reconcile_inventory does (every
top-level group under "all", hosts that belong nowhere else in
"ungrouped", and no longer in it once they belong somewhere else) and
computes group depths.  Host.precedence lists the levels of a host's
variables in Ansible's order; Host.with_play_vars adds a play's on top,
and the playbook directory's group_vars/ and host_vars/ among them.
An inventory holds at most MAX_HOSTS hosts and MAX_GROUPS groups, whatever
the number of files and patterns they come from.
"""

from __future__ import annotations

import copy
import decimal
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from nictune.profile.errors import dotted

from .errors import InventoryError, shown
from .hostnames import RULE, host_name_problem
from .templates import NOT_RENDERED, first_template, is_template

# (file, line); line is None when unknown.
Where = Tuple[str, Optional[int]]
# One precedence level: its variables and where each was set.
Layer = Tuple[Dict[str, Any], Dict[str, Where]]

NICTUNE_VAR = "nictune"
# Far beyond one fleet: a few ranged lines can name a million hosts, which
# would take the controller a gigabyte and half a minute to refuse.
MAX_HOSTS = 100_000
MAX_GROUPS = 100_000
VAULT_ADVICE = ("nictune does not decrypt Ansible Vault: set it in plain text (`ansible-vault decrypt` "
                "reads the vaulted value on stdin)")


class Vaulted:
    """A `!vault` value: Ansible Vault ciphertext, kept as is and never shown."""

    def __init__(self, ciphertext: str):
        self.ciphertext = ciphertext

    def __repr__(self) -> str:
        return "Vaulted(<encrypted>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vaulted) and other.ciphertext == self.ciphertext

    def __hash__(self) -> int:
        return hash(self.ciphertext)


def where_text(where: Optional[Where]) -> str:
    if where is None:
        return "?"
    file, line = where
    return file if line is None else f"{file}:{line}"


class Group:
    def __init__(self, name: str):
        self.name = name
        self.hosts: List[Host] = []          # direct members, in the order they were added
        self.children: List[Group] = []      # in the order the edges were added
        self.parents: List[Group] = []
        self.vars: Dict[str, Any] = {}       # set inline in the inventory file
        self.var_where: Dict[str, Where] = {}
        self.priority = 1                    # ansible_group_priority
        self.nictune_earlier: List[Tuple[Any, Where]] = []  # `nictune` values a later one replaced
        self.depth = 0                       # longest path from "all"; set by finish()
        self._member_names: set = set()

    def __repr__(self) -> str:
        return f"Group({self.name!r})"

    def ancestors(self) -> List[Group]:
        seen: Dict[int, Group] = {}
        todo = list(self.parents)
        while todo:
            group = todo.pop()
            if id(group) not in seen:
                seen[id(group)] = group
                todo.extend(group.parents)
        return list(seen.values())

    def descendants(self) -> List[Group]:
        """Self, its children, then each further level, in breadth-first order.

        Ansible walks levels below the first through a set, so its order
        there is arbitrary; this is the deterministic order it most often gives.
        """
        ordered, seen = [self], {id(self)}
        level = [self]
        while level:
            following = []
            for group in level:
                for child in group.children:
                    if id(child) not in seen:
                        seen.add(id(child))
                        ordered.append(child)
                        following.append(child)
            level = following
        return ordered

    def all_hosts(self) -> List[Host]:
        """Hosts of this group and of every group below it, without repeats."""
        out: List[Host] = []
        seen: set = set()
        for group in self.descendants():
            for host in group.hosts:
                if host.name not in seen:
                    seen.add(host.name)
                    out.append(host)
        return out

    @property
    def host_names(self) -> List[str]:
        return [h.name for h in self.hosts]

    @property
    def child_names(self) -> List[str]:
        return [g.name for g in self.children]


class Host:
    def __init__(self, name: str, inventory: Inventory):
        self.name = name
        self.inline: Dict[str, Any] = {}     # variables set in the inventory file itself
        self.inline_where: Dict[str, Where] = {}
        self.nictune_earlier: List[Tuple[Any, Where]] = []  # `nictune` values a later one replaced
        self.direct_groups: List[Group] = []
        self.group_objects: List[Group] = []  # direct groups and their ancestors, "all" included
        self._inventory = inventory
        self._layers: Optional[List[Layer]] = None
        self._vars: Optional[Dict[str, Any]] = None

    def __repr__(self) -> str:
        return f"Host({self.name!r})"

    @property
    def groups(self) -> List[str]:
        """The names of the host's groups and their ancestors but "all", sorted (Ansible's group_names)."""
        return sorted(g.name for g in self.group_objects if g.name != "all")

    def precedence(self) -> List[Layer]:
        """Every level that can set a variable of this host, lowest precedence first.

        Ansible's default order: the "all" group's inline vars; each other
        group's inline vars, groups sorted by (depth, ansible_group_priority,
        name); group_vars/all files; group_vars files of those groups in the
        same order; the host's inline vars; its host_vars files.  A
        group_vars *directory* gives one level per file, in name order.
        A `nictune` mapping set more than once at one inline level keeps
        each earlier value as a level of its own just below it.
        """
        if self._layers is None:
            self._layers = self._levels(_no_files)
        return self._layers

    def _levels(self, beside_playbook: VarsFileLoader) -> List[Layer]:
        # The playbook's group_vars/host_vars go just above the inventory's
        # of the same kind (ansible-core's default VARIABLE_PRECEDENCE).
        inv = self._inventory
        ordered = sorted((g for g in self.group_objects if g.name != "all"),
                         key=lambda g: (g.depth, g.priority, g.name))
        top = inv.groups["all"]
        levels: List[Layer] = []
        for group in [top] + ordered:
            levels += _inline_levels(group.vars, group.var_where, group.nictune_earlier)
        for files in (inv.vars_files, beside_playbook):
            levels += files("group_vars", top.name)
        for files in (inv.vars_files, beside_playbook):
            for group in ordered:
                levels += files("group_vars", group.name)
        levels += _inline_levels(self.inline, self.inline_where, self.nictune_earlier)
        for files in (inv.vars_files, beside_playbook):
            levels += files("host_vars", self.name)
        return levels

    @property
    def vars(self) -> Dict[str, Any]:
        """Variables as Ansible resolves them: a higher level replaces a variable whole."""
        if self._vars is None:
            merged: Dict[str, Any] = {}
            for values, _where in self.precedence():
                merged.update(values)
            self._vars = merged
        return self._vars

    def layers(self, varname: str) -> List[Any]:
        """The value of one variable at each level that sets it, lowest precedence first."""
        return [values[varname] for values, _where in self.precedence() if varname in values]

    def where_of(self, varname: str) -> Optional[Where]:
        """(file, line) where the winning value of a variable was set, or None if unset."""
        found = None
        for values, where in self.precedence():
            if varname in values:
                found = where.get(varname)
        return found

    def source_of(self, varname: str) -> Optional[str]:
        """"file:line" where the winning value of a variable was set, or None if unset."""
        found = self.where_of(varname)
        return None if found is None else where_text(found)

    def nictune_overrides(self) -> List[Tuple[Dict[str, Any], str]]:
        """Each level's `nictune` mapping with its "file:line", lowest precedence first.

        Ansible would let the highest level replace the others; nictune
        deep-merges them instead, so a group can set interfaces and a host
        only its sysctls.
        """
        out = []
        for values, where in self.precedence():
            if NICTUNE_VAR in values:
                value = values[NICTUNE_VAR]
                spot = where.get(NICTUNE_VAR)
                file, line = spot if spot else (None, None)
                if id(value) not in self._inventory.nictune_checked:  # a group's value: once, not per host
                    self._check_nictune(value, file, line)
                    self._inventory.nictune_checked.add(id(value))
                out.append((value, where_text(spot)))
        return out

    def _check_nictune(self, value: Any, file: Optional[str], line: Optional[int]) -> None:
        if _holds_vaulted(value):
            raise InventoryError(file, line, f"variable 'nictune' of host {self.name!r} holds an Ansible "
                                 f"Vault value (!vault); {VAULT_ADVICE}")
        self._not_templated(value, file, line)
        if not isinstance(value, dict):
            raise InventoryError(file, line, f"variable 'nictune' of host {self.name!r} must be a mapping "
                                 f"of profile overrides, not {type(value).__name__}")

    def _not_templated(self, value: Any, file: Optional[str], line: Optional[int]) -> None:
        """Refuse a `nictune` value with a string Ansible would render: nictune would use it as written."""
        found = first_template(value)
        if found is not None:
            path, text = found
            name = dotted((NICTUNE_VAR,) + path)
            raise InventoryError(file, line, f"{name} of host {self.name!r} {NOT_RENDERED}: {shown(text)}; "
                                 "write the value itself (or tag it !unsafe if these characters are meant)")

    def _connection_var(self, *names: str) -> Tuple[str, Any]:
        """(name, value) of the last of these aliases that is set: Ansible's ssh connection takes that one."""
        found = (names[0], None)
        for name in names:
            if self.vars.get(name) is not None:
                found = (name, self.vars[name])
        return found

    def _text_var(self, *names: str) -> Optional[str]:
        name, value = self._connection_var(*names)
        if value is None:
            return None
        self._not_vaulted(name, value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # Ansible's string options take numbers as their text: ansible_user=1000
        if not isinstance(value, str) or not value.strip():
            raise self._bad(name, "must be non-empty text")
        if is_template(value):
            raise self._bad(name, f"{NOT_RENDERED}: {shown(value)}")
        if any(c.isspace() for c in value) or "\x00" in value:
            raise self._bad(name, "must not contain blanks")
        return value

    def _not_vaulted(self, name: str, value: Any) -> None:
        if isinstance(value, Vaulted):
            raise self._bad(name, f"is an Ansible Vault value (!vault); {VAULT_ADVICE}")

    def _bad(self, name: str, why: str) -> InventoryError:
        file, line = self.where_of(name) or (None, None)
        return InventoryError(file, line, f"{name} of host {self.name!r} {why}")

    @property
    def address(self) -> str:
        """Where to connect: ansible_host (or ansible_ssh_host), else the inventory name."""
        value = self._text_var("ansible_host", "ansible_ssh_host")
        if value is not None and (value.startswith("-") or "," in value):
            # It reaches argv too: a ProxyCommand's %h, the nccl-tests launcher's {addresses}.
            raise self._bad(self._connection_var("ansible_host", "ansible_ssh_host")[0],
                            "must not start with '-' or hold ',' (a command given it would read an option "
                            "or several hosts)")
        return value or self.name

    @property
    def port(self) -> Optional[int]:
        name, value = self._connection_var("ansible_port", "ansible_ssh_port")
        if value is None:
            return None
        self._not_vaulted(name, value)
        if is_template(value):
            raise self._bad(name, f"{NOT_RENDERED}: {shown(value)}")
        port = _whole_number(value)
        if port is None or not 0 < port < 65536:
            raise self._bad(name, f"must be a port number (1-65535), not {shown(value)}")
        return port

    @property
    def user(self) -> Optional[str]:
        return self._text_var("ansible_user", "ansible_ssh_user")

    @property
    def key_file(self) -> Optional[str]:
        path = self._text_var("ansible_private_key_file", "ansible_ssh_private_key_file")
        return None if path is None else os.path.expanduser(path)

    def with_play_vars(self, layer: Layer, playbook_dir: Optional[str] = None) -> Host:
        """This host as a play sees it: the play's variables over every inventory level
        (Ansible's precedence), for its connection settings as for the rest; with
        the group_vars/ and host_vars/ beside the playbook in playbook_dir, each
        above the inventory's of the same kind, as ansible-playbook reads them."""
        view = copy.copy(self)
        beside = _no_files if playbook_dir is None else self._inventory.beside_playbook(playbook_dir)
        view._layers = (self.precedence() if beside is _no_files else self._levels(beside)) + [layer]
        view._vars = None
        return view


def _whole_number(value: Any) -> Optional[int]:
    """An int option's value as Ansible's ensure_type makes it: 2222, 2222.0 and "2222" are 2222."""
    if isinstance(value, bool):
        return None  # Ansible would take True as 1; no port is meant that way
    if isinstance(value, int):
        return value
    if isinstance(value, (float, str)):
        try:
            number = decimal.Decimal(value)
            if number == int(number):
                return int(number)
        except (decimal.DecimalException, ValueError, OverflowError):
            pass
    return None


def _inline_levels(values: Dict[str, Any], wheres: Dict[str, Where],
                   nictune_earlier: List[Tuple[Any, Where]]) -> List[Layer]:
    """Variables set in the inventory files themselves for one group or host.

    For every variable but `nictune`, the last assignment wins, as in
    Ansible.  Each earlier `nictune` assignment (two [g:vars] sections, a
    host line in two files) is a level of its own below the last one, in
    file order, so the profile merge deep-merges them all.
    """
    earlier: List[Layer] = [({NICTUNE_VAR: value}, {NICTUNE_VAR: where}) for value, where in nictune_earlier]
    return earlier + [(values, wheres)]


def _holds_vaulted(value: Any) -> bool:
    if isinstance(value, Vaulted):
        return True
    if isinstance(value, dict):
        return any(_holds_vaulted(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_vaulted(v) for v in value)
    return False


VarsFileLoader = Callable[[str, str], List[Layer]]
Warn = Callable[[Where, str], None]


def _no_files(kind: str, name: str) -> List[Layer]:
    return []


class Inventory:
    """Hosts and groups of one inventory source, with Ansible's variables."""

    def __init__(self, source: str, 
                 vars_dirs: Optional[Callable[[str, Warn], VarsFileLoader]] = None):
        """vars_dirs(directory, warn): the reader of group_vars/ and host_vars/
        beside a playbook (inventory/loader.py gives varsdirs.py's, which
        builds on this module); without it, a playbook's directory adds none."""
        self.source = source
        self._vars_dirs = vars_dirs
        self.groups: Dict[str, Group] = {}
        self.hosts: Dict[str, Host] = {}
        self.warnings: List[str] = []
        self._vars_files: VarsFileLoader = _no_files
        self._vars_base: Optional[str] = None
        self._beside_playbooks: Dict[str, VarsFileLoader] = {}
        # ids of `nictune` values found usable (Host.nictune_overrides); the
        # inventory keeps every value alive, so no id is reused meanwhile.
        self.nictune_checked: set = set()
        for name in ("all", "ungrouped"):
            self.add_group(name)
        self._link(self.groups["all"], self.groups["ungrouped"])

    def vars_files(self, kind: str, name: str) -> List[Layer]:
        """The layers of group_vars/NAME (kind "group_vars") or host_vars/NAME, in load order."""
        return self._vars_files(kind, name)

    def use_vars_files(self, loader: VarsFileLoader, base: Optional[str] = None) -> None:
        """Read group_vars/ and host_vars/ through loader; base: the directory they are in."""
        self._vars_files = loader
        self._vars_base = None if base is None else os.path.realpath(base)

    def beside_playbook(self, directory: str) -> VarsFileLoader:
        """The group_vars/ and host_vars/ files of a playbook's directory, read once each.

        When it is the inventory's own directory, Ansible reads the same
        files twice, which changes no variable; nictune reads them once, so
        that no `nictune` layer is merged twice.
        """
        real = os.path.realpath(directory or ".")
        if real == self._vars_base:
            return _no_files
        if self._vars_dirs is None:
            return _no_files
        if real not in self._beside_playbooks:
            self._beside_playbooks[real] = self._vars_dirs(directory or ".", self.warn)
        return self._beside_playbooks[real]

    def source_of(self, host: str, varname: str) -> Optional[str]:
        """"file:line" where the value host `host` gets for `varname` was set (None if unset)."""
        return self.hosts[host].source_of(varname)

    def select(self, pattern: Optional[str], limit: Optional[str] = None) -> List[Host]:
        """Hosts matching an Ansible host pattern (None: all), narrowed by a --limit pattern."""
        from .patterns import select
        return select(self, pattern, limit)

    # -- building, in file order (the parsers call these) --

    def add_group(self, name: str, where: Optional[Where] = None) -> Group:
        group = self.groups.get(name)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:
                file, line = where or (self.source, None)
                raise InventoryError(file, line, f"the inventory declares more than {MAX_GROUPS} groups")
            group = self.groups[name] = Group(name)
        return group

    def add_host(self, name: str, group: Optional[str], port: Optional[int], where: Where) -> Host:
        if not name:
            raise InventoryError(where[0], where[1], "a host name is empty")
        host = self.hosts.get(name)
        if host is None:
            problem = host_name_problem(name)
            if problem:
                raise InventoryError(where[0], where[1], f"{problem}; {RULE}")
            if len(self.hosts) >= MAX_HOSTS:
                raise InventoryError(where[0], where[1], f"the inventory names more than {MAX_HOSTS} hosts, "
                                     "nictune's limit (is a range too wide?)")
            host = self.hosts[name] = Host(name, self)
            if port is not None:  # only the first mention's port counts, as in Ansible
                self._set(host.inline, host.inline_where, "ansible_port", port, where)
        if group is not None:
            self._join(self.groups[group], host)
        return host

    def add_child(self, parent: str, child: str, where: Where) -> None:
        """Make group `child` (or, failing that, host `child`) a member of group `parent`."""
        top = self.groups[parent]
        if child in self.groups:
            sub = self.groups[child]
            if sub is top:
                raise InventoryError(where[0], where[1], f"group {parent!r} cannot be its own child")
            if sub in top.children:
                return
            if sub in top.ancestors():
                raise InventoryError(where[0], where[1], f"making {child!r} a child of {parent!r} "
                                     "creates a cycle of groups")
            self._link(top, sub)
        elif child in self.hosts:
            self._join(top, self.hosts[child])
        else:
            raise InventoryError(where[0], where[1], f"{child!r} is not a known host or group")

    def set_variable(self, entity: str, key: Any, value: Any, where: Where) -> None:
        # Ansible looks the name up among groups first, then hosts.
        if entity in self.groups:
            group = self.groups[entity]
            if key == "ansible_group_priority":
                try:
                    group.priority = int(value)
                except (TypeError, ValueError):
                    raise InventoryError(where[0], where[1], f"ansible_group_priority of group {entity!r} "
                                         f"must be an integer, not {shown(value)}") from None
                return
            self._set(group.vars, group.var_where, key, value, where, group.nictune_earlier)
        elif entity in self.hosts:
            host = self.hosts[entity]
            self._set(host.inline, host.inline_where, key, value, where, host.nictune_earlier)
        else:
            raise InventoryError(where[0], where[1], f"{entity!r} is not a known host or group")

    def warn(self, where: Where, message: str) -> None:
        self.warnings.append(f"{where_text(where)}: {message}")

    @staticmethod
    def _set(values: Dict[str, Any], wheres: Dict[str, Where], key: Any, value: Any, where: Where,
             nictune_earlier: Optional[List[Tuple[Any, Where]]] = None) -> None:
        if not isinstance(key, str):
            raise InventoryError(where[0], where[1], f"variable name {shown(key)} is not text")
        if key == NICTUNE_VAR and key in values and nictune_earlier is not None:
            nictune_earlier.append((values[key], wheres[key]))  # each one is a layer (Host.precedence)
        values[key] = value
        wheres[key] = where

    @staticmethod
    def _link(parent: Group, child: Group) -> None:
        parent.children.append(child)
        if parent not in child.parents:
            child.parents.append(parent)

    @staticmethod
    def _join(group: Group, host: Host) -> None:
        if host.name not in group._member_names:
            group._member_names.add(host.name)
            group.hosts.append(host)
            host.direct_groups.append(group)

    @staticmethod
    def _leave(group: Group, host: Host) -> None:
        if host.name in group._member_names:
            group._member_names.discard(host.name)
            group.hosts.remove(host)
            host.direct_groups.remove(group)

    # -- after every file is read --

    def finish(self) -> None:
        top, ungrouped = self.groups["all"], self.groups["ungrouped"]
        for group in list(self.groups.values()):
            if group is not top and not group.parents:
                self._link(top, group)
        self._set_depths(top)
        for host in self.hosts.values():
            host.group_objects = self._groups_of(host)
            others = [g for g in host.group_objects if g is not top and g is not ungrouped]
            if ungrouped in host.group_objects and others:
                self._leave(ungrouped, host)
            elif ungrouped not in host.group_objects and not others:
                self._join(ungrouped, host)
            else:
                continue
            host.group_objects = self._groups_of(host)
        for name in self.groups.keys() & self.hosts.keys():
            self.warnings.append(f"{self.source}: {name!r} is both a group and a host")

    @staticmethod
    def _groups_of(host: Host) -> List[Group]:
        member_of: Dict[int, Group] = {}
        for group in host.direct_groups:
            member_of[id(group)] = group
            for above in group.ancestors():
                member_of.setdefault(id(above), above)
        return list(member_of.values())

    def _set_depths(self, top: Group) -> None:
        # Longest path from "all", as Ansible's add_child_group keeps it.
        # Groups in topological order (parents before children), then relax.
        pending = {id(g): len(g.parents) for g in self.groups.values()}
        order, ready = [], [top]
        while ready:
            group = ready.pop()
            order.append(group)
            for child in group.children:
                pending[id(child)] -= 1
                if pending[id(child)] == 0:
                    ready.append(child)
        for group in order:
            for child in group.children:
                child.depth = max(child.depth, group.depth + 1)
