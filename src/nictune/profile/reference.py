"""docs/reference/profile.md, generated from the schema and the knob families.

    .venv/bin/python -m nictune.profile.reference > docs/reference/profile.md

Every key a profile may hold, what it accepts (in the words error messages
use), the keys inside its mappings and lists of mappings, which family owns
it and where that family sits in an apply, what each NIC class makes of it,
and an example per family (each family's `example`).
tests/unit/test_families.py fails when the checked-in file differs from
what this prints, and when a family has no example that the schema takes.
"""

from __future__ import annotations

import re
import sys
from typing import Dict, Iterator, List, Tuple


from ..host.facts import nicclass
from ..host.knobs import FAMILIES, REGISTERED
from .schema import SCHEMA, describe, resolve

ENTRY = "interfaces.<entry>"
_ALLOWED = re.compile(r"\s*Allowed: .*$", re.S)


def examples() -> Dict[str, str]:
    """Family name -> the body of a profile (without `nictune: 1`) that
    shows its settings: each family's own `example`, so a new family
    brings its example in its module."""
    return {family.name: family.example for family in REGISTERED if family.example}


def node_at(root: dict, path: str) -> dict:
    """The schema node of a dotted path below `root` (an object node)."""
    node = root
    for part in path.split("."):
        node = resolve(node)["properties"][part]
    return resolve(node)


def _where(family) -> List[Tuple[str, dict]]:
    """(prefix, root node) of the places this family's settings live."""
    places = []
    if family.host_sections:
        places.append(("host", SCHEMA["properties"]["host"]))
    if family.sections:
        places.append((ENTRY, SCHEMA["$defs"]["entry"]))
    return places


def settings_of(family) -> Iterator[Tuple[str, dict]]:
    """(full dotted path, schema node) of every setting the family declares."""
    for prefix, root in _where(family):
        owned = family.host_sections if prefix == "host" else family.sections
        for path in family.settings:
            if path.split(".")[0] in owned:
                yield f"{prefix}.{path}", node_at(root, path)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _about(node: dict) -> str:
    text = _ALLOWED.sub("", node.get("description", "")).strip()
    return text if text.endswith(".") or not text else text + "."


def _apply_order() -> List[str]:
    lines = ["## Apply order", "",
             "An apply writes the families in this order; a rollback restores them in reverse.", ""]
    for n, family in enumerate(FAMILIES, 1):
        lines.append(f"{n}. `{family.name}`: {family.position_note}.")
    return lines + [""]


def _top_level() -> List[str]:
    lines = ["## Top level", "", "| key | allowed | what |", "|---|---|---|"]
    for key, node in SCHEMA["properties"].items():
        lines.append(f"| `{key}` | {describe(node)} | {_about(node)} |")
    entry = SCHEMA["$defs"]["entry"]["properties"]
    lines += ["", f"In every `{ENTRY}` mapping, besides the settings below:", "",
              "| key | allowed | what |", "|---|---|---|"]
    for key in ("match", "on_unsupported"):
        lines.append(f"| `{key}` | {describe(entry[key])} | {_about(entry[key])} |")
    for key, node in entry["match"]["properties"].items():
        lines.append(f"| `match.{key}` | {describe(node)} | {_about(node)} |")
    return lines + [""]


def _is_bound(node: dict) -> bool:
    """{min: N} / {max: N}: a value's bound, which describe() words whole."""
    return set(node.get("properties", {})) == {"min", "max"}


def sub_keys(node: dict, prefix: str = "") -> Iterator[Tuple[str, dict]]:
    """(relative path, schema node) of the keys inside a setting: the named
    keys of its mappings, `<key>.` for a mapping of free-form keys whose
    values are mappings, `[].` for a list of mappings; nested to any depth."""
    node = resolve(node)
    for branch in node.get("anyOf") or node.get("oneOf") or ():
        yield from sub_keys(branch, prefix)
    if node.get("type") == "array":
        yield from sub_keys(node.get("items", {}), prefix + "[].")
    if node.get("type") != "object" or _is_bound(node):
        return
    for key, child in node.get("properties", {}).items():
        yield prefix + key, resolve(child)
        yield from sub_keys(child, prefix + key + ".")
    values = node.get("additionalProperties")
    if isinstance(values, dict):
        yield from sub_keys(values, prefix + "<key>.")


def _sub_key_table(path: str, node: dict, family) -> List[str]:
    """The keys inside a setting, less those the family declares as
    settings of their own (they have their own heading)."""
    own = {full for full, _ in settings_of(family)}
    rows = [(key, child) for key, child in sub_keys(node) if f"{path}.{key}" not in own]
    if not rows:
        return []
    lines = ["| key inside | allowed | what |", "|---|---|---|"]
    lines += [f"| `{key}` | {describe(child)} | {_about(child)} |" for key, child in rows]
    return lines + [""]


def _example(family) -> List[str]:
    text = examples().get(family.name)
    if not text:
        return []
    return ["Example:", "", "```yaml", "nictune: 1", text.rstrip(), "```", ""]


def _setting(path: str, node: dict, family) -> List[str]:
    writers = [f for f in FAMILIES if not f.read_only]
    when = ("read only, never written" if family.read_only
            else f"written {_ordinal(writers.index(family) + 1)} of {len(writers)}")
    lines = [f"### `{path}`", ""]
    if _about(node):
        lines += [_about(node), ""]
    lines.append(f"- allowed: {describe(node)}")
    lines.append(f"- family: `{family.name}`, {when}")
    for nic in nicclass.CLASSES.values():
        note = family.nic_support(nic.driver, path.split(".", 2)[-1] if path.startswith(ENTRY)
                                  else path.split(".", 1)[1])
        lines.append(f"- {nic.title}: {note or 'yes'}")
    return lines + [""] + _sub_key_table(path, node, family)


def render() -> str:
    lines = [
        "# Profile reference",
        "",
        "<!-- Generated by `python -m nictune.profile.reference` from the schema and the knob",
        "     families; do not edit by hand (tests/unit/test_families.py checks it). -->",
        "",
        "Every key a profile may hold.  `nictune schema` prints the same rules as JSON Schema;",
        "\"yes\" for a NIC class means the driver takes the setting as the kernel documents it",
        "(the device's own limits are still checked in `plan`).",
        "",
    ]
    lines += _apply_order() + _top_level()
    for family in REGISTERED:
        lines += [f"## {family.name}", ""] + _example(family)
        for path, node in settings_of(family):
            lines += _setting(path, node, family)
    lines += _driver_rules()
    return "\n".join(lines).rstrip() + "\n"


def _driver_rules() -> List[str]:
    """What each driver refuses or does by itself, as plan, lint and the test
    fakes apply it (nicclass.RULES)."""
    if not nicclass.RULES:
        return []
    lines = ["## Driver rules", "",
             "What the drivers refuse, round, reset or do by themselves, read from their sources.",
             "`plan` and `lint` apply these rules, and the test suite's stand-ins for hardware",
             "refuse exactly what they say.", "",
             "| driver | key | effect | when | what the driver does | source |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.driver} | `{r.key}` | {r.effect} | {r.when} | {r.why} | {r.source} |"
              for r in nicclass.RULES]
    return lines + [""]


if __name__ == "__main__":
    sys.stdout.write(render())
