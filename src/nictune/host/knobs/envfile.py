"""Files nictune owns whole, one family each: NCCL's nccl.conf (nccl.py),
UCX's ucx.conf (ucx.py), Open MPI's openmpi-mca-params.conf (mpi.py),
the profile.d file that exports NVSHMEM's variables (nvshmem.py), and the
outputs that carry settings to jobs (jobenv.py: a Slurm TaskProlog,
enroot's environ.d and mounts.d files, and nictune's own block of
/etc/environment, the one family that owns lines rather than a file).

Each is a list of NAME -> VALUE settings in the syntax of its reader (a
Syntax: how nictune renders the file, and how the program that reads it
parses it).  A family renders the profile's settings into the whole file,
writes it atomically (files.py), and compares variables, never text:
order, comments, blank lines and nictune's header line are not content,
so a file someone else wrote with the same variables, or nictune's own
file with its lines reordered, is as wanted and left as it is.

Which file.  host.<section>.path is the family's own conventional path
(default_path), or a path below a directory the profile lists in
allowed_dirs; never in /proc, /sys, /dev or /run, and never where a shell,
the dynamic loader, cron, sudo, PAM, systemd and the like read (validate.py
READERS; a family's own path may be there: NVSHMEM's profile.d file), nor
below a whole system tree listed as an allowed directory (BROAD_DIRS).  An
inventory or a play's vars set none of path, allowed_dirs and adopt
(profile/loader.py FILE_POLICY, which must name each section): only a
profile decides which files are written where.  On the host it must be a
regular file of at most 1 MiB, or absent, and the same rules hold for its
path with symlinks resolved (files.py, _check_directory).  In a network
namespace (the request names it), a path under /etc is the namespace's
own /etc/netns/NAME/... file, which `ip netns exec` binds over /etc/...
only when it exists: nictune reads and writes that file, creates it when
absent (only directly in /etc/netns/NAME: a subdirectory there would
hide the host's whole directory), and says so in the plan; writing
/etc/... there would write the host's file.  Creating it hides the
host's /etc/... from the namespace's programs, so when that is a file
nictune did not write, it takes adopt: true, as replacing it would.

Whose file.  A file nictune writes starts with its family's header
(header_of: "# Managed by nictune (nccl): ..."); an absent or empty file
is free to take.  A file headed by another family is that family's: no
family replaces it, adopt or not (two families never share a file).
Files written before headers named their family start with LEGACY_HEADER:
such a file is this family's own only at the family's conventional path
and only when every line is a setting this family could have written
(its names and values pass the syntax's patterns); anywhere else, or
with anything else in it, it is someone else's file.  Any other file is
someone else's: a report carries a placeholder for its text unless the
request asks for it (shown(), on the host, so the text never travels),
and nictune replaces it only when the profile says adopt: true in the
file that names the path.  Someone else's file that sets the same
variables is as wanted, and left alone.  One that differs is drift to
verify, audit and the resident agent (check() answers a model.Withheld:
the host differs, only the leave to replace it is missing), with a note
naming the profile's variables and the adopt: true an apply needs; plan
and apply refuse it, as unsupported.

What a plan shows of a rewrite.  The note names the variables that change.
Of nictune's own file it gives each name with its old and new value (its
text is in the report anyway).  Of someone else's file, whose names and
values are its content, it gives only the profile's side (the variables
the new file sets) and how many variables the file has now: which of them
differ, and how, stays on the host; --show-file-content sends the file's
text and so shows it all.

`nictune show` prints the variables of each file at its default path as a
profile section (it runs on the host itself, so nothing leaves it), values
that are canonical integers as integers, and leaves out a variable a
profile cannot hold (then verify reports the file as drift, truthfully).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Any, ClassVar, Dict, Optional, Tuple

from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.files import UnsafeFile, read_owned, remove_owned, remove_stale_temps, write_owned
from nictune.host.knobs.base import Family
from nictune.host.model import HOST, Desired, Key, Unsupported, Want, Withheld
from nictune.host.validate import (KERNEL_DIRS, NOT_NORMALISED, OWNED_DIR, OWNED_PATH, check,
                                   check_owned_dir, check_owned_path, check_path, matches,
                                   reader_of, within)

# What nictune wrote before each file named its family (see "Whose file").
LEGACY_HEADER = "# Managed by nictune: edit the profile, not this file.\n"
# A file the kernel executes (a Slurm TaskProlog) starts with its "#!" line,
# then the header.
SHEBANG = "#!/bin/sh\n"
_HEADER = re.compile(r"(?:#!/bin/sh\n)?"
                     r"# Managed by nictune(?: \(([a-z_]{1,24})\))?: edit the profile, not this file\.\n")
AUTO = "auto"


def header_of(family: str) -> str:
    """The first line of every file the family writes."""
    return f"# Managed by nictune ({family}): edit the profile, not this file.\n"


def writer_of(text: str) -> Optional[str]:
    """The family whose header the text starts with, "" for the legacy
    header, None when nictune did not write it."""
    match = _HEADER.match(text)
    return None if match is None else (match.group(1) or "")


def nictune_wrote(text: str) -> bool:
    """Whether the file's text is nictune's to show: a header of nictune's
    (every text nictune writes starts with one), or nothing at all.  Which
    family may replace it is OwnedFileFamily._ours."""
    return text == "" or writer_of(text) is not None


def placeholder(text: str) -> str:
    return f"<file not written by nictune: {len(text.encode())} bytes>"


class Foreign(str):
    """The text of a file nictune did not write.  It is the text (the
    journal keeps it whole, for rollback); wherever it could be shown it
    is a placeholder: in reports through OwnedFileFamily.shown(), in notes
    ("read back ...", "still ...") through repr()."""

    def __repr__(self) -> str:
        return placeholder(self)


def value_text(value: Any) -> str:
    """A profile value as every reader here takes it: true and false as 1
    and 0 (NCCL's and NVSHMEM's integer parsers, UCX's and Open MPI's
    booleans all read 1 and 0), numbers in decimal."""
    if isinstance(value, bool):
        return str(int(value))
    return str(value)


def shown_value(text: str) -> Any:
    """A value read from a file as `nictune show` prints it: a canonical
    decimal integer as an integer (renders back to the same text)."""
    try:
        number = int(text)
    except ValueError:
        return text
    return number if str(number) == text else text


class Syntax:
    """One file format: the names and values it takes, how nictune writes
    a setting, and how the program that reads the file parses it."""

    what: str = "variable"      # "NCCL variable", for error messages
    family: str = ""            # whose header render() writes
    preamble: str = ""          # what comes before the header (SHEBANG)
    name_pattern: str = ""
    value_pattern: str = ""

    def line(self, name: str, text: str) -> str:
        raise NotImplementedError

    def parse(self, text: str) -> Dict[str, str]:
        """{name: value} as the reader ends up with them."""
        raise NotImplementedError

    @property
    def header(self) -> str:
        return header_of(self.family)

    def render(self, env: dict) -> str:
        lines = [self.preamble, self.header]
        for name, value in env.items():
            check(self.name_pattern, name, f"{self.what} name")
            text = check(self.value_pattern, value_text(value), f"value of {name}")
            lines.append(self.line(name, text))
        return "".join(lines)

    def showable(self, env: dict) -> dict:
        """What of `env` a profile can hold, as show prints it."""
        return {n: shown_value(v) for n, v in env.items()
                if matches(self.name_pattern, n) and matches(self.value_pattern, v)}

    def only_settings(self, text: str) -> bool:
        """Whether every setting its reader takes from `text` is one this
        syntax could have written (names and values pass its patterns)."""
        env = self.parse(text)
        return len(self.showable(env)) == len(env)


def auto_schema(devices: str, what: str, form: str, value_pattern: str, max_length: int,
                gid_index: str, lowest: int, gid_note: str = "") -> Dict[str, Any]:
    """Schema nodes (built with the kit `s` later) of a device list and a
    GID index that take `auto`, resolved on the host (nccl.auto_values)."""
    return {
        devices: lambda s: {
            "anyOf": [{"const": AUTO}, s.text(value_pattern, max_length)],
            "description": f"{what}; auto: {form} of the RoCE ports under the interfaces the "
                           "profile's roce: entries matched (else every matched interface), "
                           "resolved on the host.",
        },
        gid_index: lambda s: {
            "anyOf": [{"const": AUTO}, s.integer(lowest, 255)],
            "description": "GID index; auto: the index NCCL itself would select (RoCE v2, "
                           "NCCL_IB_ADDR_FAMILY, default IPv4, within NCCL_IB_ADDR_RANGE) on "
                           f"those ports, resolved on every plan and verify{gid_note}. With NCCL "
                           "2.21 or later leave NCCL_IB_GID_INDEX unset: NCCL selects the GID "
                           "itself and nothing can go stale.",
        },
    }


@dataclass
class _Policy:
    """What the profile lets nictune do with its file, from expand()."""

    dirs: tuple           # directories the profile lets the file be below (allowed_dirs)
    adopt: bool           # replace a file nictune did not write
    not_adopted: str = ""  # why an adopt: true of the profile does not cover this path


@dataclass
class _Place:
    """Where a key's file is on this host."""

    file: str       # the path to open, under Host.root
    shown: str      # that path as reports name it
    netns: str      # the namespace whose own file it is, or ""
    creatable: bool  # its directory may be created (/etc/netns/NAME)


def _file_of(where: str) -> str:
    return where.rpartition(":")[0] if ":" in where else where


def _listed(names: list, limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class OwnedFileFamily(Family):
    """A file nictune owns whole (see the module docstring); a subclass
    names its section, its default path and its Syntax."""

    position = 12
    position_note = "with the sysctls, before any device setting: a file cannot cut the management path"
    section: ClassVar[str] = ""
    values_key: ClassVar[str] = "env"  # the section's mapping of settings
    default_path: ClassVar[str] = ""
    syntax: ClassVar[Syntax] = Syntax()
    title: ClassVar[str] = ""          # "The NCCL configuration file."
    values_description: ClassVar[str] = ""
    auto_properties: ClassVar[Dict[str, dict]] = {}  # schema of the names that take `auto`
    max_value_length: ClassVar[int] = 900
    new_file_mode: ClassVar[int] = 0o644  # a file apply creates (an existing one keeps its own)

    def __init__(self, host):
        super().__init__(host)
        self._notes: dict = {}
        self._unresolved: dict = {}  # key -> why its `auto` values have no answer here
        self._policy: dict = {}      # key -> _Policy (none in rollback and show: no profile)
        self._foreign: set = set()   # keys whose file is not this family's, from read()
        self._others: dict = {}      # key -> the other family whose header its file has
        self._legacy: set = set()    # keys whose file has the legacy header but is not ours
        self._created: dict = {}     # key -> what the note says of a file apply would create
        self._text: dict = {}        # key -> the text read(), for the note's variable diff
        self._wanted: dict = {}      # key -> the text expand() rendered
        # Keys whose namespace file, once created, would hide a host file
        # nictune did not write (ip netns exec binds it over that file).
        self._hides: dict = {}       # key -> the host file's path

    # -- what the family is ----------------------------------------------------
    @classmethod
    def schema(cls, s):
        syntax = cls.syntax
        values = s.mapping(cls.values_description, s.text(syntax.name_pattern, 128),
                           {"anyOf": [s.text(syntax.value_pattern, cls.max_value_length),
                                      {"type": "integer"}, {"type": "boolean"}]},
                           128)
        if cls.auto_properties:
            values["properties"] = {name: node(s) if callable(node) else node
                                    for name, node in cls.auto_properties.items()}
        path = {**s.text(OWNED_PATH, 256, f"Where to write it: {cls.default_path} (the default), "
                                          "or a path below a directory of allowed_dirs; never where "
                                          "a shell, the loader, cron, sudo or systemd read. An "
                                          "inventory cannot set it."),
                "not": {"pattern": NOT_NORMALISED}}
        adopt = {"type": "boolean",
                 "description": "Replace a file at path that nictune did not write (one without its "
                                "header line); without it, plan and apply refuse such a file unless it "
                                "already sets the same variables, and verify reports it as drift. Its text stays on the host, for rollback. "
                                "Covers the path named in the same file; an inventory cannot set it. "
                                "A file another nictune family wrote is never replaced."}
        allowed = {"type": "array", "maxItems": 16,
                   "items": {**s.text(OWNED_DIR, 256), "not": {"pattern": NOT_NORMALISED}},
                   "description": "Directories a path other than the default may be below: the "
                                  "directory the program reads, never a whole tree such as /etc or "
                                  "/opt, nor /proc, /sys, /dev, /run or where a shell, the loader, "
                                  "cron, sudo or systemd read. An inventory cannot set it."}
        return {"host": {cls.section: s.section(cls.title, {
            "path": path, cls.values_key: values, "adopt": adopt, "allowed_dirs": allowed})}}

    @classmethod
    def shown(cls, value: Any) -> Any:
        if isinstance(value, str) and not nictune_wrote(value):
            return placeholder(value)
        return value

    # -- profile -> keys -------------------------------------------------------
    def resolve(self, env: dict) -> Tuple[dict, str]:
        """env with its `auto` values resolved on this host, and a note
        saying from what; AutoUnresolved when they have no answer here."""
        return env, ""

    def expand(self, target, sections, source):
        section = sections.get(self.section)
        if not section:
            return []
        extra = tuple(check_owned_dir(d, f"host.{self.section}.allowed_dirs item")
                      for d in section.get("allowed_dirs") or ())
        path_source = source(self.section, "path")
        path = check_owned_path(section.get("path", self.default_path), self.default_path, list(extra),
                                f"host.{self.section}.path" + (f" ({path_source})" if path_source else ""))
        key = Key(self.name, HOST, path)
        self._policy[key] = self._policy_of(section, extra, source)
        env = section.get(self.values_key, {})
        try:
            env, self._notes[key] = self.resolve(env)
        except NictuneError as e:
            if isinstance(e, InvalidInput):  # a bad NCCL_IB_ADDR_RANGE...: name where it is
                where = source(self.section, self.values_key)
                raise InvalidInput(f"{where}: {e.message}" if where else e.message) from None
            # The file as asked for, `auto` and all: read() answers
            # Unsupported for it, so on_unsupported decides, as for any key.
            self._unresolved[key] = e.message
        try:
            self._wanted[key] = self.syntax.render(env)
        except InvalidInput as e:  # a request that did not come through the schema: say where
            where = source(self.section, self.values_key)
            raise InvalidInput(f"host.{self.section}.{self.values_key}" + (f" ({where})" if where else "")
                               + f": {e.message}") from None
        return [Desired(key, Want(self._wanted[key]), source(self.section))]

    def _policy_of(self, section: dict, extra: tuple, source) -> _Policy:
        policy = _Policy(extra, section.get("adopt") is True)
        path_source, adopt_source = source(self.section, "path"), source(self.section, "adopt")
        # An adopt: true covers the path its own file names (or the default):
        # a path set elsewhere (an inventory, a child profile) is not adopted.
        if policy.adopt and path_source and _file_of(path_source) != _file_of(adopt_source):
            policy.adopt = False
            policy.not_adopted = (f"the adopt: true of {adopt_source} covers only a path named in "
                                  f"its own file, and this path comes from {path_source}")
        return policy

    # -- checks and notes --------------------------------------------------------
    def problems(self, key: Key, env: dict) -> list:
        """What this host cannot take of the wanted settings (a family's own checks)."""
        return []

    def check(self, key, want) -> Optional[str]:
        """Why apply may not write `want`.  When the only reason is a file
        nictune did not write (no adopt: true), a Withheld: the host
        differs all the same, and verify says so as drift."""
        problems = []
        withheld = []  # reasons the profile's adopt: true would lift
        policy = self._policy.get(key)
        adopted = policy is not None and policy.adopt
        unadopted = f" ({policy.not_adopted})" if policy and policy.not_adopted else ""
        if key in self._others:
            problems.append(
                f"{self._place(key).shown} was written by nictune's {self._others[key]} family (its "
                f"header says so), not by its {self.name} family: a family never replaces another's "
                f"file, adopt or not; give host.{self.section}.path a file of its own")
        elif key in self._foreign and not adopted:
            withheld.append(
                f"{self._place(key).shown} was not written by nictune's {self.name} family "
                f"({self._whose(key)}) and differs from the profile: nictune replaces such a file "
                f"only when the profile says host.{self.section}.adopt: true" + unadopted)
        if key in self._hides and not adopted:
            withheld.append(
                f"creating {self._place(key).shown} would hide the host's {self._hides[key]}, which "
                f"nictune did not write, from every program started in {self.host.netns} (ip netns "
                f"exec binds it over that file): nictune does that only when the profile says "
                f"host.{self.section}.adopt: true" + unadopted)
        env = self.syntax.parse(want.value) if isinstance(want.value, str) else {}
        own = self.problems(key, env)
        if withheld and not problems and not own:
            return Withheld("; ".join(withheld))
        return "; ".join(problems + withheld + own) or None

    def _whose(self, key: Key) -> str:
        if key not in self._legacy:
            return "it does not start with nictune's header"
        if key.name != self.default_path:
            return (f"it has the old header that names no family, which counts as {self.name}'s "
                    f"only at {self.default_path}")
        return ("it has the old header that names no family, and settings this family never "
                "writes, so it may be another's")

    def _ours(self, name: str, text: str) -> bool:
        """Whether a file's text is this family's to replace (see "Whose
        file" above): empty, headed by this family, or legacy-headed at
        the family's own path with nothing but settings it could write."""
        writer = "" if text == "" else writer_of(text)
        if text == "" or writer == self.name:
            return True
        return writer == "" and name == self.default_path and self.syntax.only_settings(text)

    def met(self, key, want, current) -> bool:
        # Variables, not text: the header, order and comments are not content.
        if want.satisfied_by(current):
            return True
        return (isinstance(current, str) and isinstance(want.value, str)
                and self.syntax.parse(current) == self.syntax.parse(want.value))

    def note(self, key):
        notes = [self._notes.get(key, "")]
        place = self._place(key)
        if place.netns:
            notes.append(f"the namespace's own file {place.shown}" + self._created.get(key, ""))
        policy = self._policy.get(key)
        if key in self._foreign and policy and policy.adopt:
            notes.append("adopts a file nictune did not write; its text stays on the host, "
                         "in the journal, for rollback")
        notes.append(self._variables_note(key))
        return "; ".join(n for n in notes if n)

    def _variables_note(self, key: Key) -> str:
        """Which variables a rewrite changes (see the module docstring for
        what it says of a file nictune did not write)."""
        text, wanted = self._text.get(key), self._wanted.get(key)
        if wanted is None or not text:
            return ""  # a new file: the plan shows all of it
        old, new = self.syntax.parse(text or ""), self.syntax.parse(wanted)
        if old == new:
            if text != wanted:
                return "sets the profile's variables already; its text is left as it is"
            return ""
        if key in self._foreign:
            count = len(old)
            wanted = _listed([f'{n}={v}' for n, v in new.items()])
            policy = self._policy.get(key)
            # Without adopt: true nothing replaces it: verify's drift note.
            said = (f"would replace it whole, setting {wanted}" if policy and policy.adopt
                    else f"the profile wants {wanted}")
            return (f"{said}; it sets {count} variable{'s' if count != 1 else ''} now, which and "
                    "how stays on the host (--show-file-content shows its text)")
        changed = [f"{n} {old[n]} -> {new[n]}" for n in new if n in old and old[n] != new[n]]
        added = [f"+{n}={new[n]}" for n in new if n not in old]
        removed = [f"-{n}" for n in old if n not in new]
        return "variables: " + _listed(changed + added + removed)

    # -- where the file is ---------------------------------------------------------
    def _place(self, key: Key) -> _Place:
        name = check_path(key.name)
        netns = self.host.netns or ""
        if netns and within(name, "/etc"):
            shown = f"/etc/netns/{netns}/{name[len('/etc/'):]}"
            creatable = os.path.dirname(shown) == f"/etc/netns/{netns}"
        else:
            shown, netns, creatable = name, "", False
        return _Place(self.host.path(shown.lstrip("/")), shown, netns, creatable)

    def _real(self, path: str) -> str:
        return self.host.io.realpath(self.host.path(path.lstrip("/")))

    def _shown_real(self, path: str) -> str:
        """path with symlinks resolved, as seen from Host.root."""
        real, root = self._real(path), self._real("/")
        return "/" + os.path.relpath(real, root) if real != root else "/"

    def _check_directory(self, key: Key, place: _Place) -> None:
        """Refuse a file whose directory resolves (through symlinks) into
        the kernel's directories; under a profile (not in a rollback, which
        puts back what the journal says was there), refuse one that
        resolves where READERS are, or that is neither the family's own
        path nor below a directory the profile allows."""
        real = self.host.io.realpath(os.path.dirname(place.file))
        root = self._real("/")
        shown = "/" + os.path.relpath(real, root) if real != root else "/"
        if shown.startswith("/.."):  # out of Host.root altogether
            raise UnsafeFile(f"{place.shown}: its directory resolves outside the host's root")
        if any(within(real, self._real(d)) for d in KERNEL_DIRS):
            raise UnsafeFile(f"{place.shown}: its directory is {shown}, where nictune never writes")
        policy = self._policy.get(key)
        if policy is None:
            return
        twin = f"/etc/netns/{place.netns}"
        if place.netns and within(shown, twin):  # ip netns exec binds it over /etc/...
            shown = "/etc" + shown[len(twin):]
        resolved = os.path.join(shown, os.path.basename(key.name))
        if resolved == self.default_path:
            return
        reader = reader_of(resolved)
        if reader:
            raise UnsafeFile(f"{place.shown} resolves to {resolved}, where nictune never writes "
                             f"({reader})")
        if not any(within(shown, self._shown_real(d)) for d in policy.dirs):
            allowed = ", ".join(policy.dirs) or "none"
            raise UnsafeFile(f"{place.shown}: its directory is {shown}, and the file is neither "
                             f"{self.default_path} nor below a directory of allowed_dirs ({allowed})")

    # -- host -> values ------------------------------------------------------------
    def read(self, keys):
        out = {}
        for key in keys:
            if key in self._unresolved:
                out[key] = Unsupported(self._unresolved[key])
                continue
            try:
                out[key] = self._read(key)
            except UnsafeFile as e:
                out[key] = Unsupported(e.message)
            except OSError as e:
                out[key] = Unsupported(f"cannot read {key.name}: {e.strerror or e}")
        return out

    def _read(self, key: Key):
        self._created.pop(key, None)
        self._hides.pop(key, None)
        self._text.pop(key, None)
        place = self._place(key)
        self._check_directory(key, place)
        data = read_owned(place.file, place.shown, io=self.host.io)
        if data is None:
            absent = self._absent(key, place)
            if absent is None:
                self._text[key] = None
            return absent
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UnsafeFile(f"{place.shown} is not UTF-8 text, so not a {self.syntax.what} file") from None
        self._foreign.discard(key)
        self._others.pop(key, None)
        self._legacy.discard(key)
        self._text[key] = text
        if self._ours(key.name, text):
            return text
        writer = writer_of(text)
        if writer:
            self._others[key] = writer
        elif writer == "":
            self._legacy.add(key)
        self._foreign.add(key)
        return Foreign(text)

    def _absent(self, key: Key, place: _Place):
        """None (no file, apply may create it), or why it cannot be created."""
        directory = os.path.dirname(place.file)
        if not self.host.io.isdir(directory) and not place.creatable:
            why = f"directory {os.path.dirname(place.shown)} does not exist"
            if place.netns:  # ip netns exec binds it whole over its /etc twin
                why += (": creating it would hide the host's "
                        f"{os.path.dirname(key.name)} in the namespace; create it yourself")
            return Unsupported(why)
        if place.netns:
            self._created[key] = ", created"
            if self._host_file_not_ours(key):
                self._hides[key] = key.name
            if not self.host.io.lexists(self.host.path(key.name.lstrip("/"))):
                self._created[key] += (f"; ip netns exec binds it over {key.name} only where that "
                                       f"file exists, and this host has none: create an empty "
                                       f"{key.name} for programs in {place.netns} to read it")
        return None

    def _host_file_not_ours(self, key: Key) -> bool:
        """Whether the host has a file at key.name that nictune did not
        write (anything there but a nictune file, or nothing, counts)."""
        shown = key.name
        try:
            data = read_owned(self.host.path(shown.lstrip("/")), shown, io=self.host.io)
        except (UnsafeFile, OSError):
            return self.host.io.lexists(self.host.path(shown.lstrip("/")))
        if data is None:
            return False
        try:
            return not self._ours(shown, data.decode("utf-8"))
        except UnicodeDecodeError:
            return True

    # -- values -> host ------------------------------------------------------------
    def apply(self, items):
        for key, text in items:
            place = self._place(key)
            self._check_directory(key, place)
            if text is None:  # reverting to "there was no file"
                remove_owned(place.file, place.shown, io=self.host.io)
                continue
            if place.creatable:
                self.host.io.makedirs(os.path.dirname(place.file), mode=0o755)
            # A namespace's own file is the source of bind mounts: other mount
            # namespaces (a shell, an sshd in it) see it only if it keeps its inode.
            write_owned(place.file, text, place.shown, keep_inode=bool(place.netns),
                        io=self.host.io, new_mode=self.new_file_mode)

    def tidy(self, keys: list) -> list:
        """Remove the temporary files interrupted writes left beside these
        keys' files (files.remove_stale_temps).  Returns what to tell the
        user; never raises: tidying does not undo a finished apply."""
        said = []
        for key in keys:
            place = self._place(key)
            directory = os.path.dirname(place.shown)
            try:
                self._check_directory(key, place)
                removed = remove_stale_temps(os.path.dirname(place.file), io=self.host.io)
            except (OSError, NictuneError) as e:
                said.append(f"could not look for temporary files left in {directory}: "
                            f"{getattr(e, 'message', None) or e}")
                continue
            if removed:
                said.append(f"removed {len(removed)} temporary file(s) an interrupted nictune "
                            f"write left in {directory}: {', '.join(sorted(removed))}")
        return said

    def show(self, target):
        if target != HOST:
            return {}
        key = Key(self.name, HOST, self.default_path)
        text = self.read([key])[key]
        env = self.syntax.parse(text) if isinstance(text, str) else {}
        # Only what a profile can say: the printed profile must validate.
        env = self.syntax.showable(env)
        if not env:
            return {}  # no file, or nothing its reader would take from it
        return {self.section: {"path": self.default_path, self.values_key: env}}
