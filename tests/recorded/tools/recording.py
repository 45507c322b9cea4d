"""What the recorders (devlink_record.py, macsec_record.py, vf_record.py)
share: running a tool under genlshim.c, reading what `strace -e write=3`
dumped, packing an attribute, and the record/print/--write entry point.
A test tool: never shipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
FAMILY_ID = 0x7E  # GENLSHIM_ID in genlshim.c
RTM_NEWLINK = 16


def attr(kind: int, payload: bytes) -> bytes:
    """A netlink attribute, padded to 4 bytes."""
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-(4 + len(payload)) % 4)


# -- generic netlink under genlshim.c -------------------------------------------

def build_shim(workdir: Path) -> Path:
    """Compile genlshim.c (with shim_core.h) into workdir."""
    out = workdir / "genlshim.so"
    subprocess.run(["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(out),
                    str(HERE / "genlshim.c"), "-ldl"], check=True, capture_output=True)
    return out


def shim_env(shim: Path, family: str, log: Path, replies: Path) -> Dict[str, str]:
    """The environment that runs a process under the shim, standing in for `family`."""
    return dict(os.environ, LD_PRELOAD=str(shim), NT_GENLSHIM_FAMILY=family,
                NT_GENLSHIM_LOG=str(log), NT_GENLSHIM_REPLIES=str(replies))


def run_genl(shim: Path, workdir: Path, family: str, argv: List[str],
             replies: Optional[Dict[int, bytes]] = None) -> Tuple[str, List[str]]:
    """Run argv under the shim, answering `family`'s command N with
    replies[N]; (stdout, hex of each request)."""
    log = workdir / "sent.hex"
    rdir = workdir / "replies"
    shutil.rmtree(rdir, ignore_errors=True)
    rdir.mkdir()
    for cmd, data in (replies or {}).items():
        (rdir / f"{cmd}.bin").write_bytes(data)
    if log.exists():
        log.unlink()
    done = subprocess.run(argv, env=shim_env(shim, family, log, rdir), capture_output=True,
                          text=True, timeout=20)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: rc {done.returncode}: {done.stderr.strip()}")
    sent = log.read_text().split() if log.exists() else []
    return done.stdout, sent


def record_genl(run: Callable[[Path, Path, List[str]], Tuple[str, List[str]]],
                requests: List[Tuple[str, List[str]]], prefix: List[str]) -> Dict[str, dict]:
    """name -> {argv, sent}: what run(shim, workdir, args) sends for each request."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shim = build_shim(work)
        return {name: {"argv": prefix + args, "sent": run(shim, work, args)[1]}
                for name, args in requests}


# -- rtnetlink requests, read from strace ---------------------------------------

_LINE = re.compile(r"^ \| [0-9a-f]{5}  ((?:[0-9a-f]{2}  ?){1,16})")


def strace_buffers(dump: str) -> List[bytes]:
    """The buffers strace dumped, one per syscall (each starts at 00000)."""
    out: List[bytearray] = []
    for line in dump.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        if line.startswith(" | 00000"):
            out.append(bytearray())
        out[-1] += bytes.fromhex(m.group(1).replace(" ", ""))
    return [bytes(b) for b in out]


def last_newlink(dump: str) -> bytes:
    """The last RTM_NEWLINK in a `strace -e write=3` dump."""
    newlinks = [m for m in strace_buffers(dump)
                if len(m) >= 16 and int.from_bytes(m[4:6], "little") == RTM_NEWLINK]
    if not newlinks:
        raise RuntimeError(f"ip sent no RTM_NEWLINK: {dump[-500:]}")
    return newlinks[-1]


# -- the entry point ------------------------------------------------------------

def main(unavailable: Callable[[], Optional[str]], record: Callable[[], dict],
         recordings: Path) -> int:
    """Record and print; with --write, rewrite recordings/requests.json."""
    why = unavailable()
    if why:
        print(why, file=sys.stderr)
        return 1
    recorded = record()
    print(json.dumps(recorded, indent=1))
    if "--write" in sys.argv:
        recordings.mkdir(exist_ok=True)
        (recordings / "requests.json").write_text(json.dumps(recorded, indent=1) + "\n")
    return 0
