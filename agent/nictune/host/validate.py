"""Checks for every user-supplied string that reaches the system.

The JSON Schema (controller side) uses these same patterns, and the host side
checks again before touching anything: a request may come from anywhere.
"""

from __future__ import annotations

import os
import re

from nictune.host.errors import InvalidInput

# Kernel rule (dev_valid_name): 1..15 bytes, not "." or "..", no "/", ":" or
# whitespace.  We also refuse shell and glob metacharacters outright.
IFNAME = r"^(?!\.{1,2}$)[A-Za-z0-9_.@-]{1,15}$"
# A glob over interface names: the same alphabet plus * ? [ ] !.
IFGLOB = r"^[A-Za-z0-9_.@*?\[\]!-]{1,64}$"
# Host-level sysctls: dotted names under net., no empty or dot-dot parts.
SYSCTL_KEY = r"^net(\.[A-Za-z0-9_-]+){1,6}$"
# Per-interface sysctls are named relative to net.<family>.conf.<ifname>.
IF_SYSCTL_KEY = r"^ipv[46]\.[A-Za-z0-9_-]{1,64}$"
# A sysctl value: numbers, words and the separators multi-value keys use.
SYSCTL_VALUE = r"^[A-Za-z0-9_ \t.,:/+-]{0,256}$"
NCCL_NAME = r"^NCCL_[A-Z0-9_]{1,64}$"
# NCCL reads "NAME=VALUE" lines of at most 1023 bytes and trims nothing, so
# leading or trailing blanks would become part of the value: refuse them.
NCCL_VALUE = r"^([^\s\x00]([^\n\r\x00]{0,898}[^\s\x00])?)?$"
FEATURE_NAME = r"^[a-z0-9_-]{1,64}$"
MAC = r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$"
PCI_ID = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$"
DRIVER = r"^[A-Za-z0-9_-]{1,32}$"
# A name under /run/netns: "." and ".." would leave that directory.
NETNS = r"^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,64}$"
ABS_PATH = r"^/[A-Za-z0-9_./+-]{0,255}$"

_compiled: dict[str, re.Pattern] = {}


def matches(pattern: str, value: object) -> bool:
    if not isinstance(value, str):
        return False
    rx = _compiled.get(pattern)
    if rx is None:
        rx = _compiled[pattern] = re.compile(pattern)
    return rx.fullmatch(value) is not None and "\n" not in value

# A counter as ethtool -S or an RDMA port's hw_counters names it.
COUNTER_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
# An optional comparison and a dotted numeric version: ">=28.39", "28.39.1002".
VERSION_WANT = r"^(==|>=|<=|>|<)?[0-9]{1,9}(\.[0-9]{1,9}){0,7}$"

# An RDMA device name as /sys/class/infiniband lists it ("." and ".." are
# directory entries, not devices).
IBDEV = r"^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,64}$"
# A DCQCN parameter: a file name under /sys/class/net/<if>/ecn/roce_{np,rp}/.
ECN_PARAM = r"^[a-z][a-z0-9_]{0,63}$"
DSCP = r"^(6[0-3]|[1-5]?[0-9])$"


def check(pattern: str, value: object, what: str) -> str:
    if not matches(pattern, value):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise InvalidInput(f"invalid {what}: {shown}")
    return value  # type: ignore[return-value]


def check_path(value: object, what: str = "path") -> str:
    """An absolute, already-normalised path with no '..' part."""
    path = check(ABS_PATH, value, what)
    if os.path.normpath(path) != path or "/../" in path + "/" or path.endswith("/"):
        raise InvalidInput(f"invalid {what}: {path!r} must be absolute and normalised")
    return path
