"""Playbooks: Ansible-style plays that roll profiles out to inventory hosts
in batches, with a health gate between batches.

A playbook file is a list of plays:

    - name: ConnectX-7 training fleet
      hosts: cx7_training            # an inventory pattern
      profile: ../profiles/connectx7-training.yaml   # or a list, merged in order
      vars:
        nictune:                     # profile overrides, over the inventory's own
          interfaces: {rails: {mtu: 4200}}
      serial: [1, "10%", "100%"]     # batch sizes; the last one repeats
      max_fail_percentage: 0         # failed share of a batch that stops the rollout
      hooks:                         # on the controller, around each batch (control/rollout/hooks.py)
        before_batch: [kubectl, drain, "{host}", --ignore-daemonsets]
        after_batch: [kubectl, uncordon, "{host}"]
        cleanup: [...]               # after every batch that started, whatever happened
      require_drain: true            # refuse to start if the plan is disruptive and nothing drains
      gate: {...}                    # traffic gate after verify (control/rollout/gate/)

A play's hosts are its pattern's hosts, each seen through the play
(Play.host): the play's vars over the inventory's, connection settings
included, and the group_vars/ and host_vars/ beside the playbook, as in
Ansible.  A string of vars.nictune Ansible would render as a template is
refused (nictune renders none).  Batches follow Ansible's `serial` exactly
(make_batches); `rollout` runs, batch by batch, the before_batch hooks,
apply, verify as a health gate, the traffic gate (a `gate` callable) and
the after_batch and cleanup hooks, through a `run` callable, so it knows nothing about
SSH or measurements.  Errors are ProfileError: one paragraph naming file,
line and key.
"""

from __future__ import annotations

import copy
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from nictune.control.rollout import hooks as hooklib
from nictune.control.rollout.gate.schema import GATE_SCHEMA
from nictune.control.outcome import Outcome
from nictune.host import errors
from nictune.host.errors import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_ROLLBACK_FAILED,
    EXIT_ROLLED_BACK,
    combined_exit,
)
from nictune.host.text import printable
from nictune.inventory.patterns import split_pattern
from nictune.inventory.templates import NOT_RENDERED, first_template
from nictune.profile import yamlpos
from nictune.profile.check import check, locate
from nictune.profile.errors import ProfileError, dotted, show
from nictune.profile.loader import (NOT_OVERRIDABLE, Profile, merge_file_layer, override_layer,
                                    sources_of)
from nictune.profile.merge import Resolver, merge_layers
from nictune.profile.schema import EXTENDS_PATH, register_words
from nictune.profile.yamlpos import Parsed, Path

__all__ = ["Play", "ProfileError", "load_playbook", "load_playbook_parsed", "make_batches", "too_many_failed",
           "play_profile", "rollout", "PLAYBOOK_SCHEMA"]

# -- the schema ------------------------------------------------------------------

SERIAL_PERCENT = r"^(100|[1-9][0-9]?)%$"
FAIL_PERCENT = r"^(100|[0-9]{1,2}(\.[0-9]{1,3})?)%$"
VAR_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
HOST_PATTERN = r"^[^\x00-\x1f\x7f]{1,1000}$"
PLAY_NAME = r"^[^\x00-\x1f\x7f]{1,200}$"

# The words error messages use for these patterns (schema.describe reads them).
register_words({
    SERIAL_PERCENT: 'a percentage of the play\'s hosts from "1%" to "100%"',
    FAIL_PERCENT: 'a percentage from "0%" to "100%"',
    VAR_NAME: "a variable name: a letter or '_' and then up to 63 letters, digits or '_'",
    HOST_PATTERN: "an inventory host pattern of up to 1000 characters with no control characters",
    PLAY_NAME: "a name of up to 200 characters with no control characters",
})

MAX_BATCH = 1_000_000
_SERIAL_ONE = [{"type": "integer", "minimum": 1, "maximum": MAX_BATCH},
               {"type": "string", "pattern": SERIAL_PERCENT, "maxLength": 4}]
_HOSTS_ONE = {"type": "string", "pattern": HOST_PATTERN, "maxLength": 1000}
_PROFILE_ONE = {"type": "string", "pattern": EXTENDS_PATH, "maxLength": 4096}

PLAY_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "title": "play",
    "properties": {
        "name": {"type": "string", "pattern": PLAY_NAME, "maxLength": 200,
                 "description": "Shown in progress and reports; defaults to the hosts pattern."},
        "hosts": {"anyOf": [_HOSTS_ONE, {"type": "array", "items": _HOSTS_ONE, "minItems": 1, "maxItems": 64}],
                  "description": "Inventory host pattern (Ansible syntax: groups, globs, a:b, a:&b, a:!b); in a list, each "
                                 "item is split on its own and the parts are read as one pattern, as Ansible does."},
        "profile": {"anyOf": [_PROFILE_ONE, {"type": "array", "items": _PROFILE_ONE, "minItems": 1, "maxItems": 16}],
                    "description": "Profile file(s), relative to the playbook's directory; several are merged in order, like extends."},
        "vars": {
            "type": "object",
            "description": "Play variables; they override the inventory's, connection settings (ansible_host, "
                           "ansible_port, ansible_user, ...) included. nictune: a mapping of profile keys, deep-merged "
                           "over the profile after the inventory's own nictune: layers.",
            "propertyNames": {"type": "string", "pattern": VAR_NAME, "maxLength": 64},
            "properties": {"nictune": {"type": "object"}},
            "maxProperties": 256,
        },
        "serial": {"anyOf": [*_SERIAL_ONE, {"type": "array", "items": {"anyOf": _SERIAL_ONE}, "minItems": 1, "maxItems": 32}],
                   "description": "Batch sizes: a host count or a percentage of the play's hosts (rounded down, at least 1); "
                                  "in a list, the last value repeats until every host is in a batch. Default: one batch."},
        "max_fail_percentage": {
            "anyOf": [{"type": "integer", "minimum": 0, "maximum": 100},
                      {"type": "string", "pattern": FAIL_PERCENT, "maxLength": 8}],
            "description": "The rollout stops when the share of a batch that failed to apply is greater than this. Default 0: "
                           "any failed host stops it.",
        },
        "hooks": hooklib.HOOKS_SCHEMA,
        "require_drain": {"type": "boolean",
                          "description": "Before the first batch, plan every host of the play; if a change is "
                                         "disruptive (the link drops, queues reset), refuse to start unless "
                                         "hooks.before_batch drains the batch. Default false."},
        "gate": GATE_SCHEMA,
    },
    "required": ["hosts", "profile"],
    "additionalProperties": False,
}

PLAYBOOK_SCHEMA: Dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://nictune.dev/schema/playbook-1.json",
    "title": "nictune playbook",
    "type": "array",
    "items": PLAY_SCHEMA,
    "minItems": 1,
    "maxItems": 64,
}



# -- plays -------------------------------------------------------------------------

@dataclass
class Play:
    """One play, checked; profile paths resolved against the playbook's directory."""

    name: str
    hosts: str                                   # the pattern; a list's items are split and joined by ","
    profiles: List[str]
    vars: Dict[str, Any]
    serial: List[Union[int, str]]
    max_fail_percentage: float
    source: str                                  # "file:line" of the play
    overrides: Optional[Parsed] = field(default=None, repr=False)   # vars.nictune, with its lines
    vars_where: Dict[str, Tuple[str, Optional[int]]] = field(default_factory=dict, repr=False)
    # (path, file, line, keypath) of each profile entry, for errors about it.
    _refs: List[Tuple[str, str, Optional[int], str]] = field(default_factory=list, repr=False)
    _base: Optional[Tuple[Parsed, List[str]]] = field(default=None, repr=False)
    hooks: Optional[hooklib.Hooks] = None
    require_drain: bool = False
    drain_source: str = ""                       # "file:line" of require_drain
    gate: Optional[Dict[str, Any]] = None        # the gate: mapping as written, for the gate callable
    gate_source: str = ""                        # "file:line" of gate
    directory: str = ""                          # the playbook's, with its group_vars/ and host_vars/

    def host(self, host: Any) -> Any:
        """An inventory host as this play sees it: address, port, user, key
        file and every other variable with the play's vars winning, and the
        group_vars/ and host_vars/ beside the playbook each just above the
        inventory's, as ansible-playbook reads them."""
        view = host.with_play_vars((self.vars, self.vars_where), self.directory)
        view.nictune_overrides()  # the playbook's variables files are checked as the inventory's are
        return view

    def profile(self, inventory_layers: Sequence[Tuple[Any, str]] = ()) -> Profile:
        """play_profile(self, inventory_layers): a method, so that the fleet
        and the gate, which this module imports, reach it without importing
        this module back."""
        return play_profile(self, inventory_layers)


def load_playbook(path: str) -> List[Play]:
    """The plays of the playbook at path; raises ProfileError and nothing else."""
    return load_playbook_parsed(yamlpos.parse_file(path, "playbook"), path)


def load_playbook_parsed(parsed: Parsed, path: str) -> List[Play]:
    """load_playbook for a file already parsed (yamlpos.read_target); path
    is that file, whose directory the plays' profile paths are relative to."""
    for index, raw in enumerate(parsed.doc if isinstance(parsed.doc, list) else []):
        hooklib.shell_strings(parsed, index)
    check(parsed.doc, parsed.positions, parsed.plain, PLAYBOOK_SCHEMA)
    return [_play(parsed, index, path) for index in range(len(parsed.doc))]


def _play(parsed: Parsed, index: int, path: str) -> Play:
    raw = parsed.doc[index]
    file, line = locate(parsed.positions, (index,))
    written = raw["hosts"] if isinstance(raw["hosts"], str) else ",".join(raw["hosts"])
    # Ansible splits each item of a list on its own: ["web:&edge", "db"] is web,&edge,db.
    parts = [part for item in ([written] if isinstance(raw["hosts"], str) else raw["hosts"])
             for part in split_pattern(item)]
    if not parts:
        raise ProfileError(*locate(parsed.positions, (index, "hosts")), dotted((index, "hosts")),
                           f"{written!r} names no host or group")
    hosts = written if isinstance(raw["hosts"], str) else ",".join(parts)
    entries = [(raw["profile"], (index, "profile"))] if isinstance(raw["profile"], str) else \
        [(entry, (index, "profile", i)) for i, entry in enumerate(raw["profile"])]
    base_dir = os.path.dirname(path)
    refs = []
    for entry, at in entries:
        resolved = entry if os.path.isabs(entry) else os.path.normpath(os.path.join(base_dir, entry))
        refs.append((resolved, *locate(parsed.positions, at), dotted(at)))
    play_vars = dict(raw.get("vars") or {})
    overrides = None
    if "nictune" in play_vars:
        _not_templated(parsed, (index, "vars", "nictune"))
        overrides = _subtree(parsed, (index, "vars", "nictune"))
        for key in NOT_OVERRIDABLE:
            if key in overrides.doc:
                raise ProfileError(*locate(parsed.positions, (index, "vars", "nictune", key)),
                                   dotted((index, "vars", "nictune", key)),
                                   f"{key} cannot be overridden here; list profiles under profile:")
        del play_vars["nictune"]
    vars_where = {key: locate(parsed.positions, (index, "vars", key)) for key in play_vars}
    serial = raw.get("serial", "100%")
    where = lambda key: "%s:%s" % locate(parsed.positions, (index, key)) if key in raw else ""  # noqa: E731
    return Play(
        name=raw.get("name") or written,
        hosts=hosts,
        profiles=[r[0] for r in refs],
        vars=play_vars,
        serial=list(serial) if isinstance(serial, list) else [serial],
        max_fail_percentage=_percent(raw.get("max_fail_percentage", 0)),
        source=f"{file}:{line}",
        overrides=overrides,
        vars_where=vars_where,
        _refs=refs,
        hooks=hooklib.load_hooks(parsed, index, base_dir),
        require_drain=bool(raw.get("require_drain", False)),
        drain_source=where("require_drain"),
        gate=copy.deepcopy(raw["gate"]) if "gate" in raw else None,
        gate_source=where("gate"),
        directory=base_dir,
    )


def _not_templated(parsed: Parsed, prefix: Path) -> None:
    """Refuse a string of vars.nictune that Ansible would render as a template."""
    node: Any = parsed.doc
    for part in prefix:
        node = node[part]
    found = first_template(node)
    if found is not None:
        path, text = found
        at = prefix + path
        raise ProfileError(*locate(parsed.positions, at), dotted(at),
                           f"{NOT_RENDERED}: {show(text)}; write the value itself")


def _percent(value: Union[int, str]) -> float:
    return float(value[:-1]) if isinstance(value, str) else float(value)


def _subtree(parsed: Parsed, prefix: Path) -> Parsed:
    """The part of a document below prefix, as a document of its own."""
    cut = len(prefix)
    positions = {p[cut:]: pos for p, pos in parsed.positions.items() if p[:cut] == prefix}
    plain = {p[cut:]: text for p, text in parsed.plain.items() if p[:cut] == prefix}
    node: Any = parsed.doc
    for part in prefix:
        node = node[part]
    return Parsed(node, positions, plain)


# -- the profile a host gets ----------------------------------------------------------

def play_profile(play: Play, inventory_layers: Sequence[Tuple[Any, str]] = ()) -> Profile:
    """The profile for one host of the play, merged and validated.

    Layers, lowest first: the play's profiles in order (each with its own
    extends), the host's inventory `nictune:` mappings as
    (mapping, "file:line") pairs lowest precedence first (as
    inventory Host.nictune_overrides() gives them), then the play's
    vars.nictune.  Each layer may use replace/drop like a child profile.
    """
    if play._base is None:
        play._base = _load_profiles(play)
    merged, files = play._base
    for mapping, where in inventory_layers:
        merged = merge_file_layer(merged, override_layer(mapping, where))
    if play.overrides is not None:
        merged = merge_file_layer(merged, play.overrides, ("vars", "nictune"), "a play's vars")
    check(merged.doc, merged.positions, merged.plain)
    name = play.profiles[0] if len(play.profiles) == 1 else " + ".join(play.profiles)
    # A copy: the merged profiles are cached on the play and shared by its hosts.
    return Profile(name, copy.deepcopy(merged.doc), sources_of(merged), list(files))


def _load_profiles(play: Play) -> Tuple[Parsed, List[str]]:
    resolver = Resolver()
    merged = Parsed({}, {}, {})
    for path, file, line, keypath in play._refs:
        try:
            parsed = yamlpos.parse_file(path)
        except ProfileError as e:
            if e.file == path and e.line is None:  # could not read it at all
                raise ProfileError(file, line, keypath, f"cannot use the profile {path}: {e.message}") from None
            raise
        own = resolver.resolve(parsed, path, os.path.dirname(path), [(path, os.path.realpath(path))])
        merged = merge_layers(merged, own)
    return merged, resolver.files


# -- batches -------------------------------------------------------------------------

def _batch_size(value: Union[int, str], total: int) -> int:
    if isinstance(value, str):
        # Ansible's own arithmetic (utils/helpers.pct_to_int), float rounding
        # included: "29%" of 100 hosts is 28, as ansible-playbook makes it.
        return int((int(value[:-1]) / 100.0) * total) or 1
    return value


def make_batches(serial: Sequence[Union[int, str]], hosts: Sequence) -> List[list]:
    """Split hosts (in order) into batches as Ansible's `serial:` does: each
    value is a host count or a percentage of all the play's hosts (rounded
    down, at least 1); the last value repeats until every host is placed."""
    hosts = list(hosts)
    batches: List[list] = []
    start = 0
    while start < len(hosts):
        value = serial[min(len(batches), len(serial) - 1)] if serial else "100%"
        size = _batch_size(value, len(hosts))
        batches.append(hosts[start:start + size])
        start += size
    return batches


def too_many_failed(failed: int, batch_size: int, max_fail_percentage: float) -> bool:
    """Ansible's rule: stop when the failed share of the batch is greater
    than max_fail_percentage, and always when the whole batch failed."""
    if failed == 0 or batch_size == 0:
        return False
    return failed == batch_size or failed / batch_size > max_fail_percentage / 100.0


# -- the rollout -----------------------------------------------------------------------

# A host's outcome -> the rollout report list it is named in, and its exit code.
KEPT, UNCHANGED, FAILED, NOT_STARTED = "kept", "unchanged", "failed", "not-started"
OUTCOMES = {
    KEPT: ("kept", EXIT_OK),                    # applied, passed the gates, stays
    UNCHANGED: ("unchanged", EXIT_OK),          # in a stopped batch, but apply changed nothing
    FAILED: ("failed", EXIT_ERROR),             # apply failed before writing (or unreachable)
    errors.ROLLED_BACK: ("rolled_back", EXIT_ROLLED_BACK),              # its changes were undone
    errors.ROLLBACK_FAILED: ("rollback_failed", EXIT_ROLLBACK_FAILED),  # a human must look
    NOT_STARTED: ("not_started", EXIT_ERROR),   # its batch's before_batch hook failed: nothing written
}

Run = Callable[[str, list], List[dict]]
# gate(batch number, the batch's hosts that passed verify) ->
# {"passed": bool, "message": str, "results": [{"client", "server", "rail", "tool", "figures", "passed", "why"}]}
Gate = Callable[[int, list], dict]


def _name(host: Any) -> str:
    return host if isinstance(host, str) else host.name


def rollout(play: Play, hosts: Sequence, run: Run, on_batch: Optional[Callable[[dict], None]] = None,
            gate: Optional[Gate] = None, name: Optional[str] = None) -> dict:
    """Apply the play to hosts batch by batch.

    run(command, hosts) runs "plan", "apply", "verify" or "rollback" on some
    of the hosts (the objects given here: inventory hosts or names) and
    returns their host reports (docs/reference/report-format.md), "host" being the
    host's name; it must report errors in them rather than raise.

    With require_drain, every host is planned first; a disruptive change
    with no before_batch hook to drain, or a plan that fails, stops the
    rollout before any batch.  Per batch: the before_batch hooks (a failure
    stops before anything is written); apply; stop if an apply could not
    restore its host, or if more than max_fail_percentage of the batch
    failed; else verify the hosts that applied (the health gate), stop
    unless every one passes; then, if the play has a gate: key, gate()
    (the traffic gate), stop unless it passes.  On a stop, the hosts of
    that batch that changed are rolled back; earlier batches are kept,
    later ones never start.  The after_batch hooks run whenever the
    before_batch ones succeeded, rollback or not; their failure stops the
    rollout but undoes nothing.  The cleanup hooks run after every batch
    that started, even one whose before_batch failed half-way or that an
    exception broke off.  on_batch gets each batch's result as soon as it
    is done.  name: the rollout's {rollout} for the hooks (rollout_id()
    when None; give the one the gate's launcher was given).
    """
    batches = make_batches(play.serial, hosts)
    report: dict = {
        "play": play.name, "pattern": play.hosts, "source": play.source, "id": name or rollout_id(),
        "serial": play.serial, "max_fail_percentage": play.max_fail_percentage,
        "batch_sizes": [len(b) for b in batches], "batches": [], "stopped": None, "result": "",
        **{listed: [] for listed, _ in OUTCOMES.values()}, "exit_code": EXIT_OK,
        "hooks": _hooks_summary(play.hooks), "gate": play.gate_source or None, "drain_check": None,
    }
    codes = []
    stop = _refuse_to_start(play, hosts, run, gate, report)
    if stop is not None:
        report["stopped"] = stop
        report["not_started"] = [_name(h) for h in hosts]
    for number, batch in enumerate(batches if stop is None else [], 1):
        result = _run_batch(play, number, batch, run, gate, report["id"])
        report["batches"].append(result)
        for name, outcome in result["outcomes"].items():
            listed, code = OUTCOMES[outcome]
            report[listed].append(name)
            codes.append(code)
        if on_batch is not None:
            on_batch(result)
        if result["stop"]:
            report["stopped"] = result["stop"]
            report["not_started"] += [_name(h) for later in batches[number:] for h in later]
            break
    if report["not_started"] or report["stopped"]:
        codes.append(EXIT_ERROR)
    report["exit_code"] = combined_exit(codes)
    report["result"] = (f"stopped: {report['stopped']['message']}" if report["stopped"]
                        else f"done: {len(report['kept'])} of {len(hosts)} hosts kept")
    return report


def rollout_id() -> str:
    """This rollout's name for hooks ({rollout}): the UTC time it started
    and a random suffix, so that two rollouts started in the same second
    (or a rerun after one that died) never share a reservation name."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def _hooks_summary(hooks: Optional[hooklib.Hooks]) -> Optional[dict]:
    if hooks is None:
        return None
    return {"source": hooks.where, "timeout": hooks.timeout,
            **{when: [list(h.argv) for h in getattr(hooks, when)] for when in hooklib.WHEN}}


def _refuse_to_start(play: Play, hosts: Sequence, run: Run, gate: Optional[Gate], report: dict) -> Optional[dict]:
    """A stop before the first batch, or None: a gate the play asks for and
    nobody can run, or require_drain's plan says the rollout needs a drain."""
    if play.gate is not None and gate is None:
        return errors.error(errors.TRAFFIC_GATE, f"{play.gate_source}: the play asks for a traffic gate, and this "
                            f"nictune has no gate runner to run it; nothing was written", batch=None)
    if not play.require_drain or not hosts:
        return None
    check = _drain_check(play, hosts, run)
    report["drain_check"] = check
    if check["failed"]:
        names = _listing([f["host"] for f in check["failed"]])
        return errors.error(errors.DRAIN_REQUIRED, f"{play.drain_source}: require_drain: cannot tell whether the "
                            f"rollout needs a drain: plan failed on {names}; nothing was written", batch=None)
    if check["disruptive"] and not check["drained"]:
        shown = [f"{d['host']} {d['family']} {d['target']} {d['name']}" for d in check["disruptive"]]
        hosts_of = sorted({d["host"] for d in check["disruptive"]})
        return errors.error(errors.DRAIN_REQUIRED, f"{play.drain_source}: require_drain: the plan has disruptive "
                            f"changes on {_listing(hosts_of)} ({_listing(shown, 5)}) and the play has no "
                            f"hooks.before_batch to drain them; add one, or drop require_drain; nothing was written",
                            batch=None)
    return None


def _drain_check(play: Play, hosts: Sequence, run: Run) -> dict:
    """Plan every host of the play: which changes would interrupt traffic."""
    names = [_name(h) for h in hosts]
    planned = _reports(run("plan", list(hosts)), names, "plan")
    failed, disruptive = [], []
    for n in names:
        r = planned[n]
        if r.get("error") or r["exit_code"] not in (EXIT_OK, errors.EXIT_PENDING):
            why = r.get("error") or errors.error(errors.SYSTEM, f"plan exit {r['exit_code']}")
            failed.append({"host": n, "error": why})
            continue
        for c in r.get("changes") or []:
            if c.get("disruptive") and c.get("status") == "pending":
                key = c.get("key") or {}
                disruptive.append({"host": n, "family": key.get("family", "?"), "target": key.get("target", "?"),
                                   "name": key.get("name", "?"), "why": c["disruptive"]})
    drained = bool(play.hooks and play.hooks.before_batch)
    return {"source": play.drain_source, "hosts": len(names), "failed": failed, "disruptive": disruptive,
            "drained": drained, "passed": not failed and (drained or not disruptive)}


def _run_batch(play: Play, number: int, batch: list, run: Run, gate: Optional[Gate] = None,
               rollout_name: str = "") -> dict:
    """One batch, then its cleanup hooks whatever happened: also when
    before_batch failed half-way and when an exception (a Ctrl-C, a bug)
    breaks the batch off, so that a reservation or drain it set up is
    undone before the rollout stops."""
    names = [_name(h) for h in batch]
    try:
        result = _batch(play, number, batch, run, gate, rollout_name)
    except BaseException:
        hooklib.run_hooks(play.hooks, "cleanup", number, names, "interrupted", {}, rollout_name)
        raise
    stop = result["stop"]
    cleaned, cleanup_failed = hooklib.run_hooks(play.hooks, "cleanup", number, names, stop["kind"] if stop else "",
                                                result["outcomes"], rollout_name)
    result["hooks"] = result["hooks"] + cleaned
    if cleanup_failed is not None:
        words = f"batch {number}: {hook_words(cleanup_failed)}"
        if result["stop"] is None:
            result["stop"] = errors.error(errors.HOOK_FAILED, f"{words}; the batch passed its gates and is kept",
                                          batch=number)
        else:
            result["stop"]["message"] += f"; and {words}"
        result["result"] = result["stop"]["message"]
    return result


def _batch(play: Play, number: int, batch: list, run: Run, gate: Optional[Gate], rollout_name: str) -> dict:
    names = [_name(h) for h in batch]
    before, hook_failed = hooklib.run_hooks(play.hooks, "before_batch", number, names, rollout=rollout_name)
    if hook_failed is not None:
        stop = errors.error(errors.HOOK_FAILED, f"batch {number}: {hook_words(hook_failed)}; nothing was "
                            f"written in this batch of {len(names)} host(s) ({_listing(names)})"
                            f"{_ran_before(before)}", batch=number)
        return {"number": number, "hosts": names, "hooks": before, "reports": [], "verify": [], "gate": None,
                "rollback": [], "outcomes": {n: NOT_STARTED for n in names}, "stop": stop,
                "result": stop["message"]}

    outcomes: Dict[str, str] = {}
    applied = _reports(run("apply", batch), names, "apply")
    failed = [n for n in names if applied[n]["exit_code"] != EXIT_OK]
    for n in failed:
        outcomes[n] = errors.KIND_OF_EXIT.get(applied[n]["exit_code"], FAILED)

    stop = None
    stranded = [n for n in failed if applied[n]["exit_code"] == EXIT_ROLLBACK_FAILED]
    if stranded:
        stop = errors.error(errors.ROLLBACK_FAILED, f"batch {number}: apply failed and could not "
                            f"restore {_listing(stranded)}: a human must look", batch=number)
    elif too_many_failed(len(failed), len(names), play.max_fail_percentage):
        stop = errors.error(errors.MAX_FAIL, _max_fail_message(number, failed, names, play), batch=number)

    good = [h for h in batch if applied[_name(h)]["exit_code"] == EXIT_OK]
    verified: Dict[str, dict] = {}
    if stop is None and good:
        verified = _reports(run("verify", good), [_name(h) for h in good], "verify")
        bad = [f"{n} ({(r.get('error') or {}).get('kind') or 'drift'})" for n, r in verified.items()
               if r["exit_code"] != EXIT_OK and not reset_due(r)]
        if bad:
            stop = errors.error(errors.HEALTH_GATE, f"batch {number}: the health gate (verify) did "
                                f"not pass on {_listing(bad)}", batch=number)

    gated = None
    if stop is None and good and play.gate is not None and gate is not None:
        gated = _traffic_gate(gate, number, good)
        if not gated["passed"]:
            stop = errors.error(errors.TRAFFIC_GATE, f"batch {number}: the traffic gate did not pass: "
                                f"{_gate_words(gated)}", batch=number)

    restored: Dict[str, dict] = {}
    if stop is None:
        outcomes.update((_name(h), KEPT) for h in good)
    else:
        restored = _undo(good, applied, outcomes, run)

    # After a rollback too: nodes a before_batch hook drained must not stay drained.
    after, after_failed = hooklib.run_hooks(play.hooks, "after_batch", number, names,
                                            stop["kind"] if stop else "", outcomes, rollout_name,
                                            {n: reset_due(r) for n, r in verified.items()
                                             if stop is None})
    if after_failed is not None:
        words = f"batch {number}: {hook_words(after_failed)}"
        if stop is None:
            stop = errors.error(errors.HOOK_FAILED, f"{words}; the batch passed its gates and is kept",
                                batch=number)
        else:
            stop["message"] += f"; and {words}"
    passed = "passed the health gate" + (" and the traffic gate" if gated is not None else "")
    return {
        "number": number,
        "hosts": names,
        "hooks": before + after,                          # before_batch, then after_batch
        "reports": [applied[n] for n in names],           # what apply did on each host
        "verify": [verified[n] for n in names if n in verified],    # the health gate
        "gate": gated,                                    # the traffic gate, or None when it did not run
        "rollback": [restored[n] for n in names if n in restored],  # the rollout's rollbacks
        "outcomes": {n: outcomes[n] for n in names},
        "stop": stop,
        "result": stop["message"] if stop else passed,
    }


# What a stored firmware value waits for (knobs/firmware.py staged notes),
# strongest first: the word after_batch hooks get in NICTUNE_RESET.
RESETS = (("reboot", "a reboot"), ("fw_activate", "fw_activate"),
          ("driver_reinit", "devlink dev reload"))


def reset_due(report: dict) -> str:
    """The reset a verified host waits for when every key that is not as
    wanted is only stored for a reset (status pending-reset) and nothing
    else is wrong: "reboot", "fw_activate" or "driver_reinit"; else ""."""
    if report.get("error") or report.get("exit_code") not in (EXIT_OK, EXIT_PENDING):
        return ""
    waiting = [c for c in report.get("changes", []) if c.get("status") != "ok"]
    if not waiting or any(c.get("status") != "pending-reset" for c in waiting):
        return ""
    notes = " ".join(str(c.get("note", "")) for c in waiting)
    return next((word for word, said in RESETS if said in notes), "reboot")


def hook_words(result: dict) -> str:
    """What went wrong with a hook, for a stop message: its source and argv."""
    argv = " ".join(printable(a) for a in result["argv"])
    if len(argv) > 120:
        argv = argv[:117] + "..."
    return f"{result['hook']} hook ({result['source']}) {argv!r} {result['error']['message']}"


def _ran_before(results: List[dict]) -> str:
    ok = [r for r in results if r["ok"]]
    if not ok:
        return ""
    return (f" (the {len(ok)} hook command(s) that ran before it succeeded: after_batch does not run "
            f"when before_batch fails, cleanup does)")


def _traffic_gate(gate: Gate, number: int, hosts: list) -> dict:
    """The gate's answer, checked; an exception or a malformed answer is the gate failing."""
    start = time.monotonic()
    try:
        answer = gate(number, hosts)
    except Exception as e:  # a gate that breaks must stop the rollout, never let a batch through
        answer = {"passed": False, "message": f"the gate failed: {type(e).__name__}: {e}", "results": []}
    if not isinstance(answer, dict) or not isinstance(answer.get("passed"), bool):
        answer = {"passed": False, "message": f"the gate gave no passed: true/false ({type(answer).__name__})",
                  "results": []}
    results = answer.get("results")
    rows = [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
    passed, message = answer["passed"], printable(answer.get("message") or "")
    # Whatever the gate said besides, the result shape is the one every gate has.
    outcome = Outcome(True, message) if passed else Outcome.failed(errors.TRAFFIC_GATE, message)
    return {**answer, "passed": passed, "results": rows, **outcome.fields(),
            "seconds": round(time.monotonic() - start, 3)}


def _gate_words(gated: dict) -> str:
    failing = [r for r in gated["results"] if not r.get("passed")]
    if not failing:
        return gated["message"] or "it said so, without a failing pair"
    parts = [printable(f"{r.get('client', '?')} -> {r.get('server', '?')} on {r.get('rail', '?')} "
                       f"({r.get('tool', '?')}: {r.get('why') or 'failed'})") for r in failing]
    return "; ".join(parts[:5]) + (f"; and {len(parts) - 5} more" if len(parts) > 5 else "")


def _undo(good: list, applied: Dict[str, dict], outcomes: Dict[str, str], run: Run) -> Dict[str, dict]:
    # Only hosts whose apply wrote something: a rollback where the apply
    # changed nothing would restore the apply before it, from its journal.
    changed = [h for h in good if applied[_name(h)].get("changed")]
    for h in good:
        if not applied[_name(h)].get("changed"):
            outcomes[_name(h)] = UNCHANGED
    if not changed:
        return {}
    restored = _reports(run("rollback", changed), [_name(h) for h in changed], "rollback")
    for n, r in restored.items():
        outcomes[n] = errors.ROLLED_BACK if r["exit_code"] == EXIT_OK else errors.ROLLBACK_FAILED
    return restored


def _reports(reports: List[dict], names: List[str], command: str) -> Dict[str, dict]:
    """Host reports by name; a host with no report gets an error report."""
    wanted = set(names)
    found = {r.get("host"): r for r in reports if r.get("host") in wanted}
    for n in names:
        if n not in found:
            found[n] = {"host": n, "command": command, "ok": False, "exit_code": EXIT_ERROR,
                        "changed": False, "changes": [], "warnings": [],
                        "error": errors.error(errors.TRANSPORT, f"no {command} report came back from {n}")}
    return found


def _listing(names: List[str], limit: int = 10) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _max_fail_message(number: int, failed: List[str], names: List[str], play: Play) -> str:
    if len(failed) == len(names):
        return f"batch {number}: every host failed to apply ({_listing(failed)})"
    share = 100.0 * len(failed) / len(names)
    return (f"batch {number}: {len(failed)} of {len(names)} hosts failed to apply ({share:.0f}%, more than "
            f"max_fail_percentage {play.max_fail_percentage:g}): {_listing(failed)}")
