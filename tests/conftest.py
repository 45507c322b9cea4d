"""Fixtures shared by every test directory: the recorded hosts of
tests/golden/states on the fake kernel (tests/fakes.py), fresh per test."""

from __future__ import annotations

import pytest

from fakes import FakeHost


@pytest.fixture
def cx7(tmp_path):
    """Two ConnectX-7 ports and an igb management NIC."""
    return FakeHost("cx7-host", tmp_path / "root")


@pytest.fixture
def maia(tmp_path):
    """hv_netvsc eth0 with its MANA VF."""
    return FakeHost("maia-host", tmp_path / "maia-root")
