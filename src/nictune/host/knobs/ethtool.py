"""ethtool settings over the ethtool generic-netlink family.

Features are per bit, named as the kernel names them; ethtool's short
aliases are accepted.  Rings, channels, coalesce and pause share one shape
(a dump per family of every device, one set message per device) and so one
class.  Plans refuse before writing what the drivers would refuse or round
(ring minimums and powers of two, nicclass.py), MANA channel changes on a
down port whose vPort a RAW QP may hold (nicclass.MANA_CHANNELS_VPORT_BUSY),
and mark queue rebuilds as disruptive.
"""

from __future__ import annotations

import fnmatch

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune.host.facts import nicclass
from nictune.host.errors import NictuneError
from nictune.host.knobs.base import Family, group_by_target
from nictune.host.model import Unsupported
from nictune.host.validate import FEATURE_NAME, check

# The crypto family's feature bits (knobs/crypto.py names them; net/ethtool/common.c
# netdev_features_strings): kept here, where features' show() leaves them out, so that
# neither module imports the other's.
CRYPTO_BITS = {
    "tls_tx": "tls-hw-tx-offload",
    "tls_rx": "tls-hw-rx-offload",
    "esp": "esp-hw-offload",
    "esp_tx_csum": "esp-tx-csum-hw-offload",
    "macsec": "macsec-hw-offload",
}

RING_MAX = 1048576  # KMALLOC_MAX_SIZE-bound in every driver; the device's own maximum is checked too

# ethtool's own aliases (its off_flag_def table).  One-bit aliases are
# normalised to the kernel name; several-bit aliases stay as written and
# stand for every bit their pattern matches on the device.
FEATURE_ALIASES = {
    "rx": "rx-checksum",
    "gso": "tx-generic-segmentation",
    "gro": "rx-gro",
    "lro": "rx-lro",
    "ufo": "tx-udp-fragmentation",
    "rxvlan": "rx-vlan-hw-parse",
    "txvlan": "tx-vlan-hw-insert",
    "ntuple": "rx-ntuple-filter",
    "rxhash": "rx-hashing",
}
FEATURE_GROUPS = {
    "tx": "tx-checksum-*",
    "sg": "tx-scatter-gather*",
    "tso": "tx-tcp*-segmentation",
}


class ApplyRefused(NictuneError):
    """The kernel acknowledged a features write but left bits unchanged: a
    refusal, as knobs/base.py says apply may raise (kind "system")."""


class FeaturesFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    features: {rx-gro-hw: true, lro: false, hw-tc-offload: true}
"""
    name = "features"
    position = 30
    position_note = ("the first device setting: an offload change that reopens the queues "
                     "(mlx5 LRO) happens before their counts and sizes are set")
    sections = ("features",)
    settings = ("features",)

    @classmethod
    def schema(cls, s):
        return {"entry": {"features": s.mapping(
            "Offload features as ethtool -K names them, each on (true) or off (false).",
            s.text(FEATURE_NAME, 64), {"type": "boolean"}, 256)}}

    def __init__(self, host):
        super().__init__(host)
        self._devices: dict = {}

    def key_name(self, name: str) -> str:
        check(FEATURE_NAME, name, "feature name")
        return FEATURE_ALIASES.get(name, name)

    def _bits(self, target: str, name: str, changeable_only: bool) -> list:
        dev = self._devices[target]
        pattern = FEATURE_GROUPS.get(name)
        if pattern is None:
            names = [name] if name in dev.active else []
        else:
            names = sorted(b for b in dev.active if fnmatch.fnmatchcase(b, pattern))
        return [b for b in names if b in dev.changeable] if changeable_only else names

    def read(self, keys):
        self._devices = self.host.ethtool().features()
        out = {}
        for key in keys:
            dev = self._devices.get(key.target)
            if dev is None:
                out[key] = Unsupported("no such interface, or it has no ethtool features")
                continue
            bits = self._bits(key.target, key.name, True) or self._bits(key.target, key.name, False)
            if not bits:
                import difflib  # only for this hint: kept off the agent's start-up

                hint = difflib.get_close_matches(key.name, list(dev.active) + list(FEATURE_GROUPS), 1)
                out[key] = Unsupported(f"the device has no feature {key.name!r}"
                                       + (f"; did you mean {hint[0]!r}?" if hint else ""))
                continue
            values = {dev.active[b] for b in bits}
            # Bits that differ read as {bit: on/off}, so that a rollback can
            # put each one back (one bool would lose which).
            out[key] = values.pop() if len(values) == 1 else {b: dev.active[b] for b in bits}
        return out

    def check(self, key, want) -> Optional[str]:
        if key.target in self._devices and not self._bits(key.target, key.name, True):
            return f"{key.name} is fixed on this device"
        return None

    def _driver_keeps_tc(self, target: str, wanted: Optional[dict]):
        """The rule by which the driver owns hw-tc-offload on `target` (an
        mlx5 uplink or representor whose eswitch is, or with `wanted` will
        be, in switchdev), or None."""
        iface = next((i for i in self.host.interfaces() if i.name == target), None)
        if iface is None or iface.driver not in nicclass.MLX5_PORT_DRIVERS:
            return None
        from nictune.host.knobs.eswitch import eswitch_mode  # only for mlx5 ports

        return nicclass.hw_tc_kept(iface.driver, iface, eswitch_mode(self.host, target, wanted))

    def note(self, key) -> str:
        if key.name != "hw-tc-offload":
            return ""
        found = self._driver_keeps_tc(key.target, self.wanted)
        return f"{found.why} [{found.source}]" if found else ""

    def kept(self, key, before) -> str:
        # A rollback that would turn mlx5's own hw-tc-offload off on a
        # switchdev port: EINVAL while OVS has flows there (set_feature_hw_tc).
        if key.name != "hw-tc-offload" or before is not False:
            return ""
        found = self._driver_keeps_tc(key.target, None)
        return f"left on: {found.why} [{found.source}]" if found else ""

    def apply(self, items):
        for target, values in group_by_target(items).items():
            wanted = {}
            for name, value in values.items():
                for bit in self._bits(target, name, True):
                    if not isinstance(value, dict):
                        wanted[bit] = bool(value)
                    elif bit in value:  # restoring a group that was mixed
                        wanted[bit] = bool(value[bit])
            refused = self.host.ethtool().set_features(target, wanted)
            if refused:
                raise ApplyRefused(f"{target}: the kernel did not change "
                                   + ", ".join(sorted(refused)))

    def _shown_device(self, target):
        """The target's ethtool features for show() (read once), or None."""
        if not self._devices:
            self._devices = self.host.ethtool().features()
        return self._devices.get(target)

    def show(self, target):
        dev = self._shown_device(target)
        if dev is None:
            return {}
        crypto = set(CRYPTO_BITS.values())
        return {"features": {b: dev.active[b] for b in sorted(dev.changeable) if b not in crypto}}


class EthtoolParamsFamily(Family):
    """One of rings / channels / coalesce / pause: a section of the same name
    whose keys are ethtool's CLI names."""

    names: tuple = ()      # the section's keys: ethtool's CLI names
    has_max = False        # device reports "<name>-max" limits
    what = ""              # the section's description

    @classmethod
    def _value_schema(cls, s, name: str) -> dict:
        raise NotImplementedError

    @classmethod
    def schema(cls, s):
        return {"entry": {cls.name: s.section(
            cls.what, {k: cls._value_schema(s, k) for k in cls.names})}}

    def __init__(self, host):
        super().__init__(host)
        self._devices: dict = {}
        self._shown: Optional[dict] = None

    def _dump(self) -> dict:
        raise NotImplementedError

    def _set(self, ifname: str, values: dict) -> None:
        raise NotImplementedError

    def read(self, keys):
        self._devices = self._dump()
        out = {}
        for key in keys:
            dev = self._devices.get(key.target)
            if dev is None:
                out[key] = Unsupported(f"the driver does not support {self.name} settings")
            elif key.name not in dev:
                out[key] = Unsupported(f"the driver does not report {self.name} {key.name}")
            else:
                out[key] = dev[key.name]
        return out

    def check(self, key, want) -> Optional[str]:
        limit = self._devices.get(key.target, {}).get(f"{key.name}-max")
        if self.has_max and limit is not None and want.value > limit:
            return f"{self.name} {key.name} {want.value} is above the device maximum {limit}"
        return None

    def apply(self, items):
        for target, values in group_by_target(items).items():
            self._set(target, values)

    def _driver_refusal(self, key) -> Optional[str]:
        """Why the driver refuses this key on this port now, by the rules of
        nicclass.RULES (MANA channels while a RAW QP may hold the vPort of
        a down port: mana_ethtool.c mana_set_channels), or None."""
        driver = self.driver_of(key.target)
        if not nicclass.rules_for(driver, self.name):
            return None
        facts = self._port_facts(key.target)
        found = nicclass.refusal(driver, f"{self.name}.{key.name}", facts)
        if found is None:
            return None
        unknown = (f"; nictune cannot read whether a RAW QP holds it ({facts['rdma']} sits on "
                   f"{key.target}): bring {key.target} up first") if facts["raw_qp"] is None else ""
        return f"not supported by {driver} while {found.when}: {found.why} ({found.source}){unknown}"

    def _port_facts(self, ifname: str) -> dict:
        """The facts nicclass rules ask of a port: is it up, and may a RAW QP
        hold its vPort (False without an RDMA device on it, else unknown:
        only rdma netlink's QP dump would tell)."""
        link = next((l for l in self.host.links() if l.name == ifname), None)
        rdma_port = None
        if self.driver_of(ifname) == "mana":
            from nictune.host.facts import rdma  # only for MANA ports

            rdma_port = rdma.port_of(self.host, ifname)
        return {"port_up": bool(link is not None and link.up),
                "raw_qp": False if rdma_port is None else None,
                "rdma": rdma_port[0] if rdma_port else None}

    def disruptive(self, key, before, after) -> str:
        """The kinds nicclass.DISRUPTS lists (rings, channels on mlx5 and
        MANA): the driver rebuilds the queues of an up interface."""
        why = nicclass.disruption(self.driver_of(key.target), self.name)
        link = next((l for l in self.host.links() if l.name == key.target), None)
        return why if link is not None and link.up else ""

    def show(self, target):
        if self._shown is None:  # one dump for every interface shown
            self._shown = self._dump()
        dev = self._shown.get(target)
        if not dev:
            return {}
        return {self.name: {k: dev[k] for k in self.names if k in dev}}


class RingsFamily(EthtoolParamsFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    rings: {rx: 8192, tx: 8192}
"""
    name = "rings"
    position = 50
    position_note = "after channels: a channel count change can reallocate the rings on mlx5 and MANA"
    sections = ("rings",)
    names = ("rx", "rx-mini", "rx-jumbo", "tx")
    settings = tuple(f"rings.{k}" for k in names)
    has_max = True
    what = "Ring sizes (ethtool -G)."

    @classmethod
    def plan_reads(cls, host) -> None:
        host.page_size()  # some drivers' ring minima are counted in pages

    @classmethod
    def _value_schema(cls, s, name):
        return s.wanted(1, RING_MAX, f"{name} ring size.")

    @classmethod
    def nic_support(cls, driver, setting):
        nic = nicclass.for_driver(driver)
        limits = nic.rings.get(setting.split(".", 1)[1]) if nic else None
        if nic is None or not nic.rings:
            return None
        if limits is None:
            return "not supported: the driver has no such ring"
        rounding = ", rounded up to a power of two" if nic.rings_round_up_pow2 else ""
        per_entry = nic.rings_page_bytes.get(setting.split(".", 1)[1])
        paged = (f" (the least is PAGE_SIZE / {per_entry}: {limits[0]} with 4 KiB pages, "
                 f"{65536 // per_entry} with 64 KiB)") if per_entry else ""
        return f"{limits[0]} to {limits[1]}{rounding}{paged}"

    def _dump(self):
        return self.host.ethtool().rings()

    def check(self, key, want) -> Optional[str]:
        reason = self._driver_refusal(key) or super().check(key, want)
        if reason:
            return reason
        driver = self.driver_of(key.target)
        least = nicclass.rings_minimum(driver, key.name, self.host.page_size())
        if want.value < least:
            # What an unmet bound writes is its value: EINVAL mid-apply
            # (mlx5e_ethtool_set_ringparam, mana_set_ringparam).
            return (f"not supported by {driver}: {key.name} rings below {least} are refused "
                    f"by the driver; ask for at least {least}")
        if want.bound == "min":
            return None
        effective = nicclass.rings_effective(driver, key.name, want.value)
        if effective != want.value:
            # It would read back as `effective`, fail verification and roll back.
            return (f"not supported by {driver}: {key.name} rings are a power of two of at least "
                    f"{least}; {want.value} would become {effective}: ask for {effective}, "
                    f"or {{min: {want.value}}}")
        return None

    def _set(self, ifname, values):
        self.host.ethtool().set_rings(ifname, values)


class ChannelsFamily(EthtoolParamsFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    channels: {combined: {min: 32}}
"""
    name = "channels"
    position = 40
    position_note = "before rings (see rings)"
    sections = ("channels",)
    names = ("rx", "tx", "other", "combined")
    settings = tuple(f"channels.{k}" for k in names)
    has_max = True
    what = "Queue counts (ethtool -L)."

    @classmethod
    def _value_schema(cls, s, name):
        return s.wanted(0, 65535, f"Number of {name} channels.")

    @classmethod
    def nic_support(cls, driver, setting):
        nic = nicclass.for_driver(driver)
        kind = setting.split(".", 1)[1]
        if nic is None or kind in nic.channels:
            return None
        return f"not supported: {' and '.join(nic.channels)} channels only"

    def _dump(self):
        return self.host.ethtool().channels()

    def check(self, key, want) -> Optional[str]:
        return self._driver_refusal(key) or super().check(key, want)

    def _set(self, ifname, values):
        self.host.ethtool().set_channels(ifname, values)


class CoalesceFamily(EthtoolParamsFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    coalesce: {adaptive-rx: true, adaptive-tx: false, rx-usecs: 8, tx-usecs: 16}
"""
    name = "coalesce"
    position = 60
    position_note = "after the queues are sized; no other setting depends on it"
    sections = ("coalesce",)
    flags = ("adaptive-rx", "adaptive-tx", "cqe-mode-rx", "cqe-mode-tx")
    names = flags + ("rx-usecs", "rx-frames", "rx-usecs-irq", "rx-frames-irq",
                     "tx-usecs", "tx-frames", "tx-usecs-irq", "tx-frames-irq")
    settings = tuple(f"coalesce.{k}" for k in names)
    what = "Interrupt coalescing (ethtool -C)."

    @classmethod
    def _value_schema(cls, s, name):
        return {"type": "boolean"} if name in cls.flags else s.wanted(0, s.U32, f"{name}.")

    def _dump(self):
        return self.host.ethtool().coalesce()

    def _set(self, ifname, values):
        self.host.ethtool().set_coalesce(ifname, values)


class PauseFamily(EthtoolParamsFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    pause: {autoneg: false, rx: false, tx: false}
"""
    name = "pause"
    position = 70
    position_note = ("before dcb: mlx5 keeps link pause and PFC in one port register and will "
                     "not run both, so pause goes off before PFC comes on (and a rollback, "
                     "walking backwards, turns PFC off before pause comes back)")
    sections = ("pause",)
    names = ("autoneg", "rx", "tx")
    settings = tuple(f"pause.{k}" for k in names)
    what = "Pause frames (ethtool -A)."

    @classmethod
    def schema(cls, s):
        return {"entry": {"pause": s.flags(list(cls.names), cls.what)}}

    def _dump(self):
        return self.host.ethtool().pause()

    def _set(self, ifname, values):
        self.host.ethtool().set_pause(ifname, values)
