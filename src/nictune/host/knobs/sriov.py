"""SR-IOV on a PF: the number of VFs (sysfs) and each VF's attributes
(rtnetlink IFLA_VFINFO_LIST, netlink/vf.py).

    sriov: {numvfs: 4, vfs: {0: {mac: "02:00:00:00:00:10", vlan: 100, trust: true}}}  # legacy eswitch

numvfs is /sys/class/net/<pf>/device/sriov_numvfs, checked against
device/sriov_totalvfs when the device has one (netdevsim has none: its
limit, 4 by default, shows as ENOMEM on the write).  The PCI core only
takes 0 -> N and N -> 0 (drivers/pci/iov.c sriov_numvfs_store: "%d VFs
already enabled. Disable before enabling %d VFs", EBUSY), so N -> M is
written as N -> 0 -> M, and the plan says so: every VF, its driver and its
attributes go away and come back.  Any VF count change is disruptive.

drivers_autoprobe is device/sriov_drivers_autoprobe (PCI only): whether
VFs made from now on are bound to a host driver (0 for VFs that go to VMs);
it is written before numvfs, since it only acts when VFs are made.

Keys: "numvfs", "drivers_autoprobe", and "vfs.<n>.<attr>" per VF attribute.  A VF that does not
exist (yet) reads as None, so a plan that creates VFs and sets their
attributes is a plan, and a rollback that removes them leaves every
attribute at its before-value None.  Writes of one PF go numvfs first, then
one RTM_NEWLINK per VF; a revert goes the same way (numvfs back first,
then the attributes of VFs that existed before, which the VF count change
may have reset).

Order against the eswitch mode, on mlx5 (read in linux 6.12,
drivers/net/ethernet/mellanox/mlx5/core/):
- eswitch_offloads.c:3734 mlx5_devlink_eswitch_mode_set takes a mode change
  with or without VFs: it disables the eswitch (mlx5_eswitch_disable_locked)
  and esw_offloads_start (:2333) enables it again in offloads mode for
  `esw->dev->priv.sriov.num_vfs` VFs (:2339).  With VFs present, their
  vports are torn down under the VF drivers; NVIDIA's guide (DOCA 2.10
  "OVS-Kernel Hardware Acceleration", docs.nvidia.com/doca/archive/2-10-0/
  OVS-Kernel+Hardware+Acceleration) therefore makes the VFs, unbinds them
  from mlx5_core ("Before changing the mode, make sure that all VFs are
  unbound"), switches to switchdev and binds them again -- a recipe from
  kernels where the mode could not be set before SR-IOV was on (4.x
  mlx5_devlink_eswitch_mode_set: `if (cur_mlx5_mode == SRIOV_NONE) return
  -EOPNOTSUPP;`, since removed).
- sriov.c:72 mlx5_device_enable_sriov -> eswitch.c:1544 mlx5_eswitch_enable:
  with the FDB already created (switchdev), VFs made later are loaded as
  vports of the current mode (mlx5_eswitch_load_vf_vports with the
  offloads events), so their representors appear with them.
So nictune goes mode first, VFs after: no VF is ever bound while its vport
is rebuilt, and no unbind/rebind is needed.  The families' positions do it
(eswitch 22, sriov 24); a rollback walks them backwards: VFs back to their
count (0) first, then the eswitch back to legacy.  netdevsim
(drivers/net/netdevsim/dev.c nsim_drv_configure_vfs) takes both orders, and
drops to legacy by itself when VFs go to 0 in switchdev.

What the eswitch mode allows (nicclass.py, "mlx5 in switchdev"): mlx5
takes a VF's mac, link_state and rates in both modes (esw/legacy.c
mlx5_eswitch_set_vport_rate has no mode check; `devlink port function
rate` is switchdev's own way to the same vport QoS), and refuses VLAN
other than 0, qos, trust and spoofchk in switchdev (EOPNOTSUPP:
mlx5_eswitch_set_vport_vlan, _trust, _spoofchk): there, VLANs go on the
representor's OVS port (tag=) or in tc vlan push/pop on the representor.
netdevsim is the other way round (nsim_set_vf_rate refuses rates in
switchdev).  check() refuses such a key in the plan, by the rule, when the
PF's eswitch is in switchdev or this profile puts it there.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Optional

from nictune.host.facts import nicclass
from nictune.host.knobs.base import Family, read_quietly
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.transports.netlink.uapi import VF_LINK_STATES as LINK_STATES
from nictune.host.validate import MAC, InvalidInput

if TYPE_CHECKING:
    from nictune.host.transports.netlink.vf import VfConfig

VF_ATTRS = ("mac", "vlan", "qos", "trust", "spoofchk", "max_tx_rate", "min_tx_rate", "link_state")
MAX_VFS = 1024
VF_NUMBER = r"^[0-9]{1,4}$"
_NOT = {"mana": "not supported by mana: the MANA NIC is itself a VF of the Azure host"}


def _vfs(host):
    # pyroute2's message classes: the agent loads them (Host.vfs), the
    # controller (which imports this module for its schema) never does.
    return host.vfs()


def _vf_key(name: str):
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "vfs" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None


class SriovFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  uplinks:
    match: {driver: mlx5_core, flavour: physical}
    # A legacy eswitch: in switchdev mlx5 refuses vlan, qos, trust and spoofchk.
    sriov:
      numvfs: 4
      drivers_autoprobe: false
      vfs:
        "0": {mac: "02:00:00:00:00:10", vlan: 100, qos: 3, trust: true, spoofchk: true,
              link_state: auto, max_tx_rate: 10000, min_tx_rate: 1000}
"""
    name = "sriov"
    position = 24
    position_note = ("after eswitch: VFs are made once the eswitch is in its mode (mlx5 loads "
                     "their vports in that mode, representors included); before features, which "
                     "may set the representors")
    # A plan reads the VFs over an rtnetlink socket of the family's own
    # (netlink/vf.py Vfs), which a snapshot does not record.
    offline_plan = "its VF attributes are read over a socket snapshots do not record"
    sections = ("sriov",)
    settings = ("sriov.numvfs", "sriov.drivers_autoprobe", "sriov.vfs")

    @classmethod
    def plan_reads(cls, host) -> None:
        for iface in host.interfaces():
            for name in ("sriov_numvfs", "sriov_totalvfs"):
                read_quietly(host, host.path("sys/class/net", iface.name, "device", name))

    @classmethod
    def schema(cls, s):
        vf = s.section("Attributes of one VF (ip link set PF vf N ...).", {
            "mac": {**s.text(MAC, 17), "description": "VF MAC address, such as 02:00:00:00:00:10."},
            "vlan": {**s.integer(0, 4095), "description": "Port VLAN (0: none). Legacy eswitch "
                                                          "only on mlx5 (driver rules)."},
            "qos": {**s.integer(0, 7), "description": "802.1p priority of the port VLAN. Legacy "
                                                      "eswitch only on mlx5."},
            "trust": {"type": "boolean", "description": "Trusted VF (promiscuous, MAC change). "
                                                         "Legacy eswitch only on mlx5."},
            "spoofchk": {"type": "boolean", "description": "Source MAC spoof checking. Legacy "
                                                           "eswitch only on mlx5."},
            "max_tx_rate": {**s.integer(0, s.U32), "description": "Mbit/s, 0: no limit."},
            "min_tx_rate": {**s.integer(0, s.U32), "description": "Mbit/s, 0: none."},
            "link_state": {"enum": list(LINK_STATES), "description": "VF link: auto, enable or disable."},
        })
        return {"entry": {"sriov": s.section("SR-IOV on a PF: VF count and VF attributes.", {
            "numvfs": {**s.integer(0, MAX_VFS),
                       "description": "Number of VFs (sriov_numvfs). Disruptive: N to M goes through 0."},
            "drivers_autoprobe": {"type": "boolean",
                                  "description": "Bind VFs to a host driver when they are made "
                                                 "(sriov_drivers_autoprobe); false for VFs meant for VMs."},
            "vfs": {"type": "object", "description": "Per-VF attributes, by VF number.",
                    "propertyNames": s.text(VF_NUMBER, 4, words="a VF number: 1-4 digits"),
                    "additionalProperties": vf, "maxProperties": MAX_VFS},
        }, title="SR-IOV")}}

    @classmethod
    def nic_support(cls, driver, setting):
        if driver in _NOT:
            return _NOT[driver]
        if driver == "mlx5_core" and setting == "sriov.vfs":
            return ("vlan (other than 0), qos, trust and spoofchk in legacy eswitch mode only "
                    "(EOPNOTSUPP in switchdev: VLANs go on the representor's OVS port or in tc); "
                    "mac, link_state and rates in both modes")
        return None

    def __init__(self, host):
        super().__init__(host)
        self._numvfs: dict = {}   # pf -> current count, from read
        self._total: dict = {}    # pf -> sriov_totalvfs, when the device has one
        self._wanted: dict = {}   # pf -> numvfs the profile asks for
        self._modes: dict = {}    # pf -> its eswitch mode, now or as this profile sets it

    def expand(self, target, sections, source):
        sec = sections["sriov"]
        out = []
        if "numvfs" in sec:
            self._wanted[target] = sec["numvfs"]
            out.append(Desired(Key(self.name, target, "numvfs"), Want.parse(sec["numvfs"]),
                               source("sriov", "numvfs")))
        if "drivers_autoprobe" in sec:
            out.append(Desired(Key(self.name, target, "drivers_autoprobe"),
                               Want.parse(sec["drivers_autoprobe"]),
                               source("sriov", "drivers_autoprobe")))
        for vf, attrs in (sec.get("vfs") or {}).items():
            if not str(vf).isdigit():
                raise InvalidInput(f"sriov.vfs: {vf!r} is not a VF number")
            for attr, raw in attrs.items():
                if attr == "mac" and isinstance(raw, str):
                    raw = raw.lower()
                out.append(Desired(Key(self.name, target, f"vfs.{int(vf)}.{attr}"),
                                   Want.parse(raw), source("sriov", "vfs", str(vf), attr)))
        return out

    # -- reading --

    def _sysfs(self, pf: str, name: str) -> str:
        return self.host.path("sys/class/net", pf, "device", name)

    def _read_int(self, path: str) -> Optional[int]:
        try:
            return int(self.host.io.read_text(path).strip())
        except FileNotFoundError:
            return None

    def read(self, keys):
        out: dict = {}
        vfs = None
        self._numvfs, self._total = {}, {}  # a read after a write asks again
        for k in keys:
            if k.target not in self._numvfs:
                self._numvfs[k.target] = self._read_int(self._sysfs(k.target, "sriov_numvfs"))
                self._total[k.target] = self._read_int(self._sysfs(k.target, "sriov_totalvfs"))
            count = self._numvfs[k.target]
            if count is None:
                out[k] = Unsupported(f"{k.target} has no SR-IOV (no device/sriov_numvfs)")
                continue
            if k.name == "numvfs":
                out[k] = count
                continue
            if k.name == "drivers_autoprobe":
                probe = self._read_int(self._sysfs(k.target, "sriov_drivers_autoprobe"))
                out[k] = bool(probe) if probe is not None else Unsupported(
                    f"{k.target} has no device/sriov_drivers_autoprobe (not a PCI PF)")
                continue
            if vfs is None:
                handle = _vfs(self.host)
                try:
                    vfs = handle.all()
                finally:
                    handle.close()
            vf, attr = _vf_key(k.name)
            cfg = vfs.get(k.target, {}).get(vf)
            out[k] = getattr(cfg, attr) if cfg is not None else None
        return out

    def check(self, key, want):
        if key.name == "numvfs":
            total = self._total.get(key.target)
            if total is not None and isinstance(want.value, int) and want.value > total:
                return f"{key.target} allows at most {total} VFs (sriov_totalvfs)"
            return None
        parsed = _vf_key(key.name)
        if parsed is None:
            return None
        return self._vf_beyond(key.target, parsed[0]) or self._refused_in_mode(
            key.target, parsed[1], want.value)

    def _refused_in_mode(self, pf: str, attr: str, value) -> Optional[str]:
        """The PF's driver refuses this VF attribute in the eswitch mode the
        VFs will be written in (eswitch sits before sriov: the profile's
        mode, else the current one)."""
        if pf not in self._modes:
            from nictune.host.knobs.eswitch import eswitch_mode

            self._modes[pf] = eswitch_mode(self.host, pf, self.wanted)
        found = nicclass.vf_write_refused(self.driver_of(pf), attr, value, self._modes[pf])
        return nicclass.refusal_text(found) if found else None

    def _vf_beyond(self, pf: str, vf: int) -> Optional[str]:
        count = self._wanted.get(pf, self._numvfs.get(pf))
        if count is not None and vf >= count:
            return f"VF {vf} does not exist: {pf} has {count} VFs"
        return None

    def disruptive(self, key, before, after):
        if key.name != "numvfs":
            return ""
        if before:
            return (f"{before} VFs are removed first (a VF count only changes through "
                    "0), with their drivers, representors and attributes")
        return "VFs and, in switchdev, their representors are created"

    # -- writing --

    def _write_numvfs(self, pf: str, count: int) -> None:
        path = self._sysfs(pf, "sriov_numvfs")
        now = self._read_int(path)
        if now == count:
            return
        for value in ((0, count) if now else (count,)):
            try:
                self.host.io.write_text(path, str(value))
            except OSError as e:
                if value and e.errno == errno.ENOMEM:
                    raise OSError(e.errno, f"{pf}: the device refused {count} VFs "
                                           "(more than it allows)") from None
                raise
        self.host.forget(facts=True)

    def _write(self, items, skip_absent: bool) -> None:
        by_pf: dict = {}
        for key, value in items:
            by_pf.setdefault(key.target, {})[key.name] = value
        for pf, values in by_pf.items():
            if values.get("drivers_autoprobe") is not None:
                self.host.io.write_text(self._sysfs(pf, "sriov_drivers_autoprobe"),
                                        "1" if values["drivers_autoprobe"] else "0")
            if values.get("numvfs") is not None:
                self._write_numvfs(pf, values["numvfs"])
            per_vf: dict = {}
            for name, value in values.items():
                parsed = _vf_key(name)
                if parsed is None or (value is None and skip_absent):
                    continue
                per_vf.setdefault(parsed[0], {})[parsed[1]] = value
            if not per_vf:
                continue
            index = self._index(pf)
            handle = _vfs(self.host)
            try:
                current = handle.all().get(pf, {})
                for vf, attrs in sorted(per_vf.items()):
                    if vf not in current:
                        if skip_absent:
                            continue  # gone with the VF count it had
                        raise OSError(errno.ENODEV, f"{pf} has no VF {vf}")
                    handle.set(index, vf, self._config(current[vf], attrs))
            finally:
                handle.close()

    @staticmethod
    def _config(now: VfConfig, attrs: dict) -> VfConfig:
        from nictune.host.transports.netlink.vf import VfConfig

        cfg = VfConfig(**{a: attrs.get(a) for a in ("mac", "trust", "spoofchk", "link_state")})
        # vlan+qos and the two rates travel as pairs: the other half stays.
        if "vlan" in attrs or "qos" in attrs:
            cfg.vlan = attrs.get("vlan", now.vlan or 0)
            cfg.qos = attrs.get("qos", now.qos or 0)
        if "min_tx_rate" in attrs or "max_tx_rate" in attrs:
            cfg.min_tx_rate = attrs.get("min_tx_rate", now.min_tx_rate or 0)
            cfg.max_tx_rate = attrs.get("max_tx_rate", now.max_tx_rate or 0)
        return cfg

    def _index(self, pf: str) -> int:
        for link in self.host.links():
            if link.name == pf:
                return link.index
        raise OSError(errno.ENODEV, f"no interface {pf}")

    def apply(self, items):
        self._write(items, skip_absent=False)

    def revert(self, items):
        self._write(items, skip_absent=True)

    def show(self, target):
        count = self._read_int(self._sysfs(target, "sriov_numvfs"))
        if count is None:
            return {}
        handle = _vfs(self.host)
        try:
            vfs = handle.all().get(target, {})
        finally:
            handle.close()
        shown = {}
        for vf, cfg in sorted(vfs.items()):
            attrs = {a: getattr(cfg, a) for a in VF_ATTRS if getattr(cfg, a) is not None}
            if attrs:
                shown[str(vf)] = attrs
        probe = self._read_int(self._sysfs(target, "sriov_drivers_autoprobe"))
        extra = {"drivers_autoprobe": bool(probe)} if probe is not None else {}
        return {"sriov": {"numvfs": count, **extra, **({"vfs": shown} if shown else {})}}
