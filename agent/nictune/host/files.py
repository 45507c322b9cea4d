"""Writing files so that a reader never sees half of one."""

from __future__ import annotations

import errno
import os


def write_atomic(path: str, text: str, mode: int = 0o600, busy_in_place: bool = False) -> None:
    """Write to a temporary file beside `path`, fsync, rename over it.

    A file that is itself a mount point (a bind mount in a container, or
    `ip netns exec` over /etc/netns/NAME/) cannot be renamed over; with
    `busy_in_place` it is then rewritten in place instead.
    """
    import tempfile  # only writers pay for it (plan, verify and audit never write)

    fd, tmp = tempfile.mkstemp(prefix=".nictune-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        try:
            os.replace(tmp, path)
        except OSError as e:
            if not (busy_in_place and e.errno == errno.EBUSY):
                raise
            with open(path, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
