"""netdevsim in the test VM: a simulated device with ports, and how to read
its ethtool settings without nictune.

tests/vm/run.py builds netdevsim.ko out of tree for the VM's kernel and
names it in NICTUNE_VM_NETDEVSIM (or says in NICTUNE_VM_NETDEVSIM_SKIP why
there is none).  A device is created through /sys/bus/netdevsim/new_device
and deleted again even when a test fails; the deletion itself is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional

from rxe import sh

BUS = "/sys/bus/netdevsim"
MODULE_ENV, SKIP_ENV = "NICTUNE_VM_NETDEVSIM", "NICTUNE_VM_NETDEVSIM_SKIP"
PORTS_WAIT = 30.0


@dataclass(frozen=True)
class Netdevsim:
    id: int
    ifnames: tuple  # one netdev per port, in port order


def unavailable() -> Optional[str]:
    """Why netdevsim cannot be loaded here, or None when it can."""
    if os.path.isdir(BUS):
        return None
    module = os.environ.get(MODULE_ENV)
    if not module:
        return os.environ.get(SKIP_ENV) or f"{MODULE_ENV} is not set (run through scripts/test-vm)"
    if not os.path.isfile(module):
        return f"{module} does not exist"
    return None


def load() -> None:
    if os.path.isdir(BUS):
        return
    sh("modprobe", "psample")  # netdevsim needs its symbols; insmod resolves no dependencies
    sh("insmod", os.environ[MODULE_ENV])


def _device_dir(ns_id: int) -> str:
    return os.path.join(BUS, "devices", f"netdevsim{ns_id}")


def _port_netdevs(ns_id: int) -> List[str]:
    net = os.path.join(_device_dir(ns_id), "net")
    names = os.listdir(net) if os.path.isdir(net) else []
    return sorted(names, key=lambda name: int(_read(f"/sys/class/net/{name}/ifindex")))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def leftovers(dev: Netdevsim) -> List[str]:
    """What of dev still exists, as sysfs shows it."""
    found = [path for path in (_device_dir(dev.id),) if os.path.exists(path)]
    found += [f"netdev {name}" for name in dev.ifnames
              if os.path.exists(os.path.join("/sys/class/net", name))]
    return found


@contextlib.contextmanager
def netdevsim_device(ports: int, queues: int) -> Iterator[Netdevsim]:
    """A netdevsim device with ports, each with queues combined channels."""
    load()
    ns_id = 100 + secrets.randbelow(900)
    ifnames: tuple = ()
    try:
        with open(os.path.join(BUS, "new_device"), "w") as f:
            f.write(f"{ns_id} {ports} {queues}")
        deadline = time.monotonic() + PORTS_WAIT
        while len(_port_netdevs(ns_id)) < ports:
            if time.monotonic() > deadline:
                raise RuntimeError(f"netdevsim{ns_id}: {ports} ports did not appear: "
                                   f"{_port_netdevs(ns_id)}")
            time.sleep(0.2)
        ifnames = tuple(_port_netdevs(ns_id))
        yield Netdevsim(ns_id, ifnames)
    finally:
        if os.path.exists(_device_dir(ns_id)):
            with open(os.path.join(BUS, "del_device"), "w") as f:
                f.write(str(ns_id))


def _current(text: str) -> dict:
    """`Key: value` lines after ethtool's "Current hardware settings:"."""
    _, _, current = text.partition("Current hardware settings:")
    return dict(re.findall(r"^([A-Za-z ]+):\s*(\S+)\s*$", current, re.M))


def _value(text: str):
    if text.isdigit():
        return int(text)
    return {"on": True, "off": False}.get(text, text)


def ethtool_state(ifname: str) -> dict:
    """{(family, name): value} of ifname's rings, channels, coalesce, pause
    and hw-tc-offload, named as nictune names them, as the ethtool tool
    reports them (its text: ethtool 6.1 has --json only for some of them)."""
    state = {}
    rings = _current(sh("ethtool", "-g", ifname).stdout)
    for label, name in (("RX", "rx"), ("RX Mini", "rx-mini"), ("RX Jumbo", "rx-jumbo"),
                        ("TX", "tx")):
        state[("rings", name)] = _value(rings[label])
    channels = _current(sh("ethtool", "-l", ifname).stdout)
    state[("channels", "combined")] = _value(channels["Combined"])
    coalesce = sh("ethtool", "-c", ifname).stdout
    adaptive = re.search(r"^Adaptive RX:\s*(\w+)\s+TX:\s*(\w+)", coalesce, re.M)
    state[("coalesce", "adaptive-rx")] = _value(adaptive.group(1))
    state[("coalesce", "adaptive-tx")] = _value(adaptive.group(2))
    for name, number in re.findall(r"^([a-z-]+):\s+(\d+)\s*$", coalesce, re.M):
        state[("coalesce", name)] = int(number)
    pause = dict(re.findall(r"^(\w+):\s*(\w+)\s*$", sh("ethtool", "-a", ifname).stdout, re.M))
    for label, name in (("Autonegotiate", "autoneg"), ("RX", "rx"), ("TX", "tx")):
        state[("pause", name)] = _value(pause[label])
    (features,) = json.loads(sh("ethtool", "--json", "-k", ifname).stdout)
    state[("features", "hw-tc-offload")] = features["hw-tc-offload"]["active"]
    return state


@contextlib.contextmanager
def esp_port(ifname: str, address: str) -> Iterator[str]:
    """ifname up with address/24 and the ESP offload modules loaded (for SAs
    with `offload dev ifname`); every xfrm policy and state flushed and the
    address removed after."""
    for module in ("esp4", "esp4_offload"):
        sh("modprobe", module)
    sh("ip", "link", "set", ifname, "up")
    sh("ip", "addr", "add", f"{address}/24", "dev", ifname)
    try:
        yield ifname
    finally:
        sh("ip", "xfrm", "policy", "flush")
        sh("ip", "xfrm", "state", "flush")
        sh("ip", "addr", "flush", "dev", ifname, check=False)
