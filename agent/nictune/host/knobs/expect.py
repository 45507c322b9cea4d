"""Expectations: health facts an interface must show, never written.

    expect:
      driver: mlx5_core
      firmware: ">=28.39"             # ==, >=, <=, >, < or a plain exact version
      link_speed_mbps: 400000
      pcie_width: 16
      pcie_speed_gts: 32
      counters: {rx_out_of_buffer: {max: 0}, TlsDecryptError: 0}
      ipsec_offload: crypto           # crypto, packet or none (host/ipsec.py)
      firmware_pending_reset: false   # devlink dev info: stored == running

Keys are family "expect", name the fact ("counters.<name>" for counters).
The family is read-only: the engine never writes it; plan, verify and
apply report an unmet expectation as drift.  A fact the host does not
report reads as None, which meets no expectation.

Counters are the interface's ethtool statistics and RDMA hw_counters,
except the kTLS ones of /proc/net/tls_stat (Tls*: TlsTxDevice,
TlsDecryptError, ...; host/health.py), which are the network namespace's
whichever entry names them, and read as Unsupported("the tls module is not
loaded") where that file is absent.

ipsec_offload is read over NETLINK_XFRM (host/ipsec.py says which SAs and
policies concern an interface).  Its current value is the modes its SAs
run in, joined with "+" ("crypto", "crypto+none"), None without SAs:
crypto is met when every SA is offloaded to the interface (packet offload
does the crypto too) and there is at least one; packet when every SA and
policy is packet-offloaded there; none when no SA is offloaded there (no
SA at all meets it).  The plan's note names each SA at fault and why.

firmware_pending_reset is read from devlink `dev info` of the device that
has a port for the interface (host/health.py): true when a flashed
firmware waits for a reset; the note names the components and versions.
Without such a device (no devlink, a driver without info_get) it reads as
Unsupported, not as unmet.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from nictune.host.ipsec import OFFLOAD_MODES, support_note
from nictune.host.ipsec import met as ipsec_met
from nictune.host.knobs.base import Family
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import COUNTER_NAME, DRIVER, VERSION_WANT, InvalidInput, check

FWRESET = "firmware_pending_reset"
FACTS = ("driver", "firmware", "link_speed_mbps", "pcie_width", "pcie_speed_gts", FWRESET)
COUNTER_PREFIX = "counters."
IPSEC = "ipsec_offload"
IPSEC_MODES = ("crypto", "packet", "none")

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
    name = "expect"
    position = 110
    position_note = "never written: read after everything else"
    sections = ("expect",)
    settings = tuple(f"expect.{fact}" for fact in FACTS) + ("expect.counters", "expect." + IPSEC)
    read_only = True  # the engine reports unmet keys as drift, never writes them

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
                    "Counters (ethtool -S, RDMA hw_counters; Tls* names: the kernel's kTLS "
                    "counters of /proc/net/tls_stat, the host's), each with the value or bound "
                    "it must meet.",
                    s.text(COUNTER_NAME, 64), s.wanted(0, s.U64_MAX, "Counter value."), 64),
                FWRESET: {"type": "boolean",
                          "description": "Whether a flashed firmware waits for a reset (devlink "
                                         "dev info of the interface's devlink device: a stored "
                                         "version differs from the running one); false to "
                                         "report hosts that need one."},
                IPSEC: {"enum": list(IPSEC_MODES),
                        "description": "Where the interface's IPsec SAs must run (read over "
                                       "NETLINK_XFRM, never written): crypto or packet offload "
                                       "on this interface, or none (no SA offloaded to it)."},
            }, minProperties=1)}}

    @classmethod
    def nic_support(cls, driver, setting):
        if setting == "expect." + IPSEC:
            return support_note(driver)
        return None

    def __init__(self, host):
        super().__init__(host)
        self._ipsec_want: dict = {}  # ifname -> wanted mode, from expand
        self._ipsec: dict = {}       # ifname -> host.ipsec.Usage or Unsupported, from read
        self._facts: dict = {}       # ifname -> health facts, from read
        # Here, not at the top: the controller imports this module for its
        # schema alone, and health pulls in rdma and the interface facts.
        from nictune.host.health import Health

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
            mode = section[IPSEC]
            if mode not in IPSEC_MODES:
                raise InvalidInput(f"expect.{IPSEC}: {mode!r} is not one of "
                                   + ", ".join(IPSEC_MODES))
            self._ipsec_want[target] = mode
            out.append(Desired(Key(self.name, target, IPSEC), Want(mode), source("expect", IPSEC)))
        for counter, raw in (section.get("counters") or {}).items():
            check(COUNTER_NAME, counter, "counter name")
            out.append(Desired(Key(self.name, target, COUNTER_PREFIX + counter),
                               Want.parse(raw), source("expect", "counters", counter)))
        return out

    def read(self, keys):
        from nictune.host.health import is_tls_counter  # see __init__

        facts = self._facts = {}  # ifname -> health facts, kept for note()
        counters: dict = {}
        interfaces = {i.name: i for i in self.host.interfaces()}
        out = {}
        for key in keys:
            iface = interfaces.get(key.target)
            if iface is None:
                out[key] = None
            elif key.name == IPSEC:
                out[key] = self._read_ipsec(iface)
            elif key.name.startswith(COUNTER_PREFIX) and is_tls_counter(key.name[len(COUNTER_PREFIX):]):
                out[key] = self._read_tls(key.name[len(COUNTER_PREFIX):])
            elif key.name.startswith(COUNTER_PREFIX):
                if key.target not in counters:
                    counters[key.target] = self.health.counters(key.target)
                out[key] = counters[key.target].get(key.name[len(COUNTER_PREFIX):])
            else:
                if key.target not in facts:
                    facts[key.target] = self.health.of(iface)
                out[key] = facts[key.target].get(key.name)
                if key.name == FWRESET and out[key] is None:
                    out[key] = Unsupported(
                        "devlink dev info is read from the running kernel only"
                        if self.host.root != "/" else
                        f"no devlink device with a port for {key.target} answers dev info")
        return out

    def _read_tls(self, counter: str):
        from nictune.host.health import TLS_ABSENT

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
            return ipsec_met(want.value, current)
        if key.name == "firmware" and want.bound is None:
            return version_met(str(want.value), current)
        return super().met(key, want, current)

    def note(self, key):
        if key.name == IPSEC:
            return self._ipsec_note(key.target)
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
