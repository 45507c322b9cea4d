"""Checks on what we put into kernel requests, shared by both ethtool
backends, the SIOCETHTOOL ioctls (drvinfo) and dcbnl.  The patterns are
the project's own (nictune.host.validate), which the profile schema uses
too."""

from __future__ import annotations

from nictune.host.validate import FEATURE_NAME, IFNAME, matches


def validate_ifname(name: str) -> str:
    if not matches(IFNAME, name):
        raise ValueError(f"invalid interface name: {name!r}")
    return name


def validate_features(wanted: dict) -> None:
    """A feature request: kernel bit names -> bool."""
    for name, value in wanted.items():
        if not matches(FEATURE_NAME, name):
            raise ValueError(f"invalid feature name: {name!r}")
        if not isinstance(value, bool):
            raise ValueError(f"feature {name} wants a bool, got {value!r}")


def param_value(name: str, value: object, is_bool: bool) -> int:
    """A rings/channels/coalesce/pause value as the kernel takes it: a bool
    flag (0/1) or an unsigned 32-bit integer."""
    if is_bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} wants a bool, got {value!r}")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{name} wants an unsigned 32-bit int, got {value!r}")
    return value
