"""A snapshot's reads, checked before a replay trusts them.

Snapshot files may be committed for reviewers' CI and read by `plan
--from-snapshots` (control/review/snapshots.py): their content is anybody's.
check_reads() walks the "reads" part of one (host/replay/snapshot.py writes it)
and raises BadSnapshot, naming where in the file and what is wrong, for
anything a recording cannot have made: a field of another type, a value
nested deeper than any recorded value, a class that is not a nictune data
class, an errno or key length out of range.  Each recorded value is
decoded once here, so that decoding it again during the replay cannot
fail.  What remains unchecked is whether a well-formed value is what the
engine expects of that call (a list of links where a dict was recorded):
control/review/snapshots.py reports such a failure as this host's, naming the file.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from nictune.host.replay import snapshot

# Recorded values are a few levels deep (a dict of dataclasses of lists):
# anything deeper is not a recording, and a bound keeps the checks'
# recursion far below Python's limit.
MAX_DEPTH = 32
MAX_ERRNO = 4095
MAX_KEY_BYTES = 1024  # a key file's key (MACsec, IPsec: 16 to 64 bytes)
STAT_FIELDS = 10
# What the recorder files under "op path", and the result each op gives.
FILE_OPS = {"open", "stat", "lstat", "listdir", "readlink", "access", "mkdir", "rmdir"}
_TAGS = {"$bytes": {"$bytes"}, "$enum": {"$enum", "value"}, "$dc": {"$dc", "fields"},
         "$nt": {"$nt", "items"}, "$tuple": {"$tuple"}, "$set": {"$set"}, "$dict": {"$dict"}}
_LISTS = {"$nt": "items", "$tuple": "$tuple", "$set": "$set", "$dict": "$dict"}


class BadSnapshot(ValueError):
    """Where in a snapshot ("reads.files['open /x'].text") and what is wrong."""


def check_reads(reads: Any) -> None:
    """BadSnapshot unless reads is what host/replay/snapshot.py records."""
    _expect(isinstance(reads, dict), "reads", "is not a mapping")
    for name, kinds, what in (("root_is_system", (bool,), "true or false"),
                              ("recorded", (str,), "text"),
                              ("netns", (str, type(None)), "a name or null"),
                              ("calls", (dict,), "a mapping"), ("files", (dict,), "a mapping")):
        if name in reads:
            _expect(isinstance(reads[name], kinds), f"reads.{name}", f"is not {what}")
    for ident, result in reads.get("calls", {}).items():
        _check_call(result, f"reads.calls[{snapshot.shown(ident)}]")
    for ident, result in reads.get("files", {}).items():
        _check_file(ident, result, f"reads.files[{snapshot.shown(ident)}]")


def _expect(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise BadSnapshot(f"{where} {what}")


def _check_call(result: Any, where: str) -> None:
    _expect(isinstance(result, dict), where, "is not a mapping")
    if "$raise" in result:
        _check_error(result, where)
    elif "$missing" in result:
        _expect(isinstance(result["$missing"], str), f"{where}.$missing", "is not text")
    elif "fingerprint" in result:  # a key file's (host/replay/snapshot.py _key_load)
        _expect(isinstance(result["fingerprint"], str), f"{where}.fingerprint", "is not text")
        _expect(_is_int(result.get("length"), 0, MAX_KEY_BYTES), f"{where}.length",
                f"is not a key length (0 to {MAX_KEY_BYTES} bytes)")
    else:
        _expect("value" in result, where, "holds none of value, $raise, $missing")
        _check_value(result["value"], f"{where}.value")


def _check_file(ident: Any, result: Any, where: str) -> None:
    op = ident.partition(" ")[0]
    _expect(op in FILE_OPS, where, "is not a file operation nictune records")
    _expect(isinstance(result, dict), where, "is not a mapping")
    if "$raise" in result:
        _check_error(result, where)
    elif op == "open":  # text, else $bytes: as the replay reads them
        if "text" in result:
            _expect(_is_utf8(result["text"]), f"{where}.text", "is not text")
        else:
            _check_base64(result.get("$bytes"), f"{where}.$bytes")
    elif op in ("stat", "lstat"):
        fields = result.get("stat")
        _expect(isinstance(fields, list) and len(fields) == STAT_FIELDS
                and all(_is_int(x, -(1 << 63), (1 << 64) - 1) for x in fields),
                f"{where}.stat", f"is not a list of {STAT_FIELDS} integers")
    else:
        value = result.get("value")
        ok = {"listdir": lambda: isinstance(value, list) and all(isinstance(x, str) for x in value),
              "readlink": lambda: isinstance(value, str),
              "access": lambda: isinstance(value, bool)}.get(op, lambda: value is None)()
        _expect(ok, f"{where}.value", f"is not what {op} returns")


def _check_error(result: dict, where: str) -> None:
    kind = result["$raise"]
    if kind in ("netlink", "os"):
        detail = "extack" if kind == "netlink" else "strerror"
        _expect(isinstance(result.get(detail), (str, type(None))), f"{where}.{detail}",
                "is not text")
        # An OSError raised without a number (OSError("text")) has its text.
        numberless = kind == "os" and result.get("errno") is None and result.get(detail)
        _expect(numberless or _is_int(result.get("errno"), -MAX_ERRNO, MAX_ERRNO),
                f"{where}.errno", "is not an errno number")
        return
    _expect(isinstance(result.get("message"), str), f"{where}.message", "is not text")
    if kind != "value":
        try:
            snapshot.decode_error(result)
        except (ValueError, ImportError) as e:
            raise BadSnapshot(f"{where}.$raise: {e}") from None


def _is_utf8(text: Any) -> bool:
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in the JSON)
        return False
    return True


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_value(value: Any, where: str) -> None:
    """value's shape, then a decode of it (the classes it names, their fields' types)."""
    _check_shape(value, where, 0)
    try:
        snapshot.decode(value)
    except (TypeError, ValueError, AttributeError, KeyError, ImportError, OverflowError) as e:
        raise BadSnapshot(f"{where}: {str(e)[:200]}") from None


def _check_shape(value: Any, where: str, depth: int) -> None:
    _expect(depth <= MAX_DEPTH, where, f"is nested more than {MAX_DEPTH} deep")
    if isinstance(value, list):
        for item in value:
            _check_shape(item, where, depth + 1)
        return
    if not isinstance(value, dict):
        return
    tag = next((k for k in value if k.startswith("$")), None)
    if tag is None:
        for item in value.values():
            _check_shape(item, where, depth + 1)
        return
    _expect(tag in _TAGS and set(value) == _TAGS[tag], where,
            f"holds {snapshot.shown(sorted(value))}, which is no recorded value")
    if tag == "$bytes":
        _check_base64(value["$bytes"], where)
    elif tag in _LISTS:
        _expect(isinstance(value[_LISTS[tag]], list), where, f"{tag} is not a list")
        _check_shape(value[_LISTS[tag]], where, depth + 1)
        if tag == "$dict":
            _expect(all(isinstance(p, list) and len(p) == 2 for p in value["$dict"]), where,
                    "$dict is not a list of [key, value] pairs")
    elif tag == "$dc":
        _expect(isinstance(value["fields"], dict), where, "fields is not a mapping")
        _check_shape(value["fields"], where, depth + 1)
    else:
        _check_shape(value["value"], where, depth + 1)


def _check_base64(text: Any, where: str) -> None:
    _expect(isinstance(text, str), where, "is not base64 text")
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadSnapshot(f"{where} is not base64 text") from None
