"""Test helpers shared by test_devlink.py and test_macsec.py: both compare
nictune's generic netlink requests with iproute2's under genlshim.c."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import recording  # noqa: E402

AGENT = str(Path(__file__).resolve().parents[2] / "src")


def recorded(name: str) -> dict:
    """tests/recorded/<name>/requests.json."""
    return json.loads((Path(__file__).resolve().parent / name / "requests.json").read_text())


def wire(msg, kind: int, flags: int) -> str:
    """msg encoded as type `kind` with `flags`, sequence number and pid 0, as hex."""
    msg["header"]["type"] = kind
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = 0
    msg["header"]["pid"] = 0
    msg.encode()
    return bytes(msg.data).hex()


def shim_in_tmp(unavailable: Callable[[], Optional[str]]) -> Iterator[Tuple[Path, Path]]:
    """For a fixture: (genlshim.so, its work directory), or a skip saying
    what is missing."""
    why = unavailable()
    if why:
        pytest.skip(why)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        yield recording.build_shim(work), work


def run_nictune(shim: Path, family: str, log: Path, replies: Path, script: str,
                args: List[str], timeout: int) -> subprocess.CompletedProcess:
    """`python -c script AGENT *args` under the shim standing in for `family`."""
    env = recording.shim_env(shim, family, log, replies)
    return subprocess.run([sys.executable, "-c", script, AGENT, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
