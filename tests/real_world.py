"""Where tests find the real-world reference files (inventories, command
outputs) they compare nictune against.

They are other people's files, not ours to copy into the repository: they
live in ../shared/reference/real-world beside the repository root (the
same layout on a development machine and in CI), or wherever
NICTUNE_REAL_WORLD points.  A checkout without them may skip the tests
that need them; a CI run must fail instead, or it would pass having
compared nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(os.path.abspath(__file__)).parent.parent
# `or`: an empty NICTUNE_REAL_WORLD means unset, not the current directory.
REAL_WORLD = Path(os.environ.get("NICTUNE_REAL_WORLD")
                  or REPO.parent / "shared" / "reference" / "real-world")


def in_ci() -> bool:
    """CI set to a true value, as CI services set it (CI=true, CI=1)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def require(path: Path) -> Path:
    """`path` if it is a directory; otherwise fail under CI and skip
    elsewhere, naming the path looked at."""
    if not path.is_dir():
        message = f"no real-world reference directory at {path} (set NICTUNE_REAL_WORLD)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path
