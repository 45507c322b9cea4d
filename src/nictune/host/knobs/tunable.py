"""PFC storm prevention: the ETHTOOL_PFC_PREVENTION_TOUT tunable.

roce.pfc_prevention_timeout is `ethtool --set-tunable IF
pfc-prevention-tout N`: how long (ms) the NIC may keep sending PFC pause
frames because its receive side is stalled before it stops pausing the
link (a stuck host must not freeze its switch port and, through it, the
fabric).  0 turns the protection off; auto (PFC_STORM_PREVENTION_AUTO,
0xffff) lets the driver choose.  Tunables exist only as ioctls
(netlink/ethtool_ioctl.py Tunables), whichever ethtool backend the host
uses otherwise.

mlx5 (en_ethtool.c mlx5e_set_pfc_prevention_tout) takes 0, 80-8000 ms or
auto, which it turns into 100 ms and reads back as 100: there auto is
resolved to that value when the profile is expanded (the plan says so), so
that plan, read-back and verify compare numbers.  A driver that reports
0xffff itself reads as auto.  Limits are in nicclass.PFC_PREVENTION_TIMEOUT.
A driver without the tunable answers EOPNOTSUPP, and the key is unsupported
with that reason.
"""

from __future__ import annotations

import errno
from typing import Optional

from nictune.host.facts import nicclass
from nictune.host.knobs.base import Family, quietly
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.uapi import ETHTOOL_PFC_PREVENTION_TOUT, PFC_STORM_PREVENTION_AUTO

NAME = "pfc_prevention_timeout"


class TunableFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    roce:
      pfc: [3]
      pfc_prevention_timeout: 100
"""
    name = "tunable"
    position = 85
    position_note = "after dcb: storm prevention guards the PFC that dcb turns on"
    sections = ("roce",)
    settings = ("roce.pfc_prevention_timeout",)

    @classmethod
    def plan_reads(cls, host) -> None:
        def read(ifname: str) -> None:
            with host.tunables() as tunables:
                tunables.get(ifname, ETHTOOL_PFC_PREVENTION_TOUT)

        for iface in host.interfaces():
            quietly(lambda: read(iface.name))

    @classmethod
    def schema(cls, s):
        # Shares roce: with RoceFamily, which describes the section.
        return {"entry": {"roce": {"type": "object", "additionalProperties": False, "properties": {
            NAME: {"anyOf": [s.integer(0, PFC_STORM_PREVENTION_AUTO - 1), {"const": "auto"}],
                   "description": "PFC storm prevention (ethtool pfc-prevention-tout): stop sending "
                                  "pause frames after this many ms of a stalled receive side; 0 off, "
                                  "auto the driver's choice (mlx5: 80-8000, auto 100)."},
        }}}}

    @classmethod
    def nic_support(cls, driver, setting):
        reason = nicclass.dcb_unsupported(driver, "pfc")
        if reason:
            return reason
        limits = nicclass.PFC_PREVENTION_TIMEOUT.get(driver or "")
        if limits:
            return f"0 (off), {limits['min']}-{limits['max']} ms or auto ({limits['auto']} ms)"
        return None

    def __init__(self, host):
        super().__init__(host)
        self._notes: dict = {}  # ifname -> how auto was resolved

    # -- profile -> keys ---------------------------------------------------
    def expand(self, target, sections, source):
        roce = sections.get("roce") or {}
        if NAME not in roce:
            return []
        value = roce[NAME]
        limits = nicclass.PFC_PREVENTION_TIMEOUT.get(self.driver_of(target) or "")
        if value == "auto" and limits:
            value = limits["auto"]
            self._notes[target] = (f"auto: {self.driver_of(target)} uses {value} ms "
                                   "(en_ethtool.c MLX5E_PFC_PREVEN_AUTO_TOUT_MSEC)")
        return [Desired(Key(self.name, target, NAME), Want(value), source("roce", NAME))]

    def _tunables(self):
        return self.host.tunables()

    # -- host -> values ----------------------------------------------------
    def read(self, keys):
        out = {}
        with self._tunables() as tunables:
            for key in keys:
                out[key] = self._read(tunables, key.target)
        return out

    def _read(self, tunables, ifname: str):
        reason = nicclass.dcb_unsupported(self.driver_of(ifname), "pfc")
        if reason:
            return Unsupported(reason)
        try:
            value = tunables.get(ifname, ETHTOOL_PFC_PREVENTION_TOUT)
        except NetlinkError as e:
            if e.errno == errno.ENODEV:
                return Unsupported("no such interface")
            if e.errno == errno.EOPNOTSUPP:
                return Unsupported(f"{ifname} has no pfc-prevention-tout tunable (the driver or its "
                                   f"firmware lacks it; mlx5 needs the stall_detect capability): "
                                   f"ETHTOOL_GTUNABLE: {e}")
            return Unsupported(f"cannot read pfc-prevention-tout: {e}")
        return "auto" if value == PFC_STORM_PREVENTION_AUTO else value

    def check(self, key: Key, want: Want) -> Optional[str]:
        limits = nicclass.PFC_PREVENTION_TIMEOUT.get(self.driver_of(key.target) or "")
        value = want.value
        if limits and value not in ("auto", 0) and not limits["min"] <= value <= limits["max"]:
            return (f"the driver takes 0 (off), {limits['min']}-{limits['max']} ms or auto, not "
                    f"{value} (en_ethtool.c mlx5e_set_pfc_prevention_tout: EINVAL)")
        return None

    def note(self, key: Key) -> str:
        return self._notes.get(key.target, "")

    # -- writes ------------------------------------------------------------
    def apply(self, items):
        with self._tunables() as tunables:
            for key, value in items:
                raw = PFC_STORM_PREVENTION_AUTO if value == "auto" else int(value)
                tunables.set(key.target, ETHTOOL_PFC_PREVENTION_TOUT, raw)
