"""The NIC's non-volatile configuration: SR-IOV, link type, the firmware's
RoCE congestion control, ATS, PCI ordering (devlink params, else mstconfig).

Profile shape: `firmware:` on an interface entry, resolved to the devlink
device behind the interface (knobs/eswitch.py devlink_handle), one key per
device and setting:

    interfaces:
      uplinks:
        match: {driver: mlx5_core, flavour: physical}
        firmware: {sriov_enabled: true, total_vfs: 16, link_type: eth}

Every key has three values: running now, stored for the next reset or
boot, and wanted.  The key's value (plan's "before", the journal's
before-value) is the STORED one: an apply writes the stored value, reads
it back, and a rollback puts the stored value back (what the reset after
it would have run, not what runs now: a rollback of a stored-but-not-
running value just restores the stored value, and needs no reset).  The
running value is shown in the key's note, and decides the state:

    stored and running as wanted       ok
    stored as wanted, running not      pending-reset (model.STAGED): never
                                       written again; the note names the reset
    stored not as wanted               pending (plan) / drift (verify)

A key an apply left pending-reset that still does not run after the host
has rebooted is failed (transaction/engine.py _fail_after_reboot, from
resets.json in the state directory), never asked for again.  nictune itself
never resets or reboots anything, and the resident agent never writes
these keys (resident_writes): a playbook's after_batch hook does the
reset (docs/howto/firmware-config.md).

Sources, per setting (SETTINGS): a devlink param with a permanent or
driverinit cmode when the device has one (mlx5 lib/nv_param.c registers
enable_sriov, total_vfs and cqe_compress_type as permanent:
mlx5_nv_param_register_dl_params; their get reads the MNVDA register,
mlx5_nv_param_read, which holds the next-boot value), else mstconfig
(transports/mstconfig.py: its Current and Next Boot columns).  Per-port
mstconfig keys (_P1, _P2) take the port of the PCI function (function 0:
P1).  Running values: mstconfig's Current column; for the SR-IOV keys on
devlink, sysfs sriov_totalvfs (the VF count the PCI function offers now);
netdevsim's driverinit params, its debugfs files; otherwise unknown (the
note says so, and the key is judged on the stored value alone).

`params:` takes any other devlink param of the device by name, with its
permanent or driverinit value (never a runtime one: those are not
firmware configuration).
"""

from __future__ import annotations

from nictune.host.knobs.base import Family, quietly
from nictune.host.knobs.eswitch import devlink_handle
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.transports import mstconfig
from nictune.host.validate import DEVLINK_PARAM, DEVLINK_PARAM_VALUE, InvalidInput

# What takes a stored value into use.
REBOOT = "a reboot (the PCI function is enumerated again, with its SR-IOV capability)"
FW_RESET = ("a firmware reset: `devlink dev reload {handle} action fw_activate` (mlx5: "
            "mlx5_devlink_reload_down) or `mlxfwreset -d {pci} -l 3 reset`, else a reboot")
DRIVER_REINIT = "`devlink dev reload {handle}` (action driver_reinit)"

# setting -> (devlink param, mstconfig key, kind, {profile word: number}, reset)
# kind: bool, int (with its maximum) or enum.
SETTINGS = {
    "sriov_enabled": ("enable_sriov", "SRIOV_EN", "bool", None, REBOOT),
    "total_vfs": ("total_vfs", "NUM_OF_VFS", ("int", 1024), None, REBOOT),
    "link_type": (None, "LINK_TYPE_P{port}", "enum", {"ib": 1, "eth": 2, "vpi": 3}, FW_RESET),
    "roce_cc_prio_mask": (None, "ROCE_CC_PRIO_MASK_P{port}", ("int", 255), None, FW_RESET),
    "cnp_dscp": (None, "CNP_DSCP_P{port}", ("int", 63), None, FW_RESET),
    "cnp_802p_prio": (None, "CNP_802P_PRIO_P{port}", ("int", 7), None, FW_RESET),
    "ats": (None, "ATS_ENABLED", "bool", None, REBOOT),
    "pci_write_ordering": (None, "PCI_WR_ORDERING", "enum",
                           {"per_mkey": 0, "force_relax": 1}, FW_RESET),
    "max_acc_out_read": (None, "MAX_ACC_OUT_READ", ("int", 255), None, FW_RESET),
    "cqe_compress_type": ("cqe_compress_type", "CQE_COMPRESSION", "enum",
                          {"balanced": 0, "aggressive": 1}, FW_RESET),
}
PARAM = "param."  # key names of free-form devlink params: "param.max_macs"
# Running values of driverinit params the driver shows elsewhere: netdevsim
# keeps them in debugfs (drivers/net/netdevsim/dev.c, nsim_dev_debugfs_init).
DEBUGFS_RUNNING = {"netdevsim": ("max_macs", "test1")}
SRIOV_RUNNING = ("enable_sriov", "total_vfs")


class FirmwareFamily(Family):
    example = """\
interfaces:
  uplinks:
    match: {driver: mlx5_core, flavour: physical}
    firmware:
      sriov_enabled: true
      total_vfs: 16
      link_type: eth
      roce_cc_prio_mask: 8
      cnp_dscp: 48
      cnp_802p_prio: 6
      ats: false
      pci_write_ordering: per_mkey
"""
    name = "firmware"
    position = 21
    position_note = ("first of the device settings: a write here is stored for the next reset "
                     "and changes nothing that runs, so nothing after it depends on it")
    sections = ("firmware",)
    settings = tuple(f"firmware.{n}" for n in SETTINGS) + ("firmware.params",)
    resident_writes = False
    offline_plan = "mstconfig is a command, and a snapshot records no command's output"

    def __init__(self, host):
        super().__init__(host)
        self.running: dict = {}  # Key -> running value, or None when unknown
        self.source: dict = {}   # Key -> "devlink param total_vfs (permanent)" / "mstconfig ..."
        self.reset: dict = {}    # Key -> what makes the stored value run
        self.params: dict = {}   # handle -> {name: devlink Param}
        self.mst: dict = {}      # Key -> mstconfig key
        self.netdev: dict = {}   # handle -> an interface of it (its sysfs device)
        self.flashed: dict = {}  # handle -> "fw.version 28.39 -> 28.41" waiting for a reset

    @classmethod
    def plan_reads(cls, host) -> None:
        def params() -> None:
            devlink = host.devlink()
            for handle in devlink.devices():
                quietly(lambda: devlink.params(handle))

        quietly(params)

    @classmethod
    def schema(cls, s):
        props: dict = {}
        for name, (param, mst, kind, words, _) in SETTINGS.items():
            where = (f"devlink param {param}, else " if param else "") + "mstconfig " + mst.replace(
                "{port}", "<n>, n the PCI function's port")
            if kind == "bool":
                node = {"type": "boolean"}
            elif kind == "enum":
                node = {"enum": list(words)}
            else:
                node = {"type": "integer", "minimum": 0, "maximum": kind[1]}
            props[name] = {**node, "description": f"Stored in the NIC's flash ({where})."}
        props["params"] = {
            "type": "object", "description": "Other devlink params of the device, by name, set in "
            "their permanent or driverinit cmode (devlink dev param).",
            "propertyNames": {"type": "string", "maxLength": 48, "pattern": DEVLINK_PARAM},
            "additionalProperties": {"anyOf": [
                {"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 0xFFFFFFFF},
                {"type": "string", "maxLength": 31, "pattern": DEVLINK_PARAM_VALUE}]}}
        return {"entry": {"firmware": s.section(
            "The NIC's non-volatile configuration: stored now, running after a reset or reboot "
            "(plans show running, stored and wanted).", props, title="firmware")}}

    @classmethod
    def nic_support(cls, driver, setting):
        if driver == "mana":
            return "not supported by mana: Azure owns the NIC's firmware configuration"
        name = setting.rpartition(".")[2]
        if driver == "mlx5_core" and name in SETTINGS:
            param = SETTINGS[name][0]
            return (f"devlink param {param} (permanent, lib/nv_param.c) on kernels that have it, "
                    "else mstconfig" if param else "mstconfig only (no devlink param)")
        return None

    def expand(self, target, sections, source):
        handle = devlink_handle(self.host, target) or target
        self.netdev.setdefault(handle, target)
        out = []
        for name, raw in sections["firmware"].items():
            if name == "params":
                for pname, value in raw.items():
                    out.append(Desired(Key(self.name, handle, PARAM + pname), Want(value),
                                       source("firmware", "params", pname)))
                continue
            if isinstance(raw, dict):
                raise InvalidInput(f"{source('firmware', name) or 'firmware'}: firmware.{name} "
                                   "takes one exact value (stored in flash), not a bound")
            out.append(Desired(Key(self.name, handle, name), Want(raw), source("firmware", name)))
        return out

    # -- read ------------------------------------------------------------------------
    def read(self, keys):
        out: dict = {}
        by_handle: dict = {}
        for k in keys:
            by_handle.setdefault(k.target, []).append(k)
        for handle, mine in by_handle.items():
            if "/" not in handle:
                out.update({k: Unsupported(f"{handle} has no devlink device") for k in mine})
                continue
            params = self._params(handle)
            self.flashed[handle] = self._flashed(handle)
            rest = []
            for k in mine:
                found = self._devlink_value(handle, k, params)
                if found is None:
                    rest.append(k)
                else:
                    out[k] = found
            out.update(self._mstconfig_values(handle, rest))
        return out

    def _flashed(self, handle: str) -> str:
        """A flashed firmware waiting for the same reset (devlink dev info:
        stored version != running; the firmware_pending_reset fact)."""
        try:
            info = self.host.devlink().info(handle)
        except (OSError, ValueError):
            return ""
        return ", ".join(f"{c} {info.running[c]} -> {info.stored[c]}"
                         for c in info.pending_firmware())

    def _params(self, handle: str) -> dict:
        if handle not in self.params:
            try:
                found = self.host.devlink().params(handle)
            except (OSError, ValueError):  # no devlink, no params, a reply that does not decode
                found = []
            self.params[handle] = {p.name: p for p in found}
        return self.params[handle]

    def _devlink_value(self, handle, key, params):
        """The stored value of `key` from its devlink param, or None when
        the device has no such param (mstconfig then)."""
        pname = key.name[len(PARAM):] if key.name.startswith(PARAM) else \
            (SETTINGS[key.name][0] if key.name in SETTINGS else None)
        param = params.get(pname) if pname else None
        if param is None:
            if key.name.startswith(PARAM):
                return Unsupported(f"devlink {handle} has no param {pname}")
            return None
        cmode = next((c for c in ("permanent", "driverinit") if c in param.values), None)
        if cmode is None:
            return Unsupported(f"devlink param {pname} of {handle} has no permanent or "
                               "driverinit value (a runtime param is not firmware configuration)")
        self.source[key] = f"devlink param {pname} ({cmode})"
        self.reset[key] = (DRIVER_REINIT if cmode == "driverinit" else
                           SETTINGS.get(key.name, (0, 0, 0, 0, FW_RESET))[4]).format(
            handle=handle, pci=handle.partition("/")[2])
        self.running[key] = self._running_of(handle, pname)
        stored = param.values[cmode]
        words = SETTINGS.get(key.name, (0, 0, 0, None))[3]
        return stored if not words or not isinstance(stored, int) else _word(words, stored)

    def _running_of(self, handle: str, pname: str):
        bus, _, dev = handle.partition("/")
        if bus == "netdevsim" and pname in DEBUGFS_RUNNING["netdevsim"]:
            text = _quiet_read(self.host, self.host.path("sys/kernel/debug/netdevsim", dev, pname))
            if text is None:
                return None
            return text == "Y" if pname == "test1" else _int_or_none(text)
        if bus == "pci" and pname in SRIOV_RUNNING:
            where = (self.host.path("sys/class/net", self.netdev[handle], "device")
                     if handle in self.netdev else self.host.path("sys/bus/pci/devices", dev))
            total = _int_or_none(_quiet_read(self.host, where + "/sriov_totalvfs") or "0")
            return total if pname == "total_vfs" else bool(total)
        return None

    def _mstconfig_values(self, handle: str, keys: list) -> dict:
        if not keys:
            return {}
        bus, _, pci = handle.partition("/")
        if bus != "pci":
            return {k: Unsupported(f"{handle} is not a PCI device: no devlink param and no "
                                   "mstconfig for it") for k in keys}
        port = int(pci.rsplit(".", 1)[1]) + 1
        names = {k: SETTINGS[k.name][1].format(port=port) for k in keys}
        try:
            rows = mstconfig.query(self.host.io, pci, sorted(set(names.values())))
        except FileNotFoundError:
            return {k: Unsupported(f"no devlink param for it and mstconfig is not installed "
                                   f"(Debian package mstflint): cannot read {names[k]}")
                    for k in keys}
        except (OSError, ValueError) as e:
            return {k: Unsupported(f"mstconfig cannot read {names[k]} of {pci}: {e}")
                    for k in keys}
        out = {}
        for k in keys:
            row, words = rows[names[k]], SETTINGS[k.name][3]
            kind = SETTINGS[k.name][2]
            shown = (lambda n: bool(n)) if kind == "bool" else (
                (lambda n: _word(words, n)) if words else (lambda n: n))
            self.mst[k] = names[k]
            self.source[k] = f"mstconfig {names[k]}"
            self.reset[k] = SETTINGS[k.name][4].format(handle=handle, pci=pci)
            self.running[k] = shown(row.current)
            out[k] = shown(row.next_boot)
        return out

    def check(self, key, want):
        """A free-form devlink param whose value is not of its type (from
        the device's own description): refused at plan, not at the write."""
        if not key.name.startswith(PARAM):
            return None
        param = self.params.get(key.target, {}).get(key.name[len(PARAM):])
        if param is None:
            return None
        value = want.value
        ok = {"bool": isinstance(value, bool), "string": isinstance(value, str)}.get(
            param.type, isinstance(value, int) and not isinstance(value, bool))
        return None if ok else (f"devlink param {param.name} of {key.target} is a {param.type}; "
                                f"{value!r} is not one")

    # -- states ----------------------------------------------------------------------
    def staged(self, key, want):
        running = self.running.get(key)
        if running is None or running == want.value:
            return ""
        flashed = self.flashed.get(key.target)
        return (f"pending reset: stored {want.value!r} for the next reset, running {running!r}; "
                f"takes effect at {self.reset.get(key, 'a reset')}"
                + (f"; a flashed firmware waits for a reset too ({flashed}: "
                   "firmware_pending_reset)" if flashed else ""))

    def note(self, key):
        if key not in self.source:
            return ""
        running = self.running.get(key)
        return (f"running now: {'unknown' if running is None else repr(running)}; stored for "
                f"the next reset (the value shown); source {self.source[key]}; a new value takes "
                f"effect at {self.reset[key]}")

    def disruptive(self, key, before, after):
        """The write itself stores a value and stops nothing; the reset that
        makes it run does (a reboot, a firmware reset: every port of the
        NIC goes down), so a playbook drains the host before it."""
        if key not in self.reset:
            return ""
        return (f"stored only; it runs after {self.reset[key]}, which takes every port of the "
                "NIC down: drain the host before that reset (a playbook's after_batch hook does it)")

    # -- write -----------------------------------------------------------------------
    def apply(self, items):
        by_handle: dict = {}
        for key, value in items:
            by_handle.setdefault(key.target, []).append((key, value))
        for handle, mine in by_handle.items():
            params = self._params(handle)
            mst: dict = {}
            for key, value in mine:
                if key in self.mst:
                    mst[self.mst[key]] = self._number(key, value)
                    continue
                pname = key.name[len(PARAM):] if key.name.startswith(PARAM) else SETTINGS[key.name][0]
                param = params.get(pname)
                if param is None:  # gone since the plan read it (a reload, a driver swap)
                    raise OSError(f"devlink {handle} has no param {pname} any more")
                cmode = next(c for c in ("permanent", "driverinit") if c in param.values)
                words = SETTINGS.get(key.name, (0, 0, 0, None))[3]
                raw = value if not words or param.type == "string" else words[value]
                self.host.devlink().set_param(handle, pname, param.type, cmode, raw)
            if mst:
                mstconfig.write(self.host.io, handle.partition("/")[2], mst)
        self.params = {}

    def _number(self, key, value) -> int:
        kind, words = SETTINGS[key.name][2], SETTINGS[key.name][3]
        if kind == "bool":
            return int(bool(value))
        return words[value] if words else int(value)

    def show(self, target):
        """The stored values of the settings the device has devlink params
        for (show runs no mstconfig: a query takes seconds per device);
        show_facts() has the running ones beside them."""
        handle = devlink_handle(self.host, target)
        self.shown = {}
        if handle is None:
            return {}
        self.netdev.setdefault(handle, target)
        params = self._params(handle)
        values = {}
        for name, (pname, *_rest) in SETTINGS.items():
            if pname in params:
                key = Key(self.name, handle, name)
                value = self._devlink_value(handle, key, params)
                if not isinstance(value, Unsupported):
                    values[name] = value
                    self.shown[name] = {"running": self.running.get(key), "stored": value}
        return {"firmware": values} if values else {}

    def show_facts(self, target):
        shown = getattr(self, "shown", None)
        return {"firmware_config": shown} if shown else {}


def _word(words: dict, number: int):
    return next((w for w, n in words.items() if n == number), number)


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _quiet_read(host, path: str):
    try:
        return host.io.read_text(path).strip()
    except (OSError, UnicodeDecodeError):
        return None

