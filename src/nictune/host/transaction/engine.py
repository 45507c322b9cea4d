"""Desired state, current state, the plan between them, and applying it.

    profile doc + host facts --expand--> desired {Key: Want}
    knob families read the host -------> current {Key: value}
    desired x current --diff--> [Change]
    apply: journal(before, and what the changes take with them: aside.py)
           -> write -> read back -> commit,
           any failure -> restore every touched key, newest first, then
           put back what the changes took with them.

`plan` and `verify` never reach a family's apply(): only `apply` and
`rollback` write.
"""

from __future__ import annotations

import re
import time
from contextlib import suppress

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

    from nictune.host.facts.health import Health

from nictune.host import errors

from nictune.host.transaction import aside
from nictune.host import model as m
from nictune.host.errors import (
    Conflict,
    Interrupted,
    InvalidInput,
    JournalDamaged,
    Locked,
    NictuneError,
    NoJournal,
    StateDirError,
)
from nictune.host.machine import Host, vfs_of
from nictune.host.transaction.journal import (
    AGENT,
    HISTORY_KEPT,
    APPLYING,
    COMMITTED,
    CONFIRM_EXPIRED,
    CONFIRM_PENDING,
    ROLLBACK_FAILED,
    ROLLED_BACK,
    Journal,
    desired_stamp,
    is_agents,
    unconfirmed,
)
from nictune.host import knobs
from nictune.host.model import HOST, Change, Default, Desired, Key, Outcome, Unsupported


class Superseded(NictuneError):
    """The resident agent's apply of a desired state that an apply or a
    rollback has replaced since the agent read it: nothing was written."""


class Families:
    """One instance of every knob family, in apply order, for one command
    (knobs/base.py: what a family may keep between phases).  With `names`,
    only those families: the agent imports no other (knobs/__init__.py)."""

    def __init__(self, host: Host, names=None):
        classes = knobs.FAMILIES if names is None else sorted(
            (knobs.load(n) for n in names), key=lambda family: family.position)
        self.ordered = [cls(host) for cls in classes]
        self.by_name = {f.name: f for f in self.ordered}
        # host/replay/probe_reads.py learning: make the reads a drifted key's check
        # would make even where nothing drifted, so that a probe can answer
        # a later verify of a drifted host too.
        self.rehearse = getattr(host, "learning", False)

    def __getitem__(self, name: str):
        return self.by_name[name]

    def write(self, family: str, items: list, revert: bool = False) -> None:
        """The only way anything is written to the host."""
        fam = self.by_name[family]
        if fam.read_only:
            raise RuntimeError(f"{family} keys are read-only: nothing writes them")
        (fam.revert if revert else fam.apply)(items)

    def read(self, keys: list) -> dict:
        """Current values of `keys`, one batch per family."""
        current = {}
        for fam in self.ordered:
            mine = [k for k in keys if k.family == fam.name]
            if not mine:
                continue
            try:
                current.update(fam.read(mine))
            except InvalidInput:
                raise  # the request is at fault, not the host: refuse it whole
            except (OSError, ValueError, NictuneError) as e:
                current.update({k: Unsupported(f"cannot read {fam.name}: {e}") for k in mine})
        return current


class Desire:
    """The expanded profile: what this host should look like."""

    def __init__(self):
        self.items: dict = {}   # Key -> Desired, in profile order
        self.policy: dict = {}  # Key -> "fail" | "warn" | "skip"
        self.owner: dict = {}   # Key -> profile entry that asked for it
        self.warnings: list = []

    def add(self, desired: Desired, policy: str, owner: str) -> None:
        """One key asked for; two asks that disagree are a conflict, but a
        family's default (model.Default) gives way to the profile's own."""
        old = self.items.get(desired.key)
        if old is not None and isinstance(old, Default) != isinstance(desired, Default):
            if isinstance(desired, Default):
                return
            old = None
        if old is not None and old.want != desired.want:
            raise Conflict(
                f"{desired.key.target}: {self.owner[desired.key]} ({old.source or 'profile'}) and "
                f"{owner} ({desired.source or 'profile'}) both set {desired.key.family} "
                f"{desired.key.name}, to {old.want.as_json()!r} and {desired.want.as_json()!r}; "
                "make the match: selectors disjoint or drop one of them")
        if old is None:
            self.items[desired.key] = desired
            self.policy[desired.key] = policy
            self.owner[desired.key] = owner

    def narrow(self, scope) -> None:
        """Keep only the keys scope(key) accepts, to read, diff and write.
        The families keep the whole profile's wants (Family.wanted): a
        narrowed command leaves keys out, never changes what the others mean."""
        self.items = {k: d for k, d in self.items.items() if scope(k)}


class Sourced(str):
    """A key's "file:line", which also knows the profile path the family
    asked for it at (("roce", "ecn", "np")): per-section on_unsupported
    goes by that path."""

    path: tuple = ()


def _source_in(sources: dict, prefix: str):
    def source(*parts: str) -> Sourced:
        out = Sourced(sources.get("/".join((prefix,) + parts), ""))
        out.path = parts
        return out
    return source


class Policy:
    """What on_unsupported says for one key: the entry's word or mapping
    first, then the profile's; in a mapping the longest path that covers
    the key's profile path, then its default (schema.py _on_unsupported)."""

    def __init__(self, *layers):
        self.layers = [layer for layer in layers if layer is not None]

    def of(self, path: str) -> str:
        for layer in self.layers:
            if isinstance(layer, str):
                return layer
            covering = [k for k in layer if k != "default" and (path == k or path.startswith(k + "."))]
            if covering:
                return layer[max(covering, key=len)]
            if "default" in layer:
                return layer["default"]
        return "fail"


def expand(host: Host, fams: Families, doc: dict, sources: dict) -> Desire:
    """The profile's wants on this host: host: sections first, then the
    interface entries in profile order.

    An entry's match: selects among the interfaces as they are when the plan
    runs.  `vf_of: ENTRY` (with `vfs: [N, ...]`) selects the VF
    representors and VF netdevs of the PFs that the earlier ENTRY matched
    (machine.vfs_of); those that this same apply makes (switchdev, numvfs)
    are not there yet, and apply writes only what its plan showed: the next
    plan matches them.  The entries are matched before host: sections
    expand, so that those can take the rails' devices (Family.profile_interfaces)."""
    desire = Desire()
    top = doc.get("on_unsupported")
    entry_desires: list = []  # (Desired, policy word, owner)
    interfaces: list = []
    if doc.get("interfaces"):
        interfaces = host.interfaces()
        desire.warnings.extend(host.skipped_interfaces)
    matched_by: dict = {}  # entry name -> its interfaces, for vf_of
    rails: list = []       # interfaces of entries with a roce: section
    for entry_name, entry in (doc.get("interfaces") or {}).items():
        policy = Policy(entry.get("on_unsupported"), top)
        match = entry.get("match", {})
        pool = interfaces
        if "vfs" in match and "vf_of" not in match:
            where = sources.get(f"interfaces/{entry_name}/match/vfs") or f"interfaces.{entry_name}"
            raise InvalidInput(f"{where}: interfaces.{entry_name}.match.vfs needs vf_of: "
                               "the entry whose PFs the VF numbers are of")
        if "vf_of" in match:
            if match["vf_of"] not in matched_by:
                where = sources.get(f"interfaces/{entry_name}/match/vf_of") or f"interfaces.{entry_name}"
                raise InvalidInput(
                    f"{where}: interfaces.{entry_name}.match.vf_of names {str(match['vf_of'])[:40]!r}, "
                    "which is not an interface entry before this one; vf_of takes the name "
                    "of an earlier entry that matches the PFs")
            pool = vfs_of(matched_by[match["vf_of"]], interfaces, match.get("vfs"))
        matched = [i for i in pool if i.matches(match)]
        matched_by[entry_name] = matched
        if "roce" in entry:
            rails.extend(i.name for i in matched if i.name not in rails)
        if not matched:
            desire.warnings.append(f"interfaces.{entry_name} matched no interface on this host")
        for iface in matched:
            for fam in fams.ordered:
                sections = {s: entry[s] for s in fam.sections if s in entry}
                if not sections:
                    continue
                for d in fam.expand(iface.name, sections, _source_in(sources, f"interfaces/{entry_name}")):
                    entry_desires.append((d, policy.of(_path_of(d)), f"interfaces.{entry_name}"))

    everything = list(dict.fromkeys(i.name for found in matched_by.values() for i in found))
    host_policy = Policy(top)
    host_doc = doc.get("host") or {}
    for fam in fams.ordered:
        if doc.get("interfaces"):
            fam.profile_interfaces = {"roce": rails, "all": everything}
        sections = {s: host_doc[s] for s in fam.host_sections if s in host_doc}
        for d in fam.expand(HOST, sections, _source_in(sources, "host")) if sections else ():
            desire.add(d, host_policy.of("host." + _path_of(d)), "host")
    for d, word, owner in entry_desires:
        desire.add(d, word, owner)
    for fam in fams.ordered:
        fam.wanted = desire.items
    return desire


def _path_of(desired: Desired) -> str:
    """The profile path a key was asked for at, dotted ("roce.ecn.np")."""
    return ".".join(getattr(desired.source, "path", ()))


def _add_neighbours(facts: dict, fams: Families) -> None:
    """Each rail's LLDP neighbour as the switch family read it (None: none
    heard), into the verify report's facts as `neighbour`: the controller
    checks the cabling plan on it (control/review/cabling.py) without
    asking the host again."""
    switch = fams.by_name.get("switch")
    if switch is None:
        return
    for ifname, n in switch.neighbours().items():
        if ifname in facts:
            facts[ifname]["neighbour"] = None if n is None else n.to_dict()


def diff(fams: Families, desire: Desire, current: dict, read_only: bool = False) -> list:
    """The changes from `current` to `desire`.  `read_only` (verify, audit,
    the resident agent's watch): a key whose write is only withheld
    (model.Withheld: a file nictune did not write, without adopt: true)
    differs from the profile, so it is drift, whatever on_unsupported says;
    plan and apply refuse it, as unsupported."""
    changes = []
    for key, d in desire.items.items():
        fam = fams[key.family]
        cur = current[key]
        before = None if isinstance(cur, Unsupported) else cur
        reason: Optional[str] = cur.reason if isinstance(cur, Unsupported) else None
        staged = ""
        if reason is None and fam.met(key, d.want, cur):
            status = m.OK
            staged = fam.staged(key, d.want)
            if staged:  # stored as wanted, running only after a reset: never written again
                status = m.STAGED
            if fams.rehearse and not fam.read_only:
                _rehearse(fam, key, d.want)
        elif reason is None and fam.read_only:
            status = fam.unmet_status  # an expectation: reported, never written
        elif reason is None and fam.checked_only(key):
            status = m.DRIFT  # a key the family compares and never writes (knobs/macsec.py: MKA's)
        else:
            reason = reason or fam.check(key, d.want)
            status = m.PENDING if reason is None else (
                m.UNSUPPORTED if desire.policy[key] == "fail" else m.SKIPPED)
            if read_only and isinstance(reason, m.Withheld):
                status = m.DRIFT
                reason = "; ".join(n for n in (reason, fam.note(key)) if n)
        change = Change(key, before, d.want.value, status, d.source,
                        "; ".join(n for n in (staged, reason or fam.note(key)) if n),
                        d.want.bound)
        if status == m.PENDING:
            change.disruptive = fam.disruptive(key, before, d.want.value)
        changes.append(change)
    return changes


def _rehearse(fam, key, want) -> None:
    try:
        fam.check(key, want)
        fam.disruptive(key, None, want.value)
    except Exception:  # noqa: BLE001 - only its reads matter, and a failure is the kernel's answer
        pass


def _readback(fams: Families, desire: Desire, changes: list) -> Optional[tuple]:
    """First change whose key does not read back as wanted, with what it read."""
    current = fams.read([c.key for c in changes])
    for c in changes:
        if not desire.items[c.key].want.satisfied_by(current[c.key]):
            return c, current[c.key]
    return None


def _show_value(value) -> str:
    if isinstance(value, Unsupported):
        return f"unreadable ({value.reason})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def restore(fams: Families, changes: list) -> bool:
    """Put every key of `changes` back to its before-value, newest first.

    Consecutive keys of one family go back in one write, as they were
    applied (a NIC may refuse half of a coupled pair, such as rx without tx
    channels).  Two passes, because coupled settings can undo each other (a
    channel count change may reset rings); whatever still differs after
    that is reported as revert-failed for a human to look at.
    """
    errors: dict = {}
    current = fams.read([c.key for c in changes])
    # Keys already back (hand-made drift, or an interrupted apply that never
    # reached them) are not written, and not reported as restored.
    already = {c.key for c in changes if current[c.key] == c.before}
    # Keys the driver keeps by itself (asked before any write: while the
    # state that makes it keep them, such as a switchdev eswitch, holds).
    kept = {c.key: why for c in changes if c.key not in already
            for why in (fams[c.key.family].kept(c.key, c.before),) if why}
    for _ in range(2):
        todo = [c for c in reversed(changes) if current[c.key] != c.before and c.key not in kept]
        if not todo:
            break
        for batch in _runs_of_one_family(todo):
            try:
                fams.write(batch[0].key.family, [(c.key, c.before) for c in batch], revert=True)
            except Exception as e:  # noqa: BLE001 - keep restoring the rest
                errors.update({c.key: str(e) for c in batch})
        current = fams.read([c.key for c in changes])
    ok = True
    for c in changes:
        if c.key in kept:
            c.status, c.note = m.KEPT, kept[c.key]
        elif current[c.key] == c.before:
            if c.status == m.APPLIED and c.key in already:
                c.status, c.note = m.OK, "already at its before-value"
            elif c.status == m.APPLIED:
                c.status = m.REVERTED
        else:
            ok = False
            c.status = m.REVERT_FAILED
            c.note = f"still {_show_value(current[c.key])}" + (
                f": {errors[c.key]}" if c.key in errors else "")
    return ok


def _runs_of_one_family(changes: list) -> list:
    runs: list = []
    for c in changes:
        if runs and runs[-1][0].key.family == c.key.family:
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


class Engine:
    """Runs one command on one host.  Never exits the process."""

    def __init__(self, host: Host, state_dir: str):
        self.host = host
        self.fams = Families(host, ())
        self._own_health: Optional[Health] = None
        # With the host's root, the journal's lock also locks the target.
        self.journal = Journal(state_dir, root=host.root)

    @property
    def _health(self) -> Health:
        """The expect family's Health: one per command, shared with the report
        (its own when the command has no expect family)."""
        if "expect" in self.fams.by_name:
            return self.fams["expect"].health
        if self._own_health is None:
            # Imported here: only verify and show report health, and a plan
            # or an apply over SSH pays every import at every run.
            from nictune.host.facts.health import Health

            self._own_health = Health(self.host)
        return self._own_health

    def _fresh(self, names=None) -> None:
        """A Host, and so an Engine, may outlive one command: every command
        reads afresh, with families that know nothing of the last one:
        those named (knobs.families_for), or all of them."""
        self.host.forget(facts=True)
        self.fams = Families(self.host, names)
        for fam in self.fams.ordered:  # what a family keeps across commands (macsec PN marks)
            fam.state_dir = self.journal.dir
        self._own_health = None

    def _plan(self, doc: dict, sources: dict, read_only: bool = False, scope=None) -> tuple:
        """(desire, changes); `read_only` for a check that never writes (diff);
        `scope(key)`: only the keys it accepts are read (Desire.narrow)."""
        self._fresh(knobs.families_for(doc))
        desire = expand(self.host, self.fams, doc, sources)
        if scope is not None:
            desire.narrow(scope)
        current = self.fams.read(list(desire.items))
        changes = diff(self.fams, desire, current, read_only)
        if any(c.status == m.STAGED for c in changes):  # else no read a snapshot lacks
            _fail_after_reboot(changes, self.journal.load_resets(), boot_id(self.host))
        return desire, changes

    def plan(self, doc: dict, sources: dict, command: str = "plan") -> Outcome:
        desire, changes = self._plan(doc, sources, read_only=command == "verify")
        out = Outcome(command, changes, list(desire.warnings))
        _report_unsupported(out, desire)
        _report_reset_failed(out)
        if command == "plan":
            out.warnings += aside.warnings([c for c in changes if c.status == m.PENDING])
        out.warnings += [w for fam in self.fams.ordered for w in fam.warnings()]
        if command == "verify":
            for c in changes:
                if c.status == m.PENDING:
                    c.status = m.DRIFT
            # Health of the interfaces the profile touches, for the report.
            targets = {c.key.target for c in changes}
            health = self._health
            out.facts = {i.name: health.of(i) for i in self.host.interfaces() if i.name in targets}
            _add_neighbours(out.facts, self.fams)
        return out

    def apply(self, doc: dict, sources: dict, profile: Optional[str], remember: bool = True,
              only=None, keeping: Optional[dict] = None, scope=None) -> Outcome:
        """With `remember` (every apply but the resident agent's own), a
        successful apply stores its profile as the host's desired state
        (journal.py desired.json).  `only(key)` limits the writes to the keys
        it accepts (the resident agent's re-tune of one interface, its
        restore of some keys): the others that differ are left, as drift.
        `keeping` is the stored desired state the resident agent applies:
        its record says so ("by": "agent"), and when that state has been
        replaced (an apply, a rollback) since the agent read it, nothing
        is written (Superseded): checked under the lock that rollback
        holds while it restores and puts back the desired state before.
        `scope(key)`: the keys outside it are not even read (the resident
        agent's applies leave out what it never writes: Engine._plan)."""
        with self.journal.lock():
            self._refuse_unfinished()
            if keeping is not None and desired_stamp(self._desired_now()) != desired_stamp(keeping):
                raise Superseded("the desired state was replaced since the agent read it: "
                                 "nothing written")
            desire, changes = self._plan(doc, sources, scope=scope)
            out = Outcome("apply", changes, list(desire.warnings) + self.journal.warnings)
            out.warnings += [w for fam in self.fams.ordered for w in fam.warnings()]
            _report_unsupported(out, desire)
            _report_reset_failed(out)
            self._leave_as_drift(changes, only, agent=keeping is not None)
            pending = [c for c in changes if c.status == m.PENDING]
            desired = {"path": profile, "doc": doc, "sources": sources, "apply": None,
                       "stored": time.time()} if remember else None
            if out.error or not pending:
                if desired is not None and not out.error:
                    self.journal.save_desired(desired)
                if not out.error and keeping is None:
                    self._remember_resets(desire, changes)
                return out
            # Read before the first write: a state directory that refuses it
            # refuses the apply.
            desired_before = self._desired_now() if remember else None
            # Both raise before the first write, not after.
            self.journal.begin(pending, profile, aside.snapshot(self.host, aside.affected(pending)),
                               by=AGENT if keeping is not None else None)
            touched: list = []
            try:
                for fam in self.fams.ordered:
                    group = [c for c in pending if c.key.family == fam.name]
                    if not group:
                        continue
                    touched.extend(group)
                    self.fams.write(fam.name, [(c.key, c.after) for c in group])
                    _fail_if_differs(self.fams, desire, group)
                    for c in group:
                        c.status = m.APPLIED
                # A later family can undo an earlier one: verify the whole plan.
                _fail_if_differs(self.fams, desire, pending)
            except _VerifyFailed as e:
                group = [c for c in touched if c.status == m.PENDING]
                if group:  # empty when the final whole-plan check failed
                    _sort_out_group(self.fams, desire, group)
                e.change.status, e.change.note = m.FAILED, e.note
                self._roll_back(out, pending, touched, _failed(e.change))
            except Exception as e:  # noqa: BLE001 - whatever broke, the host goes back
                # touched is never empty here: a group joins it before its write.
                group = [c for c in touched if c.status == m.PENDING] or touched
                failed = _sort_out_group(self.fams, desire, group)
                failed.status, failed.note = m.FAILED, f"write refused: {e}"
                self._roll_back(out, pending, touched, _failed(failed))
            else:
                try:
                    if desired is not None:
                        desired["apply"] = self.journal.record["id"]
                        self.journal.record["desired_before"] = desired_before
                        self.journal.save_desired(desired)
                    self.journal.finish(COMMITTED)
                    if keeping is None:
                        self._remember_resets(desire, changes)
                except StateDirError as e:
                    # The host took the apply, but no journal says so: a later
                    # rollback could not undo it.
                    if desired is not None:
                        with suppress(StateDirError):
                            self.journal.save_desired(desired_before)
                    self._roll_back(out, pending, touched, f"recording the apply failed ({e})")
            return out

    def _leave_as_drift(self, changes: list, only, agent: bool) -> None:
        """Pending keys this apply must not write become drift: those `only`
        refuses, and for the resident agent (`agent`) those of families it
        never writes (Family.resident_writes: firmware configuration)."""
        for c in changes:
            if c.status != m.PENDING:
                continue
            if (only is not None and not only(c.key)) or (
                    agent and not self.fams[c.key.family].resident_writes):
                c.status = m.DRIFT

    def _remember_resets(self, desire: Desire, changes: list) -> None:
        """Record, in the state directory, the keys this apply leaves stored
        for a reset (written now, or found stored), with this boot's id:
        _fail_after_reboot fails them when a later boot still does not run
        them.  A key asked for already keeps its first record (a second
        apply must not restart the count); a key that runs is forgotten."""
        resets = self.journal.load_resets()
        now = dict(resets)
        boot = boot_id(self.host)
        for c in changes:
            name = str(c.key)
            staged = c.status == m.STAGED or c.status == m.APPLIED and self.fams[
                c.key.family].staged(c.key, desire.items[c.key].want)
            old = resets.get(name)
            if staged or c.status == m.FAILED and old:
                if not old or old.get("value") != c.after:
                    now[name] = {"value": c.after, "boot_id": boot, "asked": time.time(),
                                 "reset": staged if isinstance(staged, str) else c.note}
            elif c.status == m.OK:
                now.pop(name, None)
        if now != resets:
            try:
                self.journal.save_resets(now)
            except StateDirError as e:
                self.journal.warnings.append(str(e))

    def _desired_now(self) -> Optional[dict]:
        """The stored desired state; a damaged one is replaced, not kept."""
        try:
            return self.journal.load_desired()
        except JournalDamaged:
            return None

    def _restore_desired(self, record: dict, out: Outcome) -> None:
        """After a rollback: the desired state that apply replaced comes back,
        unless a later apply (one that wrote nothing) has replaced it since."""
        if "desired_before" not in record:
            return
        try:
            now = self._desired_now()
            if now is not None and now.get("apply") == record["id"]:
                self.journal.save_desired(record["desired_before"])
        except StateDirError as e:
            out.warnings.append(f"the desired state was not put back: {e}")

    def _refuse_unfinished(self) -> None:
        """No apply while the last one on this target has not finished or
        awaits its confirmation, in this state directory or another."""
        last = self.journal.load()
        # A damaged journal.json stood in for by its history copy: say so.
        _refuse_if_unfinished(last, "".join(f" ({w})" for w in self.journal.warnings))
        other = self.journal.other_state_dir()
        if other:
            _refuse_if_unfinished(Journal(other).load(),
                                  f" (its journal is in {other}, another state directory)")

    def _roll_back(self, out: Outcome, pending: list, touched: list, why: str) -> None:
        for c in pending:
            if c not in touched:
                c.status = m.NOT_APPLIED
        ok = restore(self.fams, touched)
        # What the changes took with them goes back after their keys.
        lost = aside.restore(self.host, self.journal.record.get("aside"))
        ok = ok and not lost
        unrecorded = self._record_end(ROLLED_BACK if ok else ROLLBACK_FAILED, ok)
        if ok:
            out.error = errors.error(errors.ROLLED_BACK,
                                     f"{why}; every change was restored{unrecorded}")
        else:
            bad = [str(c.key) for c in touched if c.status == m.REVERT_FAILED] + lost
            out.error = errors.error(errors.ROLLBACK_FAILED,
                                     f"{why}; could not restore " + "; ".join(bad)
                                     + f": a human must look{unrecorded}")

    def _record_end(self, status: str, restored: bool, record: Optional[dict] = None) -> str:
        """Record how an apply or rollback ended (of self.journal.record, or
        `record`).  Returns '', or what the reader must know when the journal
        could not take it."""
        try:
            self.journal.finish(status, record)
        except StateDirError as e:
            then = ("finds nothing left to restore and clears it" if restored
                    else "retries the restore from it")
            return (f"; but the journal could not record that ({e}) and still says "
                    f"'{self.journal.saved}': once {self.journal.dir} is writable, "
                    f"`nictune rollback` {then}")
        return ""

    def rollback(self, only: Optional[str] = None, seen: Optional[dict] = None,
                 to: Optional[str] = None, steps: Optional[int] = None) -> Outcome:
        """Undo the user's last apply (or, with `to`, that apply and every
        one after it; with `steps`, the newest `steps` applies not rolled
        back yet), newest first, each from its own journal record: an
        apply's before-values are what the apply before it left, so undoing
        them in reverse order walks the host back.  Each restore is read
        back; the first that fails stops the walk (the older before-values
        assume the newer undone).  Each record is marked rolled back as
        soon as it is restored, so a rollback --to cut off part-way is
        finished by running it again (--steps counts from where the host
        is now: it would walk past).  With the desired state: each apply undone
        puts back the one before it (journal.py desired.json).

        A plain rollback whose last apply is rolled back already restores
        nothing: when older applies are still in place, it says so and
        fails (the kind no-journal) rather than undo one nobody named: a
        retried rollback (a lost report, a second operator) must never
        walk further back than asked.

        With `only` (the confirm watchdog), just if the last apply is still
        that one and its controller has not confirmed it: the check and the
        restore happen under one lock.  `seen` is that apply's record as
        the watchdog last read it: what to restore from when the journal
        and its history copy are both unusable now.

        The resident agent's own applies (journal records "by": "agent",
        see _to_roll_back) are passed over: each put keys back to the
        values a user's apply wanted, so restoring that apply's
        before-values undoes them too.  Under the same lock the desired
        state goes back, so the agent (whose applies check it under that
        lock: apply(keeping=)) keeps the restored values, never the old."""
        with self.journal.lock():
            try:
                last = self.journal.load()
            except StateDirError as e:
                if seen is None or seen["id"] != only:
                    raise
                last = self.journal.record = seen
                self.journal.warnings.append(f"{e}; restored from the record the watchdog "
                                             "read before")
            if last is None:
                raise NoJournal(f"no apply journal in {self.journal.dir}: nothing to roll back")
            unfinished, chain = self._to_roll_back(last, fallback=only is not None)
            out = Outcome("rollback", warnings=list(self.journal.warnings),
                          extra={"journal": (chain[0] if chain else unfinished)["id"]})
            complaint = ""
            if only is not None:
                record = chain[0] if chain else None
                confirm = (record or {}).get("confirm") or {}
                if (record or {}).get("id") != only or confirm.get("state") != CONFIRM_PENDING:
                    out.warnings.append(f"apply {only} was confirmed or superseded: left alone")
                    return out
                confirm["state"] = CONFIRM_EXPIRED
                chosen = [record]
                if record["status"] == ROLLED_BACK:
                    out.warnings.append(f"apply {record['id']} was already rolled back")
                    chosen = []
            else:
                chosen, complaint = self._chosen(chain, to, steps, out)
            undo = ([unfinished] if unfinished is not None else []) + chosen
            if undo:
                out.extra["journal"] = undo[0]["id"] if not chosen else chosen[0]["id"]
                self._undo(undo, out)
            if complaint and out.error is None:
                out.error = errors.error(errors.NO_JOURNAL, complaint)
            return out

    def _chosen(self, chain: list, to: Optional[str], steps: Optional[int], out: Outcome) -> tuple:
        """(the user's applies to undo, newest first; what to fail with
        when a plain rollback restores nothing while applies remain)."""
        pending = [r for r in chain if r["status"] != ROLLED_BACK]
        if not chain and to is None and steps is None:
            return [], ""  # only the resident agent's unfinished apply to undo
        if to is not None:
            ids = [r["id"] for r in chain]
            if to not in ids:
                raise NoJournal(f"apply {to} is not in the history in {self.journal.dir}, which "
                                f"holds {_applies(chain) or 'none of your applies'} (the last "
                                f"{HISTORY_KEPT} of your applies are kept; an older one's record "
                                "is removed as a newer apply finishes): see `nictune history`")
            undo = [r for r in chain[:ids.index(to) + 1] if r["status"] != ROLLED_BACK]
            if not undo:
                out.warnings.append(f"apply {to} and every apply after it were rolled back "
                                    "already: nothing to restore")
            return undo, ""
        if steps is not None:
            if steps > len(pending):
                raise NoJournal(f"--steps {steps}: the history in {self.journal.dir} holds "
                                f"{len(pending)} apply(s) not rolled back yet"
                                + (f" ({_applies(pending)})" if pending else "")
                                + ": nothing was restored")
            return pending[:steps], ""
        newest = chain[0]
        if newest["status"] != ROLLED_BACK:
            return [newest], ""
        if not pending:
            out.warnings.append(f"apply {newest['id']} was already rolled back, and so was every "
                                "apply before it in the history: nothing to restore")
            return [], ""
        return [], (f"apply {newest['id']} was already rolled back, so nothing was restored; "
                    f"earlier applies are still in place: {_applies(pending)}. "
                    f"`nictune rollback --steps 1` undoes {pending[0]['id']}; "
                    f"`--to {pending[-1]['id']}` undoes all of them, newest first "
                    "(`nictune history` lists them)")

    def _undo(self, undo: list, out: Outcome) -> None:
        """Restore each record of `undo` in turn (keys, then what they took
        with them), marking it rolled back, until one fails."""
        self._fresh(list(dict.fromkeys(n for r in undo for n in _families_in(r))))
        # Every record is read before the first write: one that cannot be
        # is refused before anything is restored.
        for rec in undo:
            self._journalled(rec)
        bad: list = []
        unrecorded = ""
        rolled: list = []
        for n, rec in enumerate(undo):
            if n:  # the last step changed the host (links, VFs, the eswitch): read it afresh
                self._fresh(_families_in(rec))
            changes = self._journalled(rec)
            out.changes.extend(changes)
            interrupted = rec["status"] == APPLYING  # finish() overwrites it
            keys_ok = restore(self.fams, changes)
            # What the changes took with them goes back after their keys.
            lost = aside.restore(self.host, rec.get("aside"))
            done = keys_ok and not lost
            unrecorded = self._record_end(ROLLED_BACK if done else ROLLBACK_FAILED, done,
                                          rec) or unrecorded
            if interrupted:
                out.warnings.append(f"apply {rec['id']}"
                                    + (" (the resident agent's)" if is_agents(rec) else "")
                                    + " had not finished; restored what it wrote")
            if not done:
                bad += ([] if keys_ok else [f"some keys of apply {rec['id']} could not be "
                                            "restored"]) + (
                    [f"could not put back what apply {rec['id']} took with it: "
                     + "; ".join(lost)] if lost else [])
                left = [r["id"] for r in undo[n + 1:]]
                if left:
                    bad.append(f"so the older apply(s) {', '.join(left)} were not restored (their "
                               "before-values assume this one undone)")
                break
            if not is_agents(rec):
                rolled.append(rec["id"])
                self._restore_desired(rec, out)
        out.extra["rolled_back"] = rolled
        if bad:
            out.error = errors.error(errors.ROLLBACK_FAILED,
                                     "; ".join(bad) + f": a human must look{unrecorded}")
        elif unrecorded:  # the host is back; its state directory needs a look
            out.error = errors.error(errors.SYSTEM, f"every change was restored{unrecorded}")

    def _to_roll_back(self, last: dict, fallback: bool = False) -> tuple:
        """(the resident agent's unfinished apply or None, the user's applies
        in the history, newest first).  `last` is the journal's last record;
        with `fallback` (the watchdog) a history that cannot be read leaves
        just `last`.

        When the agent's is last, the agent's committed applies since the
        user's only put keys back to what the desired state (that apply's
        profile, or one that wrote nothing since) wants, so they need no
        undoing of their own; one that did not finish, or whose own
        rollback failed, left keys half-way and is undone too, first, as
        what it is (its keys to their before-values)."""
        try:
            chain = self.journal.user_records()
        except (StateDirError, JournalDamaged):
            if not fallback:
                raise
            chain = []
        if not is_agents(last):
            # journal.json is the last record as written (its copy is never
            # older, but the journal is what an apply or a human last left).
            chain = [last] + [r for r in chain if r["id"] != last["id"]]
            chain.sort(key=lambda r: r.get("started") or 0, reverse=True)
        unfinished = last if is_agents(last) and last["status"] in (APPLYING, ROLLBACK_FAILED) \
            else None
        if not chain and unfinished is None:
            raise NoJournal(f"the journal in {self.journal.dir} holds only the resident "
                            "agent's own applies, which restored the desired state: no apply "
                            "of yours to roll back")
        return unfinished, chain

    def history(self) -> Outcome:
        """The user's applies the state directory keeps, newest first
        (journal.py history/), as `nictune history` lists them."""
        chain = self.journal.user_records()
        return Outcome("history", warnings=list(self.journal.warnings),
                       extra={"history": [history_entry(r) for r in chain],
                              "kept": HISTORY_KEPT})

    def _journalled(self, record: dict) -> list:
        changes = []
        for n, c in enumerate(record["changes"], 1):
            key = Key.from_dict(c["key"])
            if key.family not in self.fams.by_name:
                raise JournalDamaged(f"apply {record['id']} in {self.journal.dir}: its change {n} "
                                     f"is of the knob family {key.family!r}, which this nictune "
                                     "does not know")
            changes.append(Change(key, c["before"], c["after"], m.APPLIED, c.get("source", "")))
        return changes

    def show(self) -> Outcome:
        self._fresh()
        doc: dict = {"nictune": 1}
        host_part: dict = {}
        for fam in self.fams.ordered:
            if fam.host_sections:
                host_part.update(fam.show(HOST))
        if host_part:
            doc["host"] = host_part
        entries: dict = {}
        facts: dict = {}
        health = self._health
        for iface in self.host.interfaces():
            entry: dict = {"match": {"name": iface.name}}
            # Link basics first: it is what a reader looks for.
            for fam in sorted(self.fams.ordered, key=lambda f: f.name != "link"):
                if fam.sections:
                    entry.update(fam.show(iface.name))
            entries[_entry_name(iface.name, entries)] = entry
            facts[iface.name] = {**{k: v for k, v in vars(iface).items() if k != "name" and v},
                                 **health.of(iface)}
            for fam in self.fams.ordered:
                if fam.sections:
                    facts[iface.name].update(fam.show_facts(iface.name))
        if entries:
            doc["interfaces"] = entries
        return Outcome("show", warnings=list(self.host.skipped_interfaces), facts=facts,
                       extra={"profile": doc})


def _applies(records: list, shown: int = 5) -> str:
    """Records as a message names them: id and profile, newest first."""
    named = [f"{r['id']} ({r.get('profile') or 'no profile file'})" for r in records[:shown]]
    return ", ".join(named) + (f" and {len(records) - shown} more" if len(records) > shown else "")


def history_entry(record: dict) -> dict:
    """What `nictune history` says of one apply: never a value (a file
    nictune did not write is a value), only which settings it changed."""
    changes = [c for c in record.get("changes") or [] if isinstance(c, dict)]
    keys = [Key.from_dict(c["key"]) for c in changes]
    shown = [f"{k.family} {k.name}" + ("" if k.target == HOST else f" on {k.target}")
             for k in keys[:3]]
    summary = (f"{len(keys)} setting(s): " + ", ".join(shown)
               + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")) if keys else "nothing"
    entry = {"id": record["id"], "started": _utc(record.get("started")),
             "finished": _utc(record.get("finished")), "status": record["status"],
             "profile": record.get("profile"), "changes": len(keys), "summary": summary,
             "targets": sorted({k.target for k in keys})}
    if record.get("aside"):
        entry["aside"] = True  # it also recorded what its changes take with them
    return entry


def _utc(when) -> Optional[str]:
    if not isinstance(when, (int, float)) or isinstance(when, bool):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def _families_in(record: dict) -> list:
    """The known families of a journal's changes (_journalled refuses the
    others, and a change it cannot read)."""
    names = [c["key"].get("family") for c in record.get("changes") or []
             if isinstance(c, dict) and isinstance(c.get("key"), dict)]
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n in knobs.CATALOG]


def _refuse_if_unfinished(record: Optional[dict], where: str) -> None:
    if record is None:
        return
    if record["status"] == APPLYING:
        # Its journal holds the only record of the values it overwrote.
        raise Interrupted(f"apply {record['id']}{where} did not finish (the agent was stopped "
                          "mid-write); run `nictune rollback` to restore what it changed, "
                          "then apply again")
    awaiting = unconfirmed(record, where)
    if awaiting:
        raise Locked(awaiting)


def _failed(change: Change) -> str:
    return f"{change.key.family} {change.key.name} on {change.key.target} failed ({change.note})"


def _sort_out_group(fams: Families, desire: Desire, group: list) -> Change:
    """After a family's write raised: which of its changes took, and which
    one to blame (the first that did not)."""
    current = fams.read([c.key for c in group])
    failed = None
    for c in group:
        if desire.items[c.key].want.satisfied_by(current[c.key]):
            c.status = m.APPLIED
        else:
            c.status = m.NOT_APPLIED
            failed = failed or c
    return failed or group[0]


class _VerifyFailed(Exception):
    def __init__(self, change: Change, note: str):
        super().__init__(note)
        self.change, self.note = change, note


def _fail_if_differs(fams: Families, desire: Desire, changes: list) -> None:
    bad = _readback(fams, desire, changes)
    if bad:
        change, actual = bad
        raise _VerifyFailed(change, f"read back {_show_value(actual)} after writing "
                                    f"{_show_value(change.after)}")


# Settings refused for one reason on one target are listed one by one up
# to SAME_REASON_LISTED, then summarised (a 1,024-VF plan on a PF without
# SR-IOV refuses 3,000 settings for one reason); at most ENTRIES_LISTED
# entries in all, then a count.
SAME_REASON_LISTED = 5
NAMES_SHOWN = 3
ENTRIES_LISTED = 20


def boot_id(host: Host) -> str:
    """This boot's id (a new one at every boot), or "" when unreadable."""
    try:
        return host.io.read_text(host.path("proc/sys/kernel/random/boot_id")).strip()[:64]
    except (OSError, UnicodeDecodeError):
        return ""


def _fail_after_reboot(changes: list, resets: dict, boot: str) -> None:
    """A key stored for a reset by an apply in an earlier boot, and still
    not running in this one: the reset it asked for did not make it run.
    Failed, never asked for again (no reboot loop)."""
    for c in changes:
        asked = resets.get(str(c.key))
        if c.status != m.STAGED or not asked or asked.get("value") != c.after:
            continue
        if not boot or asked.get("boot_id") in ("", boot):
            continue  # same boot: the reset has not happened yet
        c.status = m.FAILED
        c.note = (f"an apply stored {c.after!r} in boot {str(asked.get('boot_id'))[:8]} and "
                  "asked for its reset; the host has booted since and still does not run it ("
                  f"{c.note}). nictune does not ask for another reset: look at the device "
                  "(mstconfig -e q, dmesg) before rebooting it again")


def _report_reset_failed(out: Outcome) -> None:
    failed = [c for c in out.changes if c.status == m.FAILED]
    if failed and out.error is None:
        out.error = errors.error(
            errors.SYSTEM,
            f"{len(failed)} setting(s) stored for a reset still do not run after the host "
            "rebooted, so nothing was written: "
            + "; ".join(f"{c.key.target} {c.key.family} {c.key.name}" for c in failed[:ENTRIES_LISTED]))


def _report_unsupported(out: Outcome, desire: Desire) -> None:
    skipped = [c for c in out.changes if c.status == m.SKIPPED and desire.policy[c.key] == "warn"]
    for target, family, names, note, _source in _by_reason(skipped):
        out.warnings.append(f"skipped {family} {names} on {target}: {note}")
    refused = [c for c in out.changes if c.status == m.UNSUPPORTED]
    if refused:
        entries = [f"{target} {family} {names}: {note}" + (f" ({source})" if source else "")
                   for target, family, names, note, source in _by_reason(refused)]
        if len(entries) > ENTRIES_LISTED:
            entries = entries[:ENTRIES_LISTED] + [f"and {len(entries) - ENTRIES_LISTED} more"]
        out.error = errors.error(
            errors.UNSUPPORTED,
            f"{len(refused)} setting(s) cannot be applied on this host, so nothing was written: "
            f"{'; '.join(entries)}. Set on_unsupported: warn or skip to apply the rest.")


def _by_reason(changes: list) -> list:
    """(target, family, names, note, source) per change, in order; a change
    whose target, family and note more than SAME_REASON_LISTED others share
    is one entry for all of them, at the first one's place, naming the
    first few keys and how many more, with the first one's source."""
    groups: dict = {}
    for c in changes:
        groups.setdefault((c.key.target, c.key.family, c.note), []).append(c)
    out = []
    for c in changes:
        group = groups[(c.key.target, c.key.family, c.note)]
        if len(group) <= SAME_REASON_LISTED:
            out.append((c.key.target, c.key.family, c.key.name, c.note, c.source))
        elif c is group[0]:
            names = ", ".join(g.key.name for g in group[:NAMES_SHOWN])
            out.append((c.key.target, c.key.family,
                        f"{names} and {len(group) - NAMES_SHOWN} more", c.note, c.source))
    return out


def _entry_name(ifname: str, taken: dict) -> str:
    name = re.sub(r"[^a-z0-9_-]", "-", ifname.lower())
    if not name[:1].isalpha():
        name = "if-" + name
    name = name[:32]
    base, n = name, 2
    while name in taken:
        name = f"{base[:29]}-{n}"
        n += 1
    return name
