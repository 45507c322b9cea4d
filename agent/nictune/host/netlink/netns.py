"""Enter a named network namespace just long enough to create sockets.

A netlink or AF_INET socket stays bound to the namespace it was created
in, so callers switch only around socket creation and switch back at once.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from nictune.host.netlink.names import validate_netns_name

CLONE_NEWNET = 0x40000000
_libc = None


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python >= 3.12
        os.setns(fd, CLONE_NEWNET)
        return
    import ctypes  # only needed before 3.12; keep it off the import path

    global _libc
    if _libc is None:
        # CDLL(None) = the symbols already loaded into this process (libc
        # included); ctypes.util.find_library would fork ldconfig/gcc.
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))



@contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Run the body inside netns `name` (as made by `ip netns add`); None = stay."""
    if name is None:
        yield
        return
    validate_netns_name(name)
    # Open both fds before switching, so a missing namespace fails
    # without ever having left the original one.
    orig = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(orig)
    finally:
        os.close(orig)
