"""What the resident agent's LLDP listener costs: idle CPU and RSS.

    sudo .venv/bin/python bench/bench_lldp_listener.py [--rails 8] [--seconds 30] [--rounds 3]

A namespace with RAILS veth rails (their peers in a second namespace, the
"switches").  The resident agent (`nictune agent run --netns`, --interval
3600 so that no poll verify runs in the window) keeps a committed profile
of those rails, in two forms taking turns each round:

  without  the rails' entry has no switch: section: no listener
  with     the same entry with switch: {lldp: optional}: an AF_PACKET
           socket per rail, the listener's modules imported

For each, after the agent settled (its start verify done): CPU time
(utime + stime, /proc/PID/stat) over SECONDS of idle wire, and VmRSS.
Then, with the listener, the cost of frames: a frame every second on every
rail (an LLDPDU of 9 TLVs sent from the switch side with a raw socket) --
a switch sends one every 30 s, so this is 30x the real rate.

Prints a table and the medians; exit 0 even when the listener costs more
than it should (a bench, not a test), 1 when it could not run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from nictune.host.facts import lldp  # noqa: E402
from _util import RailLab, cpu_seconds, rss_kib, start_resident, stop_resident  # noqa: E402

REPRODUCE = "sudo .venv/bin/python bench/bench_lldp_listener.py --rails 8 --seconds 30 --rounds 3"


def profile(rails: int, with_switch: bool) -> str:
    switch = "\n    switch: {lldp: optional}" if with_switch else ""
    return (f"nictune: 1\ninterfaces:\n  rails:\n    match: {{name: \"rail*\"}}\n    mtu: 9000{switch}\n")


def send_frames(lab: RailLab, stop: threading.Event) -> None:
    """A frame a second on every rail, from the switch namespace."""
    frame = lldp.encode(lldp.Neighbour(
        chassis_id="0c:42:a1:00:00:01", chassis_subtype="mac", port_id="swp1", port_subtype="interface-name",
        ttl=120, port_description="to host", system_name="leaf01", max_frame_size=9216,
        ets=lldp.EtsTlv((0,) * 8, (100,) + (0,) * 7, ("ets",) + ("strict",) * 7),
        pfc=lldp.PfcTlv((3,), False, False, 8), apps=(lldp.AppEntry(5, 26, 3),)))
    code = ("import socket, sys, time\n"
            f"frame = bytes.fromhex({frame.hex()!r})\n"
            f"socks = [socket.socket(socket.AF_PACKET, socket.SOCK_RAW) for _ in range({lab.rails})]\n"
            f"for i, s in enumerate(socks): s.bind((f'swp{{i}}', 0))\n"
            "while True:\n    [s.send(frame) for s in socks]\n    time.sleep(1)\n")
    proc = subprocess.Popen(["ip", "netns", "exec", lab.switch, sys.executable, "-c", code])
    stop.wait()
    proc.terminate()
    proc.wait(5)


def measure(lab: RailLab, state: str, with_switch: bool, seconds: float, frames: bool = False) -> dict:
    agent = start_resident(lab, state, profile(lab.rails, with_switch), os.path.join(os.path.dirname(HERE), "src"),
                           "--interval", "3600", "--metrics-address", "")
    stop = threading.Event()
    sender = threading.Thread(target=send_frames, args=(lab, stop)) if frames else None
    try:
        time.sleep(2)
        if sender:
            sender.start()
            time.sleep(2)
        pid = agent.pid
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = cpu_seconds(pid), time.monotonic()
        sockets = sum(1 for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"))
        return {"cpu_ms_per_min": (cpu1 - cpu0) / (t1 - t0) * 60_000, "rss_kib": rss_kib(pid),
                "sockets": sockets}
    finally:
        stop.set()
        if sender:
            sender.join(10)
        stop_resident(agent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rails", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_lldp_listener: run as root (network namespaces)", file=sys.stderr)
        return 1
    lab = RailLab(args.rails, str(os.getpid() % 10000))
    rows = {"without": [], "with": [], "with, 1 frame/s/rail": []}
    try:
        for r in range(args.rounds):
            for name, switch, frames in (("without", False, False), ("with", True, False),
                                         ("with, 1 frame/s/rail", True, True)):
                with tempfile.TemporaryDirectory(prefix="nt-lldp-bench-") as state:
                    rows[name].append(measure(lab, state, switch, args.seconds, frames))
                print(f"round {r + 1} {name}: {rows[name][-1]}", flush=True)
    finally:
        lab.close()
    print(f"\nresident agent, {args.rails} rails, {args.seconds:g} s idle windows, "
          f"median of {args.rounds} rounds:")
    print(f"{'':24} {'CPU ms/min':>11} {'RSS KiB':>9} {'sockets':>8}")
    med = {}
    for name, runs in rows.items():
        med[name] = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        print(f"{name:24} {med[name]['cpu_ms_per_min']:11.1f} {med[name]['rss_kib']:9.0f} "
              f"{med[name]['sockets']:8.0f}")
    print(f"\nlistener: idle CPU delta {med['with']['cpu_ms_per_min'] - med['without']['cpu_ms_per_min']:+.1f} "
          f"ms/min, RSS delta {med['with']['rss_kib'] - med['without']['rss_kib']:+.0f} KiB "
          f"({args.rails} sockets); at 1 frame/s on each rail: "
          f"{med['with, 1 frame/s/rail']['cpu_ms_per_min']:.1f} ms/min")
    print(f"reproduce: {REPRODUCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
