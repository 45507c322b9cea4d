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
from .schema_expect import EXPECT_PATTERN_WORDS, expect_schema

SCHEMA_ID = "https://nictune.dev/schema/profile-1.json"

# Entry names become parts of report keys and log lines; drop and replace
# would collide with the merge directives.
ENTRY_NAME = r"^(?!(?:drop|replace)$)[a-z][a-z0-9_-]{0,31}$"
# Free text: anything but control characters other than tab and newline.
DESCRIPTION = r"^[^\x00-\x08\x0b-\x1f\x7f]{0,1000}$"
# A file name in extends: any printable text.
EXTENDS_PATH = r"^[^\x00-\x1f\x7f]{1,4096}$"
# What check_path() refuses beyond ABS_PATH: '.' or '..' parts, '//', a
# trailing '/'.  Expressed as a pattern so that editors enforce it too.
NOT_NORMALISED = r"(^|/)\.\.?(/|$)|//|/$"

PATTERN_WORDS: Dict[str, str] = {
    v.IFNAME: "an interface name: 1-15 letters, digits, '_', '.', '@' or '-'",
    v.IFGLOB: "an interface name or glob: 1-64 letters, digits, '_', '.', '@', '-' or the glob characters * ? [ ] !",
    v.SYSCTL_KEY: "a sysctl name under net. such as net.ipv4.tcp_ecn: 2 to 7 parts of letters, digits, '_' or '-' joined by dots",
    v.IF_SYSCTL_KEY: "a per-interface sysctl name such as ipv4.rp_filter: ipv4. or ipv6. and then 1-64 letters, digits, '_' or '-'",
    v.SYSCTL_VALUE: "text of up to 256 letters, digits, spaces, tabs and _ . , : / + -",
    v.NCCL_NAME: "an NCCL variable name: NCCL_ and then 1-64 capital letters, digits or '_'",
    v.NCCL_VALUE: "text of up to 900 characters on one line, with no blank at either end",
    v.FEATURE_NAME: "an ethtool feature name: 1-64 lowercase letters, digits, '_' or '-'",
    v.MAC: "a MAC address such as 0c:42:a1:00:00:01",
    v.PCI_ID: "a PCI vendor:device id such as 15b3:1021",
    v.DRIVER: "a driver name: 1-32 letters, digits, '_' or '-'",
    v.ABS_PATH: "an absolute, normalised path: '/' and then up to 255 letters, digits and _ . / + -, with no '.' or '..' parts, no '//' and no trailing '/'",
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


register_words(EXPECT_PATTERN_WORDS)

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

def _text(pattern: str, max_length: int, description: str = "") -> dict:
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


def _on_unsupported(scope: str) -> dict:
    return {
        "enum": ["fail", "warn", "skip"],
        "description": f"What to do when {scope} cannot take a setting: fail the run, warn and go on, or skip silently.",
    }


# -- the schema ------------------------------------------------------------

_SYSCTL_INT = _int(S64_MIN, U64_MAX)
_SYSCTL_VALUE = {
    "anyOf": [
        _SYSCTL_INT,
        _text(v.SYSCTL_VALUE, 256),
        {"type": "array", "items": _SYSCTL_INT, "minItems": 1, "maxItems": 8},
        _bound(_SYSCTL_INT),
    ],
}


def _sysctls(key_pattern: str, key_max: int, limit: int, what: str) -> dict:
    return {
        "type": "object",
        "description": what,
        "propertyNames": _text(key_pattern, key_max),
        "additionalProperties": {"$ref": "#/$defs/sysctl_value"},
        "maxProperties": limit,
    }


def _prio_list(what: str) -> dict:
    return {"type": "array", "items": _int(0, 7), "maxItems": 8,
            "description": f"{what} Allowed: a list of up to 8 priorities, each 0 to 7; [] for none."}


def _vector(item: dict, what: str) -> dict:
    return {"type": "array", "items": item, "minItems": 8, "maxItems": 8,
            "description": f"{what} Exactly 8 entries, one per priority or traffic class."}


# The host side re-checks these with the same constants (rdma.py, knobs/roce.py).
ECN_PARAM, IBDEV, DSCP = v.ECN_PARAM, v.IBDEV, v.DSCP
register_words({
    DSCP: "a DSCP value from 0 to 63",
    ECN_PARAM: "a DCQCN parameter name as the driver's ecn directory names it: a lowercase letter and then up to 63 lowercase letters, digits or '_'",
    IBDEV: "an RDMA device name such as mlx5_0: 1-64 letters, digits, '_', '.' or '-' (not . or ..)",
})

_ROCE = {
    "type": "object",
    "title": "RoCE settings",
    "description": "RoCE v2 QoS and RDMA-CM defaults of the interface's RDMA device.",
    "properties": {
        "rdma_device": {
            "anyOf": [{"const": "auto"}, _text(IBDEV, 64)],
            "description": "The RDMA device: auto (the device whose port carries this interface) or a name such as mlx5_0.",
        },
        "mode": {"enum": ["v1", "v2"], "description": "RDMA-CM default RoCE mode (configfs default_roce_mode)."},
        "tos": {**_int(0, 255), "description": "RDMA-CM default ToS byte (configfs default_roce_tos); DSCP = tos >> 2."},
        "trust": {"enum": ["dscp", "pcp"], "description": "Which header field picks the priority: DSCP or 802.1p PCP."},
        "dscp_map": {
            "type": "object",
            "description": "DSCP (0-63) -> priority (0-7), written as DCB APP entries (selector 5); the exact set of DSCP entries.",
            "propertyNames": _text(DSCP, 2),
            "additionalProperties": _int(0, 7),
            "maxProperties": 64,
        },
        "pfc": _prio_list("Priorities with PFC on; every other priority off."),
        "ets": {
            "type": "object",
            "description": "ETS scheduling (dcb ets / mlnx_qos --prio_tc --tcbw --tsa).",
            "properties": {
                "prio_tc": _vector(_int(0, 7), "Priority -> traffic class (0-7)."),
                "tc_bw": _vector(_int(0, 100), "Bandwidth percent per traffic class; the ETS classes sum to 100."),
                "tc_tsa": _vector({"enum": ["ets", "strict", "vendor"]}, "Scheduler per traffic class: ets, strict or vendor."),
            },
            "additionalProperties": False,
            "minProperties": 1,
        },
        "ecn": {
            "type": "object",
            "description": "ECN/DCQCN, where the driver exposes /sys/class/net/<if>/ecn (MLNX_OFED/DOCA-OFED).",
            "properties": {
                "np": _prio_list("Priorities where the NIC is ECN notification point (sends CNPs)."),
                "rp": _prio_list("Priorities where the NIC is reaction point (DCQCN rate control)."),
                "cnp_dscp": {**_int(0, 63), "description": "DSCP of CNPs (0-63)."},
                "cnp_prio": {**_int(0, 7), "description": "802.1p priority of CNPs (0-7)."},
                "params": {
                    "type": "object",
                    "description": "Other DCQCN parameters, by the names the driver exposes, such as rpg_ai_rate.",
                    "propertyNames": _text(ECN_PARAM, 64),
                    "additionalProperties": {"anyOf": [_int(0, U32), _bound(_int(0, U32))]},
                    "maxProperties": 64,
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

_ENTRY = {
    "type": "object",
    "title": "interface entry",
    "description": "Settings for every interface that the match selects.",
    "properties": {
        "match": {
            "type": "object",
            "description": "Which interfaces this entry applies to. Every selector given must match; at least one is required.",
            "properties": {
                "name": _selector(v.IFGLOB, 64, "Interface name or glob, such as ens* or eth[0-3]."),
                "driver": _selector(v.DRIVER, 32, "Kernel driver name, such as mlx5_core or mana."),
                "pci_id": _selector(v.PCI_ID, 9, "PCI vendor:device id."),
                "mac": _selector(v.MAC, 17, "Permanent MAC address."),
            },
            "additionalProperties": False,
            "minProperties": 1,
        },
        "on_unsupported": _on_unsupported("an interface of this entry"),
        "mtu": _wanted(68, 65535, "MTU in bytes."),
        "txqueuelen": _wanted(0, U32, "Transmit queue length in packets."),
        "state": {"enum": ["up", "down"], "description": "Administrative link state."},
        "features": {
            "type": "object",
            "description": "Offload features as ethtool -K names them, each on (true) or off (false).",
            "propertyNames": _text(v.FEATURE_NAME, 64),
            "additionalProperties": {"type": "boolean"},
            "maxProperties": 256,
        },
        "rings": {
            "type": "object",
            "description": "Ring sizes (ethtool -G).",
            "properties": {k: _wanted(1, 1048576, f"{k} ring size.") for k in ("rx", "rx-mini", "rx-jumbo", "tx")},
            "additionalProperties": False,
        },
        "channels": {
            "type": "object",
            "description": "Queue counts (ethtool -L).",
            "properties": {k: _wanted(0, 65535, f"Number of {k} channels.") for k in ("rx", "tx", "other", "combined")},
            "additionalProperties": False,
        },
        "coalesce": {
            "type": "object",
            "description": "Interrupt coalescing (ethtool -C).",
            "properties": {
                **{k: {"type": "boolean"} for k in ("adaptive-rx", "adaptive-tx", "cqe-mode-rx", "cqe-mode-tx")},
                **{
                    k: _wanted(0, U32, f"{k}.")
                    for k in (
                        "rx-usecs", "rx-frames", "rx-usecs-irq", "rx-frames-irq",
                        "tx-usecs", "tx-frames", "tx-usecs-irq", "tx-frames-irq",
                    )
                },
            },
            "additionalProperties": False,
        },
        "pause": _flags(["autoneg", "rx", "tx"], "Pause frames (ethtool -A)."),
        "sysctl": _sysctls(v.IF_SYSCTL_KEY, 69, 128,
                           "Per-interface sysctls, named relative to net.<family>.conf.<interface>, such as ipv4.rp_filter."),
        "roce": _ROCE,
        "expect": expect_schema(_text, _wanted),
    },
    "required": ["match"],
    "additionalProperties": False,
}

SCHEMA: Dict[str, Any] = {
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
        "host": {
            "type": "object",
            "description": "Host-wide settings.",
            "properties": {
                "sysctl": _sysctls(v.SYSCTL_KEY, 128, 512, "Host sysctls under net., such as net.ipv4.tcp_ecn."),
                "nccl": {
                    "type": "object",
                    "description": "The NCCL configuration file.",
                    "properties": {
                        "path": {**_text(v.ABS_PATH, 256, "Where to write it (default /etc/nccl.conf)."),
                                 "not": {"pattern": NOT_NORMALISED}},
                        "env": {
                            "type": "object",
                            "description": "NCCL variables; true and false are written as 1 and 0.",
                            "propertyNames": _text(v.NCCL_NAME, 69),
                            "properties": {
                                "NCCL_IB_GID_INDEX": {
                                    "anyOf": [{"const": "auto"}, _int(-1, 255)],
                                    "description": "GID index; auto: the RoCE v2 IPv4 GID index of this host's RoCE ports, resolved on the host.",
                                },
                                "NCCL_IB_HCA": {
                                    "anyOf": [{"const": "auto"}, _text(v.NCCL_VALUE, 900)],
                                    "description": "HCA list; auto: =dev:port of this host's RoCE ports that are up with an IPv4 GID.",
                                },
                            },
                            "additionalProperties": {
                                "anyOf": [_text(v.NCCL_VALUE, 900), {"type": "integer"}, {"type": "boolean"}],
                            },
                            "maxProperties": 128,
                        },
                    },
                    "additionalProperties": False,
                },
            },
            "additionalProperties": False,
        },
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
    "$defs": {"entry": _ENTRY, "sysctl_value": _SYSCTL_VALUE},
}


def schema_json() -> str:
    return json.dumps(SCHEMA, indent=2, sort_keys=True) + "\n"
