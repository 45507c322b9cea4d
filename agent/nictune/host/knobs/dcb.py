"""DCB over dcbnl: trust, the DSCP -> priority map, PFC and ETS.

mlx5 has no trust attribute of its own: the device trusts DSCP exactly
when the APP table holds DSCP (selector 5) entries, so trust and dscp_map
are two views of one table.  trust dscp without a dscp_map writes the
default map (DSCP d -> priority d >> 3, as mlnx_qos --trust dscp does);
trust pcp deletes every DSCP entry.  dscp_map is the exact set of DSCP
entries: entries not in the map are deleted (mlx5 maps those DSCPs to 0).

PFC is one bitmask and ETS one structure on the device, each written in a
single message: a revert writes the whole before-vector back.
"""

from __future__ import annotations

import dataclasses
import errno
from typing import Optional

from nictune.host import nicclass
from nictune.host.knobs.base import Family, group_by_target
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.netlink.errors import NetlinkError
from nictune.host.validate import DSCP

PRIOS = 8
SEL_DSCP = 5
TSA_NAMES = {0: "strict", 1: "cbs", 2: "ets", 255: "vendor"}
TSA_CODES = {v: k for k, v in TSA_NAMES.items()}
ETS_FIELDS = {"ets.prio_tc": "prio_tc", "ets.tc_bw": "tc_tx_bw", "ets.tc_tsa": "tc_tsa"}


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
    name = "dcb"
    position = 80
    position_note = "after pause (see pause), before the RoCE files (see roce)"
    sections = ("roce",)
    settings = ("roce.trust", "roce.dscp_map", "roce.pfc",
                "roce.ets.prio_tc", "roce.ets.tc_bw", "roce.ets.tc_tsa")

    @classmethod
    def schema(cls, s):
        ets = s.section("ETS scheduling (dcb ets / mlnx_qos --prio_tc --tcbw --tsa).", {
            "prio_tc": s.vector(s.integer(0, 7), "Priority -> traffic class (0-7)."),
            "tc_bw": s.vector(s.integer(0, 100), "Bandwidth percent per traffic class; the ETS classes sum to 100."),
            "tc_tsa": s.vector({"enum": ["ets", "strict", "vendor"]}, "Scheduler per traffic class: ets, strict or vendor."),
        }, minProperties=1)
        # Shares roce: with RoceFamily, which describes the section.
        return {"entry": {"roce": {"type": "object", "additionalProperties": False, "properties": {
            "trust": {"enum": ["dscp", "pcp"], "description": "Which header field picks the priority: DSCP or 802.1p PCP."},
            "dscp_map": s.mapping(
                "DSCP (0-63) -> priority (0-7), written as DCB APP entries (selector 5); the exact set of DSCP entries.",
                s.text(DSCP, 2), s.integer(0, 7), 64),
            "pfc": s.prio_list("Priorities with PFC on; every other priority off."),
            "ets": ets,
        }}}}

    @classmethod
    def nic_support(cls, driver, setting):
        return nicclass.dcb_unsupported(driver, setting[len("roce."):])

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
        self._wanted[target] = wanted
        return [Desired(Key(self.name, target, name), Want(value),
                        source("roce", *name.split(".")))
                for name, value in wanted.items()]

    # -- host -> values ----------------------------------------------------
    def _state(self, ifname: str):
        """The device's DCB state, or the reason it has none."""
        driver = self.driver_of(ifname)
        reason = nicclass.dcb_unsupported(driver, "pfc")
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
        if state.ets is None:
            return Unsupported("the device reports no ETS")
        values = list(getattr(state.ets, ETS_FIELDS[key.name]))
        if key.name == "ets.tc_bw":
            # Bandwidth means something for ETS classes only; mlx5 reports
            # 100 for strict and vendor classes (mlx5e_build_tc_tx_bw).
            return [bw if tsa == TSA_CODES["ets"] else 0
                    for bw, tsa in zip(values, state.ets.tc_tsa)]
        return [_tsa_name(v) for v in values] if key.name == "ets.tc_tsa" else values

    def check(self, key, want) -> Optional[str]:
        wanted = self._wanted.get(key.target, {})
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

    def note(self, key: Key) -> str:
        if key.name == "dscp_map":
            return "exact map: DSCP entries not listed are deleted (they then map to priority 0)"
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
        # Read now, not at plan time; the writes below each replace one
        # object (APP table, PFC, ETS) and leave the others as read here.
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
        if "pfc" in values:
            mask = sum(1 << p for p in values["pfc"])
            dcb.set_pfc(ifname, dataclasses.replace(state.pfc, pfc_en=mask))
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

    def _set_dscp_map(self, ifname: str, wanted: dict, have: dict) -> None:
        """Make the DSCP entries `wanted`, from the `have` just read: add what
        is missing first, then delete what is left over, so the device keeps
        trusting DSCP throughout when the map stays non-empty."""
        from nictune.host.netlink.dcb import App

        dcb = self.host.dcb()
        missing = [App(SEL_DSCP, p, int(d)) for d, p in wanted.items() if have.get(d) != p]
        if missing:
            dcb.add_apps(ifname, missing)
        # Read again: drivers differ on whether a new entry replaces the old.
        stale = [a for a in dcb.get(ifname).apps
                 if a.selector == SEL_DSCP and wanted.get(str(a.protocol)) != a.priority]
        if stale:
            dcb.del_apps(ifname, stale)
