"""The VM tier's host side: the guest tests stay out of host runs, and the
initramfs the runner builds holds what /init needs (tests/vm/run.py).
Booting the VM itself is scripts/test-vm's job: minutes, not seconds."""

from __future__ import annotations

import gzip
import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# tests/vm is no package (the runner is a script): load it by path.
_spec = importlib.util.spec_from_file_location("nictune_vm_run", os.path.join(HERE, "run.py"))
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)


def cpio(archive: str, *args: str) -> str:
    with open(archive, "rb") as f:
        data = gzip.decompress(f.read())
    return subprocess.run(["cpio", "--quiet", *args], input=data, capture_output=True,
                          check=True).stdout.decode()


def collected(guest: bool) -> list:
    env = {k: v for k, v in os.environ.items() if k != "NICTUNE_VM_GUEST"}
    if guest:
        env["NICTUNE_VM_GUEST"] = "1"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--collect-only", "-q", "tests/vm"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_guest_tests_are_collected_only_inside_the_vm():
    on_host = collected(guest=False)
    assert on_host and not any("/guest/" in item for item in on_host), on_host
    in_vm = collected(guest=True)
    assert any(item.startswith("tests/vm/guest/test_softroce.py::") for item in in_vm), in_vm
    assert any(item.startswith("tests/vm/guest/test_netdevsim.py::") for item in in_vm), in_vm


def generic_kernels() -> list:
    try:
        return [run.default_kernel()]
    except run.VmError:
        return []


@pytest.mark.skipif(not generic_kernels() or not os.path.isfile(run.BUSYBOX),
                    reason="no generic 6.12 kernel or busybox here (scripts/test-vm installs them)")
def test_initramfs_holds_busybox_init_and_the_9p_modules(tmp_path):
    kernel = generic_kernels()[0]
    first = run.initramfs(kernel, str(tmp_path))
    assert run.initramfs(kernel, str(tmp_path)) == first  # cached by content
    listing = cpio(first, "-t").split()
    assert {"init", "bin/busybox", "modules.order"} <= set(listing)
    order = cpio(first, "-i", "--to-stdout", "modules.order").split()
    # Dependencies first: 9pnet before 9p and 9pnet_virtio; all decompressed.
    assert {"9p.ko", "9pnet.ko", "9pnet_virtio.ko"} <= set(order)
    assert order.index("9pnet.ko") < min(order.index("9p.ko"), order.index("9pnet_virtio.ko"))
    assert all(f"modules/{name}" in listing for name in order)


def netdevsim_buildable() -> bool:
    kernels = generic_kernels()
    version = kernels and run._package_version(f"linux-image-{kernels[0]}")
    try:
        return bool(version) and run._check_build_inputs(kernels[0], version) is None
    except run.NetdevsimUnavailable:
        return False


@pytest.mark.skipif(not netdevsim_buildable(),
                    reason="no 6.12 kernel with its headers and source here (scripts/test-vm "
                           "installs them)")
def test_netdevsim_is_built_for_the_kernel_once(tmp_path):
    kernel = generic_kernels()[0]
    module = run.netdevsim(kernel, str(tmp_path))
    vermagic = subprocess.run(["modinfo", "-F", "vermagic", module], capture_output=True,
                              text=True, check=True).stdout
    assert vermagic.startswith(f"{kernel} "), vermagic
    built = os.stat(module).st_mtime_ns
    assert run.netdevsim(kernel, str(tmp_path)) == module  # cached: not built again
    assert os.stat(module).st_mtime_ns == built
    assert os.listdir(os.path.dirname(module)) == [os.path.basename(module)]  # no build tree left


def test_netdevsim_needs_a_packaged_kernel(tmp_path):
    with pytest.raises(run.NetdevsimUnavailable, match="no Debian package linux-image-0.0.0-none"):
        run.netdevsim("0.0.0-none", str(tmp_path))
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(os.path.isdir("/sys/bus/netdevsim"),
                    reason="this kernel has netdevsim loaded: the guest tests would act on it")
def test_guest_netdevsim_tests_skip_saying_why_without_the_module():
    # Not under CI: inside the VM, as here, CI is not set (run.guest_script);
    # under CI the runner itself refuses to go on without netdevsim.
    env = {k: v for k, v in os.environ.items() if k not in ("NICTUNE_VM_NETDEVSIM", "CI")}
    env.update(NICTUNE_VM_GUEST="1", NICTUNE_VM_NETDEVSIM_SKIP="linux-headers-X is not installed")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
                           "tests/vm/guest/test_netdevsim.py"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 skipped" in proc.stdout, proc.stdout
    assert "NETDEVSIM UNAVAILABLE: linux-headers-X is not installed" in proc.stdout, proc.stdout


def test_netdevsim_unavailable_is_a_skip_outside_ci_and_an_error_under_ci(tmp_path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert run.netdevsim_or_skip("0.0.0-none", str(tmp_path)) == {
        "NICTUNE_VM_NETDEVSIM_SKIP": "no Debian package linux-image-0.0.0-none is installed"}
    monkeypatch.setenv("CI", "true")
    with pytest.raises(run.VmError, match="^CI cannot skip the netdevsim tests: no Debian package"):
        run.netdevsim_or_skip("0.0.0-none", str(tmp_path))


def path_without(tmp_path, hidden: dict) -> str:
    """A PATH with every command of this one but those in `hidden`, which
    are replaced by the given shell scripts (None: absent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            link = bin_dir / name
            if name in hidden or link.exists() or not os.access(target, os.X_OK):
                continue
            link.symlink_to(target)
    for name, script in hidden.items():
        if script is not None:
            (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
            (bin_dir / name).chmod(0o755)
    return str(bin_dir)


@pytest.fixture
def vm_unreachable(tmp_path):
    """An environment in which scripts/test-vm cannot get the VM tier: no
    QEMU, and apt-get fails as it does without the right sources."""
    if os.geteuid() != 0:
        pytest.skip("needs root (scripts/test-vm runs scripts/setup)")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = path_without(tmp_path, {"qemu-system-x86_64": None,
                                          "apt-get": "echo 'E: no sources' >&2; exit 100"})
    return env


def test_vm_tier_skip_is_a_clear_exit_0_outside_ci(vm_unreachable):
    proc = subprocess.run([os.path.join(REPO, "scripts", "test-vm")], env=vm_unreachable,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nictune test-vm: SKIPPED the soft-RoCE VM tier: apt-get" in proc.stderr, proc.stderr
    assert "nictune-vm:" not in proc.stdout + proc.stderr  # tests/vm/run.py never started


@pytest.mark.parametrize("ci", ["true", "1"])
def test_vm_tier_skip_fails_under_ci(vm_unreachable, ci):
    proc = subprocess.run([os.path.join(REPO, "scripts", "test-vm")],
                          env={**vm_unreachable, "CI": ci}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("nictune test-vm: FAILED: CI cannot skip the VM tier (the only real-kernel test of "
            "eswitch, SR-IOV, MACsec, IPsec, crypto and soft-RoCE): apt-get") in proc.stderr, \
        proc.stderr
    assert "SKIPPED" not in proc.stderr, proc.stderr
    assert "nictune-vm:" not in proc.stdout + proc.stderr
