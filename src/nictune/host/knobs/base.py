"""The one abstraction for a setting: a knob family.

A family is one module that says everything about one kind of setting:

- what it is: `name` (Key.family, and the word plans show), `position`
  (where it is written in an apply), the profile `sections` and
  `host_sections` it owns, its `settings` (the profile paths of the values
  it takes, relative to an interface entry or to `host:`), and `schema()`,
  the JSON Schema of those sections;
- what each NIC class can take of it: `nic_support()`, drawn from the
  drivers' sources (nicclass.py);
- how to handle it on a host, in phases the engine runs in this order:

    expand  profile section -> [Desired]          once per entry and target
    read    [Key] -> {Key: value | Unsupported}   one batch per family
    check   why the device cannot take a value    after read, never writes
    staged  stored as wanted, not running yet     after read, never writes
    note    what a reviewer should know           after read, never writes
    apply   [(Key, value)] -> the host            only in apply
    revert  [(Key, before)] -> the host           only in rollback/restore
    show    target -> profile sections            only in show

Diff, verify, journal and rollback are written once, in the engine, over
what families return.  Adding a family that needs no new kernel message is
this module's subclass, its tests, and one line in knobs/__init__.py's
REGISTRY (then `python -m nictune.profile.catalog` derives the rest), with
its `example` for the reference in the class itself.

State.  The engine makes new family instances for every command, so a
family may keep what one phase learns (device limits from read, a resolved
value or the wanted whole vector from expand) in instance attributes for
the later phases of the same command; it never carries anything from one
command to the next.  A read replaces what an earlier read of the same
command left: apply reads again after writing.

What each phase may raise:
- expand: InvalidInput for a value that must not reach the system (the
  whole command is refused: the request is at fault, not the host).
  Something this host cannot resolve is not an error here: make read()
  answer Unsupported(reason) for that key, so on_unsupported decides.
- read: OSError (NetlinkError is one), ValueError (kernel text that does
  not parse) or a NictuneError: the engine then reads every key of the
  family as Unsupported("cannot read <family>: ...") and goes on with the
  others.  InvalidInput still refuses the whole command.
- check, note, nic_support: nothing; they answer from what read saw.
- apply, revert: OSError, ValueError or NictuneError for a refusal.  The
  engine then restores every key it touched; success is decided by reading
  back, never by apply returning.
- show: like read.
"""

from __future__ import annotations

from nictune.host.transports.io import W_OK
from nictune.host.model import Desired, Key, Want

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs every agent run, and
    # the controller imports the families for their schemas alone
    from typing import Any, Callable, ClassVar, Dict, Optional, Tuple

    from nictune.host.machine import Host

    # source(path...) -> "file:line" of that profile key, for reviews.
    SourceOf = Callable[..., str]


class Family:
    name: ClassVar[str] = ""
    # Apply order, low first; a rollback walks it backwards.  position_note
    # says why the family sits there (docs/reference/profile.md lists them).
    position: ClassVar[int] = 0
    position_note: ClassVar[str] = ""
    sections: ClassVar[Tuple[str, ...]] = ()       # keys of an interfaces entry this family owns
    host_sections: ClassVar[Tuple[str, ...]] = ()  # keys of the host: section this family owns
    # Families whose keys this one's expand asks for as defaults (model.Default):
    # loaded with it (knobs.families_for), or they could not be read or written.
    defaults_for: ClassVar[Tuple[str, ...]] = ()
    # Profile paths of the values this family takes, dotted, relative to an
    # entry or to host: ("rings.rx", "roce.ets.tc_bw").  A path that names
    # a mapping of free-form keys (features, sysctl) stands for all of them.
    settings: ClassVar[Tuple[str, ...]] = ()
    read_only: ClassVar[bool] = False  # facts to check (expect:), never written
    # The state directory of the command (set by the engine): for what a
    # family must remember across commands (knobs/macsec.py: PN marks).
    state_dir: Optional[str] = None
    # The status an unmet key of a read-only family gets: drift, or a word
    # of its own (switch: "switch-mismatch", a disagreement no write fixes).
    unmet_status: ClassVar[str] = "drift"
    # False: the resident agent reports this family's drift but never writes
    # it (firmware configuration: a write there asks for a reset).
    resident_writes: ClassVar[bool] = True
    # None when a plan from a recorded `show` (host/replay/snapshot.py) is the live
    # plan; else why it is not.  tests/netns/test_offline_plans.py reads it
    # and fails when a family said to plan offline does not, or the reverse.
    offline_plan: ClassVar[Optional[str]] = None
    # The body of a profile (without `nictune: 1`) that shows this family's
    # settings: docs/reference/profile.md prints it under the family, and
    # tests/unit/test_profile_reference.py validates it against the schema.
    example: ClassVar[str] = ""
    # True for a family whose values the kernel resets when a link comes
    # back up or is made again (IRQ placement: drivers request their
    # interrupts again): the resident agent writes its keys of that link
    # again then, whatever on_drift says (resident/daemon.py).
    reassert_on_link_up: ClassVar[bool] = False

    def __init__(self, host: Host):
        self.host = host
        # Set by the engine before host: sections expand: the interfaces
        # the profile's entries matched on this host, entries with a roce:
        # section first ({"roce": [...], "all": [...]}); None when the
        # profile has no interface entries.
        self.profile_interfaces: Optional[Dict[str, list]] = None
        # Set by the engine once the whole profile has expanded: every key
        # the profile wants on this host, of every family (Key -> Desired),
        # for a check that depends on what another family will have written
        # by then (sriov: the eswitch mode the VFs' PF is going to).
        self.wanted: dict = {}

    # -- what the family is (no host needed) ---------------------------------
    @classmethod
    def schema(cls, s: Any) -> Dict[str, Dict[str, dict]]:
        """{"entry": {section: node}, "host": {section: node}}: the JSON Schema
        of the sections this family owns, built with `s`, the schema kit of
        profile/schema.py (so that the host side never imports it).  Two
        families may share a section that is a mapping (dcb and roce share
        roce:); their properties are merged."""
        return {}

    @classmethod
    def nic_support(cls, driver: str, setting: str) -> Optional[str]:
        """What the NIC class with this driver makes of `setting` (a path of
        `settings`): None when it takes it as the kernel documents (or the
        kernel decides), else a short note, a limit ("up to 9000") or "not
        supported by <driver>: why".  The profile reference is built from
        it, from the same tables (nicclass.py) that check() and read() use."""
        return None

    @classmethod
    def label(cls, target: str, name: str) -> str:
        """How plans name the key (target, name): as the profile spells it."""
        return name

    @classmethod
    def shown(cls, value: Any) -> Any:
        """`value` as a report carries it: itself, unless it is something
        that stays on the host (knobs/nccl.py: the text of a file nictune
        did not write), for which a placeholder says what it is."""
        return value

    # -- profile -> keys -------------------------------------------------------
    def expand(self, target: str, sections: dict, source: SourceOf) -> list:
        """Default: each owned section is a mapping of setting name -> value."""
        out = []
        for section, values in sections.items():
            for name, raw in values.items():
                out.append(Desired(Key(self.name, target, self.key_name(name)),
                                   Want.parse(raw), source(section, name)))
        return out

    def key_name(self, name: str) -> str:
        return name

    def driver_of(self, ifname: str) -> Optional[str]:
        """The driver of interface `ifname` (ethtool -i), or None."""
        return next((i.driver for i in self.host.interfaces() if i.name == ifname), None)

    # -- host -> values ----------------------------------------------------------
    def read(self, keys: list) -> dict:
        """Current value (or Unsupported) of every key, in one batch."""
        raise NotImplementedError

    def met(self, key: Key, want: Want, current) -> bool:
        """Whether `current` is as wanted.  Families whose values are not
        compared plainly override this (a firmware expectation such as
        ">=28.39" is not an equality)."""
        return want.satisfied_by(current)

    def staged(self, key: Key, want: Want) -> str:
        """For a key whose stored value is as wanted (met() said so): why it
        is not running yet, naming the reset that makes it run ("a reboot",
        "devlink dev reload ... action fw_activate"), or "" when it runs.
        Asked after read; never writes.  Only families of non-volatile
        settings (knobs/firmware.py) have keys that are stored but not
        running: the engine reports them as model.STAGED, never writes them
        again, and fails them once a reboot has not made them run."""
        return ""

    def check(self, key: Key, want: Want) -> Optional[str]:
        """Why the device cannot take `want`, from limits seen by read();
        a model.Withheld when only the profile's leave is missing (the host
        differs, and a read-only check reports it as drift)."""
        return None

    def note(self, key: Key) -> str:
        """Something a reviewer should know about this key, shown in plans."""
        return ""

    def checked_only(self, key: Key) -> bool:
        """Whether this key is only compared, never written (as every key of
        a read_only family): a difference is drift.  Asked after read."""
        return self.read_only

    def warnings(self) -> list:
        """Plan-wide warnings this family raises after expand and read (a
        static MACsec key), shown above the plan and in --json."""
        return []

    def disruptive(self, key: Key, before: Any, after: Any) -> str:
        """Why changing `key` from `before` to `after` interrupts traffic
        (the driver drops the link, re-creates its queues or detaches the
        port), citing the driver function; "" when it does not.  Plans
        mark such a change for the reviewer, and --json carries it.  Asked
        after read, for keys that would change; never writes."""
        return ""

    # -- values -> host ----------------------------------------------------------
    def apply(self, items: list) -> None:
        """Write [(key, value)]."""
        raise NotImplementedError

    def revert(self, items: list) -> None:
        """Restore [(key, before)], in the order given.  Families with coupled
        settings override this; plain ones just write the old values."""
        self.apply(items)

    def kept(self, key: Key, before: Any) -> str:
        """Why a rollback leaves `key` as it is instead of writing `before`
        back (the driver keeps the value by itself, and would refuse or undo
        the write: nicclass rules), or "".  Asked in a rollback, before its
        writes; such a key is reported as kept, not as revert-failed."""
        return ""

    # -- host -> profile (nictune show) ------------------------------------------
    def show(self, target: str) -> dict:
        """Current values of this family on `target`, as profile sections."""
        return {}

    def show_facts(self, target: str) -> dict:
        """Facts `show` reports beside the profile for `target`, after
        show(target): what a profile cannot say (firmware: the running
        value next to the stored one)."""
        return {}

    # -- what a snapshot holds (host/replay/snapshot.py) ----------------------------------
    @classmethod
    def plan_reads(cls, host: Host) -> None:
        """Read, through host, what a later plan of this family may read
        that `show` does not (capabilities, limits, files a profile may
        name): a snapshot records every read a show and these make, and an
        offline plan can use nothing else.  Each read goes through the same
        function the family calls, so that the recorded call is the one a
        plan makes; failures are the family's to expect, and are recorded."""


def read_quietly(host: Host, path: str) -> None:
    """Read a file for plan_reads(), whatever the answer."""
    try:
        host.io.read_text(path)
    except (OSError, UnicodeDecodeError):
        pass


# A tree this large is not a host's: stop walking.
MAX_WALK_FILES = 50_000


def read_tree(host: Host, top: str) -> int:
    """For plan_reads(): every file under top read, and whether it is writable."""
    io, count, stack = host.io, 0, [top]
    while stack and count < MAX_WALK_FILES:
        here = stack.pop()
        try:
            names = sorted(io.listdir(here))
        except OSError:
            continue
        for name in names:
            path = here + "/" + name
            if io.isdir(path):
                stack.append(path)
                continue
            count += 1
            io.access(path, W_OK)
            io.isfile(path)
            read_quietly(host, path)
    return count


def quietly(read) -> None:
    """read(), an OSError (EOPNOTSUPP...) being an answer recorded as such."""
    try:
        read()
    except OSError:
        pass


def group_by_target(items: list) -> dict:
    grouped: dict = {}
    for key, value in items:
        grouped.setdefault(key.target, {})[key.name] = value
    return grouped
