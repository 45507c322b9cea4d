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

A play's hosts are its pattern's hosts, each seen through the play
(Play.host): the play's vars over the inventory's, connection settings
included, as in Ansible.  Batches follow Ansible's `serial` exactly
(make_batches); `rollout` runs apply, then verify as a health gate, batch
by batch, through a `run` callable, so it knows nothing about SSH.  Errors
are ProfileError: one paragraph naming file, line and key.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from nictune.host import errors
from nictune.host.errors import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_ROLLBACK_FAILED,
    EXIT_ROLLED_BACK,
    combined_exit,
)
from nictune.inventory.patterns import split_pattern
from nictune.profile import yamlpos
from nictune.profile.check import check, locate
from nictune.profile.errors import ProfileError, dotted
from nictune.profile.loader import NOT_OVERRIDABLE, Profile, override_layer, sources_of
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

    def host(self, host: Any) -> Any:
        """An inventory host as this play sees it: address, port, user, key
        file and every other variable with the play's vars winning."""
        return host.with_play_vars((self.vars, self.vars_where))


def load_playbook(path: str) -> List[Play]:
    """The plays of the playbook at path; raises ProfileError and nothing else."""
    return load_playbook_parsed(yamlpos.parse_file(path, "playbook"), path)


def load_playbook_parsed(parsed: Parsed, path: str) -> List[Play]:
    """load_playbook for a file already parsed (yamlpos.read_target); path
    is that file, whose directory the plays' profile paths are relative to."""
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
        overrides = _subtree(parsed, (index, "vars", "nictune"))
        for key in NOT_OVERRIDABLE:
            if key in overrides.doc:
                raise ProfileError(*locate(parsed.positions, (index, "vars", "nictune", key)),
                                   dotted((index, "vars", "nictune", key)),
                                   f"{key} cannot be overridden here; list profiles under profile:")
        del play_vars["nictune"]
    vars_where = {key: locate(parsed.positions, (index, "vars", key)) for key in play_vars}
    serial = raw.get("serial", "100%")
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
    )


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
        merged = merge_layers(merged, override_layer(mapping, where))
    if play.overrides is not None:
        merged = merge_layers(merged, play.overrides)
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
KEPT, UNCHANGED, FAILED = "kept", "unchanged", "failed"
OUTCOMES = {
    KEPT: ("kept", EXIT_OK),                    # applied, passed the gate, stays
    UNCHANGED: ("unchanged", EXIT_OK),          # in a stopped batch, but apply changed nothing
    FAILED: ("failed", EXIT_ERROR),             # apply failed before writing (or unreachable)
    errors.ROLLED_BACK: ("rolled_back", EXIT_ROLLED_BACK),              # its changes were undone
    errors.ROLLBACK_FAILED: ("rollback_failed", EXIT_ROLLBACK_FAILED),  # a human must look
}

Run = Callable[[str, list], List[dict]]


def _name(host: Any) -> str:
    return host if isinstance(host, str) else host.name


def rollout(play: Play, hosts: Sequence, run: Run, on_batch: Optional[Callable[[dict], None]] = None) -> dict:
    """Apply the play to hosts batch by batch.

    run(command, hosts) runs "apply", "verify" or "rollback" on some of the
    hosts (the objects given here: inventory hosts or names) and returns
    their host reports (docs/report-format.md), "host" being the host's
    name; it must report errors in them rather than raise.  Per batch:
    apply; stop if an apply could not restore its host, or if more than
    max_fail_percentage of the batch failed; else verify the hosts that
    applied (the health gate), stop unless every one passes.  On a stop,
    the hosts of that batch that changed are rolled back; earlier batches
    are kept, later ones never start.  on_batch gets each batch's result
    as soon as it is done.
    """
    batches = make_batches(play.serial, hosts)
    report: dict = {
        "play": play.name, "pattern": play.hosts, "source": play.source,
        "serial": play.serial, "max_fail_percentage": play.max_fail_percentage,
        "batch_sizes": [len(b) for b in batches], "batches": [], "stopped": None, "result": "",
        **{listed: [] for listed, _ in OUTCOMES.values()}, "not_started": [], "exit_code": EXIT_OK,
    }
    codes = []
    for number, batch in enumerate(batches, 1):
        result = _run_batch(play, number, batch, run)
        report["batches"].append(result)
        for name, outcome in result["outcomes"].items():
            listed, code = OUTCOMES[outcome]
            report[listed].append(name)
            codes.append(code)
        if on_batch is not None:
            on_batch(result)
        if result["stop"]:
            report["stopped"] = result["stop"]
            report["not_started"] = [_name(h) for later in batches[number:] for h in later]
            break
    if report["not_started"]:
        codes.append(EXIT_ERROR)
    report["exit_code"] = combined_exit(codes)
    report["result"] = (f"stopped: {report['stopped']['message']}" if report["stopped"]
                        else f"done: {len(report['kept'])} of {len(hosts)} hosts kept")
    return report


def _run_batch(play: Play, number: int, batch: list, run: Run) -> dict:
    names = [_name(h) for h in batch]
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
               if r["exit_code"] != EXIT_OK]
        if bad:
            stop = errors.error(errors.HEALTH_GATE, f"batch {number}: the health gate (verify) did "
                                f"not pass on {_listing(bad)}", batch=number)

    restored: Dict[str, dict] = {}
    if stop is None:
        outcomes.update((_name(h), KEPT) for h in good)
    else:
        restored = _undo(good, applied, outcomes, run)
    return {
        "number": number,
        "hosts": names,
        "reports": [applied[n] for n in names],           # what apply did on each host
        "verify": [verified[n] for n in names if n in verified],    # the health gate
        "rollback": [restored[n] for n in names if n in restored],  # the rollout's rollbacks
        "outcomes": {n: outcomes[n] for n in names},
        "stop": stop,
        "result": stop["message"] if stop else "passed the health gate",
    }


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
