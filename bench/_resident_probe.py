"""bench_resident.py's hands and stopwatch inside the host namespace.

    ip netns exec NS python bench/_resident_probe.py drift RAILS COUNT GAP
    ip netns exec NS python bench/_resident_probe.py recreate RAILS COUNT GAP SWITCH_NS

It listens to rtnetlink's link group (RTMGRP_LINK) itself, so each latency
starts at the netlink event that reported the change to anyone listening
(the resident agent hears the same one), not at the command that made it:

  drift     sets railN's MTU to 1500 (`ip link set`), COUNT times over the
            rails in turn; from the event showing 1500 to the read-back
            (/sys/class/net/railN/mtu, after the event showing 9000) that
            shows 9000 again;
  recreate  deletes railN and creates it again with the same name (its
            peer in SWITCH_NS); from the event of the new link to the
            read-back showing its MTU 9000 and rp_filter 2 again.

Prints one JSON line: {"latencies_ms": [...], "missed": N}.  Stdlib only:
its own cost stays out of the agent's figures.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import subprocess
import sys
import time

RTMGRP_LINK = 0x1
RTM_NEWLINK = 16
IFLA_IFNAME, IFLA_MTU = 3, 4
HDR = struct.Struct("=IHHII")
IFINFO = struct.Struct("=BxHiII")
TIMEOUT = 5.0


def links(data: bytes) -> list:
    """(name, ifindex, mtu) of each RTM_NEWLINK in data."""
    out, off = [], 0
    while off + HDR.size <= len(data):
        length, kind = HDR.unpack_from(data, off)[:2]
        if length < HDR.size:
            break
        if kind == RTM_NEWLINK:
            index = IFINFO.unpack_from(data, off + HDR.size)[2]
            attrs, name, mtu = off + HDR.size + IFINFO.size, None, None
            while attrs + 4 <= off + length:
                alen, atype = struct.unpack_from("=HH", data, attrs)
                if alen < 4:
                    break
                if atype == IFLA_IFNAME:
                    name = data[attrs + 4:attrs + alen].rstrip(b"\0").decode()
                elif atype == IFLA_MTU:
                    mtu = struct.unpack_from("=I", data, attrs + 4)[0]
                attrs += (alen + 3) & ~3
            out.append((name, index, mtu))
        off += (length + 3) & ~3
    return out


class Events:
    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind((0, RTMGRP_LINK))

    def wait(self, test, deadline: float):
        """The monotonic time an event passing test(name, index, mtu) arrived, or None."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            data = self.sock.recv(1 << 16)
            now = time.monotonic()
            if any(test(*link) for link in links(data)):
                return now


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def settled(check, deadline: float) -> bool:
    """Poll check() every millisecond until it is true (or the deadline)."""
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def drift(rails: int, count: int, gap: float) -> dict:
    events, took, missed = Events(), [], 0
    for n in range(count):
        rail = f"rail{n % rails}"
        subprocess.run(["ip", "link", "set", rail, "mtu", "1500"], check=True)
        start = events.wait(lambda name, _i, mtu: name == rail and mtu == 1500, time.monotonic() + TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        back = events.wait(lambda name, _i, mtu: name == rail and mtu == 9000, deadline)
        if start is None or back is None or not settled(
                lambda: read(f"/sys/class/net/{rail}/mtu") == "9000", deadline):
            missed += 1
            subprocess.run(["ip", "link", "set", rail, "mtu", "9000"], check=True)
        else:
            took.append((time.monotonic() - start) * 1000)
        time.sleep(gap)
    return {"latencies_ms": took, "missed": missed}


def recreate(rails: int, count: int, gap: float, switch: str) -> dict:
    events, took, missed = Events(), [], 0
    for n in range(count):
        rail, peer = f"rail{n % rails}", f"swp{n % rails}"
        old = int(read(f"/sys/class/net/{rail}/ifindex") or 0)
        subprocess.run(["ip", "link", "del", rail], check=True)
        subprocess.run(["ip", "link", "add", rail, "type", "veth", "peer", "name", peer,
                        "netns", switch], check=True)
        start = events.wait(lambda name, index, _m: name == rail and index != old,
                            time.monotonic() + TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        back = start and events.wait(lambda name, _i, mtu: name == rail and mtu == 9000, deadline)
        if back is None or not settled(
                lambda: (read(f"/sys/class/net/{rail}/mtu") == "9000"
                         and read(f"/proc/sys/net/ipv4/conf/{rail}/rp_filter") == "2"), deadline):
            missed += 1
        else:
            took.append((time.monotonic() - start) * 1000)
        subprocess.run(["ip", "-n", switch, "link", "set", peer, "up"], check=True)
        subprocess.run(["ip", "link", "set", rail, "up"], check=True)
        time.sleep(gap)
    return {"latencies_ms": took, "missed": missed}


if __name__ == "__main__":
    what, rails, count, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    result = drift(rails, count, gap) if what == "drift" else recreate(rails, count, gap, sys.argv[5])
    print(json.dumps(result))
