"""NetlinkError: an errno from the kernel plus its extended-ack message."""

from __future__ import annotations

import errno as _errno
import os


class NetlinkError(OSError):
    """A netlink request failed.

    `.errno`/`.strerror` as for any OSError; `.extack` is the kernel's
    extended-ack text (e.g. "requested ring size exceeds maximum") or None.
    """

    def __init__(self, code: int, extack: str | None = None):
        code = abs(code)
        super().__init__(code, os.strerror(code))
        self.extack = extack or None

    def __str__(self) -> str:
        # errorcode picks ENOTSUP for 95; the kernel and ethtool say EOPNOTSUPP.
        if self.errno == _errno.EOPNOTSUPP:
            name = "EOPNOTSUPP"
        else:
            name = _errno.errorcode.get(self.errno, str(self.errno))
        text = f"{self.strerror} ({name})"
        return f"{text}: {self.extack}" if self.extack else text

    def __reduce__(self):
        # OSError's default pickling would drop .extack (multiprocessing,
        # or the agent serialising failures).
        return (type(self), (self.errno, self.extack))
