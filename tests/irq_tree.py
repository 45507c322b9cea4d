"""A fake /proc and sysfs of IRQs for the irq family (knobs/irq.py), built
from a real mlx5 host's /proc/interrupts (tests/fixtures/irq/SOURCE.md says
whose, and what was added).

What is derived here, not recorded (the recording is `cat /proc/interrupts`
alone): each function's msi_irqs/ (the IRQs whose chip column names it:
IR-PCI-MSIX-0000:01:00.0), their smp_affinity_list (mlx5's own spread,
mlx5_comp<q> on CPU q as the counts in the recording show, async on every
CPU), 12 online CPUs on one NUMA node (a Ryzen 9 9900X), and one tx-N and
rx-N queue directory per channel with empty XPS/RPS masks.  The recorded
functions 0000:01:00.0 and .1 stand in for the fake ConnectX-7 host's two
ports (tests/golden/states/cx7-host.json)."""

from __future__ import annotations

import os
import re

from fakes import cx7_rails_state

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDING = os.path.join(HERE, "fixtures", "irq", "mlx5-proc-interrupts.txt")
PORTS = {"0000:01:00.0": "enp23s0f0np0", "0000:01:00.1": "enp23s0f1np1"}
CPUS = 12
_LINE = re.compile(r"^\s*(\d+):.*IR-PCI-MSIX-(\S+)\s+\S+\s+(\S+)$")


def recorded_irqs() -> list:
    """[(irq, function, name)] of the recording."""
    with open(RECORDING) as f:
        found = [_LINE.match(line) for line in f.read().splitlines()[1:]]
    return [(int(m[1]), m[2], m[3]) for m in found if m]


def irq_files(channels: int = 12) -> dict:
    """{path under the root: text} of the recorded host's IRQs."""
    with open(RECORDING) as f:
        files = {"proc/interrupts": f.read(),
                 "sys/devices/system/cpu/online": f"0-{CPUS - 1}\n"}
    for irq, function, name in recorded_irqs():
        port = PORTS[function]
        files[f"sys/class/net/{port}/device/msi_irqs/{irq}"] = "msix\n"
        m = re.match(r"mlx5_comp(\d+)@", name)
        files[f"proc/irq/{irq}/smp_affinity_list"] = (
            f"{int(m[1]) % CPUS}\n" if m else f"0-{CPUS - 1}\n")
    for port in PORTS.values():
        files[f"sys/class/net/{port}/device/numa_node"] = "0\n"
        files[f"sys/class/net/{port}/device/local_cpulist"] = f"0-{CPUS - 1}\n"
        for n in range(channels):
            files[f"sys/class/net/{port}/queues/tx-{n}/xps_cpus"] = "000\n"
            files[f"sys/class/net/{port}/queues/rx-{n}/rps_cpus"] = "000\n"
    return files


def irq_state(**files) -> dict:
    """The fake ConnectX-7 host with the recorded IRQs; `files` adds or
    replaces paths (a debugfs IRQ, an irqbalance process)."""
    state = cx7_rails_state()
    state["files"] = {**state.get("files", {}), **irq_files(), **files}
    return state


def affinity(root, irq: int) -> str:
    with open(os.path.join(str(root), "proc/irq", str(irq), "smp_affinity_list")) as f:
        return f.read().strip()
