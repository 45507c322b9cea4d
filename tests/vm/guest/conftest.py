"""Fixtures of the VM tests: a soft-RoCE device on a veth, and rdma_cm configfs."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from rxe import leftovers, sh, soft_roce, SoftRoce

CONFIGFS = "/sys/kernel/config"


@pytest.fixture(scope="module")
def softroce() -> Iterator[SoftRoce]:
    with soft_roce("198.18.0.1", "198.18.0.2") as sr:
        yield sr
    left = leftovers(sr)
    assert not left, f"teardown left {left}"


@pytest.fixture(scope="module")
def rdma_cm() -> Iterator[str]:
    """rdma_cm loaded and configfs mounted; unmounted again if mounted here."""
    sh("modprobe", "rdma_cm")
    mounted = os.path.ismount(CONFIGFS)
    if not mounted:
        sh("mount", "-t", "configfs", "configfs", CONFIGFS)
    try:
        yield os.path.join(CONFIGFS, "rdma_cm")
    finally:
        if not mounted:
            sh("umount", CONFIGFS, check=False)
