"""Open vSwitch hardware offload: other_config:hw-offload and tc-policy.

host.ovs sets two keys of the root Open_vSwitch row's other_config map,
through OVSDB itself (nictune.host.transports.ovsdb: RFC 7047 over the unix socket
ovsdb-server listens on; host.ovs.db names another one than
/var/run/openvswitch/db.sock, as a build with another rundir has).  No
ovs-vsctl: values never pass through argv or a shell.

Only these keys.  A write deletes and inserts just these map entries (two
mutations in one transaction), so every other key of other_config (dpdk-*,
vlan-limit, an operator's own) is left as it is, byte for byte.  The same
transaction starts with a wait that compares the whole map with the one
read just before: when anything in it changed in between, the transaction
does nothing and the write is tried again on a fresh read.  And the keys
nictune writes must still hold what this command read at its start (the
plan's "before"; in a rollback, what the rollback read): a value someone
else set since is not overwritten, the write is refused and the engine
restores what it did.  Keys that were absent stay absent on revert: the
before-value None deletes the entry.

Values.  hw-offload reads as true / false when the map says "true" /
"false", as the text otherwise (OVS takes only "true" as on), and as null
when absent; tc-policy reads as its text or null.  Revert writes the same
text back.

Only where OVS runs.  Without a server on the socket (no socket, or one
nobody listens on) both keys read as unsupported, so on_unsupported
decides whether a profile shared with hosts without OVS fails there.

When it takes effect (ovs-vswitchd, lib/netdev-offload.c
netdev_set_flow_api_enabled): a running ovs-vswitchd turns the flow API on
as soon as hw-offload becomes true, once, and reads tc-policy then; turning
it off, or changing tc-policy once it is on, waits for ovs-vswitchd to
restart.  nictune never restarts it: the plan says so, per key.
"""

from __future__ import annotations

import errno
from typing import Optional

from nictune.host.facts import nicclass

from nictune.host.transports import ovsdb
from nictune.host.knobs.base import Family
from nictune.host.model import HOST, Desired, Key, Unsupported, Want
from nictune.host.validate import ABS_PATH, NOT_NORMALISED, check_path

HW_OFFLOAD = "hw_offload"
TC_POLICY = "tc_policy"
# profile name -> other_config key
OVS_KEYS = {HW_OFFLOAD: "hw-offload", TC_POLICY: "tc-policy"}
TC_POLICIES = ("none", "skip_sw", "skip_hw")
RETRIES = 5  # transactions tried when other keys of other_config keep changing

# What OVS hardware offload needs of the NIC, where the driver takes it
# (drivers/net/ethernet/mellanox/mlx5/core/en_tc.c: TC flower offload of
# the uplink and VF representors exists only in switchdev mode; legacy mode
# offloads no eswitch flows).  Drivers without it: nicclass why_not.
OFFLOAD_NEEDS = {
    nicclass.MLX5.driver: "needs the eswitch in switchdev mode (devlink dev eswitch set ... mode "
                          "switchdev) and hw-tc-offload on the PF and its representors",
}

RESTART = "nictune does not restart ovs-vswitchd"


def key_name(setting: str, db: str) -> str:
    """The key's name: the setting, and the socket when it is not the
    default one (a rollback has no profile to find it in).  Socket paths
    never hold '@' (validate.ABS_PATH)."""
    return setting if db == ovsdb.DEFAULT_DB_SOCKET else f"{setting}@{db}"


def parse_key(name: str) -> tuple:
    setting, _, db = name.partition("@")
    return setting, db or ovsdb.DEFAULT_DB_SOCKET


def from_ovs(setting: str, text: Optional[str]):
    if text is None:
        return None
    if setting == HW_OFFLOAD and text in ("true", "false"):
        return text == "true"
    return text


def to_ovs(setting: str, value) -> Optional[str]:
    """What other_config holds for `value`: None removes the entry."""
    if value is None or isinstance(value, str):
        return value  # a tc-policy, or text read from OVS written back as it was
    if isinstance(value, bool) and setting == HW_OFFLOAD:
        return "true" if value else "false"
    raise ValueError(f"{setting}: {value!r} is not a value OVS takes")


class Unreachable(Exception):
    """No OVSDB server answers on the socket."""


class OvsFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
host:
  ovs:
    hw_offload: true
    tc_policy: skip_sw
    db: /var/run/openvswitch/db.sock
"""
    name = "ovs"
    position = 95
    position_note = ("after every device setting (the eswitch in switchdev mode, VFs, hw-tc-offload "
                     "on the PF and its representors): a running ovs-vswitchd starts offloading "
                     "flows as soon as hw-offload turns on, onto ports that must take TC flower "
                     "rules by then; a rollback turns it off first. Before link, which is last")
    # OVSDB is a unix socket of its own, which a snapshot does not record.
    offline_plan = "OVSDB is not recorded in a snapshot"
    host_sections = ("ovs",)
    settings = ("ovs.hw_offload", "ovs.tc_policy", "ovs.db")

    @classmethod
    def schema(cls, s):
        db = {**s.text(ABS_PATH, 256, "The OVSDB server's unix socket (default "
                                      f"{ovsdb.DEFAULT_DB_SOCKET})."),
              "not": {"pattern": NOT_NORMALISED}}
        return {"host": {"ovs": s.section(
            "Open vSwitch hardware offload, in the Open_vSwitch table's other_config, through "
            "OVSDB; only where OVS runs.",
            {HW_OFFLOAD: {"type": "boolean",
                          "description": "other_config:hw-offload. Turning it off takes effect "
                                         "when ovs-vswitchd restarts, which nictune does not do."},
             TC_POLICY: {"enum": list(TC_POLICIES),
                         "description": "other_config:tc-policy: none (software and hardware "
                                        "rules), skip_sw (hardware only), skip_hw (software only)."
                                        " Read when offload turns on; a later change waits for an "
                                        "ovs-vswitchd restart."},
             "db": db})}}

    @classmethod
    def nic_support(cls, driver, setting):
        if setting == "ovs.db":
            return None
        nic = nicclass.for_driver(driver)
        if nic is None:
            return None
        if "ovs_offload" in nic.why_not:
            return f"not supported by {driver}: " + nic.why_not["ovs_offload"]
        return OFFLOAD_NEEDS.get(driver)

    @classmethod
    def label(cls, target, name):
        setting, db = parse_key(name)
        return setting if db == ovsdb.DEFAULT_DB_SOCKET else f"{setting} (OVSDB {db})"

    def __init__(self, host):
        super().__init__(host)
        self._wants: dict = {}  # key -> wanted value, from expand
        self._seen: dict = {}   # socket -> other_config as this command's last read saw it

    # -- profile -> keys -------------------------------------------------------------
    def expand(self, target, sections, source):
        section = sections.get("ovs")
        if not section:
            return []
        where = source("ovs", "db")
        db = check_path(section.get("db", ovsdb.DEFAULT_DB_SOCKET),
                        "host.ovs.db" + (f" ({where})" if where else ""))
        out = []
        for setting in (HW_OFFLOAD, TC_POLICY):
            if setting in section:
                key = Key(self.name, HOST, key_name(setting, db))
                self._wants[key] = section[setting]
                out.append(Desired(key, Want(section[setting]), source("ovs", setting)))
        return out

    # -- host -> values ----------------------------------------------------------------
    def _socket(self, db: str) -> str:
        return self.host.path(db.lstrip("/"))

    def _connect(self, db: str) -> ovsdb.Client:
        try:
            return ovsdb.Client(self._socket(db), io=self.host.io)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
                why = "no such socket" if e.errno == errno.ENOENT else (
                    "nothing listens on it" if e.errno == errno.ECONNREFUSED else "not a socket")
                raise Unreachable(f"OVS is not running here (no OVSDB server at {db}: {why}); "
                                  "set host.ovs.db where it listens elsewhere") from None
            raise Unreachable(f"cannot reach OVSDB at {db}: {e.strerror or e}") from None

    def _other_config(self, db: str) -> tuple:
        with self._connect(db) as client:
            uuid, config = client.root_other_config()
        self._seen[db] = config
        return uuid, config

    def read(self, keys):
        out: dict = {}
        by_db: dict = {}
        for key in keys:
            by_db.setdefault(parse_key(key.name)[1], []).append(key)
        for db, mine in by_db.items():
            try:
                _, config = self._other_config(db)
            except Unreachable as e:
                out.update({k: Unsupported(str(e)) for k in mine})
                continue
            except (OSError, ovsdb.OvsdbError) as e:
                why = f"cannot read OVSDB at {db}: {getattr(e, 'strerror', None) or e}"
                out.update({k: Unsupported(why) for k in mine})
                continue
            for key in mine:
                setting = parse_key(key.name)[0]
                out[key] = from_ovs(setting, config.get(OVS_KEYS[setting]))
        return out

    def note(self, key: Key) -> str:
        setting, db = parse_key(key.name)
        seen = self._seen.get(db)
        if seen is None:
            return ""
        offload_on = seen.get("hw-offload") == "true"
        if setting == HW_OFFLOAD:
            want = self._wants.get(key)
            if offload_on and want is not True:
                return (f"offload stays on in a running ovs-vswitchd until it restarts ({RESTART}); "
                        "a rollback to on needs no restart")
            if want is True:
                return ("a running ovs-vswitchd turns offload on at once and cannot turn it off "
                        f"again without a restart ({RESTART}): a rollback takes effect only then")
            return ""
        if offload_on:
            return (f"offload is already on: ovs-vswitchd reads tc-policy only when it turns "
                    f"offload on, so this takes effect when ovs-vswitchd restarts ({RESTART})")
        return "read by ovs-vswitchd when it turns offload on"

    # -- values -> host ----------------------------------------------------------------
    def apply(self, items):
        by_db: dict = {}
        for key, value in items:
            setting, db = parse_key(key.name)
            by_db.setdefault(db, {})[OVS_KEYS[setting]] = to_ovs(setting, value)
        for db, changes in by_db.items():
            self._write(db, changes)

    def _write(self, db: str, changes: dict) -> None:
        expected = self._seen.get(db)
        try:
            with self._connect(db) as client:
                for _ in range(RETRIES):
                    uuid, config = client.root_other_config()
                    if expected is not None:
                        moved = {k: config.get(k) for k in changes if config.get(k) != expected.get(k)}
                        if moved:
                            shown = ", ".join(f"{k} was {expected.get(k)!r}, is now {v!r}"
                                              for k, v in sorted(moved.items()))
                            raise ValueError(f"OVSDB {db}: other_config changed since nictune read "
                                             f"it ({shown}): not overwritten")
                    try:
                        client.set_other_config(uuid, config, changes, "nictune: " + ", ".join(
                            f"{k}={v}" if v is not None else f"remove {k}"
                            for k, v in sorted(changes.items())))
                        return
                    except ovsdb.Conflict:
                        continue  # another key of other_config moved: read again
                raise ValueError(f"OVSDB {db}: other_config kept changing under {RETRIES} writes")
        except Unreachable as e:
            raise ValueError(str(e)) from None
        except ovsdb.OvsdbError as e:
            raise ValueError(f"OVSDB {db}: {e}") from None

    # -- host -> profile -----------------------------------------------------------------
    def show(self, target):
        if target != HOST or not self.host.io.exists(self._socket(ovsdb.DEFAULT_DB_SOCKET)):
            return {}
        keys = [Key(self.name, HOST, s) for s in (HW_OFFLOAD, TC_POLICY)]
        values = self.read(keys)
        shown = {}
        if isinstance(values[keys[0]], bool):
            shown[HW_OFFLOAD] = values[keys[0]]
        if values[keys[1]] in TC_POLICIES:
            shown[TC_POLICY] = values[keys[1]]
        return {"ovs": shown} if shown else {}
