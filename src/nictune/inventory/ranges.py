"""Host patterns in inventories: "name", "name:port", "[v6]:port" and ranges.

Ansible's rules (its docs "How to build your inventory", "Adding ranges of
hosts"): a range is [begin:end] or [begin:end:step], numeric (zero-padded
when begin has a leading zero) or alphabetic; several ranges in one name
multiply out, the first range varying slowest.  A port suffix is honoured
only when what is left is a valid host name, IPv4 or IPv6 address (ranges
allowed); otherwise the whole text is taken as the name, as Ansible does.
IPv6 addresses are those of Ansible's own expression
(ansible/parsing/utils/addresses.py): an embedded IPv4 part only in the
::a.b.c.d, ::ffff:a.b.c.d and 0:0:0:0:0:ffff:a.b.c.d forms.  A range's
bounds may hold blanks, which Ansible's int() strips ("[1: 3]").
"""

from __future__ import annotations

import ipaddress
import re
import string
from typing import List, Optional, Tuple

_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
# A label starts with a word character or a range, continues with word
# characters, dashes or ranges, and does not end with "-" or "_".
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.I)
_HEX_RANGE = r"\[[0-9a-f]+:[0-9a-f]+(?::[0-9]+)?\]"
_NUMERIC_RANGE = r"\[[0-9]+:[0-9]+(?::[0-9]+)?\]"
_V6 = rf"(?:[0-9a-f]{{1,4}}|{_HEX_RANGE})"       # a group, or a hex range in its place
_V4_IN_V6 = rf"(?:{_V6}\.){{3}}{_V6}"            # as Ansible writes it: made of v6 groups
# Ansible's 'ipv6' expression, alternative for alternative.
_IPV6 = re.compile(rf"""(?:{_V6}:){{7}}{_V6}|(?:{_V6}:){{1,6}}:|(?:{_V6}:)(?::{_V6}){{1,6}}|
    (?:{_V6}:){{2}}(?::{_V6}){{1,5}}|(?:{_V6}:){{3}}(?::{_V6}){{1,4}}|(?:{_V6}:){{4}}(?::{_V6}){{1,3}}|
    (?:{_V6}:){{5}}(?::{_V6}){{1,2}}|(?:{_V6}:){{6}}(?::{_V6})|:(?::{_V6}){{1,6}}|{_V6}?::|
    (?:0:){{6}}{_V4_IN_V6}|::(?:ffff:)?{_V4_IN_V6}|(?:0:){{5}}ffff:{_V4_IN_V6}""", re.I | re.X)
_BRACKETED_PORT = re.compile(r"\[(.+)\]:([0-9]+)")
_HOST_PORT = re.compile(r"((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)")

# Expanding "[0:99999999]" would take the controller down; no fleet is that big.
MAX_HOSTS_PER_PATTERN = 100_000


class RangeError(ValueError):
    """A host range that cannot be expanded; the message says why."""


def split_port(text: str) -> Tuple[str, Optional[int]]:
    """(host, port) when text is a valid host with an optional port, else ValueError."""
    port = None
    # Both forms are tried in turn, as Ansible does: "[a]:1" then "a".
    for form in (_BRACKETED_PORT, _HOST_PORT):
        m = form.fullmatch(text)
        if m:
            text, port = m.group(1), int(m.group(2))
    if not (_HOSTNAME.fullmatch(text) or _is_ipv6(text)):
        raise ValueError(f"not a valid host name: {text!r}")
    return text, port


def _is_ipv6(text: str) -> bool:
    return bool(_IPV6.fullmatch(text))


def unread_ipv6(text: str, consequence: str = "fails on it as a host range") -> Optional[str]:
    """Why Ansible cannot read "[ADDRESS]:port" when ADDRESS is an IPv6
    address its expression does not take (64:ff9b::192.0.2.33), else None.
    Ansible then expands "[...]" as a host range and fails (or, in a host
    list, names a host "[...]:port"); the hex form is what it reads."""
    m = _BRACKETED_PORT.fullmatch(text)
    if not m or "%" in m.group(1) or _is_ipv6(m.group(1)):
        return None
    try:
        address = ipaddress.IPv6Address(m.group(1))
    except ValueError:
        return None
    form = ("an embedded IPv4 part only as ::a.b.c.d or ::ffff:a.b.c.d" if "." in m.group(1)
            else "no more than seven groups around '::'")
    return (f"Ansible does not read {m.group(1)} as an IPv6 address (its parser takes {form}) and "
            f"{consequence}; write the address as [{address.compressed}]:{m.group(2)}")


def expand_host_pattern(pattern: str) -> Tuple[List[str], Optional[int]]:
    """The host names a pattern stands for, and the port it names (or None)."""
    try:
        name, port = split_port(pattern)
    except ValueError:
        name, port = pattern, None
        why = unread_ipv6(pattern)
        if why:
            raise RangeError(why) from None
    if "[" not in name:
        return [name], port
    names: List[str] = []
    _expand(name, names)
    return names, port


def _expand(name: str, out: List[str]) -> None:
    start = name.find("[")
    stop = name.find("]")
    if stop < start:
        raise RangeError(f"{name!r} has ']' before '['")
    head, body, tail = name[:start], name[start + 1:stop], name[stop + 1:]
    for item in _range_items(body):
        expanded = head + item + tail
        if "[" in expanded:
            _expand(expanded, out)
        else:
            out.append(expanded)
        if len(out) > MAX_HOSTS_PER_PATTERN:
            raise RangeError(f"expands to more than {MAX_HOSTS_PER_PATTERN} hosts")


def _range_items(body: str) -> List[str]:
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise RangeError(f"[{body}] must be [begin:end] or [begin:end:step]")
    # Ansible tests emptiness and zero-padding on the text as written, and
    # reads numbers with int(), which strips blanks: "[ 01:10]" is 1..10
    # unpadded, "[001: 10]" 001..010.
    begin = bounds[0] or "0"
    end = bounds[1]
    if not end:
        raise RangeError(f"[{body}] has no end value")
    try:
        step = int(bounds[2]) if len(bounds) == 3 else 1
    except ValueError:
        raise RangeError(f"[{body}] has a step that is not a number") from None
    if step < 1:
        raise RangeError(f"[{body}] needs a step of at least 1")
    width = len(begin) if begin[0] == "0" and len(begin) > 1 else 0
    if width and len(end) != width:
        raise RangeError(f"[{body}]: a zero-padded range needs begin and end of the same length")
    letters = string.ascii_letters
    first, last = letters.find(begin), letters.find(end)
    if first >= 0 and last >= 0:
        if first > last:
            raise RangeError(f"[{body}] runs backwards")
        return list(letters[first:last + 1:step])
    if not (_digits(begin) and _digits(end)):
        raise RangeError(f"[{body}] is neither a numeric nor an alphabetic range")
    low, high = int(begin), int(end)
    if low > high:
        # Ansible silently yields no host here; a range that names nobody is a typo.
        raise RangeError(f"[{body}] runs backwards and names no host")
    if (high - low) // step >= MAX_HOSTS_PER_PATTERN:
        raise RangeError(f"[{body}] names more than {MAX_HOSTS_PER_PATTERN} hosts")
    return [str(i).zfill(width) for i in range(low, high + 1, step)]


def _digits(text: str) -> str:
    """A bound's digits when it is a plain decimal number with blanks around
    it (what Ansible's int() reads, short of signs, "_" and non-ASCII
    digits, which nictune refuses), else ""."""
    stripped = text.strip()
    return stripped if stripped.isascii() and stripped.isdigit() else ""
