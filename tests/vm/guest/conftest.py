"""Fixtures of the VM tests: a soft-RoCE device on a veth, rdma_cm configfs,
and a netdevsim device with two ports."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

import netdevsim
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


@pytest.fixture(scope="module")
def nsim() -> Iterator[netdevsim.Netdevsim]:
    """Two netdevsim ports with four queues each; skips, saying why, when
    the runner could not build the module."""
    reason = netdevsim.unavailable()
    if reason:
        pytest.skip(f"NETDEVSIM UNAVAILABLE: {reason}")
    with netdevsim.netdevsim_device(ports=2, queues=4) as dev:
        yield dev
    left = netdevsim.leftovers(dev)
    assert not left, f"teardown left {left}"


@pytest.fixture
def pf() -> Iterator[tuple]:
    """(devlink handle, PF netdev) of a one-port netdevsim device of each
    test's own: a failed test leaves nothing for the next one."""
    reason = netdevsim.unavailable()
    if reason:
        pytest.skip(f"NETDEVSIM UNAVAILABLE: {reason}")
    with netdevsim.netdevsim_device(ports=1, queues=4) as dev:
        yield f"netdevsim/netdevsim{dev.id}", dev.ifnames[0]
    left = netdevsim.leftovers(dev)
    assert not left, f"teardown left {left}"
