"""A local lab: namespaces joined by veth pairs, for demos without NIC hardware.

    ntlab1 [lab0 198.18.0.1/30] <--veth--> [lab0 198.18.0.2/30] ntlab2

Addresses come from the benchmarking range 198.18.0.0/15.  Each namespace
gets its own /etc/nccl.conf through /etc/netns/NAME/ (bind-mounted by
`ip netns exec`), so applying a profile there never touches the host's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from nictune.host.errors import SYSTEM, NictuneError
from nictune.host.transaction.journal import DEFAULT_STATE_DIR

NAMESPACES = ("ntlab1", "ntlab2")
IFNAME = "lab0"
ADDRESSES = ("198.18.0.1/30", "198.18.0.2/30")
RECORD = "/run/nictune-lab.json"
NCCL = "/etc/nccl.conf"
# Present while /etc/nccl.conf is an empty file a lab created (this lab or a
# fleet lab, which share it): whichever lab goes down last removes it.
NCCL_MARKER = "/run/nictune-lab-created-nccl.conf"
# The fleet lab's limits (lab/fleet.py), here so the CLI can declare
# its options without importing fleetlab on every start.
FLEET_MAX_HOSTS = 250
FLEET_DIR = "/run/nictune-lab"


class LabError(NictuneError):
    kind = SYSTEM


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, env={"LANG": "C", "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})
    if proc.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def claim_nccl_target() -> None:
    """Make sure /etc/nccl.conf exists: `ip netns exec` can only bind a
    namespace's own /etc/netns/NAME/nccl.conf over an existing file."""
    if not os.path.exists(NCCL):
        open(NCCL_MARKER, "a").close()  # first, so a crash leaves a claim, not an orphan file
        open(NCCL, "a").close()


def release_nccl_target() -> bool:
    """Remove /etc/nccl.conf if a lab created it, it is still empty and no
    namespace binds over it any more (call after removing /etc/netns/NAME).
    Without the last check, a lab going down would take the file from under
    a lab still up, and `ip netns exec` there would write the host's file."""
    if not os.path.exists(NCCL_MARKER):
        return False
    try:
        users = [ns for ns in os.listdir("/etc/netns") if os.path.exists(f"/etc/netns/{ns}/nccl.conf")]
    except FileNotFoundError:
        users = []
    if users:
        return False
    os.unlink(NCCL_MARKER)
    if os.path.exists(NCCL) and os.path.getsize(NCCL) == 0:
        os.unlink(NCCL)
        return True
    return False


def status() -> dict:
    present = [ns for ns in NAMESPACES if os.path.exists(f"/run/netns/{ns}")]
    return {"namespaces": present, "interface": IFNAME, "addresses": dict(zip(NAMESPACES, ADDRESSES))}


def up() -> dict:
    if status()["namespaces"]:
        raise LabError("the lab is already up (or left over): run `nictune lab down` first")
    record = {"namespaces": []}
    try:
        for ns in NAMESPACES:
            _ip("netns", "add", ns)
            record["namespaces"].append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        a, b = NAMESPACES
        _ip("link", "add", "ntlab-tmp1", "netns", a, "type", "veth", "peer", "name", "ntlab-tmp2", "netns", b)
        for ns, tmp, addr in zip(NAMESPACES, ("ntlab-tmp1", "ntlab-tmp2"), ADDRESSES):
            _ip("-n", ns, "link", "set", tmp, "name", IFNAME)
            _ip("-n", ns, "addr", "add", addr, "dev", IFNAME)
            _ip("-n", ns, "link", "set", IFNAME, "up")
        claim_nccl_target()
        for ns in NAMESPACES:
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            open(f"/etc/netns/{ns}/nccl.conf", "a").close()
    except BaseException:
        _teardown(record)
        raise
    with open(RECORD, "w") as f:
        json.dump(record, f)
    return status()


def down(state_dir: str = DEFAULT_STATE_DIR) -> dict:
    try:
        with open(RECORD) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {"namespaces": list(NAMESPACES)}
    removed = _teardown(record, state_dir)
    return {"removed": removed}


def _teardown(record: dict, state_dir: str = DEFAULT_STATE_DIR) -> list:
    removed = []
    for ns in record.get("namespaces", []):
        if ns not in NAMESPACES:
            continue
        if os.path.exists(f"/run/netns/{ns}"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            removed.append(ns)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        shutil.rmtree(os.path.join(state_dir, "netns", ns), ignore_errors=True)
    release_nccl_target()
    if os.path.exists(RECORD):
        os.unlink(RECORD)
    return removed
