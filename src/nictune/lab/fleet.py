"""A fleet lab: N namespace hosts on one Ethernet segment, each with its own real sshd.

    root namespace: PREFIXbr 198.19.X.1/24 (a /24 of 198.19.0.0/16 not yet routed here;
                    a /23 for more than 253 hosts, a /22 for more than 509)
      |-- PREFIXh001 <veth> mgmt0 198.19.X.2   [PREFIXh001: sshd on mgmt0, rail0 <veth> rail1]
      |-- PREFIXh002 <veth> mgmt0 198.19.X.3   [PREFIXh002: ...]

SSH rides on mgmt0; profiles tune the rails, so a profile never cuts the
management path.  With up(..., data_rails=True) each host also gets a rail
to the others (the traffic gate's, control/rollout/gate/): PREFIXd001 <veth>
data0 198.18.Y.N on a second bridge PREFIXrb, a /24 of 198.18.0.0/16.  Each sshd runs under `ip netns exec`, so the host's
/etc/nccl.conf is its own file (/etc/netns/NS/nccl.conf), and logins get a
HOME with Debian's stock dotfiles (root's own ~/.bashrc here starts pyenv:
~200 ms per command, which a stock host does not pay).

Up to 1,000 hosts.  A Linux bridge takes 1024 ports (BR_MAX_PORTS,
net/bridge/br_private.h; port 0 unused): past HOSTS_PER_BRIDGE hosts they
are shared evenly among bridges PREFIXbr, PREFIXbr2, ..., each joined to
the first by a veth pair (PREFIXbr2a on PREFIXbr2, PREFIXbr2b on PREFIXbr),
a star with STP off and no loop: one Ethernet segment, one subnet
(bridge_layout()).  Before building, up() checks this process's limits for
the size (open files, free PIDs, memory; check_limits()).  Beyond 250 hosts the root
namespace's neighbour table limits (net.ipv4.neigh.default.gc_thresh1/2/3,
128/512/1024 by default) are raised for the fleet's life, so that the
bridge's ARP entries for every host are not garbage-collected mid-run
(the old values go into the record and come back with `down`).

Everything created is written to DIR/record.json before it is created;
`down(record)` removes exactly that, also after a crash.  Controller side:
standard library only, commands as argv lists.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from nictune.lab import namespaces as labmod
from nictune.host.errors import SYSTEM, NictuneError

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SKEL = "/etc/skel"
POOL = ipaddress.ip_network("198.19.0.0/16")
DATA_POOL = ipaddress.ip_network("198.18.0.0/16")  # data_rails: hosts' data0
DATA_RAIL = "data0"
# bench/bench_fleet.py goes to 1,000; `nictune lab up --hosts` keeps its own
# lower limit (labmod.FLEET_MAX_HOSTS).
MAX_HOSTS = 1000
# Ports of one bridge: BR_MAX_PORTS is 1024, port number 0 is never given.
BRIDGE_MAX_PORTS = 1023
# Hosts on one bridge at most; fleets up to this size keep a single bridge
# (as before the split), larger ones take ceil(N / this) bridges.
HOSTS_PER_BRIDGE = 500
IFNAMSIZ = 15  # longest interface name (and, here, namespace name)
# What a fleet holds per host, to check before building: its sshd
# listener's PSS and the kernel's namespace, veths, sockets (2.2 MB
# measured at 500 hosts, bench/README.md: fleetlab_timing.py), rounded up.
MEM_PER_HOST_KB = 3 * 1024
# Open files this process may need per host (a tool run from it may hold a
# connection to every host at once, as pyinfra does), and PIDs: a listener
# per host plus the sessions and commands of the hosts being worked on.
FDS_BASE, PIDS_BASE, PIDS_PER_HOST = 256, 512, 2
# Above this many hosts the neighbour table limits are raised (see above).
NEIGH_RAISE_ABOVE = 250
NEIGH_SYSCTL = "/proc/sys/net/ipv4/neigh/default/gc_thresh{}"
LAB_DIR = labmod.FLEET_DIR
SSH_PORT = 22
# The prefix names the bridge (PREFIXbr) and hosts (PREFIXh001): both must fit
# IFNAMSIZ (15 characters) and start with "nt" like everything tests create.
PREFIX_RE = re.compile(r"^nt[a-z0-9]{0,9}$")
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3", "/usr/bin/python3.12",
                     "/usr/bin/python3.11", "/usr/bin/python3.10", "/usr/bin/python3.9")
_ENV = {"LANG": "C", "LC_ALL": "C", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# A "silent" host: accepts TCP on port 22 and never sends a byte.
SILENT_LISTENER = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2])))\n"
    "s.listen(128)\n"
    "held = []\n"
    "while True:\n"
    "    held.append(s.accept()[0])\n"
)


# Servers this process started, so down() in the same process reaps them
# (no zombies, no "still running" warnings); after a crash /proc is used instead.
_children: Dict[int, subprocess.Popen] = {}


class FleetError(NictuneError):
    kind = SYSTEM


@dataclass
class FleetHost:
    name: str
    netns: str  # "" for an unreachable host: it has no namespace
    address: str
    port: int
    kind: str  # "sshd" | "silent" | "unreachable"
    data_address: str = ""  # on data0, with up(..., data_rails=True)


@dataclass
class Fleet:
    prefix: str
    dir: str
    hosts: List[FleetHost]
    inventory: str
    known_hosts: str
    ssh_config: str
    key_file: str
    record: str

    def of_kind(self, kind: str) -> List[FleetHost]:
        return [h for h in self.hosts if h.kind == kind]

    def as_dict(self) -> dict:
        return asdict(self)


class _Record:
    """record.json: what this fleet created, saved (atomically) before each step creates it."""

    def __init__(self, path: str, data: dict):
        self.path = path
        self.data = data
        self.save()

    def add(self, key: str, items: Iterable) -> None:
        self.data[key].extend(items)
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)


# -- small helpers ------------------------------------------------------------

def _run(argv: List[str], stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=_ENV, check=False)


def _must(argv: List[str], stdin: Optional[str] = None) -> str:
    proc = _run(argv, stdin)
    if proc.returncode != 0:
        raise FleetError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _ip_batch(lines: List[str], netns: Optional[str] = None) -> None:
    if lines:
        _must(["ip", *(["-n", netns] if netns else []), "-batch", "-"], "\n".join(lines) + "\n")


def _parallel(work: Callable, items: list, workers: int = 8) -> list:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(work, items))


def _write(path: str, text: str, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip() or "(empty)"
    except OSError:
        return "(no log)"


def restart_sshd(fleet: Fleet, host: FleetHost) -> None:
    """Stop a host's sshd and start it again with the same command line, so
    that it (and every session it opens) sees what is now in /etc/netns/<ns>/.
    The new server goes into the record, so down() removes it."""
    data = _load_record(fleet.record)
    if data is None:
        raise FleetError(f"{fleet.record}: no fleet record (is the fleet down?)")
    record = _Record(fleet.record, data)
    _stop([p["pid"] for p in record.data["processes"] if p["host"] == host.name])
    _start_servers(record, fleet.dir, [host])
    _wait_ready(fleet.dir, [host], record, timeout=10)


def run_in(host: FleetHost, argv: List[str]) -> subprocess.CompletedProcess:
    """Run argv inside a fleet host's namespace, as its sshd's commands see it
    (its own /etc/nccl.conf included); text output, never raises on exit code."""
    if not host.netns:
        raise FleetError(f"{host.name} is {host.kind}: it has no namespace to run in")
    return _run(["ip", "netns", "exec", host.netns, *argv])


# -- choosing names and addresses ---------------------------------------------

def _networks_in_use(skip_dev: str) -> List[ipaddress.IPv4Network]:
    """IPv4 routes and addresses of the root namespace, but for device skip_dev."""
    used = []
    for entry in json.loads(_must(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        dst = entry.get("dst", "default")
        if dst != "default" and entry.get("dev") != skip_dev:
            used.append(ipaddress.ip_network(dst, strict=False))
    for link in json.loads(_must(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        if link.get("ifname") != skip_dev:
            for a in link.get("addr_info", []):
                used.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return used


def subnet_prefix(hosts: int) -> int:
    """The longest prefix whose subnet holds the bridge (.1), `hosts`
    addresses after it and the broadcast address: /24 up to 253 hosts."""
    size = 1 << (hosts + 2).bit_length()  # the least power of two > hosts + 2
    return min(24, 32 - (size.bit_length() - 1))


@dataclass(frozen=True)
class Segment:
    """One bridge of a fleet and the ports on it; every bridge but the first
    also has `join`, the veth pair to the first: (end on this bridge, end on
    the first)."""
    bridge: str
    ports: Tuple[str, ...]
    join: Optional[Tuple[str, str]] = None


def bridge_layout(bridge: str, ports: List[str], per_bridge: Optional[int] = None) -> List[Segment]:
    """Ports (root ends of the hosts' veths) shared evenly, in order, among
    as few bridges as hold per_bridge each (HOSTS_PER_BRIDGE by default):
    `bridge` itself, then bridge2, bridge3, ... each joined to the first."""
    per_bridge = per_bridge or HOSTS_PER_BRIDGE
    count = max(1, -(-len(ports) // per_bridge))
    if -(-len(ports) // count) + count - 1 > BRIDGE_MAX_PORTS:
        raise FleetError(f"{len(ports)} hosts do not fit {count} bridges of {BRIDGE_MAX_PORTS} ports")
    segments, start = [], 0
    for i in range(count):
        size = len(ports) // count + (1 if i < len(ports) % count else 0)
        name = bridge if i == 0 else f"{bridge}{i + 1}"
        join = None if i == 0 else (f"{name}a", f"{name}b")
        segments.append(Segment(name, tuple(ports[start:start + size]), join))
        start += size
    return segments


def _bridge_links(segments: List[Segment]) -> List[str]:
    """The root-namespace links of a layout besides the hosts' veths: the
    bridges and both ends of each join (deleted by name: no namespace takes
    them along)."""
    return [s.bridge for s in segments] + [end for s in segments if s.join for end in s.join]


def _bridge_lines(segments: List[Segment]) -> List[str]:
    """`ip -batch` lines making the bridges and joins; the ports are enslaved
    by the caller once they exist (_port_lines)."""
    first = segments[0].bridge
    # STP is off, so ports forward at once; forward_delay 0 makes sure of it.
    lines = [f"link add {s.bridge} type bridge forward_delay 0" for s in segments]
    for s in segments:
        if s.join:
            here, there = s.join
            lines += [f"link add {here} type veth peer name {there}",
                      f"link set {here} master {s.bridge} up", f"link set {there} master {first} up"]
    return lines


def _port_lines(segments: List[Segment]) -> List[str]:
    lines = [f"link set {port} master {s.bridge} up" for s in segments for port in s.ports]
    return lines + [f"link set {s.bridge} up" for s in segments]


def host_addresses(subnet: ipaddress.IPv4Network, count: int) -> List[str]:
    """The hosts' addresses: .2 onwards (the first bridge has .1), below the
    broadcast address."""
    if count + 3 > subnet.num_addresses:
        raise FleetError(f"{subnet} cannot hold a bridge, {count} hosts and its broadcast address")
    return [str(subnet.network_address + i + 1) for i in range(1, count + 1)]


def _check_names(prefix: str, total: int) -> None:
    """The longest names (PREFIXh1000, PREFIXbr2a) must fit IFNAMSIZ."""
    longest = max([f"{prefix}h{total:03d}", f"{prefix}d{total:03d}"]
                  + _bridge_links(bridge_layout(f"{prefix}br", ["x"] * total))
                  + _bridge_links(bridge_layout(f"{prefix}rb", ["x"] * total)), key=len)
    if len(longest) > IFNAMSIZ:
        raise FleetError(f"fleet prefix {prefix!r} is too long for {total} hosts: {longest!r} has "
                         f"{len(longest)} characters, an interface name at most {IFNAMSIZ}")


def check_limits(hosts: int) -> None:
    """Refuse, with what to change, a fleet this process or machine cannot
    hold; raise the soft open-file limit to what the size needs when the
    hard one allows (children, the tools a bench runs, inherit it)."""
    want = FDS_BASE + hosts
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise FleetError(f"a fleet of {hosts} hosts needs {want} open files in this process (a tool "
                             f"may hold a connection to every host); its limit is {hard}: raise it "
                             f"(`ulimit -n {want}`, or LimitNOFILE= in a unit) and start again")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    want = PIDS_BASE + PIDS_PER_HOST * hosts
    free, where = _free_pids()
    if free < want:
        raise FleetError(f"a fleet of {hosts} hosts needs about {want} free process IDs (a server per "
                         f"host and their sessions); {where} leaves {free}: raise it and start again")
    want = MEM_PER_HOST_KB * hosts
    have = _mem_available_kb()
    if have < want:
        raise FleetError(f"a fleet of {hosts} hosts needs about {want // 1024} MB of memory "
                         f"({MEM_PER_HOST_KB // 1024} MB per host); MemAvailable is {have // 1024} MB")


def _free_pids() -> Tuple[int, str]:
    """How many more tasks can start, and the limit that says so: the
    kernel's pid_max and threads-max against the tasks alive now, and the
    pids cgroup this process is in (a container's pids.max) if any."""
    with open("/proc/loadavg") as f:
        tasks = int(f.read().split()[3].split("/")[1])
    best = (10 ** 9, "")
    for path, name in (("/proc/sys/kernel/pid_max", "kernel.pid_max"),
                       ("/proc/sys/kernel/threads-max", "kernel.threads-max")):
        limit = _read_int(path)
        if limit is not None and limit - tasks < best[0]:
            best = (limit - tasks, f"{name} ({limit}, {tasks} tasks running)")
    group = _pids_cgroup()
    if group:
        limit, current = _read_int(os.path.join(group, "pids.max")), _read_int(os.path.join(group, "pids.current"))
        if limit is not None and current is not None and limit - current < best[0]:
            best = (limit - current, f"the pids cgroup's pids.max ({group}: {limit}, {current} in use)")
    return best


def _pids_cgroup() -> Optional[str]:
    """This process's pids cgroup directory (v1 controller or v2), if any."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for candidate in ((f"/sys/fs/cgroup/pids{path}",) if "pids" in controllers.split(",") else
                          (f"/sys/fs/cgroup{path}",) if controllers == "" else ()):
            if os.path.exists(os.path.join(candidate, "pids.max")):
                return candidate
    return None


def _read_int(path: str) -> Optional[int]:
    """An integer file ("max" and unreadable files: None)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _mem_available_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def _claim_subnet(bridge: str, prefixlen: int = 24, pool=POOL) -> ipaddress.IPv4Network:
    """Give the bridge .1 of a subnet of 198.19.0.0/16 that nothing else in the
    root namespace uses (a test fleet and the lab fleet may be up together).
    Random, and checked again once taken, so that two fleets built at the
    same moment cannot end up on one subnet."""
    for _ in range(5):
        used = _networks_in_use(bridge)
        free = [net for net in pool.subnets(new_prefix=prefixlen) if not any(net.overlaps(u) for u in used)]
        if not free:
            raise FleetError(f"no free /{prefixlen} left in {pool} for a fleet bridge")
        subnet = random.choice(free)
        _must(["ip", "addr", "add", f"{subnet.network_address + 1}/{subnet.prefixlen}", "dev", bridge])
        if not any(subnet.overlaps(u) for u in _networks_in_use(bridge)):
            return subnet
        _must(["ip", "addr", "flush", "dev", bridge])  # another fleet took it meanwhile
    raise FleetError(f"could not claim a free /{prefixlen} of 198.19.0.0/16 for a fleet bridge (busy machine?)")


def _target_python() -> str:
    """The interpreter the agent will use on the hosts: a system python3 >= 3.9
    (never the controller's virtualenv or a pyenv shim: hosts have neither)."""
    check = "import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)"
    for path in PYTHON_CANDIDATES:
        if os.access(path, os.X_OK) and _run([path, "-c", check]).returncode == 0:
            return path
    raise FleetError("no system python3 >= 3.9 found (looked at " + ", ".join(PYTHON_CANDIDATES) + ")")


def _plan_hosts(prefix: str, n: int, silent: int, unreachable: int) -> List[FleetHost]:
    """Names and kinds; addresses come once the bridge has its subnet."""
    kinds = ["sshd"] * n + ["silent"] * silent + ["unreachable"] * unreachable
    hosts = []
    for i, kind in enumerate(kinds, start=1):
        name = f"{prefix}h{i:03d}"
        hosts.append(FleetHost(name=name, netns="" if kind == "unreachable" else name,
                               address="", port=SSH_PORT, kind=kind))
    return hosts


def _check_free(prefix: str, hosts: List[FleetHost], data_rails: bool = False) -> None:
    in_ns = [h.name for h in hosts if h.netns]
    names = _bridge_links(bridge_layout(f"{prefix}br", in_ns)) + [h.name for h in hosts]
    if data_rails:
        names += _bridge_links(bridge_layout(f"{prefix}rb", in_ns)) + [_data_link(prefix, h) for h in hosts]
    links = {link["ifname"] for link in json.loads(_must(["ip", "-j", "link", "show"]) or "[]")}
    taken = [name for name in names if name in links or os.path.exists(f"/run/netns/{name}")]
    if taken:
        raise FleetError(f"fleet prefix {prefix!r} is in use ({', '.join(taken[:3])} exist): "
                         f"a fleet left over? remove it with `nictune lab down` or fleetlab.down(record.json)")


# -- bring-up ------------------------------------------------------------------

def up(n: int, dir: str, prefix: str = "ntf", silent: int = 0, unreachable: int = 0,
       data_rails: bool = False) -> Fleet:
    """Build a fleet of n sshd hosts (+ silent and unreachable ones) and write
    its inventory, known_hosts, ssh_config and record.json into dir;
    data_rails: also a data0 rail per host, all on one bridge."""
    if not PREFIX_RE.match(prefix):
        raise FleetError(f"fleet prefix {prefix!r}: want 'nt' then up to 9 lower-case letters or digits")
    if n < 1 or silent < 0 or unreachable < 0 or n + silent + unreachable > MAX_HOSTS:
        raise FleetError(f"a fleet has 1 to {MAX_HOSTS} hosts in all (asked: {n} sshd, "
                         f"{silent} silent, {unreachable} unreachable)")
    _check_names(prefix, n + silent + unreachable)
    if os.geteuid() != 0:
        raise FleetError("building a fleet needs root (network namespaces, sshd)")
    if not os.access(SSHD, os.X_OK) or shutil.which("ssh-keygen", path=_ENV["PATH"]) is None:
        raise FleetError(f"building a fleet needs OpenSSH's server ({SSHD}) and ssh-keygen")
    dir = os.path.abspath(dir)
    if os.path.isdir(dir) and os.listdir(dir):
        raise FleetError(f"fleet directory {dir} is not empty: a fleet left over? "
                         f"remove it with fleetlab.down('{dir}/record.json') or pick another directory")
    check_limits(n + silent + unreachable)
    python = _target_python()
    hosts = _plan_hosts(prefix, n, silent, unreachable)
    _check_free(prefix, hosts, data_rails)

    created_dir = not os.path.isdir(dir)
    os.makedirs(dir, mode=0o755, exist_ok=True)
    record = _Record(os.path.join(dir, "record.json"), {
        "nictune_fleet": 1, "prefix": prefix, "dir": dir, "created_dir": created_dir,
        "subnet": None, "bridge": f"{prefix}br",
        "hosts": [asdict(h) for h in hosts],
        "links": [], "namespaces": [], "etc_netns": [], "files": [], "processes": [],
        "nccl_claimed": False,
    })
    try:
        _build_network(record, prefix, hosts)
        if data_rails:
            _build_data_rails(record, prefix, hosts)
        fleet = _write_files(record, prefix, dir, hosts, python)
        _start_servers(record, dir, hosts)
        _wait_ready(dir, hosts, record)
        return fleet
    except BaseException:
        down(record.path)
        raise


def _build_network(record: _Record, prefix: str, hosts: List[FleetHost]) -> None:
    in_ns = [h for h in hosts if h.netns]
    segments = bridge_layout(f"{prefix}br", [h.name for h in in_ns])
    # Recorded before creation: down() of a name that was never made is a no-op,
    # and _check_free() made sure none of these names belonged to anyone else.
    record.data["root_links"] = _bridge_links(segments)
    record.add("namespaces", [h.netns for h in in_ns])
    record.add("links", _bridge_links(segments) + [h.name for h in in_ns])
    lines = [f"netns add {h.netns}" for h in in_ns] + _bridge_lines(segments)
    for h in in_ns:
        lines.append(f"link add {h.name} type veth peer name mgmt0 netns {h.netns}")
        lines.append(f"link add rail0 netns {h.netns} type veth peer name rail1 netns {h.netns}")
    lines += _port_lines(segments)
    _raise_neigh_limits(record, len(hosts))
    _ip_batch(lines)
    subnet = _claim_subnet(segments[0].bridge, subnet_prefix(len(hosts)))
    for h, address in zip(hosts, host_addresses(subnet, len(hosts))):
        h.address = address
    record.data.update(subnet=str(subnet), hosts=[asdict(h) for h in hosts],
                       bridges=[s.bridge for s in segments])
    record.save()

    def inside(h: FleetHost) -> None:
        _ip_batch(["link set lo up", f"addr add {h.address}/{subnet.prefixlen} dev mgmt0",
                   "link set mgmt0 up", "link set rail0 up", "link set rail1 up"], h.netns)

    _parallel(inside, in_ns)


def _data_link(prefix: str, host: FleetHost) -> str:
    return f"{prefix}d{host.name[len(prefix) + 1:]}"  # PREFIXh001 -> PREFIXd001


def _build_data_rails(record: _Record, prefix: str, hosts: List[FleetHost]) -> None:
    """data0 in each host namespace, its peer on the bridge PREFIXrb (and
    more, joined, past HOSTS_PER_BRIDGE): a rail between hosts (the rails
    rail0/rail1 are each host's own)."""
    in_ns = [h for h in hosts if h.netns]
    segments = bridge_layout(f"{prefix}rb", [_data_link(prefix, h) for h in in_ns])
    record.data["data_bridge"] = segments[0].bridge
    record.data["root_links"] = record.data.get("root_links", []) + _bridge_links(segments)
    record.add("links", _bridge_links(segments) + [_data_link(prefix, h) for h in in_ns])
    lines = _bridge_lines(segments)
    lines += [f"link add {_data_link(prefix, h)} type veth peer name {DATA_RAIL} netns {h.netns}" for h in in_ns]
    _ip_batch(lines + _port_lines(segments))
    subnet = _claim_subnet(segments[0].bridge, subnet_prefix(len(hosts)), DATA_POOL)
    for h, address in zip(hosts, host_addresses(subnet, len(hosts))):
        h.data_address = address if h.netns else ""
    record.data.update(data_subnet=str(subnet), hosts=[asdict(h) for h in hosts])
    record.save()
    _parallel(lambda h: _ip_batch([f"addr add {h.data_address}/{subnet.prefixlen} dev {DATA_RAIL}",
                                   f"link set {DATA_RAIL} up"], h.netns), in_ns)


def neigh_limits_for(hosts: int) -> Optional[List[int]]:
    """gc_thresh1/2/3 wanted for a fleet of `hosts` (None: the defaults do).
    Defaults 128/512/1024 (net/ipv4/arp.c arp_tbl); below gc_thresh1 the
    periodic GC leaves entries alone (net/core/neighbour.c
    neigh_periodic_work), above gc_thresh2/3 neigh_alloc forces a GC or
    refuses a new entry (neigh_forced_gc).  Twice the fleet, then the
    default proportions."""
    if hosts <= NEIGH_RAISE_ABOVE:
        return None
    low = 2 * hosts
    return [low, 4 * low, 8 * low]


def _raise_neigh_limits(record: _Record, hosts: int) -> None:
    """Raise what is lower than wanted; the old values go into the record
    first, so down() puts them back (if nobody changed them meanwhile)."""
    wanted = neigh_limits_for(hosts)
    if wanted is None:
        return
    old = []
    for i, value in enumerate(wanted, start=1):
        with open(NEIGH_SYSCTL.format(i)) as f:
            now = int(f.read())
        if now < value:
            old.append({"path": NEIGH_SYSCTL.format(i), "old": now, "set": value})
    record.data["neigh"] = old
    record.save()
    for entry in old:
        with open(entry["path"], "w") as f:
            f.write(f"{entry['set']}\n")


def _restore_neigh_limits(record: dict) -> List[str]:
    restored = []
    for entry in record.get("neigh", []):
        try:
            with open(entry["path"]) as f:
                if int(f.read()) != entry["set"]:
                    continue  # someone changed it since: theirs now
            with open(entry["path"], "w") as f:
                f.write(f"{entry['old']}\n")
            restored.append(f"{entry['path']} = {entry['old']}")
        except (OSError, ValueError):
            pass
    return restored


def _write_files(record: _Record, prefix: str, dir: str, hosts: List[FleetHost], python: str) -> Fleet:
    sshd_hosts = [h for h in hosts if h.kind == "sshd"]
    key_file = os.path.join(dir, "id_ed25519")
    paths = {name: os.path.join(dir, name) for name in
             ("inventory.ini", "known_hosts", "ssh_config", "authorized_keys")}
    record.add("files", [key_file, key_file + ".pub", *paths.values()] +
               [os.path.join(dir, h.name) for h in hosts if h.netns])

    # Each sshd host gets its own /etc/nccl.conf, bound over the host's by `ip netns exec`.
    record.data["nccl_claimed"] = True
    record.add("etc_netns", [f"/etc/netns/{h.netns}" for h in sshd_hosts])
    labmod.claim_nccl_target()
    for h in sshd_hosts:
        os.makedirs(f"/etc/netns/{h.netns}", exist_ok=True)
        open(f"/etc/netns/{h.netns}/nccl.conf", "a").close()

    def keygen(path_comment) -> None:
        path, comment = path_comment
        _must(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])

    for h in hosts:
        if h.netns:
            os.makedirs(os.path.join(dir, h.name, "state"))
    jobs = [(key_file, f"nictune-fleet-{prefix}")]
    jobs += [(os.path.join(dir, h.name, "ssh_host_ed25519_key"), h.name) for h in sshd_hosts]
    _parallel(keygen, jobs)

    def public_key(path: str) -> str:
        with open(path + ".pub") as f:
            return " ".join(f.read().split()[:2])

    with open(key_file + ".pub") as f:
        _write(paths["authorized_keys"], f.read())
    known = [f"{h.address} {public_key(os.path.join(dir, h.name, 'ssh_host_ed25519_key'))}\n"
             for h in sshd_hosts]
    _write(paths["known_hosts"], "".join(known))
    for h in sshd_hosts:
        home = os.path.join(dir, h.name, "home")
        shutil.copytree(SKEL, home, symlinks=True)
        _write(os.path.join(dir, h.name, "sshd_config"), _sshd_config(dir, h, home))
    _write(paths["ssh_config"], _ssh_config(hosts, key_file, paths["known_hosts"]))
    _write(paths["inventory.ini"], _inventory(dir, hosts, key_file, paths["known_hosts"], python))
    return Fleet(prefix=prefix, dir=dir, hosts=hosts, inventory=paths["inventory.ini"],
                 known_hosts=paths["known_hosts"], ssh_config=paths["ssh_config"],
                 key_file=key_file, record=record.path)


def _sshd_config(dir: str, host: FleetHost, home: str) -> str:
    lines = [
        f"ListenAddress {host.address}",
        f"Port {host.port}",
        "AddressFamily inet",
        f"HostKey {os.path.join(dir, host.name, 'ssh_host_ed25519_key')}",
        f"AuthorizedKeysFile {os.path.join(dir, 'authorized_keys')}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # keys live in a directory other users may read
        "UseDNS no",
        "PidFile none",
        "PrintMotd no",
        "PrintLastLog no",
        f"SetEnv HOME={home}",
    ]
    if os.access(SFTP_SERVER, os.X_OK):
        lines.append(f"Subsystem sftp {SFTP_SERVER}")
    return "\n".join(lines) + "\n"


def _ssh_config(hosts: List[FleetHost], key_file: str, known_hosts: str) -> str:
    blocks = []
    for h in hosts:
        blocks.append("\n".join([
            f"Host {h.name} {h.address}",  # by address too: tools that look up ansible_host
            f"  HostName {h.address}",
            "  User root",
            f"  Port {h.port}",
            f"  IdentityFile {key_file}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {known_hosts}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  UpdateHostKeys no",
            "  ConnectTimeout 5",
        ]))
    return "\n\n".join(blocks) + "\n"


def _inventory(dir: str, hosts: List[FleetHost], key_file: str, known_hosts: str, python: str) -> str:
    def line(h: FleetHost) -> str:
        state = os.path.join(dir, h.name, "state")
        return (f"{h.name} ansible_host={h.address} ansible_user=root "
                f"ansible_ssh_private_key_file={key_file} nictune_state_dir={state} "
                f"nictune_python={python}")

    sshd = [h for h in hosts if h.kind == "sshd"]
    groups = [("canary", sshd[:1]), ("rest", sshd[1:]),
              ("silent", [h for h in hosts if h.kind == "silent"]),
              ("unreachable", [h for h in hosts if h.kind == "unreachable"])]
    out = ["# Written by nictune's fleet lab (nictune.lab.fleet); removed by `down`."]
    for name, members in groups:
        out += [f"[{name}]", *(line(h) for h in members), ""]
    out += ["[fleet:children]", "canary", "rest", "",
            "[broken:children]", "silent", "unreachable", "",
            # So that `ansible -i inventory.ini fleet -m ping` works as is.
            "[all:vars]", f"ansible_ssh_common_args='-o UserKnownHostsFile={known_hosts} -o IdentitiesOnly=yes'"]
    return "\n".join(out) + "\n"


def _start_servers(record: _Record, dir: str, hosts: List[FleetHost]) -> None:
    if any(h.kind == "sshd" for h in hosts):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    started = []
    try:
        for h in hosts:
            if h.kind == "sshd":
                conf = os.path.join(dir, h.name, "sshd_config")
                argv = [SSHD, "-D", "-f", conf, "-E", os.path.join(dir, h.name, "sshd.log")]
            elif h.kind == "silent":
                argv = [sys.executable, "-c", SILENT_LISTENER, h.address, str(h.port)]
            else:
                continue
            with open(os.path.join(dir, h.name, "start.log"), "ab") as log:
                proc = subprocess.Popen(["ip", "netns", "exec", h.netns, *argv], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log, env=_ENV, start_new_session=True)
            _children[proc.pid] = proc
            # `ip netns exec` execs argv in the same process: either command line is ours.
            started.append({"pid": proc.pid, "host": h.name, "argv": argv, "netns": h.netns})
    finally:
        # One record rewrite for all servers.  A crash before it loses no
        # process: every server runs in a namespace the record already
        # lists, and down() stops whatever runs in those (_pids_in).
        record.add("processes", started)


def _wait_ready(dir: str, hosts: List[FleetHost], record: _Record, timeout: Optional[float] = None) -> None:
    """Until every sshd sends its banner and every silent host accepts TCP."""
    waiting = [h for h in hosts if h.kind in ("sshd", "silent")]
    deadline = time.monotonic() + (timeout if timeout is not None else 20 + 0.3 * len(waiting))
    pids = {p["host"]: p["pid"] for p in record.data["processes"]}

    def probe(h: FleetHost) -> Optional[str]:
        while True:
            try:
                with socket.create_connection((h.address, h.port), timeout=2) as s:
                    if h.kind == "silent":
                        return None
                    banner = s.recv(256)
                    if banner.startswith(b"SSH-"):
                        return None
                    why = f"sent {banner[:40]!r} instead of an SSH banner"
            except OSError as e:
                why = str(e)
            if not _alive(pids[h.name]):
                why = "the server exited"
            elif time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            logs = [os.path.join(dir, h.name, "start.log"), os.path.join(dir, h.name, "sshd.log")]
            return (f"fleet host {h.name} ({h.address}:{h.port}, {h.kind}) is not answering: {why}; log tail: "
                    + " | ".join(_tail(p) for p in logs if os.path.exists(p)))

    failures = [msg for msg in _parallel(probe, waiting, workers=32) if msg]
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise FleetError(failures[0] + more)


# -- teardown ------------------------------------------------------------------

def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[pid]  # reaped by poll()
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> List[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _is_ours(process: dict) -> bool:
    """Is the recorded PID still the process we started (not a reused PID)?
    Its command line is ours as started, ours after `ip netns exec` exec'd
    it, or sshd's retitled "sshd: <command line> [listener] ..."."""
    argv = process["argv"]
    cmdline = _cmdline(process["pid"])
    if cmdline in (argv, ["ip", "netns", "exec", process["netns"], *argv]):
        return True
    return len(cmdline) == 1 and cmdline[0].startswith(f"sshd: {' '.join(argv)} [")


def _pids_in(namespaces: List[str]) -> List[int]:
    """Processes in these namespaces (what `ip netns pids` finds, in one /proc scan)."""
    wanted = set()
    for ns in namespaces:
        st = os.stat(f"/run/netns/{ns}")
        wanted.add((st.st_dev, st.st_ino))
    found = []
    for entry in os.listdir("/proc") if wanted else []:
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue  # gone meanwhile, or a kernel thread
            if (st.st_dev, st.st_ino) in wanted and _alive(int(entry)):
                found.append(int(entry))
    return found


def _stop(pids: List[int], grace: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [p for p in pids if _alive(p)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)


def down(record_path: str) -> List[str]:
    """Remove everything record_path lists (and nothing else); what was removed.
    Idempotent: a second call, or one on a missing record, removes nothing."""
    record = _load_record(record_path)
    if record is None:
        return []
    removed: List[str] = []

    # Processes first: a namespace outlives `ip netns del` while a process is in it.
    ours = [p["pid"] for p in record.get("processes", []) if _is_ours(p)]
    _stop(ours)
    removed += [f"process {pid}" for pid in ours]
    namespaces = [ns for ns in record.get("namespaces", []) if os.path.exists(f"/run/netns/{ns}")]
    # Then whatever still runs inside our namespaces: sshd's per-connection
    # children (they call setsid, so they are not in the listener's group)
    # and the commands they started.
    inside = _pids_in(namespaces)
    _stop(inside)
    removed += [f"process {pid}" for pid in inside]

    # Namespaces first: the kernel frees all their devices (and so the root
    # ends of the veths) in one batch, where `link del` per veth waits for an
    # RCU grace period each (~10 ms).  Whatever is still there after a few
    # seconds is deleted by name.
    present = _root_links()
    links = [name for name in record.get("links", []) if name in present]
    _ip_batch_forgiving([f"netns del {ns}" for ns in namespaces])
    deadline = time.monotonic() + 5
    while True:
        present = _root_links()
        # Bridges (and the veths joining them) stay until deleted by name;
        # the hosts' veths go with their namespaces.
        bridges = {record.get("bridge"), record.get("data_bridge"), *record.get("root_links", [])}
        if not present & (set(links) - bridges) or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    _ip_batch_forgiving([f"link del {name}" for name in links if name in present])
    removed += [f"netns {ns}" for ns in namespaces] + [f"link {name}" for name in links]

    removed += _restore_neigh_limits(record)
    for path in record.get("etc_netns", []):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if record.get("nccl_claimed") and labmod.release_nccl_target():
        removed.append(labmod.NCCL)
    for path in record.get("files", []):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
        else:
            continue
        removed.append(path)
    for path in (record_path + ".tmp", record_path):
        if os.path.exists(path):
            os.unlink(path)
    if record.get("created_dir"):
        try:
            os.rmdir(record["dir"])
            removed.append(record["dir"])
        except OSError:
            pass  # something not ours is in it: leave it
    return removed


def _load_record(record_path: str) -> Optional[dict]:
    """A fleet's record.json, or None when there is none."""
    try:
        with open(record_path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise FleetError(f"{record_path}: not a readable fleet record ({e})")
    if not isinstance(record, dict) or record.get("nictune_fleet") != 1:
        raise FleetError(f"{record_path}: not a fleet record written by nictune's fleet lab")
    return record


def _root_links() -> set:
    return {link["ifname"] for link in json.loads(_run(["ip", "-j", "link", "show"]).stdout or "[]")}


def _ip_batch_forgiving(lines: List[str]) -> None:
    # -force: one name already gone must not stop the rest.
    if lines:
        _run(["ip", "-force", "-batch", "-"], "\n".join(lines) + "\n")


def status(record_path: str) -> Optional[Dict]:
    """What a recorded fleet looks like now, or None when there is no record."""
    record = _load_record(record_path)
    if record is None:
        return None
    running = {p["host"] for p in record.get("processes", []) if _is_ours(p) and _alive(p["pid"])}
    hosts = [{**h, "running": h["name"] in running} for h in record.get("hosts", [])]
    return {"prefix": record["prefix"], "dir": record["dir"], "subnet": record["subnet"],
            "bridge": record["bridge"], "bridges": record.get("bridges", [record["bridge"]]), "hosts": hosts,
            "inventory": os.path.join(record["dir"], "inventory.ini"),
            "ssh_config": os.path.join(record["dir"], "ssh_config")}


# -- the fleet of `nictune lab up --hosts N` ---------------------------------

LAB_PREFIX = "ntf"
# Where `nictune lab up --hosts` says its record is, so `lab down` and
# `lab status` find a fleet built with any --dir.
LAB_POINTER = "/run/nictune-lab-fleet.json"


def lab_record() -> Optional[str]:
    """The record of the lab's fleet, if one is up (or left over)."""
    try:
        with open(LAB_POINTER) as f:
            return json.load(f)["record"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FleetError(f"{LAB_POINTER}: unreadable ({e}); remove it by hand after checking "
                         f"`ip netns list` for {LAB_PREFIX}h* hosts")


def lab_up(n: int, dir: str = LAB_DIR, silent: int = 0, unreachable: int = 0,
           data_rails: bool = False) -> Fleet:
    record = lab_record()
    if record is not None and os.path.exists(record):
        raise FleetError(f"a lab fleet is already up (record {record}): run `nictune lab down` first")
    fleet = up(n, dir, prefix=LAB_PREFIX, silent=silent, unreachable=unreachable, data_rails=data_rails)
    try:
        _write(LAB_POINTER, json.dumps({"record": fleet.record}) + "\n")
    except BaseException:
        down(fleet.record)
        raise
    return fleet


def lab_down() -> List[str]:
    record = lab_record()
    removed = down(record) if record else []
    if os.path.exists(LAB_POINTER):
        os.unlink(LAB_POINTER)
    return removed


def lab_status() -> Optional[Dict]:
    record = lab_record()
    return status(record) if record else None
