"""The LD_PRELOAD shim (tools/nlshim.c), compiled once per test run."""

from __future__ import annotations

import pytest

from recorded.tools import dcb_recorder as rec


@pytest.fixture(scope="session")
def shim(tmp_path_factory):
    why = rec.missing_tools()
    if why:
        pytest.skip(why)
    return rec.build_shim(tmp_path_factory.mktemp("shim"))
