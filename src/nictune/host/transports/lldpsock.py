"""LLDP frames as they arrive on the rails: AF_PACKET sockets, one per rail.

Each socket is bound to the LLDP ethertype (0x88cc) on its rail and joins
the nearest-bridge group address 01:80:c2:00:00:0e (PACKET_ADD_MEMBERSHIP,
PACKET_MR_MULTICAST): the NIC passes that multicast up without promiscuous
mode.  The kernel queues matching frames on the socket; the owner select()s
on them, so a listener costs nothing between frames (a switch sends one
every 30 s).  Frames the host itself sends (an lldpd on the host) come back
as PACKET_OUTGOING and are dropped.

Kept per rail: the last frame of each LLDP agent (chassis id + port id, the
MSAP of 802.1AB), at most AGENTS_PER_RAIL, with its arrival time.  What a
frame says is decoded where it is used (facts/lldp.py); here a frame is only
parsed far enough to name its MSAP, and one that does not parse is counted
and dropped.  Every frame is bounded: a read takes at most MAX_FRAME + 1
bytes and a wake reads at most READS_PER_WAKE frames per rail, so a flood
cannot hold the agent.

Used by the resident agent (host/resident/daemon.py: listens for as long as
it runs and keeps STORE_FILE in its state directory, which a verify reads)
and by `audit --lldp-wait` (wait_for_frames: a bounded wait when asked).
"""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import struct
import time

from nictune.host.facts import lldp

SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_MULTICAST = 0
PACKET_OUTGOING = 4
AGENTS_PER_RAIL = 4   # LLDP agents kept per rail: the newest win
READS_PER_WAKE = 16
STORE_FILE = "lldp.json"
STORE_FORMAT = 1
MAX_STORE = 1 << 20   # bytes: a store larger than this is not ours


def open_rail(ifname: str) -> socket.socket:
    """A non-blocking AF_PACKET socket receiving LLDP frames on ifname."""
    index = socket.if_nametoindex(ifname)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                         socket.htons(lldp.ETH_P_LLDP))
    try:
        sock.bind((ifname, lldp.ETH_P_LLDP))
        mreq = struct.pack("iHH8s", index, PACKET_MR_MULTICAST, 6, lldp.NEAREST_BRIDGE)
        sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
    except OSError:
        sock.close()
        raise
    return sock


def msap(frame: bytes) -> bytes:
    """The frame's chassis id and port id TLVs, raw: who sent it.  Raises
    LldpError when the frame is not an LLDPDU that starts as one must."""
    neighbour = lldp.decode(frame)
    return f"{neighbour.chassis_subtype}/{neighbour.chassis_id}/{neighbour.port_subtype}/{neighbour.port_id}".encode()


class RailListener:
    """The LLDP sockets of a set of rails and the last frames heard on them."""

    def __init__(self, log=None):
        self.socks: dict = {}    # ifname -> socket
        self.frames: dict = {}   # ifname -> {msap: (unix time, frame bytes)}
        self.errors: dict = {}   # ifname -> why it has no socket
        self.refused = 0         # frames dropped as not LLDP
        self.log = log or (lambda line: None)

    def watch(self, ifnames) -> None:
        """Listen on exactly these rails (opening and closing sockets)."""
        wanted = list(dict.fromkeys(ifnames))
        for name in [n for n in self.socks if n not in wanted]:
            self.socks.pop(name).close()
            self.frames.pop(name, None)
        for name in wanted:
            if name in self.socks:
                continue
            try:
                self.socks[name] = open_rail(name)
                self.errors.pop(name, None)
            except OSError as e:
                self.errors[name] = str(e)
                self.log(f"no LLDP listener on {name}: {e}")

    def sockets(self) -> list:
        return list(self.socks.values())

    def read(self, ready) -> bool:
        """Take the frames waiting on the ready sockets; True when any was kept."""
        kept = False
        for name, sock in list(self.socks.items()):
            if sock in ready:
                kept = self._drain(name, sock) or kept
        return kept

    def _drain(self, name: str, sock: socket.socket) -> bool:
        kept = False
        for _ in range(READS_PER_WAKE):
            try:
                frame, address = sock.recvfrom(lldp.MAX_FRAME + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # the link went away: the next watch() reopens
                self.log(f"LLDP listener on {name}: {e}")
                break
            if len(address) > 2 and address[2] == PACKET_OUTGOING:
                continue
            kept = self.keep(name, frame, time.time()) or kept
        return kept

    def keep(self, name: str, frame: bytes, when: float) -> bool:
        try:
            who = msap(frame)
        except lldp.LldpError:
            self.refused += 1
            return False
        agents = self.frames.setdefault(name, {})
        agents.pop(who, None)
        agents[who] = (when, frame)
        while len(agents) > AGENTS_PER_RAIL:
            agents.pop(next(iter(agents)))  # the oldest
        return True

    def stored(self) -> dict:
        """The frames as STORE_FILE holds them."""
        return {"nictune_lldp": STORE_FORMAT, "rails": {
            name: [{"received": when, "frame": frame.hex()}
                   for when, frame in sorted(agents.values(), key=lambda a: -a[0])]
            for name, agents in self.frames.items()}, "listening": sorted(self.socks),
            "errors": dict(self.errors)}

    def close(self) -> None:
        self.watch([])


def wait_for_frames(ifnames, seconds: float, listener: RailListener = None) -> dict:
    """Listen on ifnames for `seconds` (every LLDP agent heard in that time
    counts: a switch port may speak through more than one); the stored()
    form of what arrived.  The sockets are closed on return."""
    listener = listener or RailListener()
    listener.watch(ifnames)
    deadline = time.monotonic() + max(0.0, seconds)
    try:
        while listener.socks:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(listener.sockets(), [], [], left)
            listener.read(ready)
        return listener.stored()
    finally:
        listener.close()


def load_store(path: str) -> dict:
    """STORE_FILE's rails ({ifname: [{"received", "frame"}]}), {} when there
    is none; a file that is not ours (too big, not the format) reads as {}."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_STORE:
            return {}
        data = os.read(fd, MAX_STORE + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(doc, dict) or doc.get("nictune_lldp") != STORE_FORMAT or not isinstance(doc.get("rails"), dict):
        return {}
    return doc["rails"]
