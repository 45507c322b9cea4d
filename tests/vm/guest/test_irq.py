"""IRQ placement (knobs/irq.py) on a real multi-queue virtio-net device:
tests/vm/run.py gives the VM one (multiqueue_nic_args: 4 queue pairs, 10
MSI-X vectors, a tap backend left down on the host).

- plan resolves the queue vectors from the PCI function's msi_irqs/ and
  /proc/interrupts (virtio<n>-input.<q>, -output.<q>), as this test reads
  them itself; virtio-net's vectors are not kernel-managed (virtnet_find_vqs
  passes no irq_affinity to virtio_find_vqs), so apply writes them, which
  a managed IRQ would refuse with EIO, and /proc/irq reads back;
  rollback puts the kernel's placement back;
- the resident agent, on_drift report: a placement changed while the link
  is down is written again when the link comes back up; a device unbound
  and bound again (virtnet_probe -> virtnet_set_affinity places the new
  vectors itself) is re-tuned when its netdev appears.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time

import pytest

from nictune.host.resident.daemon import load_status
from nictune_cli import changes, nictune
from rxe import sh

QUEUES = 4  # tests/vm/run.py MULTIQUEUE_NIC_QUEUES
WAIT = 240.0  # guest Python is 20-30x slower than the host's: the agent's start takes a while


def _virtio_net() -> tuple:
    """(interface, PCI function directory) of the multi-queue virtio-net NIC."""
    sh("modprobe", "virtio_net")
    for _ in range(50):
        for name in sorted(os.listdir("/sys/class/net")):
            driver = f"/sys/class/net/{name}/device/driver"
            if os.path.islink(driver) and os.path.basename(os.readlink(driver)) == "virtio_net":
                return name, os.path.dirname(os.path.realpath(f"/sys/class/net/{name}/device"))
        time.sleep(0.2)
    raise AssertionError(f"no virtio_net interface: {os.listdir('/sys/class/net')}")


def queue_irqs(pci: str) -> dict:
    """{"input.0": irq, ...}: read by this test from msi_irqs/ and /proc/interrupts."""
    mine = set(os.listdir(os.path.join(pci, "msi_irqs")))
    out = {}
    with open("/proc/interrupts") as f:
        for line in f:
            m = re.match(r"\s*(\d+):.*\svirtio\d+-((?:input|output)\.\d+)\s*$", line)
            if m and m[1] in mine:
                out[m[2]] = int(m[1])
    return out


def affinity(irq: int) -> str:
    with open(f"/proc/irq/{irq}/smp_affinity_list") as f:
        return f.read().strip()


def set_affinity(irq: int, cpus: str) -> None:
    with open(f"/proc/irq/{irq}/smp_affinity_list", "w") as f:
        f.write(cpus)


def wait_for(check, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.5)
    return check()


@pytest.fixture(scope="module")
def nic():
    name, pci = _virtio_net()
    sh("ip", "link", "set", name, "up")
    before = {vector: affinity(irq) for vector, irq in queue_irqs(pci).items()}
    try:
        yield name, pci
    finally:
        for vector, irq in queue_irqs(pci).items():
            with contextlib.suppress(OSError):
                set_affinity(irq, before.get(vector, "0-1"))


def _profile(tmp_path, name: str) -> str:
    path = tmp_path / "irq.yaml"
    path.write_text(f"nictune: 1\ninterfaces:\n  rail:\n    match: {{name: {name}}}\n"
                    "    irq: {cpus: '1', xps: true}\n")
    return str(path)


def test_the_queue_vectors_are_placed_read_back_and_rolled_back(nic, tmp_path):
    name, pci = nic
    irqs = queue_irqs(pci)
    assert len(irqs) == 2 * QUEUES, irqs
    # Debian's kernel has no CONFIG_GENERIC_IRQ_DEBUGFS (no /sys/kernel/debug/irq/):
    # that the vectors are not managed shows in the apply below, which a
    # managed IRQ would refuse with EIO.
    kernel = {vector: affinity(irq) for vector, irq in irqs.items()}
    assert kernel["input.2"] != "1" and kernel["input.0"] != "1", kernel
    state = ["--state-dir", str(tmp_path / "state")]
    code, report, _ = nictune("plan", _profile(tmp_path, name), *state)
    rows = changes(report)
    planned = {k[2][4:]: row for k, row in rows.items() if k[1] == "irq" and k[2].startswith("irq.")}
    assert set(planned) == set(irqs), rows
    assert planned["input.2"]["before"] == kernel["input.2"] and planned["input.2"]["after"] == "1"
    assert f"queue 2 -> CPU 1 (cpus 1); IRQ {irqs['input.2']}" in planned["input.2"]["note"]
    code, report, _ = nictune("apply", _profile(tmp_path, name), *state)
    assert code == 0, report
    assert {vector: affinity(irq) for vector, irq in irqs.items()} == {v: "1" for v in irqs}
    with open(f"/sys/class/net/{name}/queues/tx-0/xps_cpus") as f:
        assert int(f.read().replace(",", ""), 16) == 0b10
    code, report, _ = nictune("rollback", *state)
    assert code == 0, report
    assert {vector: affinity(irq) for vector, irq in irqs.items()} == kernel


@contextlib.contextmanager
def resident(state: str):
    log = open(os.path.join(state, "..", "agent.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "nictune.host.resident", "--state-dir", state,
                             "--interval", "3600", "--metrics-address", ""],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: (load_status(state) or {}).get("last_verify")
                        or proc.poll() is not None, WAIT), "the agent never verified"
        assert proc.poll() is None, open(log.name).read()
        yield proc
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_the_resident_agent_places_them_again_after_link_up_and_a_new_device(nic, tmp_path):
    name, pci = nic
    state = str(tmp_path / "state")
    code, report, _ = nictune("apply", _profile(tmp_path, name), "--state-dir", state)
    assert code == 0, report
    irqs = queue_irqs(pci)
    with resident(state):
        # Moved while the link is down (as a driver's open does): put back at link up.
        sh("ip", "link", "set", name, "down")
        set_affinity(irqs["input.0"], "0")
        sh("ip", "link", "set", name, "up")
        assert wait_for(lambda: affinity(irqs["input.0"]) == "1", WAIT), open(
            os.path.join(state, "..", "agent.log")).read()
        assert load_status(state)["last_reapply"]["reason"] == f"link up: {name}"
        # The device made again: the kernel places its new vectors, the agent re-tunes.
        bdf = os.path.basename(pci)
        driver = os.path.realpath(os.path.join(pci, "driver"))
        with open(os.path.join(driver, "unbind"), "w") as f:
            f.write(bdf)
        with open(os.path.join(driver, "bind"), "w") as f:
            f.write(bdf)
        again, _ = _virtio_net()
        sh("ip", "link", "set", again, "up")

        def placed() -> bool:
            now = queue_irqs(pci)
            return len(now) == 2 * QUEUES and all(affinity(irq) == "1" for irq in now.values())

        assert wait_for(placed, WAIT), ({v: affinity(i) for v, i in queue_irqs(pci).items()},
                                        open(os.path.join(state, "..", "agent.log")).read())
    code, report, _ = nictune("rollback", "--state-dir", state)
    assert code == 0, report
