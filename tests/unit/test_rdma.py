"""GID discovery over sysfs fixture trees shaped like real hosts
(tests/fixtures/{mlx5,mana}-host), and the rdma_cm configfs hold."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from nictune.host.facts import rdma
from nictune.host.transports.io import LiveIO
from nictune.host.machine import Host
from nictune.host.validate import InvalidInput
from roce_gid import roce_v2_ipv4

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")


@pytest.fixture
def mlx5_root(tmp_path):
    root = tmp_path / "mlx5"
    shutil.copytree(os.path.join(FIXTURES, "mlx5-host"), root, symlinks=True)
    return Host(str(root))


def test_devices_ports_and_gid_table(mlx5_root):
    assert rdma.devices(mlx5_root) == ["mlx5_0", "mlx5_1"]
    assert rdma.ports(mlx5_root, "mlx5_0") == [1]
    table = rdma.gids(mlx5_root, "mlx5_0", 1)
    # Unpopulated (all-zero) entries 4 and 5 are skipped.
    assert [(g.index, g.type, g.ndev, g.ipv4) for g in table] == [
        (0, rdma.ROCE_V1, "enp23s0f0np0", None), (1, rdma.ROCE_V2, "enp23s0f0np0", None),
        (2, rdma.ROCE_V1, "enp23s0f0np0", "198.18.0.1"), (3, rdma.ROCE_V2, "enp23s0f0np0", "198.18.0.1")]


def test_roce_v2_ipv4_index(mlx5_root):
    g = roce_v2_ipv4(mlx5_root, "mlx5_1", 1, "enp23s0f1np1")
    assert (g.index, g.ipv4) == (3, "198.18.0.5")
    assert roce_v2_ipv4(mlx5_root, "mlx5_1", 1, "enp23s0f0np0") is None


def test_unreadable_entries_are_tolerated(mlx5_root, monkeypatch):
    """On a real host types/N and ndevs/N of an entry being torn down read EINVAL."""
    real_open = open

    def einval_open(path, *a, **kw):
        if str(path).endswith(os.path.join("gid_attrs", "types", "3")):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, *a, **kw)

    monkeypatch.setattr(LiveIO, "open", lambda io, *a, **kw: einval_open(*a, **kw))  # Host.io
    table = {g.index: g for g in rdma.gids(mlx5_root, "mlx5_0", 1)}
    assert table[3].type is None
    assert roce_v2_ipv4(mlx5_root, "mlx5_0", 1) is None


def test_port_of_by_gid_and_by_device(mlx5_root, tmp_path):
    assert rdma.port_of(mlx5_root, "enp23s0f1np1") == ("mlx5_1", 1)
    # Without addresses there are no GIDs: the RDMA device on the same PCI function.
    for n in range(4):
        os.unlink(mlx5_root.path(rdma.IB_CLASS, "mlx5_1/ports/1/gid_attrs/ndevs", str(n)))
    assert rdma.port_of(mlx5_root, "enp23s0f1np1") == ("mlx5_1", 1)
    assert rdma.port_of(mlx5_root, "nosuch0") is None


def test_mana_gids_belong_to_the_netvsc_master(tmp_path):
    root = tmp_path / "mana"
    shutil.copytree(os.path.join(FIXTURES, "mana-host"), root, symlinks=True)
    host = Host(str(root))
    assert rdma.port_of(host, "eth0") == ("mana_0", 1)
    # The VF has no GIDs; mana_ib sits on an auxiliary device below its PCI function.
    assert rdma.port_of(host, "enP30832p0s0") == ("mana_0", 1)
    assert roce_v2_ipv4(host, "mana_0", 1).index == 1


def test_device_names_are_checked(mlx5_root):
    for bad in ("../etc", "..", "a/b", "", "x" * 65):
        with pytest.raises(InvalidInput):
            rdma.ports(mlx5_root, bad)


class FakeConfigfs:
    """A labelled fake of configfs semantics: mkdir of a device directory
    makes ports/<n>/default_roce_* appear with the kernel's values, rmdir
    drops the directory and the values stay with the kernel."""

    def __init__(self, monkeypatch, kernel: dict):
        self.kernel, self.calls = kernel, []
        self.real_mkdir, self.real_rmdir = os.mkdir, os.rmdir
        # The host's port (Host.io), for every host of the test.
        monkeypatch.setattr(LiveIO, "mkdir", lambda io, path, mode=0o777: self.mkdir(path))
        monkeypatch.setattr(LiveIO, "rmdir", lambda io, path: self.rmdir(path))

    def mkdir(self, path):
        self.calls.append(("mkdir", os.path.basename(path)))
        for d in (path, os.path.join(path, "ports"), os.path.join(path, "ports", "1")):
            self.real_mkdir(d)
        for name, value in self.kernel.items():
            with open(os.path.join(path, "ports", "1", name), "w") as f:
                f.write(value + "\n")

    def rmdir(self, path):
        self.calls.append(("rmdir", os.path.basename(path)))
        for name in self.kernel:
            with open(os.path.join(path, "ports", "1", name)) as f:
                self.kernel[name] = f.read().strip()
            os.unlink(os.path.join(path, "ports", "1", name))
        for d in (os.path.join(path, "ports", "1"), os.path.join(path, "ports"), path):
            self.real_rmdir(d)


def test_cm_device_holds_and_releases_only_what_it_made(tmp_path, monkeypatch):
    host = Host(str(tmp_path))
    os.makedirs(host.path(rdma.CM_CONFIGFS))
    cfs = FakeConfigfs(monkeypatch, {"default_roce_mode": "IB/RoCE v1", "default_roce_tos": "0"})
    with rdma.cm_device(host, "mlx5_3") as path:
        with open(os.path.join(path, "ports/1/default_roce_tos"), "w") as f:
            f.write("106")
    assert cfs.calls == [("mkdir", "mlx5_3"), ("rmdir", "mlx5_3")]
    assert cfs.kernel["default_roce_tos"] == "106"
    assert not os.path.exists(host.path(rdma.CM_CONFIGFS, "mlx5_3"))
    cfs.real_mkdir(host.path(rdma.CM_CONFIGFS, "mlx5_4"))  # held by someone else: left alone
    with rdma.cm_device(host, "mlx5_4"):
        pass
    assert cfs.calls[2:] == [] and os.path.isdir(host.path(rdma.CM_CONFIGFS, "mlx5_4"))


def test_cm_device_without_configfs_says_why(tmp_path):
    with pytest.raises(FileNotFoundError, match="mount configfs"):
        with rdma.cm_device(Host(str(tmp_path)), "mlx5_0"):
            pass
