"""Expectations: health facts an interface must show, never written.

    expect:
      driver: mlx5_core
      firmware: ">=28.39"             # ==, >=, <=, >, < or a plain exact version
      link_speed_mbps: 400000
      pcie_width: 16
      pcie_speed_gts: 32
      counters: {rx_discards_phy: {max: 0}, TlsDecryptError: 0}  # increase
      counters_interval: 5            # seconds between the two reads
      counter_totals: {TlsTxDevice: {min: 1}}   # the value as it reads
      ipsec_offload: {if_present: crypto}  # or crypto, packet, none (host/facts/ipsec.py)
      firmware_pending_reset: false   # devlink dev info: stored == running

Keys are family "expect", name the fact ("counters.<name>" and
"counter_totals.<name>" for counters).  The family is read-only: the
engine never writes it; plan, verify and apply report an unmet
expectation as drift.  A fact the host does not report reads as None,
which meets no expectation.

Counters are the interface's ethtool statistics, RDMA hw_counters and
/sys/class/net/X/statistics (host/facts/health.py), except the kTLS ones of
/proc/net/tls_stat (Tls*: TlsTxDevice, TlsDecryptError, ...), which are
the network namespace's whichever entry names them -- the namespace the
agent runs in: kTLS sockets of pods in their own namespaces are not
counted -- and read as Unsupported("the tls module is not loaded") where
that file is absent.

`counters` compares how much each counter rose over an interval, not its
total: a counter is a total since the device last reset it, so one drop
at boot would otherwise be drift forever.  read() reads every counter key
of every interface, waits, and reads them again: one wait per command,
as long as the longest counters_interval any entry asks for (default 5 s,
1 to 60); an entry with a shorter one has its second read when its own
interval is up, within that one wait.  The value plans show is the
increase, and the note says "rx_discards_phy rose by 12 in 5 s (100 ->
112)".  A counter that fell between the reads (reset, or a 32-bit
hw_counter wrapped), or that only one read found, reads as None: its
increase is unknown, and the note says so; one the host lacks reads as
None too, named in the note.  Counters that count what there is now rather than events (the
TlsCurr* sockets, a veth's peer_ifindex: health.GAUGES) are compared as
they read, without a wait.  `counter_totals` is for wanting a total (at
least one kTLS record sent by the device since boot: TlsTxDevice {min:
1}): compared as it reads, without a wait.

Which commands wait: every one that reads these keys samples them the same
way, so that plan, apply and verify agree on what is drift.  plan and
apply (whose plan comes before any write) and verify each wait once;
audit is verify on each host, and hosts run in parallel (the fleet's
forks), so a fleet audit pays the interval once per batch of hosts, not
once per host.  show reads no expectations and never waits.  A profile
without counters: expectations (or with gauges and totals only) never
waits.

ipsec_offload is read over NETLINK_XFRM (host/facts/ipsec.py says which SAs and
policies concern an interface).  Its current value is the modes its SAs
run in, joined with "+" ("crypto", "crypto+none"), None without SAs:
crypto is met when every SA is offloaded to the interface (packet offload
does the crypto too) and there is at least one; packet when every SA and
policy is packet-offloaded there; none when no SA is offloaded there (no
SA at all meets it).  The plan's note names each SA at fault and why.

Expectations are read on every verify and audit, busy or idle, so the ones
that need traffic at that moment (crypto or packet: at least one SA;
TlsCurrTxDevice {min: 1}: an open kTLS socket) drift forever on an idle
host.  Their "if present" forms hold there: {if_present: crypto|packet}
shows as "crypto if present" and is met with no SA at all, else as crypto
or packet; for kTLS, TlsCurrTxSw {max: 0} (no socket in software now).  "Is
it in use" is the play gate's question, asked while its traffic runs
(control/rollout/gate/ipsec.py, counters: min:).

firmware_pending_reset is read from devlink `dev info` of the device that
has a port for the interface (host/facts/health.py): true when a flashed
firmware waits for a reset; the note names the components and versions.
Without such a device (no devlink, a driver without info_get) it reads as
Unsupported, not as unmet.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from nictune.host.facts.ipsec import OFFLOAD_MODES, support_note
from nictune.host.facts.ipsec import met as ipsec_met
from nictune.host.knobs.base import Family
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import COUNTER_NAME, DRIVER, VERSION_WANT, InvalidInput, check

FWRESET = "firmware_pending_reset"
FACTS = ("driver", "firmware", "link_speed_mbps", "pcie_width", "pcie_speed_gts", FWRESET)
COUNTER_PREFIX = "counters."
TOTAL_PREFIX = "counter_totals."
# Named to sort beside counters:, the mapping whose reads it spaces; whole
# seconds.  5 s catches a drop burst of a congested job yet keeps an audit
# short; a minute is the most one command waits.
INTERVAL = "counters_interval"
DEFAULT_INTERVAL = 5
MAX_INTERVAL = 60
IPSEC = "ipsec_offload"
IPSEC_MODES = ("crypto", "packet", "none")
IF_PRESENT = "if_present"
IF_PRESENT_MODES = ("crypto", "packet")
IF_PRESENT_TEXT = " if present"  # how plans show {if_present: crypto}: "crypto if present"

_OPS = {
    "==": lambda a, b: a == b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


def _parts(version: str) -> Optional[Tuple[int, ...]]:
    """"28.39.1002 (MT_0000000838)" -> (28, 39, 1002); None if not numeric."""
    head = version.strip().split(" ", 1)[0] if version else ""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", head):
        return None
    return tuple(int(p) for p in head.split("."))


def version_met(wanted: str, actual: Optional[str]) -> bool:
    """Whether firmware `actual` meets `wanted`, comparing numerically per
    dotted part; missing trailing parts count as 0 (28.39 == 28.39.0)."""
    m = re.fullmatch(r"(==|>=|<=|>|<)?(.*)", wanted)
    op, want_text = (m.group(1) or "=="), m.group(2)
    want, have = _parts(want_text), _parts(actual or "")
    if want is None or have is None:
        return False
    width = max(len(want), len(have))
    pad = lambda t: t + (0,) * (width - len(t))  # noqa: E731
    return _OPS[op](pad(have), pad(want))


class ExpectFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    expect:
      driver: mlx5_core
      firmware: ">=28.39"
      link_speed_mbps: 400000
      pcie_width: 16
      counters_interval: 5
      counters: {rx_discards_phy: {max: 0}}
      ipsec_offload: crypto
"""
    name = "expect"
    position = 110
    position_note = "never written: read after everything else"
    sections = ("expect",)
    settings = tuple(f"expect.{fact}" for fact in FACTS) + (
        "expect.counters", "expect." + INTERVAL, "expect.counter_totals", "expect." + IPSEC)
    read_only = True  # the engine reports unmet keys as drift, never writes them

    @classmethod
    def plan_reads(cls, host) -> None:
        from nictune.host.facts.health import Health

        health = Health(host)
        for iface in host.interfaces():
            health.counters(iface.name)

    @classmethod
    def schema(cls, s):
        return {"entry": {"expect": s.section(
            "Health facts the interface must show. nictune only reads them: an unmet "
            "expectation is reported as drift, never written.", {
                "driver": s.text(DRIVER, 32, "Kernel driver name (ethtool -i)."),
                "firmware": s.text(VERSION_WANT, 80, "Firmware version (ethtool -i), compared numerically per dotted part."),
                "link_speed_mbps": s.wanted(1, s.U32, "Link speed in Mb/s (/sys/class/net/X/speed)."),
                "pcie_width": s.wanted(1, 32, "PCIe link width in lanes, as the device trained."),
                "pcie_speed_gts": {"enum": [2.5, 5, 8, 16, 32, 64],
                                   "description": "PCIe link speed in GT/s, as the device trained (32 = Gen5)."},
                "counters": s.mapping(
                    "Counters (ethtool -S, RDMA hw_counters, /sys/class/net/X/statistics; "
                    "Tls* names: the kernel's kTLS counters of /proc/net/tls_stat, which is "
                    "per network namespace: the agent's, so pods' kTLS sockets in their own "
                    "namespaces are not in it), each with the value or bound its increase over "
                    "counters_interval must meet: {max: 0} is 'did not rise'. Counters of "
                    "what there is now (TlsCurr*, peer_ifindex) are compared as they read: "
                    "TlsCurrTxSw: {max: 0} holds on an idle host, TlsCurrTxDevice: {min: 1} "
                    "does not (ask that in the play's gate: counters: min:).",
                    s.text(COUNTER_NAME, 64),
                    s.wanted(0, s.U64_MAX, "Increase of the counter over the interval."), 64),
                INTERVAL: {**s.integer(1, MAX_INTERVAL),
                           "description": "Seconds between the two reads of the counters "
                                          f"(default {DEFAULT_INTERVAL}): each command that "
                                          "checks them waits this long once, for all "
                                          "interfaces and counters together."},
                "counter_totals": s.mapping(
                    "Counters compared as they read (a total since the device last reset "
                    "them), not as an increase: for 'at least one since boot' "
                    "(TlsTxDevice: {min: 1}).",
                    s.text(COUNTER_NAME, 64), s.wanted(0, s.U64_MAX, "Counter value."), 64),
                FWRESET: {"type": "boolean",
                          "description": "Whether a flashed firmware waits for a reset (devlink "
                                         "dev info of the interface's devlink device: a stored "
                                         "version differs from the running one); false to "
                                         "report hosts that need one."},
                IPSEC: {"anyOf": [
                    {"enum": list(IPSEC_MODES)},
                    s.section("Only the SAs there are now: none at all is met.", {
                        IF_PRESENT: {"enum": list(IF_PRESENT_MODES),
                                     "description": "Every SA that uses the interface runs "
                                                    "with this offload on it."}},
                        required=[IF_PRESENT])],
                        "description": "Where the interface's IPsec SAs must run (read over "
                                       "NETLINK_XFRM, never written): crypto or packet offload "
                                       "on this interface (and at least one SA), or none (no "
                                       "SA offloaded to it); {if_present: crypto|packet}: "
                                       "every SA there is now is offloaded so, and none at all "
                                       "is met too -- an idle host, or one whose IKE peer is "
                                       "down, is not drift (the play's gate: ipsec_offload "
                                       "checks that SAs exist while its traffic runs)."},
            }, minProperties=1)}}

    @classmethod
    def nic_support(cls, driver, setting):
        if setting == "expect." + IPSEC:
            return support_note(driver)
        return None

    def __init__(self, host):
        super().__init__(host)
        self._ipsec_want: dict = {}  # ifname -> wanted mode, from expand
        self._ipsec_if_present: set = set()  # ifnames whose mode holds only for SAs present
        self._ipsec: dict = {}       # ifname -> host.ipsec.Usage or Unsupported, from read
        self._facts: dict = {}       # ifname -> health facts, from read
        self._interval: dict = {}    # Key of a counters. key -> seconds, from expand
        self._samples: dict = {}     # Key -> (first, second, seconds apart), from read
        self._absent: set = set()    # total and gauge keys the host has no counter for
        # Here, not at the top: the controller imports this module for its
        # schema alone, and health pulls in rdma and the interface facts.
        from nictune.host.facts.health import Health

        self.health = Health(host)

    def expand(self, target, sections, source):
        section = sections.get("expect") or {}
        out = []
        for fact in FACTS:
            if fact in section:
                raw = section[fact]
                if fact == "firmware":
                    check(VERSION_WANT, str(raw), "firmware expectation")
                out.append(Desired(Key(self.name, target, fact), Want.parse(raw),
                                   source("expect", fact)))
        if IPSEC in section:
            mode, if_present = _ipsec_wanted(section[IPSEC], source("expect", IPSEC))
            self._ipsec_want[target] = mode
            if if_present:
                self._ipsec_if_present.add(target)
            shown = mode + IF_PRESENT_TEXT if if_present else mode
            out.append(Desired(Key(self.name, target, IPSEC), Want(shown), source("expect", IPSEC)))
        interval = section.get(INTERVAL, DEFAULT_INTERVAL)
        if (not isinstance(interval, int) or isinstance(interval, bool)
                or not 1 <= interval <= MAX_INTERVAL):
            raise InvalidInput(f"{source('expect', INTERVAL) or 'expect'}: expect.{INTERVAL} "
                               f"is {interval!r}; it takes whole seconds, 1 to {MAX_INTERVAL}")
        for mapping, prefix in (("counters", COUNTER_PREFIX), ("counter_totals", TOTAL_PREFIX)):
            for counter, raw in (section.get(mapping) or {}).items():
                check(COUNTER_NAME, counter, "counter name")
                key = Key(self.name, target, prefix + counter)
                if prefix == COUNTER_PREFIX:
                    # The first entry to name a key owns it (engine Desire.add).
                    self._interval.setdefault(key, interval)
                out.append(Desired(key, Want.parse(raw), source("expect", mapping, counter)))
        return out

    def read(self, keys):
        facts = self._facts = {}  # ifname -> health facts, kept for note()
        self._samples = {}
        interfaces = {i.name: i for i in self.host.interfaces()}
        out = {}
        rising = []  # counters. keys whose increase is wanted: read twice, below
        now: dict = {}  # target -> counters, for totals and gauges
        self._absent = set()
        for key in keys:
            iface = interfaces.get(key.target)
            counter = _counter(key)
            if iface is None:
                out[key] = None
                if counter is not None:
                    self._absent.add(key)
            elif key.name == IPSEC:
                out[key] = self._read_ipsec(iface)
            elif counter is not None and key.name.startswith(COUNTER_PREFIX) and not _gauge(counter):
                rising.append(key)
            elif counter is not None:  # a total, or a gauge: as it reads now
                if key.target not in now:
                    now.update(self._now({key.target}, keys))
                out[key] = now[key.target].get(counter)
                if out[key] is None:
                    self._absent.add(key)
            else:
                if key.target not in facts:
                    facts[key.target] = self.health.of(iface)
                out[key] = facts[key.target].get(key.name)
                if key.name == FWRESET and out[key] is None:
                    out[key] = Unsupported(
                        "devlink dev info is read from the running kernel only"
                        if self.host.root != "/" else
                        f"no devlink device with a port for {key.target} answers dev info")
        out.update(self._rises(rising))
        return out

    # -- counters --------------------------------------------------------------
    def _now(self, targets: set, keys: list, fresh: bool = False) -> dict:
        """{target: {counter: value | Unsupported}} for the counters `keys`
        name: the interfaces' own, and the kTLS ones (the namespace's)."""
        from nictune.host.facts.health import is_tls_counter  # see __init__

        wanted = sorted(c for c in {_counter(k) for k in keys} - {None} if is_tls_counter(c))
        if wanted and fresh:
            try:
                self.health.tls_stat(fresh=True)  # once for all of them
            except ValueError:
                pass  # _read_tls reads it again and says why
        tls = {c: self._read_tls(c) for c in wanted}
        return {t: {**self.health.counters(t, fresh=fresh), **tls} for t in targets}

    def _rises(self, keys: list) -> dict:
        """How much each counter of `keys` rose over its interval: one read
        of all of them, one wait (the longest interval), and a second read
        of each interval's keys when that interval is up."""
        if not keys:
            return {}
        clock = self.health.source
        first = self._now({k.target for k in keys}, keys, fresh=True)
        start = clock.now()
        by_interval: dict = {}
        for key in keys:
            by_interval.setdefault(self._interval.get(key, DEFAULT_INTERVAL), []).append(key)
        out = {}
        for interval in sorted(by_interval):
            group = by_interval[interval]
            left = start + interval - clock.now()
            if left > 0:
                clock.sleep(left)
            second = self._now({k.target for k in group}, group, fresh=True)
            elapsed = clock.now() - start
            for key in group:
                out[key] = self._rise(key, first[key.target].get(_counter(key)),
                                      second[key.target].get(_counter(key)), elapsed)
        return out

    def _rise(self, key: Key, before, after, elapsed: float):
        for value in (before, after):
            if isinstance(value, Unsupported):
                return value
        self._samples[key] = (before, after, elapsed)
        if before is None or after is None or after < before:
            return None  # absent, or reset/wrapped: the increase is unknown
        return after - before

    def _counter_note(self, key: Key) -> str:
        counter = _counter(key)
        absent = (f"{key.target} has no counter {counter} (ethtool -S, RDMA hw_counters, "
                  f"/sys/class/net/{key.target}/statistics)")
        if key in self._absent:
            return absent
        if key.name.startswith(TOTAL_PREFIX):
            return (f"{counter} as it reads: a total since the device last reset it (boot, "
                    "driver load); nictune reads it, never sets it")
        if key not in self._samples:
            return (f"{counter} counts what there is now, compared as it reads; nictune reads "
                    "it, never sets it")
        before, after, elapsed = self._samples[key]
        took = f"{round(elapsed, 1):g} s"
        if before is None and after is None:
            return absent
        if before is None or after is None:
            return f"{counter} was there at only one of two reads {took} apart: no increase to tell"
        if after < before:
            return (f"{counter} fell from {before} to {after} in {took} (reset, or a 32-bit "
                    "counter wrapped): its increase is unknown; verify again")
        if after == before:
            return f"{counter} did not rise in {took} (at {before})"
        return f"{counter} rose by {after - before} in {took} ({before} -> {after})"

    def _read_tls(self, counter: str):
        from nictune.host.facts.health import TLS_ABSENT

        try:
            stat = self.health.tls_stat()
        except ValueError as e:
            return Unsupported(f"cannot read kTLS counters: {e}")
        if stat is None:
            return Unsupported(TLS_ABSENT)
        if counter not in stat:
            return Unsupported(f"/proc/net/tls_stat has no counter {counter} on this kernel")
        return stat[counter]

    def _read_ipsec(self, iface):
        if self.host.root != "/":
            usage = Unsupported("IPsec SAs are read from the running kernel only")
        else:
            try:
                usage = self.health.ipsec(iface)
            except OSError as e:
                usage = Unsupported(f"cannot read IPsec SAs over NETLINK_XFRM: {e}")
        self._ipsec[iface.name] = usage
        if isinstance(usage, Unsupported):
            return usage
        return usage.current(self._ipsec_want.get(iface.name))

    def met(self, key: Key, want: Want, current) -> bool:
        if key.name == IPSEC:
            if key.target in self._ipsec_if_present and current is None:
                return True  # no SA uses the interface now: nothing to be offloaded
            return ipsec_met(self._ipsec_want.get(key.target, want.value), current)
        if key.name == "firmware" and want.bound is None:
            return version_met(str(want.value), current)
        return super().met(key, want, current)

    def note(self, key):
        if key.name == IPSEC:
            return self._ipsec_note(key.target)
        if _counter(key) is not None:
            return self._counter_note(key)
        if key.name == FWRESET:
            pending = self._facts.get(key.target, {}).get("firmware_pending")
            if pending:
                return "expected; flashed, waiting for a reset: " + ", ".join(
                    f"{c} running {v['running']}, stored {v['stored']}" for c, v in pending.items())
        return "expected; nictune reads it, never sets it"

    def _ipsec_note(self, ifname: str) -> str:
        want, usage = self._ipsec_want.get(ifname), self._ipsec.get(ifname)
        if want is None or usage is None or isinstance(usage, Unsupported):
            return "expected; nictune reads it, never sets it"
        if ifname in self._ipsec_if_present and usage.current(want) is None:
            return (f"expected; no IPsec SA uses {ifname} now, which {want} if present allows "
                    "(the play's gate checks that SAs exist while traffic runs)")
        if ipsec_met(want, usage.current(want)):
            counts = usage.counts()
            return (f"expected; {counts['ipsec_sa_offloaded']} SA(s) offloaded to {ifname}, "
                    f"{counts['ipsec_sa_software']} in software")
        problems = usage.problems(want, ifname)
        shown = problems[:5] + ([f"and {len(problems) - 5} more"] if len(problems) > 5 else [])
        text = "; ".join(shown)
        driver = self.driver_of(ifname)
        nic = support_note(driver)
        if nic and want != "none" and want not in OFFLOAD_MODES.get(driver, (want,)):
            text += f" ({nic})"
        return text


def _ipsec_wanted(raw, where: Optional[str]) -> Tuple[str, bool]:
    """(mode, if_present) of expect.ipsec_offload: "crypto" or {if_present: crypto}."""
    if isinstance(raw, dict) and set(raw) == {IF_PRESENT} and raw[IF_PRESENT] in IF_PRESENT_MODES:
        return raw[IF_PRESENT], True
    if isinstance(raw, str) and raw in IPSEC_MODES:
        return raw, False
    raise InvalidInput(f"{where or 'expect'}: expect.{IPSEC}: {raw!r} is not one of "
                       + ", ".join(IPSEC_MODES) + " nor {if_present: crypto|packet}")


def _counter(key: Key) -> Optional[str]:
    """The counter a counters. or counter_totals. key names; None for a fact."""
    for prefix in (COUNTER_PREFIX, TOTAL_PREFIX):
        if key.name.startswith(prefix):
            return key.name[len(prefix):]
    return None


def _gauge(counter: str) -> bool:
    from nictune.host.facts.health import GAUGES  # see ExpectFamily.__init__

    return bool(GAUGES.match(counter))
