"""Where tests find the real-world reference files (inventories, command
outputs) they compare nictune against.

They are other people's files, not ours to copy into the repository: they
live in ../shared/reference/real-world beside the repository root (the
same layout on a development machine and in CI), or wherever
NICTUNE_REAL_WORLD points.  A checkout without them skips the tests
that need them; under CI that skip fails (tests/skips.py), or CI would
pass having compared nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(os.path.abspath(__file__)).parent.parent
# `or`: an empty NICTUNE_REAL_WORLD means unset, not the current directory.
REAL_WORLD = Path(os.environ.get("NICTUNE_REAL_WORLD")
                  or REPO.parent / "shared" / "reference" / "real-world")


def require(path: Path) -> Path:
    """`path` if it is a directory; otherwise a skip naming the path
    looked at (a failure under CI: tests/skips.py)."""
    if not path.is_dir():
        pytest.skip(f"no real-world reference directory at {path} (set NICTUNE_REAL_WORLD)")
    return path
