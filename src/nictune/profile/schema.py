"""The JSON Schema of a merged nictune profile: the single source of truth.

The loader validates every merged profile against SCHEMA, editors can use
schema_json() for completion and hover help, and describe() turns any part
of it into the words error messages use ("an integer from 68 to 65535, or
{min: N} / {max: N}"), so messages, docs and checks cannot drift apart.

Every string has a pattern from nictune.host.validate (the host side re-checks
with the same constants) and a maxLength.  The schema describes the merged
document: the merge directives replace/drop never reach it, and extends is
listed only so editors accept it at the top of a file.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

from ..host import validate as v
from ..host.knobs import REGISTERED

SCHEMA_ID = "https://nictune.dev/schema/profile-1.json"

# Entry names become parts of report keys and log lines; drop and replace
# would collide with the merge directives.
ENTRY_NAME = r"^(?!(?:drop|replace)$)[a-z][a-z0-9_-]{0,31}$"
# Free text: anything but control characters other than tab and newline.
DESCRIPTION = r"^[^\x00-\x08\x0b-\x1f\x7f]{0,1000}$"
# A file name in extends: any printable text.
EXTENDS_PATH = r"^[^\x00-\x1f\x7f]{1,4096}$"
NOT_NORMALISED = v.NOT_NORMALISED

PATTERN_WORDS: Dict[str, str] = {
    **v.WORDS,
    ENTRY_NAME: "an entry name: a lowercase letter and then up to 31 lowercase letters, digits, '_' or '-' (not 'drop' or 'replace')",
    DESCRIPTION: "text of up to 1000 characters with no control characters other than tab and newline",
    EXTENDS_PATH: "a file path of up to 4096 characters with no control characters",
}



def register_words(words: Dict[str, str]) -> None:
    """Add the words for more patterns.  Words are looked up by the pattern's
    text, so two meanings must never share one pattern."""
    for pattern, text in words.items():
        if PATTERN_WORDS.get(pattern, text) != text:
            raise ValueError(f"pattern {pattern} already means {PATTERN_WORDS[pattern]!r}")
        PATTERN_WORDS[pattern] = text

U32 = 4294967295
S64_MIN, U64_MAX = -(2**63), 2**64 - 1


# -- words -----------------------------------------------------------------

def resolve(node: dict) -> dict:
    """Follow a local $ref ("#/$defs/name")."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return SCHEMA["$defs"][ref[len("#/$defs/"):]]
    return node


def describe(node: dict) -> str:
    """What a schema node accepts, in words for error messages."""
    node = resolve(node)
    branches = node.get("anyOf") or node.get("oneOf")
    if branches:
        parts: List[str] = []
        for branch in branches:
            words = describe(branch)
            branch = resolve(branch)
            if branch.get("type") == "array" and parts and describe(branch.get("items", {})) == parts[-1]:
                words = "a list of them"
            parts.append(words)
        return _either(parts)
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(str(x) for x in node["enum"])
    kind = node.get("type")
    if kind == "integer":
        lo, hi = node.get("minimum"), node.get("maximum")
        if lo is None or hi is None or lo <= S64_MIN or hi >= U64_MAX:
            return "an integer"
        return f"an integer from {lo} to {hi}"
    if kind == "number" and "minimum" in node and "maximum" in node:
        return f"a number from {node['minimum']:g} to {node['maximum']:g}"
    if kind == "boolean":
        return "true or false"
    if kind == "string":
        if node.get("pattern") in PATTERN_WORDS:
            return PATTERN_WORDS[node["pattern"]]
        return f"text of up to {node.get('maxLength', 'any number of')} characters"
    if kind == "array":
        items = resolve(node.get("items", {}))
        lo, hi = node.get("minItems", 0), node.get("maxItems")
        count = "" if hi is None else f"{hi} " if lo == hi else f"{lo} to {hi} "
        if items.get("type") == "integer":
            return f"a list of {count}integers"
        return f"a list of {count}items, each {describe(items)}"
    if kind == "object":
        props = list(node.get("properties", {}))
        if set(props) == {"min", "max"}:
            return "{min: N} / {max: N}"
        if props:
            return "a mapping with the keys " + ", ".join(props)
        if "propertyNames" in node:
            return f"a mapping whose keys are {describe(node['propertyNames'])}"
        return "a mapping"
    return "a valid value"


def _either(parts: List[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    if len(parts) == 2:
        return f"{parts[0]}, or {parts[1]}"
    return ", ".join(parts[:-1]) + f", or {parts[-1]}"


# -- building blocks -------------------------------------------------------

def _text(pattern: str, max_length: int, description: str = "", words: str = "") -> dict:
    """A string matching `pattern`.  `words` says what the pattern accepts,
    for a pattern that validate.WORDS does not know (a family's own)."""
    if words:
        register_words({pattern: words})
    node: Dict[str, Any] = {"type": "string", "pattern": pattern, "maxLength": max_length}
    if description:
        node["description"] = f"{description} Allowed: {PATTERN_WORDS[pattern]}."
    return node


def _int(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _bound(number: dict) -> dict:
    return {
        "type": "object",
        "title": "bound",
        "description": "{min: N}: at least N (N is written only when the current value is lower); {max: N}: at most N.",
        "properties": {"min": number, "max": number},
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
    }


def _wanted(lo: int, hi: int, what: str) -> dict:
    """An exact integer or a bound on it."""
    number = _int(lo, hi)
    node = {"anyOf": [number, _bound(number)]}
    node["description"] = f"{what} Allowed: {describe(node)}."
    return node


def _flags(keys: List[str], what: str) -> dict:
    props = {k: {"type": "boolean"} for k in keys}
    return {"type": "object", "description": what, "properties": props, "additionalProperties": False}


def _selector(pattern: str, max_length: int, what: str) -> dict:
    one = _text(pattern, max_length)
    node = {"anyOf": [one, {"type": "array", "items": one, "minItems": 1, "maxItems": 64}]}
    node["description"] = f"{what} A list matches if any item does. Allowed: {describe(node)}."
    return node


POLICIES = ["fail", "warn", "skip"]
# A key of the mapping form of on_unsupported: default, or a dotted profile
# path such as roce.ecn or host.nccl (profile/check.py: it must name settings).
SETTING_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
register_words({SETTING_PATH: "default, or a dotted profile path such as roce.ecn or host.nccl"})


def _on_unsupported(scope: str) -> dict:
    return {
        "anyOf": [{"enum": POLICIES},
                  {"type": "object", "propertyNames": _text(SETTING_PATH, 128),
                   "additionalProperties": {"enum": POLICIES}, "minProperties": 1, "maxProperties": 64}],
        "description": f"What to do when {scope} cannot take a setting: fail the run, warn and go "
                       "on, or skip silently. Or, per section, a mapping such as {default: fail, "
                       "roce.ecn: warn}: each key is a profile path (interface entry paths as "
                       "roce.ecn, host ones as host.nccl) and covers the settings below it, the "
                       "longest key winning; default covers the rest. An entry's word or mapping "
                       "comes before the profile's.",
    }


# on_drift (host/resident/daemon.py): what the resident agent does when a key it
# keeps no longer reads as the desired state.
DRIFT_POLICIES = ["report", "restore"]


def _on_drift(scope: str) -> dict:
    return {
        "anyOf": [{"enum": DRIFT_POLICIES},
                  {"type": "object", "propertyNames": _text(SETTING_PATH, 128),
                   "additionalProperties": {"enum": DRIFT_POLICIES}, "minProperties": 1,
                   "maxProperties": 64}],
        "description": f"What the resident agent (`nictune agent run`) does when a setting of "
                       f"{scope} drifts from this profile: report it (the default), or restore "
                       "it; a key that drifts again 3 times in 10 minutes is left alone and "
                       "reported. Or, per section, a mapping such as {default: report, mtu: "
                       "restore}, read like on_unsupported's.",
    }


def _prio_list(what: str) -> dict:
    return {"type": "array", "items": _int(0, 7), "maxItems": 8,
            "description": f"{what} Allowed: a list of up to 8 priorities, each 0 to 7; [] for none."}


def _vector(item: dict, what: str) -> dict:
    return {"type": "array", "items": item, "minItems": 8, "maxItems": 8,
            "description": f"{what} Exactly 8 entries, one per priority or traffic class."}


def _section(what: str, properties: dict, **extra) -> dict:
    """A closed mapping: only the keys given."""
    return {"type": "object", "description": what, "properties": properties,
            "additionalProperties": False, **extra}


def _mapping(what: str, keys: dict, values: dict, limit: int) -> dict:
    """A mapping of free-form keys (each matching `keys`) to `values`."""
    return {"type": "object", "description": what, "propertyNames": keys,
            "additionalProperties": values, "maxProperties": limit}


class KIT:
    """What a knob family builds its schema with (Family.schema(KIT))."""

    U32, U64_MAX, S64_MIN = U32, U64_MAX, S64_MIN
    text = staticmethod(_text)
    integer = staticmethod(_int)
    bound = staticmethod(_bound)
    wanted = staticmethod(_wanted)
    flags = staticmethod(_flags)
    prio_list = staticmethod(_prio_list)
    vector = staticmethod(_vector)
    section = staticmethod(_section)
    mapping = staticmethod(_mapping)

    @staticmethod
    def ref(name: str) -> dict:
        """A reference to a node a family declares under "defs"."""
        return {"$ref": f"#/$defs/{name}"}


# -- the schema ------------------------------------------------------------

def _merge_into(props: dict, key: str, node: dict, family: str) -> None:
    """Two families may share a section that is a closed mapping (dcb and
    roce share roce:): its properties are merged, anything else must agree."""
    have = props.get(key)
    if have is None:
        props[key] = node
        return
    if "properties" not in have or "properties" not in node:
        raise ValueError(f"{family}: section {key!r} is already declared by another family")
    twice = set(have["properties"]) & set(node["properties"])
    if twice:
        raise ValueError(f"{family}: {key}.{sorted(twice)[0]} is already declared by another family")
    merged = {**node, **have, "properties": {**have["properties"], **node["properties"]}}
    if any(k in have and have[k] != v for k, v in node.items() if k not in ("properties", "title", "description")):
        raise ValueError(f"{family}: section {key!r} disagrees with another family's")
    props[key] = merged


# A switch id as sysfs phys_switch_id prints it (up to MAX_PHYS_ITEM_ID_LEN, 32 bytes).
_SWITCH_ID = r"^[0-9a-fA-F]{2,64}$"
register_words({_SWITCH_ID: "a switch id: 2-64 hex digits, as /sys/class/net/X/phys_switch_id shows it"})


def _agreement() -> dict:
    """The profile's say in fleet agreement (control/review/agreement.py):
    the controller reads it; hosts ignore it."""
    from nictune.control.review.agreement import ENV_FAMILIES, NAMES
    from nictune.host.knobs import load

    variables = {family: {"type": "array", "items": _text(load(family).syntax.name_pattern, 128),
                          "uniqueItems": True, "maxItems": 64,
                          "description": f"More {family} variables every host of the fabric must share."}
                 for family in ENV_FAMILIES}
    return {"type": "object", "additionalProperties": False,
            "description": "Fleet agreement: `nictune audit` compares, per fabric (the hosts with the same "
                           "nictune_fabric inventory variable), the values every host must share, and "
                           "names the hosts that differ. This section tunes the set for the hosts of "
                           "this profile.",
            "properties": {
                "skip": {"type": "array", "items": {"enum": list(NAMES)}, "uniqueItems": True,
                         "maxItems": len(NAMES),
                         "description": "Values these hosts take no part in comparing."},
                "env": {"type": "object", "additionalProperties": False, "properties": variables,
                        "description": "Variables to compare besides the declared set, by the file "
                                       "they are in (host.nccl, host.ucx, host.nvshmem)."}}}


def build(families=REGISTERED) -> Dict[str, Any]:
    """The whole profile schema, with the families' sections in their
    registration order."""
    entry_props: Dict[str, Any] = {
        "match": {
            "type": "object",
            "description": "Which interfaces this entry applies to. Every selector given must match; at least one is required.",
            "properties": {
                "name": _selector(v.IFGLOB, 64, "Interface name or glob, such as ens* or eth[0-3]."),
                "driver": _selector(v.DRIVER, 32, "Kernel driver name, such as mlx5_core or mana."),
                "lower_driver": _selector(v.DRIVER, 32, "Kernel driver of a device enslaved to the interface (sysfs lower_*), such as mana for an Azure hv_netvsc NIC "
                                                        "whose Accelerated Networking VF is MANA rather than a Mellanox VF (mlx5_core, mlx4_en); an interface without lower devices does not match."),
                "pci_id": _selector(v.PCI_ID, 9, "PCI vendor:device id."),
                "mac": _selector(v.MAC, 17, "Permanent MAC address."),
                "phys_port_name": _selector(v.IFGLOB, 64, "Switch port name or glob (sysfs phys_port_name), such as p0 or pf0vf* for the representors of PF 0's VFs."),
                "phys_switch_id": _selector(_SWITCH_ID, 64, "Switch id (sysfs phys_switch_id, hex): the uplink and representors of one eswitch share it."),
                "flavour": {"anyOf": [{"enum": ["physical", "pcipf", "pcivf", "pcisf", "virtual", "cpu", "dsa", "unused"]},
                                      {"type": "array", "items": {"enum": ["physical", "pcipf", "pcivf", "pcisf", "virtual", "cpu", "dsa", "unused"]}, "minItems": 1, "maxItems": 8}],
                            "description": "devlink port flavour of the interface: physical (uplink), pcipf or pcivf (representors of a PF or VF), pcisf. A list matches if any item does."},
                "vf_of": {**_text(ENTRY_NAME, 32),
                          "description": "The name of an earlier interface entry: select the VFs of the PFs it matched, as they are when the plan runs: "
                                         "their representors (devlink flavour pcivf on the PF's devlink instance and switch id) and their VF netdevs (device/physfn is the PF). "
                                         "Representors and VFs that the same apply makes are matched by the next plan. "
                                         f"Allowed: {PATTERN_WORDS[ENTRY_NAME]}."},
                "vfs": {"anyOf": [_int(0, 65535), {"type": "array", "items": _int(0, 65535), "minItems": 1, "maxItems": 64}],
                        "description": "With vf_of: only these VF numbers (the representor's devlink VF number, pfNvfM; a VF netdev's virtfnM index). "
                                       "A list matches if any item does. Allowed: an integer from 0 to 65535, or a list of them."},
            },
            "additionalProperties": False,
            "minProperties": 1,
        },
        "on_unsupported": _on_unsupported("an interface of this entry"),
        "on_drift": _on_drift("an interface of this entry"),
    }
    host_props: Dict[str, Any] = {}
    defs: Dict[str, Any] = {}
    for family in families:
        parts = family.schema(KIT)
        for key, node in parts.get("entry", {}).items():
            _merge_into(entry_props, key, node, family.name)
        for key, node in parts.get("host", {}).items():
            _merge_into(host_props, key, node, family.name)
        defs.update(parts.get("defs", {}))
    entry = {
        "type": "object",
        "title": "interface entry",
        "description": "Settings for every interface that the match selects.",
        "properties": entry_props,
        "required": ["match"],
        "additionalProperties": False,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "nictune profile",
        "description": "NIC and host network settings that nictune plans, applies and verifies.",
        "type": "object",
        "properties": {
            "nictune": {"const": 1, "description": "Profile format version; must be 1."},
            "description": {"type": "string", "pattern": DESCRIPTION, "maxLength": 1000,
                            "description": "What this profile is for."},
            "extends": {
                "description": "Profiles to start from, relative to this file's directory; merged left to right, then this file on top. "
                               "In this file, replace: true in a mapping replaces the inherited mapping and drop: [keys] removes inherited keys.",
                "anyOf": [
                    {"type": "string", "pattern": EXTENDS_PATH, "maxLength": 4096},
                    {"type": "array", "items": {"type": "string", "pattern": EXTENDS_PATH, "maxLength": 4096}, "maxItems": 16},
                ],
            },
            "on_unsupported": _on_unsupported("the host or a device"),
            "on_drift": _on_drift("the host or a device"),
            "agreement": _agreement(),
            "host": {"type": "object", "description": "Host-wide settings.",
                     "properties": host_props, "additionalProperties": False},
            "interfaces": {
                "type": "object",
                "description": "Interface entries by name; the name is yours and appears in plans and reports.",
                "propertyNames": _text(ENTRY_NAME, 32),
                "additionalProperties": {"$ref": "#/$defs/entry"},
                "maxProperties": 64,
            },
        },
        "required": ["nictune"],
        "additionalProperties": False,
        "$defs": {"entry": entry, **defs},
    }


SCHEMA: Dict[str, Any] = build()


def schema_json() -> str:
    return json.dumps(SCHEMA, indent=2, sort_keys=True) + "\n"
