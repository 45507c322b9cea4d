#!/usr/bin/env python3
"""Benchmark: `nictune plan` / `apply` of a full profile on 1 and 16 veth interfaces.

Every figure is a whole process, run the way a user runs it:

    nictune plan PROFILE --netns NS --state-dir DIR --json

which starts the controller, which starts the agent under `ip netns exec`.
Per interface count N the bench times plan (changes pending), apply, apply
again (nothing to do), plan again and rollback (which puts the namespace back
so every repetition starts from the same state), and reports median and min
wall time, the agent's own time and the peak RSS of the process tree.  It
then times start-up and imports, splits a plan into its processes' lifetimes
and those into start-up, imports and work, and counts the netlink messages
the agent sends (under strace) to show that reads are one dump per family
whatever N is.

Everything it creates (namespaces ntbench<hex> and ntbench<hex>p, a temp
dir holding the profile, NCCL file, state dir and bytecode cache) is removed
in a `finally`, also on Ctrl-C.  Needs root.  See bench/README.md.

With --baseline DIR (another checkout with its own .venv, made by its
scripts/setup), DIR's nictune runs the same sequences too, its turn and this
tree's alternating round by round, each with its own state dir, and a
before/after table follows section 1.

    sudo .venv/bin/python bench/bench_plan_apply.py [--repeat R] [--json FILE] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import BenchError, Commands, med, table

# The CLI next to the Python running us: `.venv/bin/python bench/...` in a
# fresh clone, /tmp/venv/bin/python on a dev box.  Not `shutil.which`, which
# could pick up another install.
PY = sys.executable
NICTUNE = str(Path(PY).parent / "nictune")
HERE = Path(__file__).resolve().parent
CURRENT, BASELINE = "current", "baseline"  # --baseline: the other checkout's label
SIZES = (1, 16)
STEPS = ("plan", "apply", "apply-again", "plan-again", "rollback")
IMPORT_RUNS = 7  # start-up timings are short and noisy: more runs than --repeat
ENV = dict(os.environ, LANG="C", LC_ALL="C")
# sudo's secure_path normally has these, but a trimmed PATH must still find `ip`.
ENV["PATH"] = ENV.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin"
# Measure what a user's second run costs: bytecode cached.  Some shells set
# PYTHONDONTWRITEBYTECODE, which makes every run recompile nictune's modules
# (no __pycache__ in a fresh clone); main() points PYTHONPYCACHEPREFIX at the
# temp dir instead, so the cache is ours and the clone stays untouched.
DONTWRITE = ENV.pop("PYTHONDONTWRITEBYTECODE", None)
for var in ("PYTHONPROFILEIMPORTTIME", "PYTHONPYCACHEPREFIX", "NICTUNE_STATE_DIR", "NICTUNE_DEBUG"):
    ENV.pop(var, None)

AGENT_MODULES = ("nictune.host.agent", "nictune.host.transaction.engine", "nictune.host.transports.netlink.rtnl",
                 "nictune.host.transports.netlink.ethtool", "nictune.host.transports.netlink.drvinfo")

TARGET_PLAN_S = 1.0
TARGET_APPLY_S = 2.0
NOOP_APPLY_SLACK = 1.10  # "as fast as plan": within 10 %, round by round (see report())

# Peak memory: a child's ru_maxrss covers the children it waited for, so
# wait4() on the CLI gives the max RSS over controller, `ip` and agent.
# getrusage(RUSAGE_CHILDREN) in the bench itself cannot be used per run (it
# is a running max), hence this tiny wrapper, one per measured command.  It
# runs with -S (no site) because exec() carries the parent's RSS high-water
# mark over into the child's maxrss: the wrapper's own RSS is the floor of
# what it can report, so keep it small (it is printed as "floor").
WRAPPER = r"""
import os, sys, time
out, argv = sys.argv[1], sys.argv[2:]
# VmHWM, not getrusage(RUSAGE_SELF): the latter also holds the bench's RSS,
# carried over by our own exec; only this process's pages reach the child.
with open("/proc/self/status") as f:
    floor = [int(l.split()[1]) for l in f if l.startswith("VmHWM:")][0]
t0 = time.perf_counter()
pid = os.posix_spawnp(argv[0], argv, os.environ)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(out, "w") as f:
    f.write("%r %d %d %d" % (wall, ru.ru_maxrss, os.waitstatus_to_exitcode(status), floor))
"""


# --- running things ----------------------------------------------------------


# Each command in a process group of its own, so that an interrupted bench
# (Ctrl-C, SIGTERM) can stop the whole tree (wrapper, controller, `ip netns
# exec`, agent) before it deletes the namespaces under them.
_commands = Commands(ENV)
spawn, must = _commands.spawn, _commands.must


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, stat: str):
        wall, rss, rc, floor = stat.split()
        self.wall = float(wall)
        self.rss_kb = int(rss)
        self.rc = int(rc)
        self.floor_kb = int(floor)
        self.stdout, self.stderr = proc.stdout, proc.stderr

    def report(self) -> dict:
        """The agent's host report out of the CLI's --json envelope."""
        try:
            env = json.loads(self.stdout)
        except ValueError:
            raise BenchError(f"not a JSON report (exit {self.rc}): {self.stderr.strip()[-300:]}")
        if not env.get("hosts"):
            raise BenchError(f"no host report: {env.get('error')}")
        return env["hosts"][0]


def measured(argv: list, scratch: Path, stdin: str | None = None) -> Run:
    stat = scratch / "wrapper.stat"
    proc = spawn([PY, "-S", "-c", WRAPPER, str(stat), *argv], stdin)
    if proc.returncode != 0 or not stat.exists():
        raise BenchError(f"wrapper failed for {argv}: {proc.stderr.strip()[-300:]}")
    run = Run(proc, stat.read_text())
    stat.unlink()
    return run


# --- the lab -----------------------------------------------------------------


class Lab:
    """NS holds the N measured veth ends (ntb0..), NSp their peers.

    Peers live in a second namespace so NS contains only what the profile
    matches (plus lo).  Explicit queue counts make `channels` settable
    whatever the CPU count (veth's default maximum is the number of CPUs).
    No addresses are needed.
    """

    def __init__(self):
        tag = secrets.token_hex(3)
        self.ns, self.peer_ns = f"ntbench{tag}", f"ntbench{tag}p"
        self.created: list = []
        self.count = 0

    def up(self) -> None:
        for ns in (self.ns, self.peer_ns):
            must(["ip", "netns", "add", ns])
            self.created.append(ns)

    def grow(self, n: int) -> None:
        lines = [f"link add ntb{i} netns {self.ns} numtxqueues 4 numrxqueues 4 type veth "
                 f"peer name ntb{i} netns {self.peer_ns} numtxqueues 4 numrxqueues 4\n"
                 for i in range(self.count, n)]
        if lines:
            must(["ip", "-batch", "-"], "".join(lines))
        self.count = n

    def down(self) -> list:
        """Delete what we made; a veth pair dies with either namespace."""
        problems = []
        for ns in reversed(self.created):
            proc = spawn(["ip", "netns", "del", ns])
            if proc.returncode != 0 and os.path.exists(f"/run/netns/{ns}"):
                problems.append(f"ip netns del {ns}: {proc.stderr.strip()}")
        self.created = []
        return problems


def write_profile(path: Path, nccl: Path) -> int:
    """The full profile; returns the number of settings per interface."""
    ipv6 = os.path.isdir("/proc/sys/net/ipv6/conf")
    path.write_text(f"""\
# Written by bench/bench_plan_apply.py: every setting veth can take.
nictune: 1
on_unsupported: fail
host:
  sysctl:                     # per-namespace keys only: global ones are read-only in a netns
    net.ipv4.tcp_ecn: 1
    net.ipv4.tcp_rmem: [4096, 262144, 134217728]
    net.ipv4.tcp_wmem: [4096, 262144, 134217728]
    net.ipv4.tcp_mtu_probing: 1
    net.ipv4.tcp_slow_start_after_idle: 0
    net.ipv4.tcp_no_metrics_save: 1
  nccl:
    path: {nccl}
    allowed_dirs: [{nccl.parent}]   # a temporary directory: not one nictune writes by default
    env: {{NCCL_DEBUG: WARN, NCCL_IB_TIMEOUT: 22, NCCL_IB_RETRY_CNT: 7, NCCL_SOCKET_IFNAME: "ntb"}}
interfaces:
  bench:
    match: {{name: "ntb*"}}
    mtu: 9000
    txqueuelen: 10000
    state: up
    features:
      gro: true
      rx-udp-gro-forwarding: true
      tso: false
      tx-udp-segmentation: false
      rx-gro-list: false      # already off: one key on the "as wanted" path
    channels: {{rx: 2, tx: 2}}
    sysctl:
      ipv4.arp_ignore: 1
      ipv4.arp_announce: 2
      ipv4.rp_filter: 2
{"      ipv6.accept_ra: 0" if ipv6 else ""}
""")
    return 3 + 5 + 2 + 3 + (1 if ipv6 else 0)


# --- plan / apply sequences -----------------------------------------------------


def cli(step: str, lab: Lab, profile: Path, state: Path, nictune: str = NICTUNE) -> list:
    command = {"apply-again": "apply", "plan-again": "plan"}.get(step, step)
    argv = [nictune, command]
    if command != "rollback":
        argv.append(str(profile))
    return argv + ["--netns", lab.ns, "--state-dir", str(state), "--json"]


def check_step(step: str, host: dict, rc: int, seen: dict) -> str | None:
    """What is wrong with this step's outcome, if anything.

    The sequence must really do what its name says, or the timings mean
    nothing: plan finds changes, apply makes them all, the second apply and
    plan find none, rollback restores all of them.
    """
    s = host.get("summary", {})
    if host.get("error"):
        return f"error {host['error']}"
    if step == "plan":
        seen["pending"] = s.get("pending", 0)
        return None if rc == 2 and s.get("pending") else f"exit {rc}, {s}: expected changes pending"
    if step == "apply":
        return None if rc == 0 and s.get("applied") == seen.get("pending") else \
            f"exit {rc}, {s}: expected {seen.get('pending')} applied"
    if step in ("apply-again", "plan-again"):
        return None if rc == 0 and not s.get("applied") and not s.get("pending") else \
            f"exit {rc}, {s}: expected nothing to do"
    if step == "rollback":
        return None if rc == 0 and s.get("reverted") == seen.get("pending") else \
            f"exit {rc}, {s}: expected {seen.get('pending')} reverted"
    return None


def run_sequences(n: int, lab: Lab, profile: Path, scratch: Path, repeat: int, problems: list,
                  versions: dict) -> dict:
    """versions: {label: (nictune CLI, its state dir)}.  Each round runs the
    whole sequence with each version in turn, the order swapped every round,
    so that the machine's drifts hit them alike; rollback ends each version's
    turn with the namespace as it found it.  {label: results}."""
    out = {label: {step: {"wall": [], "agent": [], "rss_kb": [], "summary": None} for step in STEPS}
           for label in versions}
    floor = 0
    labels = list(versions)
    # One unmeasured round first: fills the page cache and the bytecode
    # cache (the first run compiles every module it imports).
    for rnd in range(repeat + 1):
        for label in (labels if rnd % 2 == 0 else labels[::-1]):
            nictune, state = versions[label]
            seen: dict = {}
            for step in STEPS:
                run = measured(cli(step, lab, profile, state, nictune), scratch)
                host = run.report()
                bad = check_step(step, host, run.rc, seen)
                if bad:
                    problems.append(f"{'' if label == CURRENT else label + ' '}N={n} round {rnd} {step}: {bad}")
                if rnd == 0:
                    continue
                r = out[label][step]
                r["wall"].append(run.wall)
                r["agent"].append(host.get("seconds", float("nan")))
                r["rss_kb"].append(run.rss_kb)
                r["summary"] = host.get("summary")
                floor = max(floor, run.floor_kb)
    for results in out.values():
        results["_floor_kb"] = floor
    return out


def commit_of(checkout: Path) -> str:
    """Short commit of a checkout, "+dirty" if its tracked files changed."""
    head = spawn(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"]).stdout.strip() or "?"
    dirty = spawn(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    return head + ("+dirty" if dirty else "")


def report_baseline(fig: dict, seq: dict, base: dict) -> None:
    """Before/after, step by step: medians of the interleaved rounds."""
    print(f"\n1b. Baseline {fig['baseline']['dir']} ({fig['baseline']['commit']}) vs this tree "
          f"({fig['commit']}), interleaved round by round (medians; ratio = this tree / baseline)")
    rows = []
    for n in SIZES:
        for step in STEPS:
            b, c = base[n][step], seq[n][step]
            rows.append((step, n, ms(med(b["wall"])), ms(med(c["wall"])), f"{med(c['wall']) / med(b['wall']):.2f}x",
                         ms(min(b["wall"])), ms(min(c["wall"])), ms(med(b["agent"])), ms(med(c["agent"])),
                         mb(max(b["rss_kb"])), mb(max(c["rss_kb"]))))
    print(table(rows, ("step", "N", "before", "after", "ratio", "min before", "min after",
                       "agent.run before", "after", "peak RSS before", "after")))


# --- start-up and imports ---------------------------------------------------------


def startup(lab: Lab, scratch: Path, request: str, profile: Path, state: Path) -> list:
    """Start-up costs, each a whole process, timed round-robin so that
    machine noise hits all of them alike."""
    cmds = [
        ("pass", "python -c pass  (interpreter start)", [PY, "-c", "pass"], None),
        ("controller", "python -c 'import nictune.cli.app'  (controller)",
         [PY, "-c", "import nictune.cli.app"], None),
        # `python -m nictune.host.agent` loads nictune.host.agent and what it needs;
        # the engine, the knobs and the netlink modules load inside agent.run
        # (so within the report's `seconds`).
        ("agent-eager", "python -c 'import nictune.host.agent'  (agent, before agent.run)",
         [PY, "-c", "import nictune.host.agent"], None),
        ("agent-core", "python -c 'import nictune.host.agent, nictune.host.transaction.engine'",
         [PY, "-c", "import nictune.host.agent, nictune.host.transaction.engine"], None),
        ("agent", "  + nictune.host.transports.netlink.rtnl, .ethtool, .drvinfo  (all the agent uses)",
         [PY, "-c", "import " + ", ".join(AGENT_MODULES)], None),
        ("pyroute2", "python -c 'import pyroute2'  (for comparison)", [PY, "-c", "import pyroute2"], None),
        ("validate", "nictune validate PROFILE  (controller imports + CLI run + profile load; no agent)",
         [NICTUNE, "validate", str(profile)], None),
        ("nsexec", "ip netns exec NS python -c pass", ["ip", "netns", "exec", lab.ns, PY, "-c", "pass"], None),
        ("agent-alone", f"agent alone: ip netns exec NS python -m nictune.host.agent < plan request (N={lab.count})",
         ["ip", "netns", "exec", lab.ns, PY, "-m", "nictune.host.agent"], request),
        # The whole plan again, under the same load as the parts above.
        ("plan", f"nictune plan PROFILE --netns NS ...  (N={lab.count}, the whole thing)",
         cli("plan", lab, profile, state), None),
    ]
    out = [{"key": key, "label": label, "wall": [], "rss_kb": []} for key, label, _, _ in cmds]
    for _ in range(IMPORT_RUNS):
        for (key, label, argv, stdin), row in zip(cmds, out):
            run = measured(argv, scratch, stdin)
            if run.rc not in ((2,) if key == "plan" else (0,)):
                raise BenchError(f"{label}: exit {run.rc}: {(run.stderr.strip() or run.stdout.strip())[-1500:]}")
            row["wall"].append(run.wall)
            row["rss_kb"].append(run.rss_kb)
    return out


def agent_request(profile: Path, lab: Lab, state: Path) -> tuple:
    """The plan request the controller would send, built by nictune itself
    (in a fresh process, so it also times a cold profile load + schema check)."""
    code = (
        "import json, sys, time\n"
        "from nictune.profile.loader import load_profile\n"
        "from nictune.control.remote.request import build_request\n"
        "t0 = time.perf_counter()\n"
        "p = load_profile(sys.argv[1])\n"
        "t1 = time.perf_counter()\n"
        "req = dict(build_request('plan', p), host='netns:' + sys.argv[2], state_dir=sys.argv[3])\n"
        "print(json.dumps({'load_s': t1 - t0, 'request': req}))\n"
    )
    loads = []
    out = {}
    for _ in range(5):
        out = json.loads(must([PY, "-c", code, str(profile), lab.ns, str(state / "netns" / lab.ns)]))
        loads.append(out["load_s"])
    return json.dumps(out["request"]), loads


_IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


def importtime(stderr: str) -> list:
    """[(depth, self_us, cumulative_us, module)] from -X importtime output."""
    rows = []
    for line in stderr.splitlines():
        m = _IMPORTTIME.match(line)
        if m:
            rows.append((len(m.group(3)) // 2, int(m.group(1)), int(m.group(2)), m.group(4)))
    return rows


NOTABLE = ("typer", "typer._adapters", "pydantic", "jsonschema", "yaml", "rich", "nictune.profile.loader",
           "nictune.host.agent", "nictune.host.model", "nictune.host.transaction.engine", "pyroute2.netlink", "json", "dataclasses")


def import_profile(rows: list, top: int = 6) -> dict:
    roots = sorted((r for r in rows if r[0] == 0), key=lambda r: -r[2])
    names = {r[3] for r in rows}
    # A submodule can be listed twice (imported, then found again by its
    # package's own import line): keep the larger, which covers the other.
    cum_of: dict = {}
    for _, _, cum, name in rows:
        cum_of[name] = max(cum, cum_of.get(name, 0))
    return {
        "total_us": sum(r[2] for r in roots),
        "top": [(r[3], r[2]) for r in roots[:top]],
        # cumulative cost of well-known packages, wherever they were imported
        "notable": [(n, cum_of[n]) for n in NOTABLE if n in cum_of],
        "modules": len(rows),
        "pyroute2_modules": sorted(n for n in names if n.startswith("pyroute2")),
        # "pyroute2" itself appears only if its __init__ (asyncio, ndb...) ran.
        "pyroute2_init": "pyroute2" in names,
        "asyncio": "asyncio" in names,
    }


# --- netlink under strace -------------------------------------------------------


NETLINK_ROUTE, NETLINK_GENERIC = 0, 16
GENL_ID_CTRL = 0x10
RTM = {16: "RTM_NEWLINK", 17: "RTM_DELLINK", 18: "RTM_GETLINK", 20: "RTM_NEWADDR", 22: "RTM_GETADDR",
       24: "RTM_NEWROUTE", 26: "RTM_GETROUTE"}
# enum ethtool_msg_user_types, include/uapi/linux/ethtool_netlink_generated.h
ETHTOOL_CMDS = {1: "STRSET_GET", 2: "LINKINFO_GET", 3: "LINKINFO_SET", 4: "LINKMODES_GET",
                5: "LINKMODES_SET", 6: "LINKSTATE_GET", 7: "DEBUG_GET", 8: "DEBUG_SET", 9: "WOL_GET",
                10: "WOL_SET", 11: "FEATURES_GET", 12: "FEATURES_SET", 13: "PRIVFLAGS_GET",
                14: "PRIVFLAGS_SET", 15: "RINGS_GET", 16: "RINGS_SET", 17: "CHANNELS_GET",
                18: "CHANNELS_SET", 19: "COALESCE_GET", 20: "COALESCE_SET", 21: "PAUSE_GET",
                22: "PAUSE_SET"}
NLM_F_DUMP = 0x300
SIOCETHTOOL_ROW = "ioctl SIOCETHTOOL (legacy ethtool API)"
SOCKETS_ROW = "sockets opened (netlink + inet)"


def genl_family_id(name: str) -> int | None:
    """Resolve a generic-netlink family id ourselves (CTRL_CMD_GETFAMILY).

    The agent's requests carry the ethtool family's id, which the kernel
    assigns at boot; family ids are global, so asking from here is fine.
    """
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
    try:
        sock.bind((0, 0))
        value = name.encode() + b"\0"
        nla = struct.pack("=HH", 4 + len(value), 2) + value  # CTRL_ATTR_FAMILY_NAME
        nla += b"\0" * (-len(nla) % 4)
        payload = struct.pack("=BBH", 3, 1, 0) + nla         # CTRL_CMD_GETFAMILY, version 1
        sock.send(struct.pack("=IHHII", 16 + len(payload), GENL_ID_CTRL, 1, 1, 0) + payload)
        data = sock.recv(65536)
    finally:
        sock.close()
    length, kind = struct.unpack_from("=IH", data)
    off = 20
    while kind == GENL_ID_CTRL and off + 4 <= length:
        alen, atype = struct.unpack_from("=HH", data, off)
        if alen < 4:
            break
        if atype & 0x3FFF == 1:  # CTRL_ATTR_FAMILY_ID, u16
            return struct.unpack_from("=H", data, off + 4)[0]
        off += (alen + 3) & ~3
    return None


def _family_asked(attrs: bytes) -> str:
    """CTRL_ATTR_FAMILY_NAME (2) of a GETFAMILY request's attributes."""
    off = 0
    while off + 4 <= len(attrs):
        length, kind = struct.unpack_from("=HH", attrs, off)
        if length < 4:
            break
        if kind & 0x3FFF == 2:
            return attrs[off + 4:off + length].split(b"\0", 1)[0].decode(errors="replace")
        off += (length + 3) & ~3
    return "?"


def message_kind(proto: int | None, data: bytes, ethtool_id: int | None) -> list:
    """Names of the netlink messages in one sent datagram."""
    kinds = []
    off = 0
    while off + 16 <= len(data):
        length, mtype, flags = struct.unpack_from("=IHH", data, off)
        if length < 16:
            break
        cmd = data[off + 16] if off + 16 < len(data) else None
        if proto == NETLINK_ROUTE:
            name = "rtnl " + RTM.get(mtype, f"type {mtype}")
        elif proto == NETLINK_GENERIC and mtype == GENL_ID_CTRL:
            # Named by the family asked for: one lookup per family a command
            # uses (ethtool, devlink...) is per command, not per key.
            name = (f"genl CTRL_CMD_GETFAMILY {_family_asked(data[off + 20:off + length])}"
                    if cmd == 3 else f"genl ctrl cmd {cmd}")
        elif proto == NETLINK_GENERIC and mtype == ethtool_id:
            name = "ethtool " + ETHTOOL_CMDS.get(cmd, f"cmd {cmd}")
        else:
            name = f"netlink proto {proto} type {mtype:#x} cmd {cmd}"
        kinds.append(name + (" (dump)" if flags & NLM_F_DUMP == NLM_F_DUMP else ""))
        off += (length + 3) & ~3
    return kinds


_SOCKET = re.compile(r"^socket\((AF_\w+), [^,]+, (\w+)\) = (\d+)")
_EXECVE = re.compile(r'^execve\("[^"]*", \[(.*)\], .*\) = 0')
_SEND = re.compile(r"^(sendto|sendmsg)\((\d+)")
_DUMP = re.compile(r"^ \| [0-9a-f]{5,}  (.{49})")
_PROTO = {"NETLINK_ROUTE": NETLINK_ROUTE, "NETLINK_GENERIC": NETLINK_GENERIC}


def strace_counts(prefix: Path, ethtool_id: int | None) -> dict:
    """{program: {kind: count}} from the files of `strace -ff -e write=all`.

    Decoding is done here from the hex dumps, not by strace: strace names
    netlink messages only when it can tell the socket's protocol, and for a
    socket in another network namespace it cannot (it prints NLMSG_???).
    """
    counts: dict = {}

    def bump(program: str, kind: str) -> None:
        per = counts.setdefault(program, {})
        per[kind] = per.get(kind, 0) + 1

    for path in sorted(prefix.parent.glob(prefix.name + ".*")):  # one file per process
        program = "?"
        protocols: dict = {}  # fd -> netlink protocol, or "inet"
        send = None  # (fd, bytearray) of the send whose hex dump lines follow
        for line in path.read_text(errors="replace").splitlines() + [""]:
            m = _DUMP.match(line)
            if m and send is not None:
                send[1].extend(bytes.fromhex(m.group(1)))
                continue
            if send is not None:  # its dump is complete
                for kind in message_kind(protocols.get(send[0]), bytes(send[1]), ethtool_id):
                    bump(program, kind)
                send = None
            if m := _EXECVE.match(line):
                argv = m.group(1)
                # `ip netns exec NS python -m nictune.host.agent` names the agent
                # too: look at what is being run first.
                program = ("ip" if argv.startswith('"ip"') else
                           "agent" if "nictune.host.agent" in argv else
                           "controller" if "nictune" in argv else "other")
                protocols = {}
            elif m := _SOCKET.match(line):
                family, proto, fd = m.groups()
                protocols[int(fd)] = _PROTO.get(proto) if family == "AF_NETLINK" else "inet"
                bump(program, SOCKETS_ROW)
            elif m := _SEND.match(line):
                send = (int(m.group(2)), bytearray())
            elif line.startswith("ioctl(") and "SIOCETHTOOL" in line:
                bump(program, SIOCETHTOOL_ROW)
    return counts


def traced(argv: list, scratch: Path, ethtool_id: int | None) -> tuple:
    out = scratch / "strace"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    proc = spawn(["strace", "-ff", "-qq", "-o", str(out / "t"), "-e", "trace=execve,socket,sendto,sendmsg,ioctl",
                  "-e", "signal=none", "-e", "write=all", "--", *argv])
    counts = strace_counts(out / "t", ethtool_id)
    shutil.rmtree(out, ignore_errors=True)
    return proc.returncode, counts


def run_traced(n: int, lab: Lab, profile: Path, state: Path, scratch: Path, ethtool_id, problems) -> dict:
    out = {}
    for step in ("plan", "apply", "apply-again", "rollback"):
        rc, counts = traced(cli(step, lab, profile, state), scratch, ethtool_id)
        out[step] = counts
        if rc not in (0, 2):
            problems.append(f"N={n} traced {step}: exit {rc}")
    return out


_EVENT = re.compile(r"^(\d+\.\d+) (execve\(\"[^\"]*\", \[(.*)\].*\) = 0|exit_group\()")


def timeline(argv: list, scratch: Path, runs: int = IMPORT_RUNS) -> dict | None:
    """A plan cut into its processes' lifetimes, from execve/exit_group times.

    Under `strace --seccomp-bpf` only those two syscalls stop the tracee,
    so the run is barely slowed, and the segments of one run add up exactly:
    controller start -> it spawns `ip netns exec` -> that execs the agent ->
    the agent exits -> the controller exits.  Median of each over `runs`.
    """
    segments: dict = {"controller_before": [], "nsexec": [], "agent": [], "controller_after": [],
                      "agent_seconds": []}
    out = scratch / "timeline"
    for _ in range(runs):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        proc = spawn(["strace", "-ff", "--seccomp-bpf", "-qq", "-ttt", "-o", str(out / "t"),
                      "-e", "trace=execve,exit_group", "-e", "signal=none", "--", *argv])
        t: dict = {}
        for path in out.iterdir():
            program = None
            for line in path.read_text(errors="replace").splitlines():
                m = _EVENT.match(line)
                if not m:
                    continue
                stamp = float(m.group(1))
                if m.group(3) is not None:  # a successful execve
                    args = m.group(3)
                    program = ("ip" if args.startswith('"ip"') else "agent" if "nictune.host.agent" in args else
                               "controller" if "nictune" in args else None)
                    if program and program + "_exec" not in t:
                        t[program + "_exec"] = stamp
                elif program in ("agent", "controller"):
                    t[program + "_exit"] = stamp
        shutil.rmtree(out, ignore_errors=True)
        if len(t) != 5 or "strace: " in proc.stderr:
            return None  # strace could not trace (ptrace or seccomp-bpf not allowed here)
        if proc.returncode not in (0, 2):
            raise BenchError(f"traced plan: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        segments["controller_before"].append(t["ip_exec"] - t["controller_exec"])
        segments["nsexec"].append(t["agent_exec"] - t["ip_exec"])
        segments["agent"].append(t["agent_exit"] - t["agent_exec"])
        segments["controller_after"].append(t["controller_exit"] - t["agent_exit"])
        segments["agent_seconds"].append(json.loads(proc.stdout)["hosts"][0]["seconds"])
    return segments


# --- output -------------------------------------------------------------------


def ms(s: float) -> str:
    return f"{s * 1000:7.0f} ms"


def mb(kb: float) -> str:
    return f"{kb / 1024:6.1f} MB"


def baseline_cli(checkout: str) -> str:
    """The nictune CLI of the --baseline checkout (its own venv, as scripts/setup makes it)."""
    cli_path = Path(checkout) / ".venv" / "bin" / "nictune"
    if not os.access(cli_path, os.X_OK):
        sys.exit(f"bench: --baseline {checkout}: no {cli_path} (run that checkout's scripts/setup)")
    return str(cli_path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="measured rounds per interface count (default 5)")
    ap.add_argument("--json", metavar="FILE", help="also save every figure as JSON")
    ap.add_argument("--baseline", metavar="DIR",
                    help="another nictune checkout (with its .venv) to measure alongside, interleaved")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (network namespaces); run it with sudo")
    for tool in ("ip",):
        if shutil.which(tool, path=ENV["PATH"]) is None:
            sys.exit(f"bench: `{tool}` not found (apt-get install iproute2)")
    if not os.access(NICTUNE, os.X_OK):
        sys.exit(f"bench: no nictune CLI at {NICTUNE}: run it with the project's venv Python "
                 "(sudo scripts/setup; sudo .venv/bin/python bench/bench_plan_apply.py)")
    base_cli = baseline_cli(args.baseline) if args.baseline else None
    has_strace = shutil.which("strace", path=ENV["PATH"]) is not None
    repeat = max(1, args.repeat)

    # SIGTERM gets the same clean-up as Ctrl-C.
    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.monotonic()
    lab = Lab()
    tmp = Path(tempfile.mkdtemp(prefix="ntbench-"))
    problems: list = []
    figures: dict = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                     "python": PY, "nictune": NICTUNE, "kernel": platform.release(),
                     "cpus": os.cpu_count(), "repeat": repeat, "namespace": lab.ns,
                     "commit": commit_of(HERE.parent)}
    if base_cli:
        figures["baseline"] = {"dir": args.baseline, "nictune": base_cli,
                               "commit": commit_of(Path(args.baseline))}
    try:
        profile, state, scratch = tmp / "profile.yaml", tmp / "state", tmp / "scratch"
        scratch.mkdir()
        ENV["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        per_if = write_profile(profile, tmp / "nccl.conf")
        figures["settings_per_interface"] = per_if
        ethtool_id = genl_family_id("ethtool")
        lab.up()
        versions = {CURRENT: (NICTUNE, state)}
        if base_cli:
            versions[BASELINE] = (base_cli, tmp / "state-baseline")
        seq: dict = {}
        base: dict = {}
        trace: dict = {}
        for n in SIZES:
            lab.grow(n)
            both = run_sequences(n, lab, profile, scratch, repeat, problems, versions)
            seq[n], base[n] = both[CURRENT], both.get(BASELINE)
            if has_strace:
                trace[n] = run_traced(n, lab, profile, state, scratch, ethtool_id, problems)
        request, loads = agent_request(profile, lab, state)
        boot = startup(lab, scratch, request, profile, state)
        agent_it = importtime(spawn(["ip", "netns", "exec", lab.ns, PY, "-X", "importtime", "-m", "nictune.host.agent"],
                                    request).stderr)
        ctl_it = importtime(spawn([PY, "-X", "importtime", NICTUNE, *cli("plan", lab, profile, state)[1:]]).stderr)
        split = timeline(cli("plan", lab, profile, state), scratch) if has_strace else None
        if base_cli:
            figures["baseline"]["sequences"] = {str(k): v for k, v in base.items()}
        figures.update(sequences={str(k): v for k, v in seq.items()},
                       startup=boot, profile_load_s=loads,
                       importtime={"agent": import_profile(agent_it), "controller": import_profile(ctl_it)},
                       netlink={str(k): v for k, v in trace.items()}, ethtool_family_id=ethtool_id,
                       plan_timeline=split)
        report(figures, seq, boot, loads, trace, split, has_strace, problems, lab,
               base if base_cli else None)
    except KeyboardInterrupt:
        print("\nbench: interrupted; cleaning up", file=sys.stderr)
        return 130
    except (BenchError, subprocess.TimeoutExpired) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for p in lab.down():
            print(f"bench: clean-up: {p}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    figures["bench_seconds"] = round(time.monotonic() - started, 1)
    print(f"\n(bench took {figures['bench_seconds']:.0f} s; namespaces {lab.ns}, {lab.peer_ns} and {tmp} removed)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1, default=str) + "\n")
        print(f"figures saved to {args.json}")
    print(f"reproduce with: sudo .venv/bin/python bench/bench_plan_apply.py --repeat {repeat}"
          + (f" --baseline {args.baseline}" if base_cli else ""))
    return 0


def report(fig: dict, seq: dict, boot: list, loads: list, trace: dict, split: dict | None,
           has_strace: bool, problems: list, lab: Lab, base: dict | None = None) -> None:
    p = print
    p(f"nictune plan/apply bench   {fig['date']}")
    p(f"  python {PY} ({platform.python_version()}), kernel {fig['kernel']}, {fig['cpus']} CPUs, "
      f"{fig['repeat']} rounds per size (+1 warm-up)")
    p(f"  profile: 6 host sysctls + NCCL file; per interface {fig['settings_per_interface']} settings "
      "(mtu, txqueuelen, state, 5 features, channels rx/tx, sysctls)")
    p(f"  namespace {lab.ns} with N veth ends (peers in {lab.peer_ns})")
    p("  bytecode cached (PYTHONPYCACHEPREFIX in the temp dir), as on a user's second run"
      + ("; PYTHONDONTWRITEBYTECODE from the environment ignored" if DONTWRITE else ""))

    p("\n1. Whole process: nictune <cmd> PROFILE --netns NS --state-dir DIR --json")
    rows = []
    for n in SIZES:
        for step in STEPS:
            r = seq[n][step]
            s = r["summary"] or {}
            rows.append((step, n, ms(med(r["wall"])), ms(min(r["wall"])), ms(med(r["agent"])),
                         mb(max(r["rss_kb"])), ", ".join(f"{v} {k}" for k, v in s.items())))
    p(table(rows, ("step", "N", "wall median", "wall min", "agent.run", "peak RSS", "outcome")))
    p("  agent.run = the report's `seconds` (median), which includes the agent's lazy imports (see 3);")
    p("  peak RSS = the largest process of the tree (controller, ip, agent), at least "
      f"{mb(seq[SIZES[-1]]['_floor_kb']).strip()} (the wrapper's own RSS).")
    if base:
        report_baseline(fig, seq, base)

    p(f"\n2. Start-up and imports (whole process, median of {IMPORT_RUNS})")
    rows = [(b["label"], ms(med(b["wall"])), ms(min(b["wall"])), mb(max(b["rss_kb"]))) for b in boot]
    p(table(rows, ("command", "median", "min", "peak RSS")))
    for side in ("controller", "agent"):
        it = fig["importtime"][side]
        p(f"  {side}, python -X importtime of a real plan run (ms, inflated by the tracing): "
          f"{it['total_us'] / 1000:.0f} ms, {it['modules']} modules")
        p("    top-level: " + ", ".join(f"{name} {us / 1000:.0f}" for name, us in it["top"]))
        p("    packages:  " + ", ".join(f"{name} {us / 1000:.0f}" for name, us in it["notable"]))
        p(f"    pyroute2: {len(it['pyroute2_modules'])} modules "
          f"({'package __init__ RAN' if it['pyroute2_init'] else 'package __init__ not run'}), "
          f"asyncio {'imported' if it['asyncio'] else 'not imported'}")

    # The controller waits, resident, while its agent runs: at that moment the
    # tree holds both.  wait4 gives the larger; the agent alone is measured.
    agent_kb = max(next(b for b in boot if b["key"] == "agent-alone")["rss_kb"])
    tree_kb = max(seq[SIZES[-1]]["plan"]["rss_kb"])
    who = "the controller" if tree_kb > agent_kb else "the agent"
    p(f"  memory, plan N={SIZES[-1]}: largest process {mb(tree_kb).strip()} ({who}; the agent alone peaks at "
      f"{mb(agent_kb).strip()}); both are resident while the agent runs: "
      f"~{mb(tree_kb + agent_kb).strip()} together")

    by = {b["key"]: med(b["wall"]) for b in boot}
    if split:
        breakdown(split, by, med(loads), lab.count)
    else:
        p("\n3. Where a plan goes: skipped, needs strace (execve/exit_group times; is ptrace allowed?)")

    checks: list = []  # (ok, what, detail): the targets
    notes: list = []   # the same shape, for things worth knowing that are not targets
    # strace runs but cannot trace where ptrace is forbidden (some containers).
    traced_ok = has_strace and all(trace[n]["plan"].get("agent") for n in SIZES)
    if traced_ok:
        p("\n4. Netlink messages sent by the agent (strace -ff; decoded from the bytes)")
        cols = [(step, n) for step in ("plan", "apply", "apply-again", "rollback") for n in SIZES]
        agent = {(step, n): trace[n][step].get("agent", {}) for step, n in cols}
        kinds = sorted({k for c in agent.values() for k in c},
                       key=lambda k: (k in (SIOCETHTOOL_ROW, SOCKETS_ROW), k))
        rows = [(k, *(agent[c].get(k, 0) for c in cols)) for k in kinds]
        p(table(rows, ("message", *(f"{s} N={n}" for s, n in cols))))
        others = {prog: c for n in SIZES for step in trace[n] for prog, c in trace[n][step].items()
                  if prog != "agent" and any(k not in (SOCKETS_ROW, SIOCETHTOOL_ROW) for k in c)}
        p("  no netlink message from any other process (controller, ip)" if not others else
          f"  netlink from other processes: {others}")

        def reads(c):
            return {k: v for k, v in c.items() if _is_read(k)}

        grow = [step for step in ("plan", "apply", "apply-again", "rollback")
                if reads(agent[(step, SIZES[0])]) != reads(agent[(step, SIZES[-1])])]
        checks.append((not grow, "netlink reads do not grow with N (1 vs 16 interfaces)",
                       "same for every command" if not grow else f"differ for {', '.join(grow)}"))
        plan16 = reads(agent[("plan", SIZES[-1])])
        multi = {k: v for k, v in plan16.items() if "(dump)" in k and v > 1}
        checks.append((not multi, "plan: one dump per message kind",
                       "yes" if not multi else "dumped more than once: "
                       + ", ".join(f"{k.replace(' (dump)', '')} x{v}" for k, v in multi.items())))
        singles = {k: v for k, v in plan16.items() if "(dump)" not in k and v > 1}
        checks.append((not singles, "plan: no per-key/per-interface get requests",
                       "none" if not singles else str(singles)))
        # Writes are per interface by nature; these are observations, not targets.
        n = SIZES[-1]
        for step in ("apply", "rollback"):
            writes = {k: v for k, v in agent[(step, n)].items() if _is_write(k)}
            notes.append((all(v <= n for v in writes.values()),
                          f"{step}: at most one write per interface per message kind (N={n})",
                          ", ".join(f"{k} {v}" for k, v in writes.items())))
    elif has_strace:
        p("\n4. Netlink messages: skipped, strace saw no agent (is ptrace allowed here?)")
    else:
        p("\n4. Netlink messages: skipped, strace is not installed (apt-get install strace)")

    n = SIZES[-1]
    plan_m = med(seq[n]["plan"]["wall"])
    apply_m = med(seq[n]["apply"]["wall"])
    again_m = med(seq[n]["apply-again"]["wall"])
    plan_min, again_min = min(seq[n]["plan"]["wall"]), min(seq[n]["apply-again"]["wall"])
    paired = med([a / b for a, b in zip(seq[n]["apply-again"]["wall"], seq[n]["plan"]["wall"])])
    it = fig["importtime"]
    checks[:0] = [
        (plan_m < TARGET_PLAN_S, f"plan on {n} interfaces under {TARGET_PLAN_S:g} s", ms(plan_m).strip()),
        (apply_m < TARGET_APPLY_S, f"apply on {n} interfaces under {TARGET_APPLY_S:g} s", ms(apply_m).strip()),
        # Paired: each round's second apply against the same round's plan,
        # run seconds apart, so slow drifts of a noisy machine cancel out.
        (paired <= NOOP_APPLY_SLACK,
         "second apply (nothing to do) as fast as plan (within 10 %, median of per-round ratios)",
         f"{paired - 1:+.0%}; median {ms(again_m).strip()} vs {ms(plan_m).strip()}, min {ms(again_min).strip()} "
         f"vs {ms(plan_min).strip()}, agent work {ms(med(seq[n]['apply-again']['agent'])).strip()} "
         f"vs {ms(med(seq[n]['plan']['agent'])).strip()}"),
        (not it["agent"]["pyroute2_init"] and not it["agent"]["asyncio"],
         "agent imports only the pyroute2 parts it uses (no pyroute2/__init__, no asyncio)",
         f"{len(it['agent']['pyroute2_modules'])} pyroute2 modules; `import pyroute2` alone: "
         f"{ms(by['pyroute2']).strip()}"),
        (not it["controller"]["pyroute2_modules"], "controller imports no pyroute2 (netlink only in the agent)",
         f"{len(it['controller']['pyroute2_modules'])} pyroute2 modules"),
    ]
    agent_gap = med(seq[n]["apply-again"]["agent"]) - med(seq[n]["plan"]["agent"])
    p("\n5. Targets")
    for ok, what, detail in checks:
        p(f"  {'PASS' if ok else 'FAIL'}  {what}: {detail}")
        if not ok and what.startswith("second apply") and agent_gap < 0.10 * plan_m:
            # Controller and start-up are the same code for both commands:
            # only the agent's work can make one slower than the other.
            p(f"        (the agent's work differs by {agent_gap * 1000:.0f} ms and nothing else differs between "
              "the two commands: machine noise; try --repeat 10)")
    if notes:
        p("  other checks (not targets):")
        for ok, what, detail in notes:
            p(f"  {'ok  ' if ok else 'NOTE'}  {what}: {detail}")
    missed = [what for ok, what, _ in checks if not ok]
    fig["targets"] = [{"ok": ok, "what": what, "detail": detail} for ok, what, detail in checks]
    fig["notes"] = [{"ok": ok, "what": what, "detail": detail} for ok, what, detail in notes]
    fig["problems"] = problems
    if problems:
        p("\n  UNEXPECTED outcomes (the timings above may not mean what they say):")
        for prob in problems:
            p(f"    {prob}")
    p(f"\n  {len(checks) - len(missed)}/{len(checks)} targets met" +
      (f"; MISSED: {'; '.join(missed)}" if missed else ""))


def breakdown(split: dict, by: dict, load: float, n: int) -> None:
    """Section 3: a plan's process lifetimes (exact, from one traced run
    each), split further with the start-up costs of section 2 (medians)."""
    seg = {k: med(v) for k, v in split.items()}
    total = sum(seg[k] for k in ("controller_before", "nsexec", "agent", "controller_after"))
    ctl_boot = by["controller"]               # interpreter + `import nictune.cli.app`
    agent_boot = by["agent-eager"]            # interpreter + `import nictune.host.agent`
    lazy = by["agent"] - by["agent-eager"]    # engine, knobs, netlink: imported inside agent.run
    seconds = seg["agent_seconds"]
    rows = [
        ("controller: start until it spawns the agent", seg["controller_before"]),
        ("  interpreter start + imports", ctl_boot),
        ("  CLI framework at run time (typer), profile, request", seg["controller_before"] - ctl_boot),
        ("    of which load + schema-check the profile", load),
        ("ip netns exec: enter the namespace, private /sys", seg["nsexec"]),
        ("agent: exec until exit", seg["agent"]),
        ("  interpreter start + import nictune.host.agent", agent_boot),
        ("  agent.run (the report's `seconds`)", seconds),
        ("    imports of engine, knobs, netlink in it", lazy),
        ("    work: read, diff (and write)", seconds - lazy),
        ("  writing the report, exit", seg["agent"] - agent_boot - seconds),
        ("controller: agent's exit until its own (read, print, exit)", seg["controller_after"]),
    ]
    boot = ctl_boot + seg["nsexec"] + agent_boot + lazy
    cli_fw = seg["controller_before"] - ctl_boot - load
    work = seconds - lazy + load
    tail = seg["agent"] - agent_boot - seconds + seg["controller_after"]
    print(f"\n3. Where a plan on {n} interfaces goes: {len(split['agent'])} runs under strace --seccomp-bpf "
          f"(execve and exit_group only), median of each process segment; they add up to {ms(total).strip()}.")
    print("   Indented parts are section 2's medians (measured apart: they need not add up exactly).")
    print(table([(k, ms(v), f"{v / total:4.0%}") for k, v in rows], ("segment", "time", "share")))
    print(f"  start-up + imports {ms(boot).strip()} ({boot / total:.0%}), CLI framework {ms(cli_fw).strip()} "
          f"({cli_fw / total:.0%}), work {ms(work).strip()} ({work / total:.0%}, agent + profile load), "
          f"report, output and exits {ms(tail).strip()} ({tail / total:.0%})")


def _is_write(kind: str) -> bool:
    return "_SET" in kind or "NEWLINK" in kind or "DEL" in kind


def _is_read(kind: str) -> bool:
    return kind not in (SIOCETHTOOL_ROW, SOCKETS_ROW) and not _is_write(kind)


if __name__ == "__main__":
    sys.exit(main())
