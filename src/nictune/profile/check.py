"""Validate a document against the schema and explain the first problem.

jsonschema's own messages dump whole values and schemas; ours name the key,
say what is allowed in words (schema.describe) and never echo more than a
short, repr()-escaped piece of the offending value.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend

from ..host import knobs
from ..host import validate as v
from .errors import ProfileError, dotted, has_control, kind, show
from .schema import SCHEMA, describe

Path = Tuple[Any, ...]

_regex_cache: Dict[str, "re.Pattern[str]"] = {}


def _strict_pattern(validator: Any, pattern: str, instance: Any, schema: dict) -> Iterator[ValidationError]:
    # Python's "$" also matches before a final newline, so "eth0\n" would pass
    # "^...$" under jsonschema's re.search.  An end anchor must mean the end.
    if not validator.is_type(instance, "string"):
        return
    rx = _regex_cache.get(pattern)
    if rx is None:
        text = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
        rx = _regex_cache[pattern] = re.compile(text)
    if not rx.search(instance):
        yield ValidationError("does not match the pattern")  # never the value: it may be huge


# 9000.0 is an "integer" to JSON Schema; a knob must get a real int.
_types = Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda checker, value: isinstance(value, int) and not isinstance(value, bool)
)
Validator = extend(Draft202012Validator, validators={"pattern": _strict_pattern}, type_checker=_types)
_PROFILE_VALIDATOR = Validator(SCHEMA)

# Among several problems with one value, which to report first.
_RANK = {"maxLength": 0, "type": 1, "const": 2, "enum": 2, "required": 3, "additionalProperties": 3}


@dataclass
class Problem:
    loc: Path       # where to point: the offending key (its line) or value
    keypath: Path   # what to name in the message
    message: str
    rank: int


def check(doc: Any, positions: Dict[Path, Tuple[str, int]], plain: Dict[Path, str],
          schema: Optional[dict] = None, prefix: Path = ()) -> None:
    """Raise ProfileError for the first problem (in document order), if any.

    prefix: where doc sits in the whole document, when checking a part.
    """
    validator = _PROFILE_VALIDATOR if schema is None else Validator(schema)
    problems: List[Problem] = []
    for error in validator.iter_errors(doc):
        problems.extend(_explain(error, validator, plain, prefix))
    if not problems:
        if schema is None and not prefix:
            _check_vf_of(doc, positions)
            _check_policy_paths(doc, positions)
            _check_owned_paths(doc, positions)
        return
    order = _doc_order(doc)
    problems.sort(key=lambda p: (_order_of(p.loc, order), p.rank))
    first = problems[0]
    others = len({p.loc for p in problems} - {first.loc})
    message = first.message
    if others:
        message += f" (and {others} more problem{'s' if others > 1 else ''})"
    file, line = locate(positions, prefix + first.loc)
    raise ProfileError(file, line, dotted(prefix + first.keypath), message)


def _check_vf_of(doc: dict, positions: Dict[Path, Tuple[str, int]]) -> None:
    """match: vf_of names an entry before this one; vfs only with vf_of."""
    seen: List[str] = []
    for name, entry in (doc.get("interfaces") or {}).items():
        match = entry.get("match") or {}
        if "vfs" in match and "vf_of" not in match:
            path = ("interfaces", name, "match", "vfs")
            raise ProfileError(*locate(positions, path), dotted(path),
                               "vfs needs vf_of: the entry whose PFs the VF numbers are of")
        target = match.get("vf_of")
        if target is not None and target not in seen:
            path = ("interfaces", name, "match", "vf_of")
            why = ("it is this entry" if target == name else
                   "that entry comes after this one" if target in (doc.get("interfaces") or {}) else
                   "there is no such entry")
            raise ProfileError(*locate(positions, path), dotted(path),
                               f"{show(target)} must name an interface entry before this one "
                               f"({why}); vf_of selects the VFs of the PFs that entry matched")
        seen.append(name)


def _names_settings(node: dict, parts: List[str]) -> bool:
    """Whether the schema `node` has settings at dotted path `parts`: a
    section, a setting, or a key of a free-form mapping (sysctl.<key>)."""
    if not parts:
        return True
    if "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    if any(_names_settings(branch, parts) for branch in node.get("anyOf", ())):
        return True
    props = node.get("properties") or {}
    if parts[0] in props:
        return _names_settings(props[parts[0]], parts[1:])
    return isinstance(node.get("additionalProperties"), dict)


def _check_policy_paths(doc: dict, positions: Dict[Path, Tuple[str, int]]) -> None:
    """Each key of an on_unsupported or on_drift mapping names settings that
    exist where it stands: a misspelt section would otherwise change
    nothing, silently."""
    entry = SCHEMA["$defs"]["entry"]
    host = SCHEMA["properties"]["host"]

    def known(key: str, hosts_too: bool) -> bool:
        parts = key.split(".")
        if parts[0] in _NOT_SETTINGS:
            return False
        if parts[0] == "host":
            return hosts_too and len(parts) > 1 and _names_settings(host, parts[1:])
        return _names_settings(entry, parts)

    places = []
    for word in _POLICY_KEYS:
        places += [((word,), True)]
        places += [(("interfaces", name, word), False) for name in (doc.get("interfaces") or {})]
    for path, hosts_too in places:
        node: Any = doc
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        for key in node if isinstance(node, dict) else ():
            if key != "default" and not known(key, hosts_too):
                where = ("an interface entry's section or setting, such as roce.ecn or rings "
                         "(docs/reference/profile.md lists them)"
                         + (", or host.<section>" if hosts_too else "; host paths go in the "
                            "profile's own on_unsupported"))
                raise ProfileError(*locate(positions, path + (key,)), dotted(path + (key,)),
                                   f"{show(key)} names no setting here; the keys are default or "
                                   f"{where}")


def _check_owned_paths(doc: dict, positions: Dict[Path, Tuple[str, int]]) -> None:
    """The host's rules for the paths of owned files (host/validate.py
    check_owned_path, check_owned_dir), with the file and line: a path
    where a shell, the loader, cron... read, or neither the family's own
    nor below allowed_dirs, is refused before anything is sent; so is a
    path two families would share."""

    host = doc.get("host") if isinstance(doc.get("host"), dict) else {}
    owners: Dict[str, str] = {}
    for section in OWNED_SECTIONS:
        node = host.get(section)
        if not isinstance(node, dict):
            continue
        own = knobs.load(section).default_path
        dirs = []
        for i, value in enumerate(node.get("allowed_dirs") or ()):
            path = ("host", section, "allowed_dirs", i)
            dirs.append(_host_rule(positions, path, v.check_owned_dir, value, dotted(path)))
        path = ("host", section, "path")
        file = node.get("path", own)
        if "path" in node:
            _host_rule(positions, path, v.check_owned_path, file, own, dirs, dotted(path))
        if file in owners:
            raise ProfileError(*locate(positions, path), dotted(path),
                               f"{file} is host.{owners[file]}'s file too: each family needs a "
                               "file of its own")
        owners[file] = section


def _host_rule(positions: Dict[Path, Tuple[str, int]], path: Path, rule: Any, *args: Any) -> Any:
    from ..host.errors import InvalidInput

    try:
        return rule(*args)
    except InvalidInput as e:
        message = e.message.partition(": ")[2] if e.message.startswith("invalid ") else e.message
        raise ProfileError(*locate(positions, path), dotted(path), message) from None


# The sections of the owned-file families (host/knobs/envfile.py), as the
# registry derives them.
OWNED_SECTIONS = knobs.OWNED_FILE_SECTIONS


# on_unsupported and on_drift take a word or such a mapping (schema.py).
_POLICY_KEYS = ("on_unsupported", "on_drift")
_NOT_SETTINGS = ("match",) + _POLICY_KEYS


def locate(positions: Dict[Path, Tuple[str, int]], path: Path) -> Tuple[str, Optional[int]]:
    """The position of path, or of its nearest ancestor that has one."""
    for end in range(len(path), -1, -1):
        if path[:end] in positions:
            return positions[path[:end]]
    return ("<unknown>", None)


def _doc_order(doc: Any) -> Dict[Path, int]:
    order: Dict[Path, int] = {}
    stack: List[Tuple[Path, Any]] = [((), doc)]
    while stack:
        path, value = stack.pop()
        order[path] = len(order)
        if isinstance(value, dict):
            children = [(path + (k,), v) for k, v in value.items()]
        elif isinstance(value, list):
            children = [(path + (i,), v) for i, v in enumerate(value)]
        else:
            continue
        stack.extend(reversed(children))
    return order


def _order_of(path: Path, order: Dict[Path, int]) -> Tuple[int, int]:
    for end in range(len(path), -1, -1):
        if path[:end] in order:
            return (order[path[:end]], -end)
    return (len(order), 0)


def _best_leaf(error: ValidationError) -> ValidationError:
    """For "value or bound" style anyOf, the branch that explains the failure.

    A branch that failed only because the value has another type ("9000x" is
    not an object) explains nothing; one that got further does.  If every
    branch failed on type, the anyOf itself is the answer.
    """
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return error
    useful = [c for c in error.context if not (c.validator == "type" and not c.relative_path)]
    if not useful:
        return error
    best = min(useful, key=lambda c: (-len(c.absolute_path), _RANK.get(c.validator, 5)))
    return _best_leaf(best)


def _outermost_at(leaf: ValidationError, path: Path) -> ValidationError:
    """The outermost error about the same value: its schema says what is allowed there."""
    found, node = leaf, leaf
    while node.parent is not None:
        node = node.parent
        if tuple(node.absolute_path) == path:
            found = node
    return found


def _explain(error: ValidationError, validator: Any, plain: Dict[Path, str], prefix: Path) -> List[Problem]:
    leaf = _best_leaf(error)
    path = tuple(leaf.absolute_path)
    what, value, schema = leaf.validator, leaf.instance, leaf.schema
    rank = _RANK.get(what, 5)
    schema_path = list(leaf.absolute_schema_path)

    if len(schema_path) >= 2 and schema_path[-2] == "propertyNames":
        # The value is a key of the mapping at path.
        if what == "maxLength":
            msg = f"a key of {len(value)} characters is too long here; the limit is {schema['maxLength']}"
        else:
            msg = f"{show(value)} is not allowed as a key here{_control_note(value)} (allowed: {describe(schema)})"
        return [Problem(path + (value,), path, msg, rank)]

    if what == "additionalProperties" and schema.get("additionalProperties") is False:
        allowed = list(schema.get("properties", {}))
        extras = [k for k in value if k not in allowed]
        return [
            Problem(path + (k,), path, f"unknown key {show(k)}{_did_you_mean(k, allowed)}; allowed keys: {', '.join(allowed)}", rank)
            for k in extras
        ]

    allowed = describe(_outermost_at(leaf, path).schema)
    if what == "required":
        missing = [k for k in schema.get("required", []) if k not in value]
        key = missing[0] if missing else "?"
        needs = schema.get("properties", {}).get(key)
        msg = f"the required key {show(key)} is missing" + (f" (it must be {describe(needs)})" if needs else "")
    elif what == "maxLength":
        msg = f"the value is {len(value)} characters long; the limit is {schema['maxLength']}"
    elif what == "minLength":
        msg = f"must not be empty (allowed: {allowed})"
    elif what in ("type", "anyOf", "oneOf"):
        msg = f"expected {allowed}, got {kind(value)}" + _quote_hint(path, prefix, value, plain, validator, error)
    elif what in ("enum", "const"):
        choices = [str(x) for x in schema.get("enum", [schema.get("const")])]
        hint = _did_you_mean(value, choices) if isinstance(value, str) else ""
        msg = f"{show(value)} is not allowed{hint} (allowed: {allowed})"
    elif what in ("pattern", "not"):
        msg = f"{show(value)} is not allowed{_control_note(value)} (allowed: {allowed})"
    elif what in ("maximum", "minimum"):
        side = "above the maximum" if what == "maximum" else "below the minimum"
        msg = f"{show(value)} is {side} {schema[what]} (allowed: {allowed})"
    elif what == "maxProperties" and set(schema.get("properties", {})) == {"min", "max"}:
        msg = "give either min or max, not both"
    elif what == "minProperties" and set(schema.get("properties", {})) == {"min", "max"}:
        msg = f"an empty mapping is not allowed (allowed: {allowed})"
    elif what == "minProperties":
        keys = list(schema.get("properties", {}))
        msg = "must not be empty" + (f"; give at least one of: {', '.join(keys)}" if keys else "")
    elif what == "maxProperties":
        msg = f"has {len(value)} keys; the limit is {schema['maxProperties']}"
    elif what in ("minItems", "maxItems"):
        msg = f"a list of {len(value)} items is not allowed here (allowed: {allowed})"
    else:
        msg = f"{show(value)} is not allowed (allowed: {allowed})"
    return [Problem(path, path, msg, rank)]


def _did_you_mean(word: str, choices: List[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _control_note(value: Any) -> str:
    if isinstance(value, str) and has_control(value):
        return "; it contains a line break or another control character"
    return ""


def _quote_hint(path: Path, prefix: Path, value: Any, plain: Dict[Path, str], validator: Any,
                error: ValidationError) -> str:
    # "mac: 10:22:33:44:55:66" is a (base 60!) integer to YAML.  If the text
    # as written would have been valid as a string, say so.
    text = plain.get(prefix + path)
    if text is None or isinstance(value, str):
        return ""
    schema = _outermost_at(_best_leaf(error), path).schema
    try:
        fits = validator.evolve(schema=schema).is_valid(text)
    except Exception:  # a fragment whose $ref does not resolve: no hint, no crash
        return ""
    if fits:
        return f"; YAML reads the unquoted {show(text)} as {kind(value)[4:]}, so write it in quotes"
    return ""
