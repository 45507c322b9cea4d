"""The agent with one fault put into it, for tests/netns/test_journal_faults.py.

Run as `python fault_agent.py MODE ARG` under `ip netns exec`: it reads the
request on stdin and answers like `python -m nictune.host.agent`, except:

    fill PATH   after the link family's write (the MTU is then really
                changed), PATH grows until its filesystem is full: the
                journal's commit meets a real ENOSPC
    eio -       after the link family's write, every journal file write
                fails with EIO
    block GATE  the link family's write first creates GATE.entered, then
                waits (at most 60 s) for GATE to exist: the apply holds its
                locks meanwhile
    kill after  SIGKILL itself right after the link family's write (the
                host is then partly changed, its journal still "applying")
    kill before SIGKILL itself before reading the request: nothing written
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time

from nictune.host.transaction import journal
from nictune.host.agent import main
from nictune.host.knobs.link import LinkFamily

MODE, ARG = sys.argv[1], sys.argv[2]
real_apply = LinkFamily.apply
written = []


def fill(path: str) -> None:
    chunk = b"\0" * 65536
    with open(path, "ab") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    # What a partial last chunk left: a block at a time down to nothing.
    with open(path, "ab", buffering=0) as f:
        for size in (4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise


def faulty_apply(self, items):
    if MODE == "block":
        open(ARG + ".entered", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(ARG) and time.monotonic() < deadline:
            time.sleep(0.02)
    real_apply(self, items)
    written.append(items)
    if MODE == "kill" and ARG == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    if MODE == "fill":
        fill(ARG)


def eio_after_the_kernel_write(write):
    def faulty(*args, **kwargs):
        if written:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return write(*args, **kwargs)
    return faulty


LinkFamily.apply = faulty_apply
if MODE == "kill" and ARG == "before":
    os.kill(os.getpid(), signal.SIGKILL)
if MODE == "eio":
    journal._replace = eio_after_the_kernel_write(journal._replace)
sys.exit(main())
