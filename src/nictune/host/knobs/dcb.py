"""DCB over dcbnl: trust, the DSCP -> priority map, PFC (and its cable
length), ETS, the port buffers and who owns DCBX.

mlx5 has no trust attribute of its own: the device trusts DSCP exactly
when the APP table holds DSCP (selector 5) entries, so trust and dscp_map
are two views of one table.  trust dscp without a dscp_map writes the
default map (DSCP d -> priority d >> 3, as mlnx_qos --trust dscp does);
trust pcp deletes every DSCP entry.  dscp_map is the exact set of DSCP
entries: entries not in the map are deleted (mlx5 maps those DSCPs to 0).

PFC is one bitmask and ETS one structure on the device, each written in a
single message: a revert writes the whole before-vector back.  The PFC
cable length (mlx5's reading of ieee_pfc.delay) rides in the PFC message,
and prio2buffer and the buffer sizes share one struct dcbnl_buffer.

dcbx: host means the host's settings stand (DCB_CAP_DCBX_HOST); firmware
hands DCBX to the NIC, whose willing agent may then take PFC and ETS from
the switch behind the profile's back.  Written first, so that what follows
is written under host control.

Where a driver has DCB but one of its netdevs does not (an mlx5 VF or VF
representor: nicclass.dcb_port_unsupported), every key is unsupported with
that reason before the kernel is asked.
"""

from __future__ import annotations

import dataclasses
import errno
from typing import Optional

from nictune.host.facts import nicclass
from nictune.host.knobs.base import Family, group_by_target, quietly
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.transports.netlink.uapi import DCBX_HOST, DCBX_LLD_MANAGED, DCBX_VER_IEEE
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.validate import DSCP

PRIOS = 8
SEL_DSCP = 5
TSA_NAMES = {0: "strict", 1: "cbs", 2: "ets", 255: "vendor"}
TSA_CODES = {v: k for k, v in TSA_NAMES.items()}
ETS_FIELDS = {"ets.prio_tc": "prio_tc", "ets.tc_bw": "tc_tx_bw", "ets.tc_tsa": "tc_tsa"}
BUFFER_FIELDS = {"buffer.prio2buffer": "prio2buffer", "buffer.size": "buffer_size"}

# The SDCBX mode each owner is written as.  `dcb dcbx set host ieee` is
# host; firmware is LLD-managed, except on mlx5, which refuses
# DCB_CAP_DCBX_LLD_MANAGED and hands DCBX to the firmware on mode 0
# (en_dcbnl.c mlx5e_dcbnl_setdcbx).
DCBX_MODES = {"host": DCBX_HOST | DCBX_VER_IEEE, "firmware": DCBX_LLD_MANAGED | DCBX_VER_IEEE}
DCBX_FIRMWARE_MODE = {"mlx5_core": 0}

# Drivers that toggle the port link when the PFC enables change, so the
# change drops traffic for a moment.  mlx5 does not for the cable length or
# the buffers: those rewrite the PBMC register in place (en/port_buffer.c
# mlx5e_port_manual_buffer_config -> port_set_buffer).
PFC_TOGGLES_LINK = {
    "mlx5_core": "mlx5 toggles the port link when PFC changes "
                 "(en_dcbnl.c mlx5e_dcbnl_ieee_setpfc -> mlx5_toggle_port_link)",
}


def default_dscp_map() -> dict:
    return {str(d): d >> 3 for d in range(64)}


def _dscp_apps(state) -> dict:
    """DSCP -> priority of the APP table's DSCP entries (keys as text)."""
    return {str(a.protocol): a.priority for a in sorted(state.apps, key=lambda a: a.protocol)
            if a.selector == SEL_DSCP}


def _pfc_list(pfc) -> list:
    return [p for p in range(PRIOS) if pfc.pfc_en & (1 << p)]


def _tsa_name(code: int) -> str:
    return TSA_NAMES.get(code, str(code))


class DcbFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    roce:
      trust: dscp
      dscp_map: {26: 3, 48: 6}
      pfc: [3]
      ets: {prio_tc: [0, 1, 2, 3, 4, 5, 6, 7], tc_bw: [50, 0, 0, 50, 0, 0, 0, 0],
            tc_tsa: [ets, strict, strict, ets, strict, strict, strict, strict]}
      dcbx: host
"""
    name = "dcb"
    position = 80
    position_note = "after pause (see pause), before the RoCE files (see roce)"
    sections = ("roce",)
    settings = ("roce.trust", "roce.dscp_map", "roce.pfc",
                "roce.ets.prio_tc", "roce.ets.tc_bw", "roce.ets.tc_tsa",
                "roce.pfc_cable_length", "roce.buffer.prio2buffer", "roce.buffer.size",
                "roce.dcbx")

    @classmethod
    def plan_reads(cls, host) -> None:
        for iface in host.interfaces():
            quietly(lambda: host.dcb().get(iface.name))

    @classmethod
    def schema(cls, s):
        ets = s.section("ETS scheduling (dcb ets / mlnx_qos --prio_tc --tcbw --tsa).", {
            "prio_tc": s.vector(s.integer(0, 7), "Priority -> traffic class (0-7)."),
            "tc_bw": s.vector(s.integer(0, 100), "Bandwidth percent per traffic class; the ETS classes sum to 100."),
            "tc_tsa": s.vector({"enum": ["ets", "strict", "vendor"]}, "Scheduler per traffic class: ets, strict or vendor."),
        }, minProperties=1)
        buffer = s.section("Port receive buffers (dcb buffer / mlnx_qos --prio2buffer --buffer_size).", {
            "prio2buffer": s.vector(s.integer(0, 7), "Priority -> receive buffer (0-7)."),
            "size": s.vector(s.integer(0, s.U32), "Size of each receive buffer in bytes; the driver may round it to its buffer cell."),
        }, minProperties=1)
        # Shares roce: with RoceFamily, which describes the section.
        return {"entry": {"roce": {"type": "object", "additionalProperties": False, "properties": {
            "trust": {"enum": ["dscp", "pcp"], "description": "Which header field picks the priority: DSCP or 802.1p PCP."},
            "dscp_map": s.mapping(
                "DSCP (0-63) -> priority (0-7), written as DCB APP entries (selector 5); the exact set of DSCP entries.",
                s.text(DSCP, 2), s.integer(0, 7), 64),
            "pfc": s.prio_list("Priorities with PFC on; every other priority off."),
            "ets": ets,
            "pfc_cable_length": {**s.integer(1, 0xFFFF), "description":
                                 "Cable length in metres for the PFC headroom (ieee_pfc.delay; mlx5: 1-999). "
                                 "mlx5 sizes the headroom for it only while software owns the port buffers "
                                 "(after a `buffer` write); with firmware-owned buffers (the default) it is "
                                 "stored and read back but changes nothing."},
            "buffer": buffer,
            "dcbx": {"enum": ["host", "firmware"], "description":
                     "Who runs DCBX: host (the profile's PFC/ETS stand) or firmware (the NIC may take them from the switch)."},
        }}}}

    @classmethod
    def nic_support(cls, driver, setting):
        name = setting[len("roce."):]
        reason = nicclass.dcb_unsupported(driver, name)
        if reason or nicclass.for_driver(driver) is None:
            return reason
        notes = [nicclass.dcb_port_note(driver)]
        if name == "pfc_cable_length" and driver in nicclass.PFC_CABLE_LENGTH:
            low, high = nicclass.PFC_CABLE_LENGTH[driver]
            notes.append(f"{low}-{high} m, read back only with port buffer support; no effect while "
                         "the firmware owns the buffers (until a buffer write)")
        elif name.startswith("buffer.") and nicclass.rules_holding(driver, setting, {}, "one-way"):
            notes.append("one-way: a write hands the port buffers to software; rollback does not "
                         "give them back to the firmware")
        elif name == "pfc" and driver in PFC_TOGGLES_LINK:
            notes.append("a change toggles the port link")
        return "; ".join(n for n in notes if n) or None

    def __init__(self, host):
        super().__init__(host)
        self._states: dict = {}      # ifname -> DcbState from the last read
        self._first_apps: dict = {}  # ifname -> DSCP map first seen (for reverting trust)
        self._wanted: dict = {}      # ifname -> {key name: value}, for whole-vector checks

    # -- profile -> keys ---------------------------------------------------
    def expand(self, target, sections, source):
        roce = sections.get("roce") or {}
        wanted = {}
        if "trust" in roce:
            wanted["trust"] = roce["trust"]
        if "dscp_map" in roce:
            wanted["dscp_map"] = {str(int(d)): int(p) for d, p in sorted(roce["dscp_map"].items(),
                                                                       key=lambda i: int(i[0]))}
        if "pfc" in roce:
            wanted["pfc"] = sorted(set(roce["pfc"]))
        for name in ("prio_tc", "tc_bw", "tc_tsa"):
            if name in (roce.get("ets") or {}):
                wanted[f"ets.{name}"] = list(roce["ets"][name])
        for name in ("pfc_cable_length", "dcbx"):
            if name in roce:
                wanted[name] = roce[name]
        for name in ("prio2buffer", "size"):
            if name in (roce.get("buffer") or {}):
                wanted[f"buffer.{name}"] = list(roce["buffer"][name])
        self._wanted[target] = wanted
        return [Desired(Key(self.name, target, name), Want(value),
                        source("roce", *name.split(".")))
                for name, value in wanted.items()]

    # -- host -> values ----------------------------------------------------
    def _state(self, ifname: str):
        """The device's DCB state, or the reason it has none."""
        driver = self.driver_of(ifname)
        iface = next((i for i in self.host.interfaces() if i.name == ifname), None)
        reason = nicclass.dcb_unsupported(driver, "pfc") or nicclass.dcb_port_unsupported(driver, iface)
        if reason:
            return Unsupported(reason)
        try:
            state = self.host.dcb().get(ifname)
        except NetlinkError as e:
            if e.errno == errno.ENODEV:
                return Unsupported("no such interface")
            if e.errno == errno.EOPNOTSUPP:
                return Unsupported(f"no DCB on {driver or ifname}: the kernel answered {e}")
            raise
        self._first_apps.setdefault(ifname, _dscp_apps(state))
        return state

    def read(self, keys):
        self._states = {}
        out = {}
        for key in keys:
            if key.target not in self._states:
                self._states[key.target] = self._state(key.target)
            state = self._states[key.target]
            out[key] = state if isinstance(state, Unsupported) else self._value(key, state)
        return out

    def _value(self, key: Key, state):
        reason = nicclass.dcb_unsupported(self.driver_of(key.target), key.name)
        if reason:
            return Unsupported(reason)
        if key.name == "trust":
            return "dscp" if _dscp_apps(state) else "pcp"
        if key.name == "dscp_map":
            return _dscp_apps(state)
        if key.name == "pfc":
            return Unsupported("the device reports no PFC") if state.pfc is None else _pfc_list(state.pfc)
        if key.name == "pfc_cable_length":
            return self._cable_length(key.target, state)
        if key.name == "dcbx":
            if state.dcbx is None:
                return Unsupported("the driver reports no DCBX mode (no getdcbx)")
            return "host" if state.dcbx & DCBX_HOST else "firmware"
        if key.name in BUFFER_FIELDS:
            if state.buffer is None:
                return Unsupported("the device reports no port buffers (the driver has no "
                                   "dcbnl_getbuffer; mlx5 has them with MLX5_BUFFER_SUPPORTED only)")
            return list(getattr(state.buffer, BUFFER_FIELDS[key.name]))
        if state.ets is None:
            return Unsupported("the device reports no ETS")
        values = list(getattr(state.ets, ETS_FIELDS[key.name]))
        if key.name == "ets.tc_bw":
            # Bandwidth means something for ETS classes only; mlx5 reports
            # 100 for strict and vendor classes (mlx5e_build_tc_tx_bw).
            return [bw if tsa == TSA_CODES["ets"] else 0
                    for bw, tsa in zip(values, state.ets.tc_tsa)]
        return [_tsa_name(v) for v in values] if key.name == "ets.tc_tsa" else values

    def _cable_length(self, ifname: str, state):
        driver = self.driver_of(ifname)
        if driver not in nicclass.PFC_CABLE_LENGTH:
            return Unsupported(f"not supported by {driver or 'this driver'}: only mlx5 reads ieee_pfc.delay "
                               "as a cable length in metres (the uapi, dcbnl.h struct ieee_pfc, "
                               "gives it in bit times)")
        if state.pfc is None or not state.pfc.delay:
            return Unsupported("the device reports no cable length (mlx5 reports it with port "
                               "buffer support only: en_dcbnl.c mlx5e_dcbnl_ieee_getpfc)")
        return state.pfc.delay

    def check(self, key, want) -> Optional[str]:
        wanted = self._wanted.get(key.target, {})
        if key.name == "pfc_cable_length":
            low, high = nicclass.PFC_CABLE_LENGTH.get(self.driver_of(key.target), (1, 0xFFFF))
            if not low <= want.value <= high:
                return (f"the driver takes a cable length of {low}-{high} m and silently keeps "
                        "the old one otherwise (en_dcbnl.c mlx5e_dcbnl_ieee_setpfc: "
                        "MLX5E_MAX_CABLE_LENGTH)")
            return None
        if key.name == "buffer.size":
            return self._check_lossless_sizes(key.target, wanted)
        if key.name in ("trust", "dscp_map") and wanted.get("trust") == "pcp" and wanted.get("dscp_map"):
            return "trust pcp and a dscp_map contradict each other: DSCP entries switch the device to trust dscp"
        if key.name.startswith("ets."):
            return self._check_ets(key.target, wanted)
        return None

    def _check_ets(self, target: str, wanted: dict) -> Optional[str]:
        """mlx5 refuses (EINVAL) an ETS whose ETS-class bandwidth is not 0 or 100."""
        state = self._states.get(target)
        if state is None or isinstance(state, Unsupported) or state.ets is None:
            return None
        tsa = wanted.get("ets.tc_tsa") or [_tsa_name(v) for v in state.ets.tc_tsa]
        bw = wanted.get("ets.tc_bw") or list(state.ets.tc_tx_bw)
        stray = [tc for tc, (b, t) in enumerate(zip(bw, tsa)) if b and t != "ets"]
        if "ets.tc_bw" in wanted and stray:
            return (f"bandwidth is for ETS classes only: traffic class {stray[0]} is "
                    f"{tsa[stray[0]]}, so its tc_bw must be 0")
        total = sum(b for b, t in zip(bw, tsa) if t == "ets")
        if total not in (0, 100):
            return (f"the ETS traffic classes' bandwidth would sum to {total}; "
                    "the device takes only 100 (or 0)")
        return None

    def _check_lossless_sizes(self, target: str, wanted: dict) -> Optional[str]:
        """mlx5 refuses (EINVAL) a zero size for a lossless buffer, one that a
        priority with PFC on maps to (port_buffer.c
        mlx5e_port_manual_buffer_config)."""
        state = self._states.get(target)
        if self.driver_of(target) != "mlx5_core" or state is None or isinstance(state, Unsupported):
            return None
        pfc = wanted.get("pfc", _pfc_list(state.pfc) if state.pfc else [])
        prio2buffer = wanted.get("buffer.prio2buffer", state.buffer.prio2buffer if state.buffer else None)
        if prio2buffer is None:
            return None
        for prio in pfc:
            if wanted["buffer.size"][prio2buffer[prio]] == 0:
                return (f"buffer {prio2buffer[prio]} holds priority {prio}, which has PFC on: "
                        "mlx5 refuses a zero size for a lossless buffer")
        return None

    def note(self, key: Key) -> str:
        if key.name == "dscp_map":
            return "exact map: DSCP entries not listed are deleted (they then map to priority 0)"
        if key.name == "dcbx" and self._wanted.get(key.target, {}).get("dcbx") == "firmware":
            return "a willing NIC firmware may then take PFC and ETS from the switch (DCBX)"
        if key.name == "pfc_cable_length":
            return self._cable_length_note(key.target)
        if key.name in BUFFER_FIELDS:
            return self._buffer_note(key)
        return ""

    def _port_facts(self, ifname: str) -> dict:
        """What nicclass's buffer rules ask of a port.  No kernel interface
        says who owns the port buffers: they are software's once this
        profile writes one, else unknown (firmware's unless a buffer write
        since the driver loaded)."""
        wanted = self._wanted.get(ifname, {})
        return {"buffers": "software" if any(k in wanted for k in BUFFER_FIELDS) else None}

    def _cable_length_note(self, ifname: str) -> str:
        driver = self.driver_of(ifname)
        found = nicclass.rules_holding(driver, "roce.pfc_cable_length", self._port_facts(ifname),
                                       "no effect")
        if not found:
            return ""
        return (f"no effect while the firmware owns the buffers (the default; roce.buffer is not "
                f"set): {found[0].why} ({found[0].source})")

    def _buffer_note(self, key: Key) -> str:
        driver = self.driver_of(key.target)
        notes = []
        if key.name == "buffer.size" and driver == "mlx5_core":
            notes.append("mlx5 keeps sizes in whole buffer cells, rounding down (en/port_buffer.c "
                         "port_set_buffer)")
        for found in nicclass.rules_holding(driver, "roce." + key.name, self._port_facts(key.target),
                                            "one-way"):
            length = self._wanted.get(key.target, {}).get("pfc_cable_length")
            sized = (f"headroom sized for the {length} m cable length this profile sets"
                     if length else f"headroom sized for {nicclass.MLX5_DEFAULT_CABLE_LENGTH} m "
                     "unless the cable length was set (pfc_cable_length is not in the profile)")
            notes.append(f"one-way: {found.why}; here: {sized} ({found.source})")
        return "; ".join(notes)

    def disruptive(self, key: Key, before, after) -> str:
        if key.name == "pfc" and before != after:
            return PFC_TOGGLES_LINK.get(self.driver_of(key.target) or "", "")
        return ""

    # -- writes ------------------------------------------------------------
    def apply(self, items):
        for target, values in group_by_target(items).items():
            self._write(target, values, revert=False)

    def revert(self, items):
        for target, values in group_by_target(items).items():
            self._write(target, values, revert=True)

    def _write(self, ifname: str, values: dict, revert: bool) -> None:
        dcb = self.host.dcb()
        if "dcbx" in values:
            mode = DCBX_MODES[values["dcbx"]]
            if values["dcbx"] == "firmware":
                mode = DCBX_FIRMWARE_MODE.get(self.driver_of(ifname) or "", mode)
            dcb.set_dcbx(ifname, mode)
        # Read now, not at plan time; the writes below each replace one
        # object (APP table, PFC, ETS, buffers) and leave the others as read here.
        state = dcb.get(ifname)
        have = _dscp_apps(state)
        if "dscp_map" in values:
            self._set_dscp_map(ifname, values["dscp_map"], have)
        trust = values.get("trust")
        if trust == "pcp":
            self._set_dscp_map(ifname, {}, have)
        elif trust == "dscp" and "dscp_map" not in values and not have:
            # Reverting restores the map this run first saw, when it had one.
            first = self._first_apps.get(ifname) if revert else None
            self._set_dscp_map(ifname, first or default_dscp_map(), have)
        if "pfc" in values or "pfc_cable_length" in values:
            pfc = state.pfc
            if "pfc" in values:
                pfc = dataclasses.replace(pfc, pfc_en=sum(1 << p for p in values["pfc"]))
            if "pfc_cable_length" in values:
                pfc = dataclasses.replace(pfc, delay=values["pfc_cable_length"])
            dcb.set_pfc(ifname, pfc)
        ets_values = {k: v for k, v in values.items() if k in ETS_FIELDS}
        if ets_values:
            ets = state.ets
            changes = {}
            for name, value in ets_values.items():
                if name == "ets.tc_tsa":
                    value = [TSA_CODES[v] if v in TSA_CODES else int(v) for v in value]
                changes[ETS_FIELDS[name]] = list(value)
            ets = dataclasses.replace(ets, **changes)
            # mlx5 reports 100% for each vendor (default) class, and the kernel
            # and dcb refuse bandwidth on a class that is not ETS: a rollback to
            # the driver's default state writes those as 0.
            ets.tc_tx_bw = [bw if tsa == TSA_CODES["ets"] else 0
                            for bw, tsa in zip(ets.tc_tx_bw, ets.tc_tsa)]
            dcb.set_ets(ifname, ets)
        buffer_values = {BUFFER_FIELDS[k]: list(v) for k, v in values.items() if k in BUFFER_FIELDS}
        if buffer_values:
            dcb.set_buffer(ifname, dataclasses.replace(state.buffer, **buffer_values))

    def _set_dscp_map(self, ifname: str, wanted: dict, have: dict) -> None:
        """Make the DSCP entries `wanted`, from the `have` just read: add what
        is missing first, then delete what is left over, so the device keeps
        trusting DSCP throughout when the map stays non-empty."""
        from nictune.host.transports.netlink.dcb import App

        dcb = self.host.dcb()
        missing = [App(SEL_DSCP, p, int(d)) for d, p in wanted.items() if have.get(d) != p]
        if missing:
            dcb.add_apps(ifname, missing)
        # Read again: drivers differ on whether a new entry replaces the old.
        stale = [a for a in dcb.get(ifname).apps
                 if a.selector == SEL_DSCP and wanted.get(str(a.protocol)) != a.priority]
        if stale:
            dcb.del_apps(ifname, stale)
