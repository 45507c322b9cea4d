"""Sysctls under /proc/sys/net, host-wide and per interface.

/proc/sys/net follows the network namespace of the reading process, but a
few keys are global: the kernel shows them read-only (or not at all) inside
a child namespace, and writing them from the initial namespace changes the
whole machine.  Those are flagged in every plan, and so are the conf.all
keys the kernel copies to every interface (SPREAD).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune.host.transports.io import W_OK
from nictune.host.knobs.base import Family, read_tree
from nictune.host.model import HOST, Desired, Key, Unsupported, Want
from nictune.host.validate import IF_SYSCTL_KEY, SYSCTL_KEY, SYSCTL_VALUE, check

_VALUE = "sysctl_value"  # the schema node both sections share

# Keys the kernel keeps in init_net only: net/core/sysctl_net_core.c
# (netns_core_table holds the per-namespace ones; the rest of net_core_table
# is global), net/ipv4/sysctl_net_ipv4.c (tcp_mem, udp_mem) and
# net/core/neighbour.c (gc_thresh*), as of kernel 6.18.
GLOBAL_SYSCTLS = frozenset({
    "net.core.rmem_max", "net.core.wmem_max", "net.core.rmem_default", "net.core.wmem_default",
    "net.core.netdev_max_backlog", "net.core.netdev_budget", "net.core.netdev_budget_usecs",
    "net.core.dev_weight", "net.core.busy_poll", "net.core.busy_read", "net.core.default_qdisc",
    "net.core.rps_sock_flow_entries", "net.ipv4.tcp_mem", "net.ipv4.udp_mem",
    "net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2",
    "net.ipv4.neigh.default.gc_thresh3",
})
GLOBAL_NOTE = "global: one value for every network namespace on the machine"

# Keys whose write the kernel copies to the same leaf of every interface
# (and, but for force_forwarding, of conf.default), so that writing the old
# value back leaves every interface with that value, not its own: net/ipv4/devinet.c
# inet_forward_change() (ip_forward is conf.all.forwarding, and it also sets
# conf.all.accept_redirects to the opposite), net/ipv6/addrconf.c
# addrconf_fixup_forwarding(), addrconf_disable_ipv6(), addrconf_fixup_linkdown()
# and the addr_gen_mode and force_forwarding handlers, as of kernel 6.18.
# nictune/host/transaction/aside.py records the interfaces' own values before an apply
# writes one of these, and puts them back after a rollback.
SPREAD = {
    "net.ipv4.ip_forward": ("ipv4", "forwarding"),
    "net.ipv4.conf.all.forwarding": ("ipv4", "forwarding"),
    "net.ipv6.conf.all.forwarding": ("ipv6", "forwarding"),
    "net.ipv6.conf.all.force_forwarding": ("ipv6", "force_forwarding"),
    "net.ipv6.conf.all.disable_ipv6": ("ipv6", "disable_ipv6"),
    "net.ipv6.conf.all.addr_gen_mode": ("ipv6", "addr_gen_mode"),
    "net.ipv6.conf.all.ignore_routes_with_linkdown": ("ipv6", "ignore_routes_with_linkdown"),
}
# What a SPREAD write sets besides the leaf of every interface.
SPREAD_ALSO = {("ipv4", "forwarding"): ("net.ipv4.conf.all.accept_redirects",)}


def spread_note(name: str) -> str:
    """What writing SPREAD key `name` does besides, for plans."""
    fam, leaf = SPREAD[name]
    also = "".join(f" and {n}" for n in SPREAD_ALSO.get((fam, leaf), ()))
    return f"writing it also sets net.{fam}.conf.<every interface>.{leaf}{also}"


# What `nictune show` reports when no profile names the keys.
SHOW_HOST = ("net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
             "net.ipv4.tcp_ecn", "net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_congestion_control")
SHOW_INTERFACE = ("ipv4.arp_ignore", "ipv4.arp_announce", "ipv4.rp_filter")


def normalise(value):
    """Kernel text and profile values to one form: an int when the value is
    a single integer, else whitespace-folded text (tcp_rmem reads back
    tab-separated)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    text = " ".join(str(value).split())
    try:
        return int(text)
    except ValueError:
        return text


class SysctlFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
host:
  sysctl:
    net.core.rmem_max: 268435456
    net.ipv4.tcp_rmem: [4096, 131072, 134217728]
interfaces:
  rails:
    match: {driver: mlx5_core}
    sysctl: {ipv4.arp_ignore: 1, ipv4.arp_announce: 2}
"""
    name = "sysctl"
    position = 10
    position_note = "first: a sysctl cannot cut the management path"
    sections = ("sysctl",)       # per interface: ipv4.<leaf> / ipv6.<leaf>
    host_sections = ("sysctl",)  # host: full net.* names
    settings = ("sysctl",)

    @classmethod
    def plan_reads(cls, host) -> None:
        # Every sysctl, so that a profile can name one a show does not print.
        read_tree(host, host.path("proc/sys/net"))

    @classmethod
    def schema(cls, s):
        number = s.integer(s.S64_MIN, s.U64_MAX)
        value = {"anyOf": [
            number,
            s.text(SYSCTL_VALUE, 256),
            {"type": "array", "items": number, "minItems": 1, "maxItems": 8},
            s.bound(number),
        ]}
        return {
            "entry": {"sysctl": s.mapping(
                "Per-interface sysctls, named relative to net.<family>.conf.<interface>, such as ipv4.rp_filter.",
                s.text(IF_SYSCTL_KEY, 69), s.ref(_VALUE), 128)},
            "host": {"sysctl": s.mapping(
                "Host sysctls under net., such as net.ipv4.tcp_ecn.",
                s.text(SYSCTL_KEY, 128), s.ref(_VALUE), 512)},
            "defs": {_VALUE: value},
        }

    @classmethod
    def label(cls, target, name):
        if target == HOST:
            return name
        # net.ipv4.conf.<if>.arp_ignore is shown as the profile spells it;
        # interface names may hold dots (VLANs), so split around the target.
        # Names come back from hosts too: anything else is shown as it came.
        for fam in ("ipv4", "ipv6"):
            prefix = f"net.{fam}.conf.{target}."
            if name.startswith(prefix) and len(name) > len(prefix):
                return f"{fam}.{name[len(prefix):]}"
        return name

    def expand(self, target, sections, source):
        out = []
        for short, raw in sections.get("sysctl", {}).items():
            want = Want.parse(raw)
            want = Want(normalise(want.value), want.bound)
            if isinstance(want.value, str):
                check(SYSCTL_VALUE, want.value, f"value of sysctl {short}")
            out.append(Desired(self.key_for(target, short), want, source("sysctl", short)))
        return out

    def key_for(self, target: str, short: str) -> Key:
        """Host keys are full names; interface keys are ipv4.<leaf>/ipv6.<leaf>."""
        if target == HOST:
            return Key(self.name, HOST, check(SYSCTL_KEY, short, "sysctl name"))
        fam, leaf = check(IF_SYSCTL_KEY, short, "interface sysctl name").split(".", 1)
        return Key(self.name, target, f"net.{fam}.conf.{target}.{leaf}")

    def path(self, key: Key) -> str:
        if key.target == HOST:
            parts = key.name.split(".")
        else:
            # Interface names may hold dots (VLANs): split around the target.
            fam = key.name.split(".")[1]
            leaf = key.name[len(f"net.{fam}.conf.{key.target}."):]
            parts = ["net", fam, "conf", key.target, leaf]
        return self.host.path("proc/sys", *parts)

    def read(self, keys):
        out = {}
        for key in keys:
            try:
                out[key] = normalise(self.host.io.read_text(self.path(key)))
            except FileNotFoundError:
                where = "" if key.target == HOST else f" for {key.target}"
                out[key] = Unsupported(f"no such sysctl{where} in this kernel or namespace")
            except OSError as e:
                out[key] = Unsupported(f"cannot read: {e.strerror}")
        return out

    def check(self, key, want) -> Optional[str]:
        if not self.host.io.access(self.path(key), W_OK):
            extra = " (a global key: set it in the host namespace)" if key.name in GLOBAL_SYSCTLS else ""
            return "read-only here" + extra
        return None

    def note(self, key: Key) -> str:
        if key.target == HOST and key.name in SPREAD:
            return spread_note(key.name)
        return GLOBAL_NOTE if key.name in GLOBAL_SYSCTLS else ""

    def apply(self, items):
        for key, value in items:
            text = str(normalise(value))
            check(SYSCTL_VALUE, text, f"value of sysctl {key.name}")
            try:
                self.host.io.write_text(self.path(key), text)
            except OSError as e:
                raise OSError(e.errno, f"{key.name}={text}: {e.strerror}") from None

    def show(self, target):
        names = SHOW_HOST if target == HOST else SHOW_INTERFACE
        keys = [self.key_for(target, n) for n in names]
        values = self.read(keys)
        shown = {n: values[k] for n, k in zip(names, keys) if not isinstance(values[k], Unsupported)}
        return {"sysctl": shown} if shown else {}
