"""Soft-RoCE in the test VM: an rdma_rxe device on a veth, and how to check it.

Runs only in the VM that tests/vm/run.py boots (Debian's generic kernel,
which has rdma_rxe).  The local veth end stays in the guest's initial
namespace, where the agent runs in-process; its peer lives in a namespace
nt<tag>b.  Everything created is removed again even when a test fails, and
the removal itself is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator, List

IB = "/sys/class/infiniband"
# rdma_rxe fills the GID table from a workqueue after the address appears.
# The VM may be starved by a busy host: be generous, and poll gently (one
# scan of rxe's 1024 entries costs about a second of guest CPU).
GID_WAIT = 120.0
_ENV = {**os.environ, "LANG": "C", "LC_ALL": "C"}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=_ENV, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@dataclass(frozen=True)
class SoftRoce:
    ibdev: str    # the rxe device
    ifname: str   # its veth, in the guest's initial namespace
    netns: str    # where the peer end lives
    address: str  # ifname's IPv4 address, without prefix length


def sysfs_gid_table(ibdev: str, port: int = 1) -> List[tuple]:
    """(index, gid, type, ndev) of every populated entry, read straight from sysfs."""
    base = os.path.join(IB, ibdev, "ports", str(port))
    out = []
    for name in sorted(os.listdir(os.path.join(base, "gids")), key=int):
        with open(os.path.join(base, "gids", name)) as f:
            gid = f.read().strip()
        if set(gid) <= {"0", ":"}:
            continue
        attrs = []
        for attr in ("types", "ndevs"):
            try:
                with open(os.path.join(base, "gid_attrs", attr, name)) as f:
                    attrs.append(f.read().strip())
            except OSError:
                attrs.append(None)
        out.append((int(name), gid, *attrs))
    return out


def ipv4_mapped_gid(address: str) -> str:
    """The text sysfs shows for the RoCE GID of an IPv4 address."""
    a, b, c, d = (int(x) for x in address.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def _wait_for_roce_v2_ipv4(sr: SoftRoce) -> None:
    want = ipv4_mapped_gid(sr.address)
    deadline = time.monotonic() + GID_WAIT
    while not any(gid == want and kind == "RoCE v2" for _, gid, kind, _ in
                  sysfs_gid_table(sr.ibdev)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sr.ibdev}: no RoCE v2 GID {want} after {GID_WAIT:.0f} s: "
                               f"{sysfs_gid_table(sr.ibdev)}")
        time.sleep(0.5)


def leftovers(sr: SoftRoce) -> List[str]:
    """What of sr still exists, each checked where the kernel shows it."""
    found = []
    if os.path.exists(os.path.join(IB, sr.ibdev)):
        found.append(f"{IB}/{sr.ibdev}")
    links = json.loads(sh("rdma", "-j", "link", "show").stdout or "[]")
    found += [f"rdma link {link['ifname']}" for link in links if link.get("ifname") == sr.ibdev]
    if os.path.exists(os.path.join("/sys/class/net", sr.ifname)):
        found.append(f"netdev {sr.ifname}")
    if sr.netns in sh("ip", "netns", "list").stdout.split():
        found.append(f"netns {sr.netns}")
    return found


@contextlib.contextmanager
def soft_roce(address: str, peer: str, prefix: int = 30) -> Iterator[SoftRoce]:
    """A veth pair (peer end in a fresh namespace) with an rxe device on it."""
    tag = secrets.token_hex(3)
    sr = SoftRoce(ibdev=f"ntrxe{tag}", ifname=f"ntv{tag}", netns=f"nt{tag}b", address=address)
    made: List[str] = []
    try:
        sh("modprobe", "rdma_rxe")
        sh("ip", "netns", "add", sr.netns)
        made.append("netns")
        sh("ip", "link", "add", sr.ifname, "type", "veth", "peer", "name", sr.ifname,
           "netns", sr.netns)
        made.append("veth")
        sh("ip", "addr", "add", f"{address}/{prefix}", "dev", sr.ifname)
        sh("ip", "-n", sr.netns, "addr", "add", f"{peer}/{prefix}", "dev", sr.ifname)
        sh("ip", "link", "set", sr.ifname, "up")
        sh("ip", "-n", sr.netns, "link", "set", sr.ifname, "up")
        sh("rdma", "link", "add", sr.ibdev, "type", "rxe", "netdev", sr.ifname)
        made.append("rdma")
        _wait_for_roce_v2_ipv4(sr)
        yield sr
    finally:
        # Reverse order; each step runs even if an earlier one failed.
        if "rdma" in made:
            sh("rdma", "link", "delete", sr.ibdev, check=False)
        if "veth" in made:
            sh("ip", "link", "del", sr.ifname, check=False)
        if "netns" in made:
            sh("ip", "netns", "del", sr.netns, check=False)
