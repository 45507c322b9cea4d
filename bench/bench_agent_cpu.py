"""The agent's own CPU on a host, per plan and per apply, in parts.

Runs the SSH path's very command (control/remote/agentzip.py: the bootstrap
with the cached agent, the request on stdin, the report back) in a network
namespace of this machine with a veth rail0, without SSH, and takes the CPU
the process used from the kernel (wait4's rusage: user + system), so that
only the host side's own cost is counted.  Each round, interleaved:

- python: `python3 -I -S -c pass`, the interpreter's start alone;
- check: the bootstrap up to its "have" (the cached agent's check), the
  agent not started;
- imports: the check, then importing every module an apply loads (found by
  a first apply), nothing run: what is left of plan and apply is their work;
- plan: a plan of the profile on a drifted rail0;
- apply: an apply of it, from the same drifted state (put back, uncounted,
  before each: the apply writes, verifies by reading back and journals).

    sudo .venv/bin/python bench/bench_agent_cpu.py [--rounds 20]

Prints the median and the 25th/75th percentiles of each, in ms of CPU.
`--against SRC` also runs the agent of another checkout (its src/ directory:
its bootstrap and its archive, built there), interleaved with this one, each
with its own state directory: "before" and "after" in one run, e.g.
`git worktree add /tmp/before main` then `--against /tmp/before/src`.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile

from nictune.control.remote import agentzip
from nictune.control.remote.request import build_request
from nictune.profile.loader import load_profile, load_profile_text

# The eleven settings a fleet change touches (bench_fleet.py --apply's): six
# sysctls, rail0's MTU and four offload features.
PROFILE = """\
nictune: 1
on_unsupported: fail
host:
  sysctl:
    net.ipv4.tcp_ecn: 1
    net.ipv4.tcp_mtu_probing: 1
    net.ipv4.tcp_slow_start_after_idle: 0
interfaces:
  rail0:
    match: {driver: veth, name: rail0}
    mtu: 9000
    features: {gro: true, gso: true, rx: true, rx-udp-gro-forwarding: true}
    sysctl:
      ipv4.arp_ignore: 1
      ipv4.arp_announce: 2
      ipv4.rp_filter: 2
"""
# Where each apply starts from: every key of PROFILE away from its value.
DRIFT = [["sysctl", "-qw", "net.ipv4.tcp_ecn=2", "net.ipv4.tcp_mtu_probing=0",
          "net.ipv4.tcp_slow_start_after_idle=1", "net.ipv4.conf.rail0.arp_ignore=0",
          "net.ipv4.conf.rail0.arp_announce=0", "net.ipv4.conf.rail0.rp_filter=0"],
         ["ip", "link", "set", "rail0", "mtu", "1500"],
         ["ethtool", "-K", "rail0", "gro", "off", "gso", "off", "rx-udp-gro-forwarding", "off"]]


def cpu_ms(argv: list, stdin: bytes = b"", exchange=None) -> tuple:
    """(CPU ms of the process, its stdout); `exchange(proc)` talks to it instead."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if exchange is not None:
        out = exchange(proc)
    else:  # not communicate(): it reaps the process, and its usage with it
        proc.stdin.write(stdin)
        proc.stdin.close()
        out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (usage.ru_utime + usage.ru_stime) * 1000, out


def agent_run(ns: str, bundle, state: str, request: dict) -> tuple:
    argv = ["ip", "netns", "exec", ns, sys.executable, "-I", "-S", "-c", bundle.bootstrap, bundle.sha256, state]

    def exchange(proc):
        answer = proc.stdout.readline()
        if answer.startswith(b"need"):
            proc.stdin.write(b"%d\n" % len(bundle.data) + bundle.data)
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.close()
        return answer + proc.stdout.read()

    return cpu_ms(argv, exchange=exchange)


def checked_only(bootstrap: str) -> str:
    """The bootstrap up to its answer: the agent is not started."""
    head, sep, _ = bootstrap.partition("os.umask(mask)\n")
    assert sep, "the bootstrap changed: no os.umask(mask) line"
    return head + "sys.exit(0)\n"


def loaded_modules(ns: str, bundle, state: str, request: dict) -> list:
    """The modules a run of the agent loads beyond the interpreter's start."""
    dump = "code = main()\nsys.stderr.write(' '.join(sorted(sys.modules))); sys.stderr.flush()\n"
    argv = ["ip", "netns", "exec", ns, sys.executable, "-I", "-S", "-c",
            bundle.bootstrap.replace("code = main()\n", dump), bundle.sha256, state]
    ran = subprocess.run(argv, input=json.dumps(request).encode() + b"\n", capture_output=True, check=True)
    start = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; print(' '.join(sys.modules))"],
                           capture_output=True, text=True, check=True).stdout.split()
    return [m for m in ran.stderr.decode().split() if m not in start and m != "__main__"]


def importing(bootstrap: str, modules: list) -> str:
    """The bootstrap's check, then `modules` imported from the cache, nothing run."""
    return (checked_only(bootstrap).replace("sys.exit(0)\n", "") + "sys.dont_write_bytecode = True\n"
            "sys.path.insert(0, home)\n" + "".join(f"import {m}\n" for m in modules) + "os._exit(0)\n")


class Bundle:
    """An agent as the SSH path sends it: the archive and its bootstrap."""

    def __init__(self, data: bytes, sha256: str, bootstrap: str):
        self.data, self.sha256, self.bootstrap = data, sha256, bootstrap


def bundle_of(src) -> Bundle:
    """This checkout's agent, or that of the checkout whose src/ is `src`."""
    if src is None:
        built = agentzip.build()
        return Bundle(built.data, built.sha256, agentzip.BOOTSTRAP)
    code = ("import json, sys, base64; from nictune.control.remote import agentzip as a; b = a.build(); "
            "print(json.dumps([base64.b64encode(b.data).decode(), b.sha256, a.BOOTSTRAP]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.path.abspath(src)}).stdout
    data, sha, bootstrap = json.loads(out)
    return Bundle(base64.b64decode(data), sha, bootstrap)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--profile", help="another profile (its drift: DRIFT's commands)")
    ap.add_argument("--against", metavar="SRC", help="another checkout's src/ directory, run interleaved")
    args = ap.parse_args()
    profile = load_profile(args.profile) if args.profile else load_profile_text(PROFILE, "agent-cpu.yaml")
    agents = {"": bundle_of(None)}
    if args.against:
        agents = {"before ": bundle_of(args.against), "after ": agents[""]}
    ns = "nt" + secrets.token_hex(3)
    scratch = tempfile.mkdtemp(prefix="nt-agent-cpu-")
    # A state directory per bootstrap: each keeps the cache it sealed.
    states = {tag: os.path.join(scratch, tag.strip() or "state") for tag in agents}
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        run = lambda argv: subprocess.run(["ip", "netns", "exec", ns, *argv], check=True,  # noqa: E731
                                          capture_output=True)
        run(["ip", "link", "add", "rail0", "type", "veth", "peer", "name", "rail1"])
        run(["ip", "link", "set", "rail0", "up"])
        got: dict = {}
        for tag, agent in agents.items():  # unpack once: every round is a warm "have"
            agent_run(ns, agent, states[tag], build_request("plan", profile))
        modules = {}
        for tag, agent in agents.items():
            for cmd in DRIFT:
                run(cmd)
            modules[tag] = loaded_modules(ns, agent, states[tag], build_request("apply", profile))
        for _ in range(args.rounds):
            got.setdefault("python", []).append(cpu_ms(["ip", "netns", "exec", ns, sys.executable,
                                                        "-I", "-S", "-c", "pass"])[0])
            for tag, agent in agents.items():
                argv = ["ip", "netns", "exec", ns, sys.executable, "-I", "-S", "-c",
                        checked_only(agent.bootstrap), agent.sha256, states[tag]]
                got.setdefault(tag + "check", []).append(cpu_ms(argv)[0])
                argv[-3] = importing(agent.bootstrap, modules[tag])
                got.setdefault(tag + "imports", []).append(cpu_ms(argv)[0])
                for command in ("plan", "apply"):
                    for cmd in DRIFT:
                        run(cmd)
                    ms, out = agent_run(ns, agent, states[tag], build_request(command, profile))
                    assert out.startswith(b"have\n"), out[:200]
                    report = json.loads(out.splitlines()[1])
                    assert report["ok"] and report["exit_code"] == (2 if command == "plan" else 0), report
                    got.setdefault(tag + command, []).append(ms)
        for what, values in got.items():
            q = statistics.quantiles(values, n=4)
            print(f"{what:12s} median {statistics.median(values):6.1f} ms CPU  "
                  f"(p25 {q[0]:.1f}, p75 {q[2]:.1f}, {len(values)} runs)")
        print(f"load average {os.getloadavg()[0]:.2f}; an apply loads "
              + ", ".join(f"{tag}{len(m)}" for tag, m in modules.items()) + " modules")
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        subprocess.run(["rm", "-rf", scratch], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
