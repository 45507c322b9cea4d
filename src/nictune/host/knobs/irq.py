"""Where a rail's queue interrupts land: IRQ affinity, XPS and RPS.

    irq:
      cpus: numa          # the NIC's NUMA node's CPUs (device/local_cpulist), or a cpulist
      count: 8            # spread over the first 8 of them...
      housekeeping: 0-1   # ...skipping these CPUs
      xps: true           # tx-N's XPS mask: the CPU of queue N's interrupt
      rps: false          # rx-N's RPS mask: none (true: every CPU of the policy)

Resolution, on every read (IRQ numbers change when a driver reloads or
re-creates its channels; names do not):
- the device's MSI-X vectors: /sys/class/net/X/device/msi_irqs/ (the PCI
  function's directory; for virtio-net, device is the virtio device and the
  directory is its parent's);
- their names, from /proc/interrupts' last column, select the queue vectors
  and their queue index: mlx5 `mlx5_comp<q>@pci:<bdf>` (one vector per
  channel, rx and tx), virtio-net `virtio<n>-input.<q>` and `-output.<q>`
  (one per direction), MANA `mana_q<q>@pci:<bdf>`, and the `<name>-TxRx-<q>`
  / `-rx-<q>` / `-tx-<q>` of Intel and most other drivers.  Other vectors
  (mlx5_async, virtio config and control) are left where they are.

Assignment, deterministic: the CPUs of the policy (cpus:, less
housekeeping:, the first count: of them, in CPU order); the queues in index
order; queue i -> CPU number i modulo how many.  Every vector of queue i
gets that one CPU (smp_affinity_list); tx-N's XPS mask is the CPU of queue
N modulo the queue count (mlx5 has a tx queue per channel and traffic
class); RPS, when asked, is the whole CPU set of the policy on every rx-N
(false writes 0: RPS off).  Plans show each key's queue, CPU and the
profile line of the policy.

Keys: "irq.<vector>" (the vector's name without its device decoration:
mlx5_comp3, input.3), "xps.tx-<n>", "rps.rx-<n>"; values are cpulists
("3", "0-3,8"), "" for an empty mask.

What the kernel does with a write:
- /proc/irq/N/smp_affinity_list is global: one value for the whole
  machine, whatever the network namespace.
- An IRQ whose affinity the kernel manages (IRQD_AFFINITY_MANAGED:
  pci_alloc_irq_vectors_affinity with PCI_IRQ_AFFINITY, as NVMe and
  virtio-blk use) refuses writes with EIO (kernel/irq/manage.c
  irq_set_affinity_locked -> irq_can_set_affinity_usr).  read() says so
  from debugfs (/sys/kernel/debug/irq/irqs/N "IRQD_AFFINITY_MANAGED") when
  it is mounted, and apply() words an EIO the same way: unsupported by the
  kernel, never something to retry.  mlx5 (irq_set_affinity_and_hint),
  MANA and virtio-net (vp_set_vq_affinity) set a hint and an affinity a
  user may change.
- irqbalance moves IRQs every 10 s unless told not to: note() says, per
  IRQ, whether a running irqbalance will undo the write (not when the IRQ
  is banned with --banirq, or a --policyscript may ban it; a target CPU in
  IRQBALANCE_BANNED_CPULIST/IRQBALANCE_BANNED_CPUS is one it moves IRQs
  off; --hintpolicy=exact, before irqbalance 1.2, follows the driver's
  affinity_hint) and what to set.
- The resident agent writes these keys again when a link comes back up,
  whatever on_drift says (reassert_on_link_up): drivers that free and
  request their IRQs on open (and any re-created device) start from the
  driver's own placement.
"""

from __future__ import annotations

import errno
import re

from nictune.host.knobs.base import Family, read_quietly
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import InvalidInput

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (test_agent_imports.py)
    from typing import Optional

CPULIST = r"^[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?){0,63}$"
CPUS = r"^(numa|[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?){0,63})$"
MAX_CPU = 8191  # CONFIG_NR_CPUS of the largest distribution kernels
_WORDS = "a cpulist such as 0-3,8 (ranges and single CPUs, comma-separated)"

# /proc/interrupts names of queue vectors: (pattern, key name from the match).
QUEUE_VECTORS = (
    (re.compile(r"^(mlx5_comp)(\d+)@"), lambda m: f"{m[1]}{m[2]}"),
    (re.compile(r"^(mana_q)(\d+)@"), lambda m: f"{m[1]}{m[2]}"),
    (re.compile(r"^virtio\d+-(input|output)\.(\d+)$"), lambda m: f"{m[1]}.{m[2]}"),
    (re.compile(r"-(TxRx|txrx|rx|tx)-(\d+)$"), lambda m: f"{m[1]}-{m[2]}"),
)
MANAGED_FLAG = "IRQD_AFFINITY_MANAGED"
IRQBALANCE = "irqbalance"
IRQBALANCE_CONFIGS = ("etc/default/irqbalance", "etc/sysconfig/irqbalance")
_MAX_PIDS = 100_000


# -- cpulists and masks ----------------------------------------------------------

def parse_cpulist(text: str, what: str = "cpulist") -> list:
    """Sorted CPU numbers of a cpulist ("0-3,8"); "" is none."""
    text = text.strip()
    if not text:
        return []
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise InvalidInput(f"invalid {what}: {text!r} is not {_WORDS}")
        first, last = int(lo), int(hi or lo)
        if first > last or last > MAX_CPU:
            raise InvalidInput(f"invalid {what}: {part!r} in {text!r} is not a range of CPUs "
                               f"0-{MAX_CPU}, low to high")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus) -> str:
    """The kernel's own form (bitmap_print_list_to_buf): "0-3,8"."""
    out, run = [], []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(_run(run))
        run = [cpu]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_mask(text: str) -> list:
    """CPUs of a hex mask as sysfs prints it ("00000000,0000000f")."""
    value = int(text.strip().replace(",", "") or "0", 16)
    return [cpu for cpu in range(value.bit_length()) if value >> cpu & 1]


def format_mask(cpus) -> str:
    """A hex mask in 32-bit words, comma-separated, as bitmap_parse takes it."""
    value = sum(1 << cpu for cpu in set(cpus))
    digits = f"{value:x}"
    digits = digits.rjust(-(-len(digits) // 8) * 8, "0")
    return ",".join(digits[i:i + 8] for i in range(0, len(digits), 8))


def queue_vector(name: str):
    """(key name, queue index) of a /proc/interrupts name, or None when the
    vector is not a queue's (async, config, control)."""
    for pattern, key in QUEUE_VECTORS:
        m = pattern.search(name)
        if m:
            return key(m), int(m[2])
    return None


def parse_interrupts(text: str) -> dict:
    """{irq number: name} from /proc/interrupts: the name is the last
    column (mlx5's and virtio's names hold no spaces; a shared line's
    names are comma-separated and left whole)."""
    lines = text.splitlines()
    if not lines:
        return {}
    ncpus = len(lines[0].split())
    out = {}
    for line in lines[1:]:
        head, sep, rest = line.partition(":")
        if not sep or not head.strip().isdigit():
            continue
        words = rest.split()
        # counts per CPU, the chip, the hwirq-and-trigger, then the name
        tail = words[ncpus:]
        if len(tail) >= 3:
            out[int(head)] = " ".join(tail[2:])
    return out


# -- the family --------------------------------------------------------------------

class IrqFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    # Queue i's interrupt on CPU i of the NIC's NUMA node, CPUs 0-1 left to the system.
    irq: {cpus: numa, count: 8, housekeeping: "0-1", xps: true, rps: false}
"""
    name = "irq"
    position = 55
    position_note = ("after channels and rings: a channel count change re-creates queues (and "
                     "mlx5 resets XPS then); before coalesce and pause, which keep the vectors")
    sections = ("irq",)
    settings = ("irq.cpus", "irq.count", "irq.housekeeping", "irq.xps", "irq.rps")
    # The resident agent writes these keys again when a link comes back up.
    reassert_on_link_up = True

    @classmethod
    def schema(cls, s):
        return {"entry": {"irq": s.section(
            "Placement of the interface's queue interrupts (/proc/irq/N/smp_affinity_list, "
            "from the device's MSI-X vectors), XPS and RPS masks.", {
                "cpus": {**s.text(CPUS, 400, words="numa, or " + _WORDS),
                         "description": "numa: the CPUs of the NIC's NUMA node (device/local_cpulist); "
                                        "or these CPUs, a cpulist such as 8-15."},
                "count": {**s.integer(1, MAX_CPU + 1),
                          "description": "Spread over this many CPUs of the set: the first N, in CPU order."},
                "housekeeping": {**s.text(CPULIST, 400, words=_WORDS),
                                 "description": "CPUs to leave out of the set (the system's own work)."},
                "xps": {"type": "boolean",
                        "description": "true: tx-N's XPS mask is the CPU of queue N's interrupt; "
                                       "false: XPS masks are left alone."},
                "rps": {"type": "boolean",
                        "description": "true: every rx-N steers to the whole CPU set (RPS); "
                                       "false: RPS off (mask 0)."},
            }, minProperties=1, title="IRQ placement")}}

    def __init__(self, host):
        super().__init__(host)
        self._why: dict = {}      # key -> what the plan shows (queue, CPU, policy)
        self._managed: set = set()  # irq numbers debugfs says the kernel manages
        self._irqs: dict = {}     # (target, vector) -> irq number, from the last read
        self._balancer = None     # irqbalance as found, once per command

    # -- where things are -------------------------------------------------------------

    def _net(self, ifname: str, *parts: str) -> str:
        return self.host.path("sys/class/net", ifname, *parts)

    def pci_dir(self, ifname: str) -> Optional[str]:
        """The directory of the PCI function behind `ifname`, holding
        msi_irqs/ and local_cpulist (virtio-net's device is the virtio
        device: its parent's), or None."""
        io = self.host.io
        device = self._net(ifname, "device")
        if not io.exists(device):
            return None
        here = io.realpath(device)
        for candidate in (here, here.rsplit("/", 1)[0]):
            if io.isdir(candidate + "/msi_irqs"):
                return candidate
        return None

    def vectors(self, ifname: str) -> dict:
        """{key name: (irq, queue)} of the interface's queue vectors."""
        pci = self.pci_dir(ifname)
        if pci is None:
            raise LookupError(f"{ifname} has no MSI-X vectors (no device/msi_irqs: "
                              "not a PCI function, or legacy interrupts)")
        mine = {int(n) for n in self.host.io.listdir(pci + "/msi_irqs") if n.isdigit()}
        names = parse_interrupts(self.host.io.read_text(self.host.path("proc/interrupts")))
        out = {}
        for irq in sorted(mine):
            found = queue_vector(names.get(irq, ""))
            if found:
                out[found[0]] = (irq, found[1])
        if not out:
            raise LookupError(f"{ifname}: none of its {len(mine)} MSI vectors is named as a "
                              "queue's in /proc/interrupts")
        return out

    def queue_dirs(self, ifname: str, prefix: str) -> list:
        try:
            names = self.host.io.listdir(self._net(ifname, "queues"))
        except OSError:
            return []
        return sorted((n for n in names if n.startswith(prefix) and n[len(prefix):].isdigit()),
                      key=lambda n: int(n[len(prefix):]))

    def online(self) -> list:
        return parse_cpulist(self.host.io.read_text(self.host.path(
            "sys/devices/system/cpu/online")), "online CPUs")

    def numa_cpus(self, ifname: str) -> tuple:
        """(node, CPUs) of the NIC's NUMA node."""
        pci = self.pci_dir(ifname) or self.host.io.realpath(self._net(ifname, "device"))
        node = self.host.io.read_text(pci + "/numa_node").strip()
        cpus = parse_cpulist(self.host.io.read_text(pci + "/local_cpulist"), "local_cpulist")
        return node, cpus

    # -- profile -> keys ----------------------------------------------------------------

    def expand(self, target, sections, source):
        sec = sections["irq"]
        policy = sec.get("cpus", "numa")
        for name in ("cpus", "housekeeping"):
            if sec.get(name, "numa") != "numa":
                try:
                    parse_cpulist(sec[name], f"irq.{name}")
                except InvalidInput as e:
                    raise InvalidInput(f"{source('irq', name)}: {e}") from None
        housekeeping = parse_cpulist(sec.get("housekeeping", ""))
        where = source("irq", "cpus" if "cpus" in sec else next(iter(sec)))
        try:
            vectors = self.vectors(target)
            cpus, described = self._cpu_set(target, policy, housekeeping, sec.get("count"))
        except (LookupError, OSError, ValueError) as e:
            key = Key(self.name, target, "queues")
            self._why[key] = str(e)
            return [Desired(key, Want(policy), where)]
        queues = sorted({q for _, q in vectors.values()})
        cpu_of = {q: cpus[i % len(cpus)] for i, q in enumerate(queues)}
        out = []
        for vector, (irq, queue) in sorted(vectors.items(), key=lambda v: (v[1][1], v[0])):
            key = Key(self.name, target, f"irq.{vector}")
            self._why[key] = f"queue {queue} -> CPU {cpu_of[queue]} ({described}); IRQ {irq}"
            out.append(Desired(key, Want(str(cpu_of[queue])), where))
        if sec.get("xps"):
            for tx in self.queue_dirs(target, "tx-"):
                queue = queues[int(tx[3:]) % len(queues)]
                key = Key(self.name, target, f"xps.{tx}")
                self._why[key] = f"{tx} -> CPU {cpu_of[queue]}, queue {queue}'s"
                out.append(Desired(key, Want(str(cpu_of[queue])), source("irq", "xps")))
        if "rps" in sec:
            wanted = format_cpulist(cpus) if sec["rps"] else ""
            for rx in self.queue_dirs(target, "rx-"):
                key = Key(self.name, target, f"rps.{rx}")
                self._why[key] = f"{rx} steers to {wanted or 'no CPU (RPS off)'}"
                out.append(Desired(key, Want(wanted), source("irq", "rps")))
        return out

    def _cpu_set(self, target: str, policy: str, housekeeping: list, count) -> tuple:
        """(CPUs in order, how the plan describes them)."""
        if policy == "numa":
            node, cpus = self.numa_cpus(target)
            described = f"NUMA node {node} of {target}: {format_cpulist(cpus)}"
        else:
            cpus, described = parse_cpulist(policy), f"cpus {policy}"
        cpus = [c for c in cpus if c not in housekeeping]
        if housekeeping:
            described += f", less housekeeping {format_cpulist(housekeeping)}"
        if count:
            cpus = cpus[:count]
            described += f", first {count}"
        if not cpus:
            raise ValueError(f"the CPU set is empty ({described})")
        return cpus, described

    # -- host -> values -------------------------------------------------------------------

    def _irq_path(self, irq: int, name: str = "smp_affinity_list") -> str:
        return self.host.path("proc/irq", str(irq), name)

    def _queue_file(self, key: Key) -> str:
        kind, _, queue = key.name.partition(".")
        return self._net(key.target, "queues", queue, "xps_cpus" if kind == "xps" else "rps_cpus")

    def read(self, keys):
        out, vectors = {}, {}
        self._irqs = {}
        for key in keys:
            if key.name == "queues":
                out[key] = Unsupported(self._why.get(key, "no queue vectors"))
                continue
            kind, _, rest = key.name.partition(".")
            if kind != "irq":
                out[key] = self._read_mask(key)
                continue
            if key.target not in vectors:
                try:
                    vectors[key.target] = self.vectors(key.target)
                except LookupError as e:
                    vectors[key.target] = str(e)
            found = vectors[key.target]
            if isinstance(found, str) or rest not in found:
                out[key] = Unsupported(found if isinstance(found, str) else
                                       f"{key.target} has no vector {rest} now")
                continue
            irq = found[rest][0]
            self._irqs[key.target, rest] = irq
            if self._is_managed(irq):
                self._managed.add(irq)
                out[key] = Unsupported(f"IRQ {irq} has kernel-managed affinity ({MANAGED_FLAG}): "
                                       "the kernel places it and refuses writes (EIO)")
                continue
            out[key] = format_cpulist(parse_cpulist(self.host.io.read_text(self._irq_path(irq))))
        return out

    def _read_mask(self, key: Key):
        try:
            return format_cpulist(parse_mask(self.host.io.read_text(self._queue_file(key))))
        except FileNotFoundError:
            return Unsupported(f"{key.target} has no {key.name.partition('.')[2]} now")
        except ValueError:
            raise
        except OSError as e:
            # XPS on a device without multiple tx queues: ENOENT or EINVAL
            return Unsupported(f"cannot read {key.name}: {e.strerror}")

    def _is_managed(self, irq: int) -> bool:
        try:
            text = self.host.io.read_text(self.host.path("sys/kernel/debug/irq/irqs", str(irq)))
        except OSError:
            return False  # no debugfs: an EIO on the write says it
        return MANAGED_FLAG in text

    def check(self, key, want):
        if key.name == "queues" or not isinstance(want.value, str):
            return None
        try:
            offline = set(parse_cpulist(want.value)) - set(self.online())
        except (OSError, ValueError):
            return None
        if offline:
            return f"CPU {format_cpulist(offline)} is not online"
        return None

    def note(self, key):
        why = self._why.get(key, "")
        if not key.name.startswith("irq."):
            return why
        irq = self._irqs.get((key.target, key.name[4:]))
        if irq is None:
            return why
        balance = self.irqbalance_note(irq, self._want_cpus(key))
        return f"{why}; {balance}" if balance else why

    def _want_cpus(self, key) -> list:
        text = self.wanted.get(key)
        try:
            return parse_cpulist(text.want.value) if text is not None else []
        except (ValueError, AttributeError):
            return []

    # -- irqbalance -------------------------------------------------------------------------

    def irqbalance(self) -> Optional[dict]:
        """{"pid", "banned_irqs", "policy_script", "banned_cpus"} of a running
        irqbalance, or None."""
        if self._balancer is None:
            self._balancer = find_irqbalance(self.host) or {}
        return self._balancer or None

    def irqbalance_note(self, irq: int, cpus: list) -> str:
        found = self.irqbalance()
        if not found:
            return ""
        pid = found["pid"]
        if irq in found["banned_irqs"]:
            return f"irqbalance (pid {pid}) leaves IRQ {irq} alone (--banirq)"
        banned = set(found["banned_cpus"]) & set(cpus)
        fix = (f"ban it: IRQBALANCE_ARGS=\"--banirq={irq}\" in /etc/default/irqbalance "
               "(/etc/sysconfig/irqbalance), then restart irqbalance; or stop irqbalance")
        if found["policy_script"]:
            return (f"irqbalance (pid {pid}) runs policy script {found['policy_script']}: it "
                    f"keeps IRQ {irq} here only if the script says ban=true; else {fix}")
        why = (f" (CPU {format_cpulist(banned)} is in its banned CPU list)" if banned else
               " (--hintpolicy=exact: back to the driver's affinity_hint)"
               if found.get("hint_policy") == "exact" else "")
        return f"irqbalance (pid {pid}) will move IRQ {irq} again{why}: {fix}"

    # -- values -> host --------------------------------------------------------------------

    def apply(self, items):
        for key, value in items:
            if key.name == "queues":
                continue
            if not isinstance(value, str):
                raise ValueError(f"{key.name}: {value!r} is not a cpulist")
            cpus = parse_cpulist(value)
            if key.name.startswith("irq."):
                self._write_affinity(key, cpus)
            else:
                self.host.io.write_text(self._queue_file(key), format_mask(cpus))

    def _write_affinity(self, key: Key, cpus: list) -> None:
        vector = key.name[4:]
        irq = self._irqs.get((key.target, vector))
        if irq is None:
            irq = self.vectors(key.target)[vector][0]
        try:
            self.host.io.write_text(self._irq_path(irq), format_cpulist(cpus))
        except OSError as e:
            if e.errno == errno.EIO:
                raise OSError(e.errno, f"IRQ {irq} ({vector}) has kernel-managed affinity: the "
                                       "kernel refuses a placement (EIO); leave it out") from None
            raise OSError(e.errno, f"IRQ {irq} ({vector}) -> {format_cpulist(cpus)}: "
                                   f"{e.strerror}") from None

    # -- host -> profile ------------------------------------------------------------------

    def show(self, target):
        return {}  # placement is a policy, not a value per IRQ: nothing to show as one

    @classmethod
    def plan_reads(cls, host) -> None:
        family = cls(host)
        read_quietly(host, host.path("proc/interrupts"))
        read_quietly(host, host.path("sys/devices/system/cpu/online"))
        for iface in host.interfaces():
            try:
                vectors = family.vectors(iface.name)
            except (LookupError, OSError, ValueError):
                continue
            pci = family.pci_dir(iface.name)
            for name in ("numa_node", "local_cpulist"):
                read_quietly(host, f"{pci}/{name}")
            for irq, _ in vectors.values():
                read_quietly(host, family._irq_path(irq))
                read_quietly(host, host.path("sys/kernel/debug/irq/irqs", str(irq)))
            for prefix, name in (("tx-", "xps_cpus"), ("rx-", "rps_cpus")):
                for queue in family.queue_dirs(iface.name, prefix):
                    read_quietly(host, family._net(iface.name, "queues", queue, name))
        find_irqbalance(host)


def find_irqbalance(host) -> Optional[dict]:
    """A running irqbalance, from /proc/<pid>/comm, with what it was told:
    --banirq/-i (its command line), --policyscript/-l, and the banned CPUs
    of IRQBALANCE_BANNED_CPULIST / IRQBALANCE_BANNED_CPUS (its environment,
    which systemd fills from /etc/default/irqbalance or
    /etc/sysconfig/irqbalance)."""
    io = host.io
    try:
        pids = [p for p in io.listdir(host.path("proc")) if p.isdigit()][:_MAX_PIDS]
    except OSError:
        return None
    for pid in sorted(pids, key=int):
        try:
            if io.read_text(host.path("proc", pid, "comm")).strip() != IRQBALANCE:
                continue
            argv = io.read_text(host.path("proc", pid, "cmdline")).split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        return {"pid": int(pid), **irqbalance_options(argv, _environ(host, pid))}
    return None


def _environ(host, pid: str) -> dict:
    try:
        text = host.io.read_text(host.path("proc", pid, "environ"))
    except (OSError, UnicodeDecodeError):
        return {}
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


def irqbalance_options(argv: list, env: dict) -> dict:
    """What irqbalance's command line and environment tell it (irqbalance.c
    parse_command_line; cputree.c IRQBALANCE_BANNED_CPULIST, which wins over
    the older hex IRQBALANCE_BANNED_CPUS; --hintpolicy, of irqbalance before
    1.2, where exact follows each IRQ's affinity_hint, the driver's)."""
    banned, script, hint = set(), None, None
    args = [a for a in argv if a]
    for i, arg in enumerate(args):
        value = None
        for flag in ("--banirq", "-i", "--policyscript", "-l", "--hintpolicy", "-h"):
            if arg == flag and i + 1 < len(args):
                value = (flag, args[i + 1])
            elif arg.startswith(flag + "=") and flag.startswith("--"):
                value = (flag, arg.split("=", 1)[1])
        if value and value[0] in ("--banirq", "-i") and value[1].isdigit():
            banned.add(int(value[1]))
        elif value and value[0] in ("--policyscript", "-l"):
            script = value[1]
        elif value and value[0] in ("--hintpolicy", "-h"):
            hint = value[1]
    cpus: list = []
    try:
        if env.get("IRQBALANCE_BANNED_CPULIST"):
            cpus = parse_cpulist(env["IRQBALANCE_BANNED_CPULIST"])
        elif env.get("IRQBALANCE_BANNED_CPUS"):
            cpus = parse_mask(env["IRQBALANCE_BANNED_CPUS"])
    except ValueError:
        cpus = []
    return {"banned_irqs": banned, "policy_script": script, "banned_cpus": cpus, "hint_policy": hint}
