"""The switch port's view of each rail: does it agree with the profile?

    interfaces:
      rails:
        match: {driver: mlx5_core}
        mtu: 9000
        roce: {trust: dscp, dscp_map: {26: 3}, pfc: [3], ets: {...}, dcbx: host}
        switch:
          lldp: required      # a rail with no LLDP neighbour is a finding (optional: it is not)

The neighbour is what the switch port says of itself over LLDP
(facts/lldp.py decodes it; facts/neighbours.py says where it is read from:
the resident agent's listener, lldpd, lldpad, the driver's DCBX peer, or a
bounded wait with --lldp-wait).  Each check compares one TLV with the
profile line it must agree with; a disagreement gets its own status,
SWITCH_MISMATCH ("switch-mismatch"), never "drift": nothing on the host
would fix it, and nothing is ever written.

Keys are family "switch", one per rail and check:

  lldp            a neighbour was heard (switch.lldp: required)
  pfc             PFC Configuration TLV's priorities == roce.pfc
  ets             ETS Configuration TLV: a traffic class the profile has
                  strict is not an ETS class with bandwidth there, nor the
                  reverse; both ETS: the same percentage (roce.ets.tc_tsa,
                  roce.ets.tc_bw)
  dscp_map        Application Priority TLV: every DSCP of roce.dscp_map
                  maps to the same priority there
  max_frame_size  802.3 Maximum Frame Size TLV >= the rail's MTU (mtu, or
                  the MTU it has) + L2 overhead (18 bytes: header and FCS,
                  22 with an 802.1Q tag when roce.trust is pcp)
  willing         neither the ETS nor the PFC TLV is willing while
                  roce.dcbx is host

A TLV the switch does not send, or a profile that does not set what a
check compares, meets the check; the note says which.
"""

from __future__ import annotations

import time

from nictune.host.knobs.base import Family
from nictune.host.model import SWITCH_MISMATCH, Desired, Key, Want

CHECKS = ("lldp", "pfc", "ets", "dscp_map", "max_frame_size", "willing")
L2_OVERHEAD = 18       # Ethernet header (14) and FCS (4): 802.3's frame size beyond the MTU
VLAN_TAG = 4
AGREE = "agree"        # the wanted value of every comparison key
HEARD = "heard"


def _prios(values) -> str:
    return ", ".join(str(p) for p in values) if values else "none"


def _not_from_a_replay(host) -> None:
    """A neighbour is heard on the host's own wire, sockets and daemons,
    never through the host's I/O port: a replay of recorded reads (the
    probe, on the controller) must not read the controller's instead, and a
    run that teaches the probe its questions says the probe cannot ask this."""
    session = getattr(host.io, "session", None)
    if hasattr(session, "not_recorded"):
        raise session.not_recorded("the rails' LLDP neighbours, heard on the host's wire")
    why_not = getattr(session, "why_not", None)
    if isinstance(why_not, list):
        why_not.append("the rails' LLDP neighbours (heard on the wire, not read through the host's port)")


class SwitchFamily(Family):
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    mtu: 9000
    roce: {trust: dscp, dscp_map: {26: 3}, pfc: [3], dcbx: host}
    switch: {lldp: required}
"""
    name = "switch"
    position = 120
    position_note = "only read: the switch port's LLDP, never written"
    sections = ("switch",)
    settings = ("switch.lldp",)
    read_only = True
    unmet_status = SWITCH_MISMATCH
    offline_plan = "the neighbour is heard on the wire (LLDP), not recorded by show"

    @classmethod
    def schema(cls, s):
        return {"entry": {"switch": s.section(
            "What the switch port at the other end of each rail must agree with, read from "
            "its LLDP frames (chassis and port, maximum frame size, the 802.1Qaz ETS, PFC "
            "and APP TLVs) and compared with this entry's mtu and roce settings. "
            "nictune only reads it: a disagreement is reported as switch-mismatch.", {
                "lldp": {"enum": ["required", "optional"], "description":
                         "required: a rail with no LLDP neighbour is a finding; optional: "
                         "the checks run only where a neighbour is heard."},
            })}}

    def __init__(self, host):
        super().__init__(host)
        self._found: dict = {}     # ifname -> neighbours.Found
        self._notes: dict = {}     # Key -> note
        self._unmet: set = set()   # keys whose check failed

    def expand(self, target, sections, source):
        conf = sections.get("switch") or {}
        out = []
        if conf.get("lldp", "required") == "required":
            out.append(Desired(Key(self.name, target, "lldp"), Want(HEARD), source("switch", "lldp")))
        for check in CHECKS[1:]:
            out.append(Desired(Key(self.name, target, check), Want(AGREE), source("switch")))
        return out

    # -- reading the neighbours ----------------------------------------------------------

    def _find(self, ifnames: list) -> None:
        from nictune.host.facts import neighbours
        from nictune.host.transports import lldpsock

        _not_from_a_replay(self.host)
        state_dir = getattr(self.host, "state_dir", None)
        store = lldpsock.load_store(f"{state_dir}/{lldpsock.STORE_FILE}") if state_dir else {}
        wait = getattr(self.host, "lldp_wait", 0) or 0
        now = time.time()
        for ifname in ifnames:
            self._found[ifname] = neighbours.find(ifname, store, now, self._dcb_state(ifname))
        silent = [i for i in ifnames if self._found[i].neighbour is None]
        if wait and silent:
            waited = lldpsock.wait_for_frames(silent, wait)["rails"]
            now = time.time()
            for ifname in silent:
                found = neighbours.find(ifname, {}, now, None, waited, daemons=False)
                found.tried = self._found[ifname].tried + [f"waited {wait:g} s: " + (
                    "a frame" if found.neighbour else "no frame")]
                self._found[ifname] = found

    def _dcb_state(self, ifname: str):
        try:
            return self.host.dcb().get(ifname)
        except Exception:  # noqa: BLE001 - no DCB on the device: one source fewer
            return None

    def _live_only(self) -> None:
        """The neighbour is heard on the host's wire, read from its daemons:
        no recorded kernel answer holds it.  A verify learning for the
        probe says so (the host keeps its agent); a replay refuses."""
        session = getattr(self.host.io, "session", None)
        if session is None:
            return
        if isinstance(getattr(session, "why_not", None), list):
            session.why_not.append("the switch port's LLDP neighbour (switch: checks)")
        elif hasattr(session, "not_recorded"):
            raise session.not_recorded("the switch port's LLDP neighbour (switch: checks)")

    def read(self, keys):
        self._notes, self._unmet = {}, set()
        self._live_only()
        self._find(sorted({k.target for k in keys}))
        out = {}
        for key in keys:
            found = self._found[key.target]
            n = found.neighbour
            if key.name == "lldp":
                out[key] = None if n is None else self._who(found)
                if n is None:
                    self._fail(key, f"no LLDP neighbour heard on {key.target} ("
                               + "; ".join(found.tried) + "): the rail's switch port cannot be checked")
                elif found.others:
                    self._notes[key] = (f"{found.others} other LLDP chassis also heard on {key.target}: "
                                        "a hub or an unmanaged switch between the NIC and its switch port?")
                continue
            if n is None:
                out[key] = None
                self._notes[key] = "no LLDP neighbour: not compared"
                continue
            out[key] = getattr(self, f"_check_{key.name}")(key, n)
        return out

    def neighbours(self) -> dict:
        """rail -> the Neighbour its last read found (None: none heard): a
        verify report carries it in the rail's facts, where the audit's
        cabling check (control/review/cabling.py) reads it."""
        return {ifname: found.neighbour for ifname, found in self._found.items()}

    def met(self, key, want, current):
        return key not in self._unmet

    def note(self, key):
        return self._notes.get(key, "")

    # -- the checks ---------------------------------------------------------------------

    def _fail(self, key: Key, message: str) -> None:
        self._unmet.add(key)
        self._notes[key] = message

    def _who(self, found) -> str:
        n = found.neighbour
        age = "" if n.age is None else f", {n.age:.0f} s old"
        if n.source == "dcbnl":
            return "the driver's DCBX peer (no chassis or port identity)"
        return f"{n.label()} (chassis {n.chassis_id}; from {n.source}{age})"

    def _profile(self, key: Key, family: str, name: str):
        """(wanted value, "roce.pfc (file:line)") of the profile setting a check compares."""
        desired = self.wanted.get(Key(family, key.target, name))
        if desired is None:
            return None, ""
        path = name if family == "link" else "roce." + name
        return desired.want.value, f"{path} ({desired.source})" if desired.source else path

    def _tlv(self, n, tlv: str) -> str:
        return f"{n.label() if n.source != 'dcbnl' else 'the DCBX peer'}'s {tlv} TLV (from {n.source})"

    def _check_pfc(self, key, n):
        wanted, where = self._profile(key, "dcb", "pfc")
        if n.pfc is None:
            self._notes[key] = "the switch sends no PFC Configuration TLV"
            return None
        seen = list(n.pfc.enabled)
        if wanted is None:
            self._notes[key] = "the profile sets no roce.pfc: not compared"
        elif sorted(set(wanted)) != seen:
            self._fail(key, f"{self._tlv(n, 'PFC Configuration')} enables PFC on priorities {_prios(seen)}, "
                            f"{where} on {_prios(sorted(set(wanted)))}: traffic on "
                            f"{_prios(sorted(set(seen) ^ set(wanted)))} is paused by one side only")
        return seen

    def _check_ets(self, key, n):
        tsa, where_tsa = self._profile(key, "dcb", "ets.tc_tsa")
        bw, where_bw = self._profile(key, "dcb", "ets.tc_bw")
        if n.ets is None:
            self._notes[key] = "the switch sends no ETS Configuration TLV"
            return None
        seen = {"tc_tsa": list(n.ets.tc_tsa), "tc_bw": list(n.ets.tc_bw)}
        if tsa is None and bw is None:
            self._notes[key] = "the profile sets no roce.ets: not compared"
            return seen
        problems = []
        for tc in range(8):
            theirs, pct = n.ets.tc_tsa[tc], n.ets.tc_bw[tc]
            ours = tsa[tc] if tsa is not None else None
            if ours is not None and ours != theirs and "ets" in (ours, theirs):
                problems.append(f"TC {tc} is {theirs}" + (f" with {pct}%" if theirs == "ets" else "")
                                + f" on the switch, {ours}" + (f" with {bw[tc]}%" if ours == "ets" and bw else "")
                                + " in the profile")
            elif bw is not None and theirs == "ets" and (ours in (None, "ets")) and pct != bw[tc]:
                problems.append(f"TC {tc} has {pct}% on the switch, {bw[tc]}% in the profile")
        if problems:
            where = " and ".join(w for w in (where_tsa, where_bw) if w)
            self._fail(key, f"{self._tlv(n, 'ETS Configuration')} disagrees with {where}: " + "; ".join(problems))
        return seen

    def _check_dscp_map(self, key, n):
        wanted, where = self._profile(key, "dcb", "dscp_map")
        theirs = n.dscp_map()
        if theirs is None:
            self._notes[key] = "the switch sends no Application Priority TLV"
            return None
        shown = {str(d): p for d, p in sorted(theirs.items())}
        if wanted is None:
            self._notes[key] = "the profile sets no roce.dscp_map: not compared"
            return shown
        problems = []
        for dscp, prio in sorted(((int(d), p) for d, p in wanted.items())):
            if dscp not in theirs:
                problems.append(f"DSCP {dscp} is not in its table (priority {prio} in the profile)")
            elif theirs[dscp] != prio:
                problems.append(f"DSCP {dscp} -> priority {theirs[dscp]} there, {prio} in the profile")
        if problems:
            self._fail(key, f"{self._tlv(n, 'Application Priority')} disagrees with {where}: "
                            + "; ".join(problems))
        return shown

    def _check_max_frame_size(self, key, n):
        if n.max_frame_size is None:
            self._notes[key] = "the switch sends no Maximum Frame Size TLV"
            return None
        mtu, where = self._profile(key, "link", "mtu")
        if isinstance(mtu, dict) or mtu is None:  # a bound, or not in the profile: the MTU it has
            mtu, where = self._current_mtu(key.target), f"{key.target}'s MTU"
        trust, _ = self._profile(key, "dcb", "trust")
        overhead = L2_OVERHEAD + (VLAN_TAG if trust == "pcp" else 0)
        if isinstance(mtu, int) and n.max_frame_size < mtu + overhead:
            self._fail(key, f"{self._tlv(n, 'Maximum Frame Size')} says {n.max_frame_size} bytes, "
                            f"below {where}: {mtu} + {overhead} bytes of L2 overhead = {mtu + overhead}: "
                            "the switch drops the host's largest frames")
        return n.max_frame_size

    def _current_mtu(self, ifname: str):
        link = next((link for link in self.host.links() if link.name == ifname), None)
        return getattr(link, "mtu", None)

    def _check_willing(self, key, n):
        dcbx, where = self._profile(key, "dcb", "dcbx")
        willing = [name for name, tlv in (("ETS", n.ets), ("PFC", n.pfc)) if tlv is not None and tlv.willing]
        if dcbx is None:
            self._notes[key] = "the profile sets no roce.dcbx: not compared"
        elif dcbx == "host" and willing:
            self._fail(key, f"{self._tlv(n, ' and '.join(w + ' Configuration' for w in willing))} "
                            f"sets the willing bit while {where} keeps DCBX on the host: "
                            "a willing switch takes whatever the host's DCBX advertises, and keeps "
                            "its own configuration only while nothing is advertised")
        return willing
