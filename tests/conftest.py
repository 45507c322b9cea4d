"""Fixtures shared by every test directory: the recorded hosts of
tests/golden/states on the fake kernel (tests/fakes.py), fresh per test."""

from __future__ import annotations

import os

import pytest

from fakes import FakeHost
# Under CI a skip for something installable fails: skips.py decides.
from skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def _controller_cache(tmp_path_factory):
    """The questions a verify over SSH learns (control/remote/probe.py) go to the
    session's own directory, never the user's ~/.cache."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture
def cx7(tmp_path):
    """Two ConnectX-7 ports and an igb management NIC."""
    return FakeHost("cx7-host", tmp_path / "root")


@pytest.fixture
def maia(tmp_path):
    """hv_netvsc eth0 with its MANA VF."""
    return FakeHost("maia-host", tmp_path / "maia-root")
