"""Enter a named network namespace for a block of a test (test helper).

The agent never switches namespace: it runs inside the one it tunes (`ip
netns exec`, or sshd in the namespace).  Tests run in the root namespace
and use in_netns() to talk to the throw-away ones they create: sockets stay
bound to the namespace they were created in, so opening them in the block
is enough for Rtnl, Ethtool and NetlinkSocket.  EthtoolIoctl also lists
devices (if_nameindex) in the calling thread's namespace at call time: call
its dumps inside the block too.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from nictune.host.validate import NETNS, matches

CLONE_NEWNET = 0x40000000
_libc = None


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python >= 3.12
        os.setns(fd, CLONE_NEWNET)
        return
    import ctypes

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
    """Run the body inside netns `name` (as made by `ip netns add`); None = stay.

    setns() moves the calling thread only: the body must not hand work to
    other threads and expect them to be inside."""
    if name is None:
        yield
        return
    # The name becomes a path under /run/netns: the controller's rule.
    if not matches(NETNS, name):
        raise ValueError(f"invalid network namespace name: {name!r}")
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
