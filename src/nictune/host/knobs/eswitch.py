"""The eswitch of a devlink device: mode, inline mode, encap (devlink).

Profile shape.  `eswitch:` sits on an interface entry, and the family
resolves the entry's interface to the devlink device behind it (its
/sys/class/net/<if>/device: bus pci -> "pci/0000:03:00.0", bus netdevsim ->
"netdevsim/netdevsim1"):

    interfaces:
      uplink: {match: {driver: mlx5_core, flavour: physical}, eswitch: {mode: switchdev}}

rather than a host section keyed by PCI address (host.eswitch:
{"pci/0000:03:00.0": {...}}).  The issue says "per PCI device", and the
keys are per device (their target is the devlink handle, so two ports of
one device, or a PF and its representors, make one key, and plans name the
device); but profiles are written for a class of host and select NICs by
driver, name or PCI id, never by a PCI address that differs per host and
per slot.  An interface with no devlink device (veth, a VF with no
eswitch) gets the key under its own name, unsupported with the reason.

Writes: one DEVLINK_CMD_ESWITCH_SET per setting, mode first (netlink/
devlink.py).  A mode change is disruptive and the plan says so: the driver
tears down and rebuilds the device's vports (mlx5:
mlx5_devlink_eswitch_mode_set -> mlx5_eswitch_disable_locked +
mlx5_eswitch_enable_locked), so the PF and its VFs lose traffic, and
representor netdevs appear (switchdev) or go (legacy).

Order with sriov (knobs/sriov.py, position 24): eswitch sits at 22, before
it (and after sysctl and nccl, which come before any device), so a profile puts the eswitch in switchdev first and creates the VFs
after, and a rollback removes the VFs before going back to legacy; why
that order, from the mlx5 sources, is in knobs/sriov.py.
"""

from __future__ import annotations

import os
from typing import Optional

from nictune.host.knobs.base import Family, quietly
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.transports.netlink.uapi import ENCAP_MODES, INLINE_MODES
from nictune.host.transports.netlink.uapi import ESWITCH_MODES as MODES

# What leaving switchdev needs of OVS (plans say it on the mode key): mlx5
# removes the representors and their offloaded flows under a running
# ovs-vswitchd, and its ovs.hw_offload off waits for a restart (knobs/ovs.py).
LEAVING_SWITCHDEV = ("first stop ovs-vswitchd, or take the uplink and representors out of their "
                     "OVS bridges, so that no offloaded flow is left (nictune restarts nothing; "
                     "in a playbook, a hook)")

SETTINGS = {"mode": MODES, "inline_mode": INLINE_MODES, "encap": ENCAP_MODES}
WRITE_ORDER = ("mode", "inline_mode", "encap")
_NOT = {"mana": "not supported by mana: the MANA VF has no devlink eswitch (Azure owns the "
                "switch; accelerated networking is the host's)"}


def devlink_handle(host, ifname: str) -> Optional[str]:
    """The devlink device behind `ifname`, from sysfs, or None."""
    base = host.path("sys/class/net", ifname, "device")
    try:
        dev = host.io.realpath(base)
        bus = os.path.basename(host.io.realpath(os.path.join(base, "subsystem")))
    except OSError:
        return None
    if not host.io.isdir(dev) or not host.io.exists(os.path.join(base, "subsystem")):
        return None
    return f"{bus}/{os.path.basename(dev)}"


def open_devlink(host):
    """The host's devlink socket (one per Host, closed with it)."""
    return host.devlink()


def eswitch_mode(host, ifname: str, wanted: Optional[dict] = None) -> Optional[str]:
    """The mode of the eswitch behind `ifname` (a PF, its uplink or one of
    its representors): the one this profile sets it to (`wanted`: a family's
    Family.wanted), which the eswitch family writes before sriov and
    features; else the one devlink reads now; None without an eswitch."""
    handle = devlink_handle(host, ifname)
    if handle is None:
        return None
    asked = (wanted or {}).get(Key("eswitch", handle, "mode"))
    if asked is not None:
        return asked.want.value
    try:
        return open_devlink(host).eswitch(handle).mode
    except OSError:
        return None


class EswitchFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  uplinks:
    match: {driver: mlx5_core, flavour: physical}
    eswitch: {mode: switchdev, inline_mode: none, encap: basic}
"""
    name = "eswitch"
    position = 22
    position_note = ("before sriov: the eswitch goes to switchdev with no VFs, then the VFs are "
                     "made (they get their representors as they appear); a rollback removes the "
                     "VFs before going back to legacy")
    sections = ("eswitch",)
    settings = ("eswitch.mode", "eswitch.inline_mode", "eswitch.encap")

    @classmethod
    def plan_reads(cls, host) -> None:
        for iface in host.interfaces():
            devlink_handle(host, iface.name)

        def eswitches() -> None:
            devlink = host.devlink()
            for handle in devlink.devices():
                quietly(lambda: devlink.eswitch(handle))

        quietly(eswitches)

    @classmethod
    def schema(cls, s):
        return {"entry": {"eswitch": s.section(
            "The eswitch of the devlink device behind this interface (devlink dev eswitch).", {
                "mode": {"enum": list(MODES),
                         "description": "legacy or switchdev (representors, tc flower offload). "
                                        "Disruptive: the device's vports are rebuilt."},
                "inline_mode": {"enum": list(INLINE_MODES),
                                "description": "Headers the VF driver must inline in TX "
                                               "descriptors for the eswitch to match on."},
                "encap": {"enum": list(ENCAP_MODES),
                          "description": "basic: the eswitch may offload tunnel encap/decap."},
            }, title="eswitch")}}

    @classmethod
    def nic_support(cls, driver, setting):
        if driver in _NOT:
            return _NOT[driver]
        if driver == "mlx5_core" and setting == "eswitch.inline_mode":
            return ("ConnectX-5 and later take none only (MLX5_CAP_INLINE_MODE_NOT_REQUIRED); "
                    "ConnectX-4 Lx needs link or deeper")
        return None

    def expand(self, target, sections, source):
        out = []
        handle = devlink_handle(self.host, target) or target
        for name, raw in sections["eswitch"].items():
            out.append(Desired(Key(self.name, handle, name), Want.parse(raw),
                               source("eswitch", name)))
        return out

    def read(self, keys):
        out: dict = {}
        by_handle: dict = {}
        for k in keys:
            by_handle.setdefault(k.target, []).append(k)
        dl = None
        for handle, mine in by_handle.items():
            if "/" not in handle:
                out.update({k: Unsupported(f"{handle} has no devlink device") for k in mine})
                continue
            dl = dl or open_devlink(self.host)
            try:
                esw = dl.eswitch(handle)
            except OSError as e:
                out.update({k: Unsupported(f"devlink {handle}: no eswitch ({e})") for k in mine})
                continue
            for k in mine:
                value = getattr(esw, "encap" if k.name == "encap" else k.name)
                out[k] = value if value is not None else Unsupported(
                    f"the driver of {handle} has no eswitch {k.name}")
        return out

    def note(self, key):
        """Leaving switchdev (a rollback of this key, or a profile that asks
        for legacy) pulls the representors out from under OVS: its offloaded
        flows must be gone first, and nictune restarts nothing."""
        if key.name != "mode" or key not in self.wanted:
            return ""
        if self.wanted[key].want.value == "switchdev":
            return ("a rollback returns this eswitch to legacy: " + LEAVING_SWITCHDEV
                    + "; hw-tc-offload stays on where the driver turned it on (mlx5)")
        return "leaving switchdev: " + LEAVING_SWITCHDEV

    def disruptive(self, key, before, after):
        if key.name == "mode":
            return ("the device's vports are rebuilt (PF and VF traffic stops), "
                    "representors appear in switchdev and go in legacy")
        return ""

    def apply(self, items):
        grouped: dict = {}
        for key, value in items:
            grouped.setdefault(key.target, {})[key.name] = value
        dl = open_devlink(self.host)
        for handle, values in grouped.items():
            dl.set_eswitch(handle, **{n: values[n] for n in WRITE_ORDER if n in values})
        self.host.forget(facts=True)  # representors came or went

    def revert(self, items):
        self.apply([(k, v) for k, v in items if v is not None])

    def show(self, target):
        handle = devlink_handle(self.host, target)
        if handle is None:
            return {}
        try:
            esw = open_devlink(self.host).eswitch(handle)
        except OSError:
            return {}
        values = {n: getattr(esw, n) for n in WRITE_ORDER if getattr(esw, n) is not None}
        return {"eswitch": values} if values else {}
