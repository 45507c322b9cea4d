"""Boot Debian's generic kernel under QEMU (TCG) and run tests/vm/guest in it.

This machine's kernel has no RDMA or netdevsim; Debian's generic 6.12 kernel
ships rdma_rxe (soft-RoCE), and netdevsim is built for it here, out of tree,
from linux-source-6.12 against linux-headers-<kernel>.  The VM needs no disk
image: a tiny initramfs (busybox plus the 9p modules, tests/vm/init.sh as
/init) mounts the host's / read-only over 9p as the guest's root and the
project read-write at its own path, so the guest runs the host's Python and
the project's .venv.  One pytest run per boot: guest userspace is 20-30x
slower than the host's.

    python3 tests/vm/run.py [--kernel K] [--timeout S] [-- PYTEST-ARGS...]

scripts/test-vm installs the packages first and is the usual way in.  The
initramfs is cached under ~/.cache/nictune-vm/<kernel>/, keyed by what goes
into it, and netdevsim.ko beside it, keyed by the kernel package's version;
the guest loads the module from there (the host's / is its root).  Without
the headers or the source, the netdevsim tests skip and say why (under CI,
CI=true, the runner fails instead: netdevsim_or_skip).  Exit
status: the guest pytest's, or 124 when the VM timed out, 125 when it never
reached the tests (the serial log's tail is printed then).

A guest test may ask for another boot (tests that a state survives a
reboot): every run shares a fresh host directory read-write, the "keep"
disk, at GUEST_KEEP (NICTUNE_VM_KEEP); a guest that writes pytest arguments
there, one per line, into NEXT_BOOT gets the VM booted again, with
NICTUNE_VM_BOOT=2 (then 3...: at most MAX_BOOTS), running those; with
"systemd" in NEXT_INIT too, that boot has the host's systemd as PID 1
(init.sh), for tests of what systemctl does.  The keep directory is removed
with the run.
Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import gzip
import hashlib
import lzma
import os
import re
import resource
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(os.path.dirname(HERE))
INIT = os.path.join(HERE, "init.sh")
BUSYBOX = "/bin/busybox"  # busybox-static: the initramfs has no libc
INITRAMFS_MODULES = ("9p", "9pnet_virtio")  # virtio_pci is built into Debian's kernel
# The guest mounts tmpfs on these (the project gets its own share): the
# command script it reads from the cache directory must not live there.
GUEST_TMPFS = ("/tmp", "/run", "/var/tmp")
STARTED = "nictune-vm: running "
EXIT = re.compile(r"^nictune-vm: exit (\d+)\b", re.M)
TIMED_OUT, NOT_REACHED = 124, 125
PT_INTERP = 3
LOG_TAIL = 60
GUEST_KEEP = "/run/nictune-vm-keep"  # below a guest tmpfs: its mount point is made at boot
NEXT_BOOT = "next-boot"
NEXT_INIT = "next-init"
INITS = ("systemd",)
MAX_BOOTS = 3
NETDEVSIM_TARBALL = "/usr/src/linux-source-6.12.tar.xz"
NETDEVSIM_SOURCE = "drivers/net/netdevsim"


class VmError(Exception):
    """Something the VM needs is missing: the message says what to do."""


class NetdevsimUnavailable(Exception):
    """netdevsim cannot be built here: its tests skip, the others run."""


def _natural(text: str) -> list:
    """6.12.9 before 6.12.117."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def default_kernel() -> str:
    found = (os.path.basename(p)[len("vmlinuz-"):] for p in glob.glob("/boot/vmlinuz-6.12*"))
    generic = sorted((k for k in found if k.endswith("-amd64") and "cloud" not in k
                      and os.path.isdir(f"/lib/modules/{k}")), key=_natural)
    if not generic:
        raise VmError("no generic 6.12 kernel in /boot (the cloud kernel lacks rdma_rxe and 9p): "
                      "run scripts/test-vm, which installs linux-image-6.12-amd64")
    return generic[-1]


def _module_files(kernel: str) -> List[str]:
    """The .ko files of INITRAMFS_MODULES and their dependencies, load order."""
    proc = subprocess.run(["modprobe", "-a", "-S", kernel, "--show-depends", *INITRAMFS_MODULES],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise VmError(f"modprobe --show-depends for {kernel} failed: {proc.stderr.strip()}")
    files: List[str] = []
    for line in proc.stdout.splitlines():
        words = line.split()
        if words[:1] == ["insmod"] and words[1] not in files:
            files.append(words[1])
    return files


def _cache_key(kernel: str, modules: List[str]) -> str:
    digest = hashlib.sha256(kernel.encode())
    for path in (INIT, BUSYBOX, *modules):
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def _stage(staging: str, modules: List[str]) -> None:
    os.makedirs(os.path.join(staging, "bin"))
    os.makedirs(os.path.join(staging, "modules"))
    shutil.copy2(BUSYBOX, os.path.join(staging, "bin", "busybox"))
    shutil.copy(INIT, os.path.join(staging, "init"))
    os.chmod(os.path.join(staging, "init"), 0o755)
    order = []
    for path in modules:
        # busybox insmod hands the bytes to init_module(): decompress here.
        name = os.path.basename(path)
        opener = lzma.open if name.endswith(".xz") else open
        name = name[:-3] if name.endswith(".xz") else name
        with opener(path, "rb") as src, open(os.path.join(staging, "modules", name), "wb") as dst:
            shutil.copyfileobj(src, dst)
        order.append(name)
    with open(os.path.join(staging, "modules.order"), "w") as f:
        f.write("\n".join(order) + "\n")


def _static_elf(path: str) -> bool:
    """Whether path is a 64-bit ELF without a program interpreter (PT_INTERP)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:5] != b"\x7fELF\x02":
            return False
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        size, count = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(size * count)
    return all(struct.unpack_from("<I", table, i * size)[0] != PT_INTERP for i in range(count))


def initramfs(kernel: str, cache: str) -> str:
    """The cached initramfs for kernel, built when missing or out of date."""
    if not os.path.isfile(BUSYBOX) or not _static_elf(BUSYBOX) or shutil.which("cpio") is None:
        raise VmError(f"a static {BUSYBOX} (busybox-static) and cpio are needed: "
                      "run scripts/test-vm")
    modules = _module_files(kernel)
    directory = os.path.join(cache, kernel)
    target = os.path.join(directory, f"initramfs-{_cache_key(kernel, modules)}.cpio.gz")
    if os.path.isfile(target):
        return target
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, "initramfs-*")):
        os.unlink(stale)
    with tempfile.TemporaryDirectory(dir=directory) as work:
        staging = os.path.join(work, "root")
        _stage(staging, modules)
        names = sorted(os.path.relpath(os.path.join(d, n), staging)
                       for d, dirs, files in os.walk(staging) for n in dirs + files)
        archive = subprocess.run(["cpio", "-o", "-H", "newc", "-R", "0:0", "--quiet"], cwd=staging,
                                 input="\n".join(names).encode(), capture_output=True)
        if archive.returncode != 0:
            raise VmError(f"cpio failed: {archive.stderr.decode(errors='replace').strip()}")
        partial = os.path.join(work, "initramfs.cpio.gz")
        with gzip.open(partial, "wb", compresslevel=6) as f:
            f.write(archive.stdout)
        os.replace(partial, target)
    return target


def _package_version(package: str) -> Optional[str]:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", package],
                          capture_output=True, text=True)
    words = proc.stdout.split()
    installed = proc.returncode == 0 and words[:3] == ["install", "ok", "installed"]
    return words[-1] if installed else None


def _check_build_inputs(kernel: str, version: str) -> None:
    """Headers and source must come from the kernel's own upload: a module
    built against other headers would not load (vermagic, symbol CRCs)."""
    for package in (f"linux-headers-{kernel}", "linux-source-6.12"):
        found = _package_version(package)
        if found != version:
            state = f"is {found}" if found else "is not installed"
            raise NetdevsimUnavailable(f"{package} {state}, the kernel {version}: "
                                       f"scripts/test-vm installs {package}={version}")
    if not os.path.isfile(NETDEVSIM_TARBALL):
        raise NetdevsimUnavailable(f"{NETDEVSIM_TARBALL} is missing")


def netdevsim(kernel: str, cache: str) -> str:
    """The cached netdevsim.ko for kernel, built out of tree when missing
    (only drivers/net/netdevsim/ comes out of the source tarball).  Keyed by
    the kernel package's version: a new upload can keep the release name."""
    version = _package_version(f"linux-image-{kernel}")
    if version is None:
        raise NetdevsimUnavailable(f"no Debian package linux-image-{kernel} is installed")
    directory = os.path.join(cache, kernel)
    target = os.path.join(directory, f"netdevsim-{version}.ko")
    if os.path.isfile(target):
        return target
    _check_build_inputs(kernel, version)
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, "netdevsim-*.ko")):
        os.unlink(stale)
    with tempfile.TemporaryDirectory(dir=directory) as work:
        member = f"linux-source-6.12/{NETDEVSIM_SOURCE}"
        _build_step(["tar", "-xJf", NETDEVSIM_TARBALL, "-C", work, member])
        source = os.path.join(work, member)
        _build_step(["make", "-s", "-C", f"/lib/modules/{kernel}/build", f"M={source}",
                     "CONFIG_NETDEVSIM=m", f"-j{os.cpu_count() or 1}", "modules"])
        os.replace(os.path.join(source, "netdevsim.ko"), target)
    return target


def _build_step(argv: List[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetdevsimUnavailable(f"{shlex.join(argv)} failed: "
                                   f"{(proc.stdout + proc.stderr).strip()[-2000:]}")


def precompile() -> None:
    """Byte-compile the venv and the package on the host: the guest must
    not write into the shared tree, and compiling there costs seconds per
    module under emulation."""
    python = os.path.join(PROJECT, ".venv", "bin", "python")
    proc = subprocess.run([python, "-m", "compileall", "-q", "-j", "0",
                           os.path.join(PROJECT, ".venv", "lib"), os.path.join(PROJECT, "src")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise VmError(f"compileall failed: {(proc.stdout + proc.stderr).strip()[-2000:]}")


def guest_script(run_dir: str, pytest_args: List[str], netdevsim_env: dict,
                 boot: int = 1) -> str:
    """The command the guest runs, as a file (the kernel command line is short).
    netdevsim_env: NICTUNE_VM_NETDEVSIM (the module) or
    NICTUNE_VM_NETDEVSIM_SKIP (why there is none)."""
    env = {"HOME": "/tmp", "LANG": "C.UTF-8", "NICTUNE_VM_GUEST": "1", **netdevsim_env,
           "NICTUNE_VM_BOOT": str(boot), "NICTUNE_VM_KEEP": GUEST_KEEP,
           # Never write .pyc files into the tree the host shares.
           "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    # The serial console is a terminal to the guest: colour only if ours is one.
    colour = "yes" if sys.stdout.isatty() else "no"
    # -rs: a skipped netdevsim test says why in the summary.  A later boot
    # runs only what the guest asked for (node ids, in pytest_args).
    argv = [".venv/bin/python", "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rs",
            f"--color={colour}", *(["tests/vm/guest"] if boot == 1 else []), *pytest_args]
    path = os.path.join(run_dir, "guest.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
        f.write(f"cd {shlex.quote(PROJECT)}\n")
        f.write("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
        f.write(f"exec {shlex.join(argv)}\n")
    return path


# A multi-queue virtio-net NIC for the IRQ placement tests (guest/test_irq.py):
# a real PCI function with one MSI-X vector per queue and direction, plus
# config and control (vectors = 2 * queues + 2).  Its backend is a tap QEMU
# makes (the one netdev of QEMU 7.2 that takes queues=) with no script,
# address or bridge: it stays down on the host, no frame leaves the VM, and
# it goes away with QEMU.
MULTIQUEUE_NIC_QUEUES = 4


def multiqueue_nic_args(queues: int = MULTIQUEUE_NIC_QUEUES) -> List[str]:
    return ["-netdev", f"tap,id=mq0,queues={queues},script=no,downscript=no,vhost=off",
            "-device", f"virtio-net-pci,netdev=mq0,mq=on,vectors={2 * queues + 2}"]
# The PCIe topology of tests/vm/guest/test_pcie.py, on a q35 machine (PCI
# Express, extended configuration space):
# - a root port, a PCIe switch (TI X3130: one upstream port, two downstream
#   ports) and, behind the switch, a virtio-net NIC and a virtio-gpu device
#   standing in for a GPU (QEMU cannot give a device NVIDIA's vendor id: the
#   test names it with pcie.gpu_ids);
# - two more root ports, one with a second virtio-net NIC, one with a
#   virtio-rng device standing in for a second GPU: QEMU 7.2's X3130
#   downstream ports have no ACS capability, its root ports do, so ACS writes
#   are tested on the root ports between these two.
# The NICs' netdevs are on a hub of their own: no traffic leaves the VM.
PCIE_SWITCH_NIC_MAC, PCIE_ROOT_NIC_MAC = "52:54:00:19:80:01", "52:54:00:19:80:02"
PCIE_SWITCH_GPU, PCIE_ROOT_GPU = "1af4:1050", "1af4:1044"  # virtio-gpu, virtio-rng


def pcie_topology() -> List[str]:
    """The machine type and the devices of the PCIe paths the guest tests read."""
    return ["-machine", "q35",
            "-device", "pcie-root-port,id=nt_rp,bus=pcie.0,addr=0x10,chassis=10,slot=10",
            "-device", "x3130-upstream,id=nt_up,bus=nt_rp",
            "-device", "xio3130-downstream,id=nt_dn0,bus=nt_up,chassis=11,slot=0",
            "-device", "xio3130-downstream,id=nt_dn1,bus=nt_up,chassis=12,slot=1",
            "-device", "pcie-root-port,id=nt_rp_nic,bus=pcie.0,addr=0x11,chassis=13,slot=13",
            "-device", "pcie-root-port,id=nt_rp_gpu,bus=pcie.0,addr=0x12,chassis=14,slot=14",
            "-netdev", "hubport,id=nt_nic0,hubid=19",
            "-netdev", "hubport,id=nt_nic1,hubid=19",
            "-device", f"virtio-net-pci,netdev=nt_nic0,bus=nt_dn0,mac={PCIE_SWITCH_NIC_MAC}",
            "-device", "virtio-gpu-pci,bus=nt_dn1",
            "-device", f"virtio-net-pci,netdev=nt_nic1,bus=nt_rp_nic,mac={PCIE_ROOT_NIC_MAC}",
            "-device", "virtio-rng-pci,bus=nt_rp_gpu"]


def qemu_argv(kernel: str, initrd: str, script: str, memory: str, cpus: int,
              keep: Optional[str] = None, init: Optional[str] = None) -> List[str]:
    """keep: the host directory shared read-write at GUEST_KEEP (None: none);
    init: one of INITS as PID 1 instead of init.sh's own shell (None)."""
    append = " ".join(["console=ttyS0", "panic=-1", "quiet", "loglevel=4",
                       f"nictune.project={PROJECT}", f"nictune.cmd={script}"]
                      + ([f"nictune.keep={GUEST_KEEP}"] if keep else [])
                      + ([f"nictune.init={init}"] if init else []))
    share = "security_model=passthrough,multidevs=remap"
    return ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", memory,
            "-smp", str(cpus), "-nodefaults", "-display", "none", "-no-reboot",
            "-serial", "stdio", "-net", "none", *pcie_topology(),
            "-kernel", f"/boot/vmlinuz-{kernel}", "-initrd", initrd, "-append", append,
            "-fsdev", f"local,id=hostroot,path=/,readonly=on,{share}",
            "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
            "-fsdev", f"local,id=project,path={PROJECT},{share}",
            "-device", "virtio-9p-pci,fsdev=project,mount_tag=project"] + (
            ["-fsdev", f"local,id=keep,path={keep},{share}",
             "-device", "virtio-9p-pci,fsdev=keep,mount_tag=keep"] if keep else []) + (
            multiqueue_nic_args())


def _die_with_parent() -> None:
    """In the child: the kernel kills QEMU if this runner dies, even by SIGKILL."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def boot(argv: List[str], log_path: str, timeout: float) -> tuple:
    """Run the VM, echo the guest's output once its command has started.
    Returns (the command's exit status or None, whether the VM was killed
    for taking longer than timeout)."""
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    with open(log_path, "w", errors="replace") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            echo = False
            for raw in proc.stdout:
                line = raw.decode(errors="replace").replace("\r", "")
                log.write(line)
                echo = echo or line.startswith(STARTED)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:  # interrupted: never leave the VM running
                proc.kill()
                proc.wait()
            proc.stdout.close()
    with open(log_path, errors="replace") as log:
        found = EXIT.findall(log.read())
    return (int(found[-1]) if found else None), killed.is_set()


def boots(kernel: str, initrd: str, opts, netdevsim_env: dict, cache: str, run_dir: str,
          keep: str) -> tuple:
    """Boot once, and again while the guest asks (NEXT_BOOT in keep) and
    reported an exit status (another test's failure does not keep the later
    boot's from running); (the first non-zero status or 0, timed out, the
    last serial log)."""
    args, number, first_failure, init, again = opts.pytest_args, 1, 0, None, True
    while True:
        script = guest_script(run_dir, args, netdevsim_env, number)
        log_path = os.path.join(cache, "serial.log" if number == 1 else f"serial-{number}.log")
        status, timed_out = boot(qemu_argv(kernel, initrd, script, opts.memory, opts.cpus, keep,
                                           init), log_path, opts.timeout)
        if status is None and not timed_out and again and panicked_before_its_command(log_path):
            again = False  # once: a second panic is the kernel's, and is reported
            print(f"nictune-vm: the guest kernel panicked before boot {number}'s command started "
                  f"({log_path}); booting it again, once", flush=True)
            continue
        request = os.path.join(keep, NEXT_BOOT)
        if not os.path.isfile(request) or status is None:
            return first_failure or status, timed_out, log_path
        first_failure = first_failure or status
        with open(request) as f:
            args = [line for line in f.read().splitlines() if line]
        os.unlink(request)
        init = None
        if os.path.isfile(os.path.join(keep, NEXT_INIT)):
            with open(os.path.join(keep, NEXT_INIT)) as f:
                init = f.read().strip()
            os.unlink(os.path.join(keep, NEXT_INIT))
            if init not in INITS:
                print(f"nictune-vm: error: the guest asked for init {init!r}: not one of "
                      f"{', '.join(INITS)}", file=sys.stderr)
                return first_failure or NOT_REACHED, False, log_path
        number += 1
        if number > MAX_BOOTS:
            print(f"nictune-vm: error: the guest asked for boot {number}; at most {MAX_BOOTS}",
                  file=sys.stderr)
            return first_failure or NOT_REACHED, False, log_path
        print(f"nictune-vm: boot {number} (asked by the guest"
              + (f", {init} as PID 1" if init else "") + f"): pytest {shlex.join(args)}",
              flush=True)


def panicked_before_its_command(log_path: str) -> bool:
    """The guest kernel panicked before the guest's command started: no
    test can have caused that.  Under TCG, QEMU now and then faults while
    the kernel patches its own code in an initcall (an int3 Oops in
    kernel_init_freeable, seen once in some hundred boots)."""
    try:
        with open(log_path, errors="replace") as log:
            lines = log.read().splitlines()
    except OSError:  # no serial log: nothing says it was the kernel
        return False
    return (not any(line.startswith(STARTED) for line in lines)
            and any("Kernel panic - not syncing" in line for line in lines))


def _check_paths(cache: str) -> None:
    if any(cache == d or cache.startswith(d + "/") for d in GUEST_TMPFS):
        raise VmError(f"the cache directory {cache} is below a directory the guest mounts tmpfs "
                      f"on ({', '.join(GUEST_TMPFS)}): the guest could not read it")
    for path in (PROJECT, cache):
        if re.search(r"\s", path):
            raise VmError(f"{path!r} contains white space: it cannot go on the kernel command line")


def in_ci() -> bool:
    """CI set to a true value, read as tests/skips.py and scripts/test-vm
    read it (this runner is standard library only: no import from tests)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def netdevsim_or_skip(kernel: str, cache: str) -> dict:
    """The guest's netdevsim environment: the module, or why there is none
    (the netdevsim tests skip saying so).  Under CI there is no skipping
    them: they are the only real-kernel test of eswitch, SR-IOV, MACsec,
    IPsec and crypto."""
    try:
        return {"NICTUNE_VM_NETDEVSIM": netdevsim(kernel, cache)}
    except NetdevsimUnavailable as e:
        if in_ci():
            raise VmError(f"CI cannot skip the netdevsim tests: {e}") from None
        print(f"nictune-vm: SKIPPING the netdevsim tests: {e}", file=sys.stderr)
        return {"NICTUNE_VM_NETDEVSIM_SKIP": str(e)}


def main(args: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", help="kernel release (default: the newest generic 6.12 in /boot)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds for the whole VM run (for each boot, when there are more)")
    parser.add_argument("--memory", default="1G")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/nictune-vm"))
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to the guest's pytest")
    opts = parser.parse_args(args)
    # SIGTERM (a CI timeout) unwinds like ^C, so the VM is killed on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    cache = os.path.realpath(opts.cache_dir)
    try:
        if shutil.which("qemu-system-x86_64") is None:
            raise VmError("qemu-system-x86_64 is not installed: run scripts/test-vm")
        if not os.path.isfile(os.path.join(PROJECT, ".venv", "bin", "python")):
            raise VmError("the project has no .venv: run scripts/setup")
        _check_paths(cache)
        kernel = opts.kernel or default_kernel()
        if not os.path.isfile(f"/boot/vmlinuz-{kernel}"):
            raise VmError(f"no /boot/vmlinuz-{kernel}: run scripts/test-vm")
        started = time.monotonic()
        initrd = initramfs(kernel, cache)
        precompile()
        built = time.monotonic() - started
        started = time.monotonic()
        netdevsim_env = netdevsim_or_skip(kernel, cache)
        built_netdevsim = time.monotonic() - started
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="run-", dir=cache) as run_dir:
            keep = os.path.join(run_dir, "keep")
            os.mkdir(keep, 0o700)
            started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
            status, timed_out, log_path = boots(kernel, initrd, opts, netdevsim_env, cache,
                                                 run_dir, keep)
            seconds = time.monotonic() - started
    except VmError as e:
        print(f"nictune-vm: error: {e}", file=sys.stderr)
        return NOT_REACHED
    # QEMU is the last child and by far the largest: the RSS is its.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    print(f"nictune-vm: kernel {kernel}, initramfs and compileall {built:.1f} s, "
          f"netdevsim {built_netdevsim:.1f} s, VM {seconds:.1f} s "
          f"(CPU {cpu:.0f} s), max RSS {usage.ru_maxrss // 1024} MB, "
          f"serial log {log_path}")
    if status is not None:
        return status
    if timed_out:
        print(f"nictune-vm: error: the VM did not finish in {opts.timeout:.0f} s and was killed",
              file=sys.stderr)
    else:
        print("nictune-vm: error: the VM stopped without reporting an exit status", file=sys.stderr)
    with open(log_path, errors="replace") as log:
        tail = log.read().splitlines()[-LOG_TAIL:]
    if tail:
        print(f"--- last {len(tail)} lines of {log_path} ---", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)
    else:
        print("nictune-vm: the serial console stayed silent (the kernel had not started)",
              file=sys.stderr)
    return TIMED_OUT if timed_out else NOT_REACHED


if __name__ == "__main__":
    sys.exit(main())
