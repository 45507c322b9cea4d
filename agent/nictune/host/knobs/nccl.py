"""The NCCL configuration file, owned whole by nictune.

NCCL reads NAME=VALUE lines (the first value of a name wins, lines starting
with '#' are skipped), splits at the first '=' and trims nothing, so the
file is rendered exactly, written atomically, and compared as text.

Which file.  host.nccl.path must be in /etc or /usr/local/etc, or below a
directory the profile lists in allowed_dirs, never in /proc, /sys, /dev or
/run (validate.py); an inventory sets neither allowed_dirs nor adopt
(profile/loader.py).  On the host it must be a regular file of at most
1 MiB, or absent, and its directory must not resolve elsewhere (files.py).
In a network namespace (the request names it), a path under /etc is the
namespace's own /etc/netns/NAME/... file, which `ip netns exec` binds over
/etc/... only when it exists: nictune reads and writes that file, creates
it when absent, and says so in the plan; writing /etc/... there would
write the host's file.  Creating it hides the host's /etc/... from the
namespace's programs, so when that is a file nictune did not write, it
takes adopt: true, as replacing it would.

Whose file.  A file nictune wrote starts with HEADER; an absent or empty
file is free to take.  Any other file is someone else's: a report carries
a placeholder for its text unless the request asks for it (shown(), on
the host, so the text never travels), and nictune replaces it only when
the profile says adopt: true in the file that names the path.  Someone
else's file that sets the same variables is as wanted, and left alone.

NCCL_IB_HCA: auto and NCCL_IB_GID_INDEX: auto are resolved here, on the
host, from its GID tables (nictune.host.rdma): the RoCE ports whose netdev is up
and has a RoCE v2 IPv4 GID, and the one GID index they share.  A plan shows
what they resolved to; an `auto` this host cannot resolve makes the file's
key unsupported here, with the reason, and on_unsupported decides.  Names
in NCCL_IB_HCA and NCCL_SOCKET_IFNAME that match nothing on the host are
reported before anything is written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Optional

from nictune.host import rdma
from nictune.host.errors import UNSUPPORTED, NictuneError
from nictune.host.files import UnsafeFile, read_owned, remove_owned, remove_stale_temps, write_owned
from nictune.host.knobs.base import Family
from nictune.host.model import HOST, Desired, Key, Unsupported, Want
from nictune.host.validate import (KERNEL_DIRS, NCCL_NAME, NCCL_VALUE, NOT_NORMALISED, OWNED_DIR,
                                   OWNED_FILE_DIRS, OWNED_PATH, check, check_owned_dir,
                                   check_owned_path, check_path, matches, within)

DEFAULT_PATH = "/etc/nccl.conf"
HEADER = "# Managed by nictune: edit the profile, not this file.\n"


def render(env: dict) -> str:
    lines = [HEADER]
    for name, value in env.items():
        check(NCCL_NAME, name, "NCCL variable name")
        if isinstance(value, bool):
            value = int(value)
        text = check(NCCL_VALUE, str(value), f"value of {name}")
        lines.append(f"{name}={text}\n")
    return "".join(lines)


def parse(text: str) -> dict:
    """The variables NCCL takes from the file (src/misc/param.cc setEnvFile:
    getline, '#' lines skipped, setenv without overwriting)."""
    env: dict = {}
    for line in text.split("\n"):
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            env.setdefault(name, value)
    return env


def nictune_wrote(text: str) -> bool:
    """Whether the file's text is nictune's to show and replace: its header
    (every text nictune writes starts with it), or nothing at all."""
    return text == "" or text.startswith(HEADER)


def placeholder(text: str) -> str:
    return f"<file not written by nictune: {len(text.encode())} bytes>"


class Foreign(str):
    """The text of a file nictune did not write.  It is the text (the
    journal keeps it whole, for rollback); wherever it could be shown it
    is a placeholder: in reports through NcclFamily.shown(), in notes
    ("read back ...", "still ...") through repr()."""

    def __repr__(self) -> str:
        return placeholder(self)


@dataclass
class _Policy:
    """What the profile lets nictune do with its file, from expand()."""

    dirs: tuple           # directories the file may be below
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


AUTO = "auto"


class AutoUnresolved(NictuneError):
    """An `auto` NCCL value this host cannot resolve."""

    kind = UNSUPPORTED


def _natural(text: str) -> list:
    """mlx5_2 before mlx5_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def roce_ports(host) -> list:
    """One RoCE v2 IPv4 GID per RDMA port whose netdev is up, by device."""
    up = {link.name for link in host.links() if link.up}
    found = []
    for device in sorted(rdma.devices(host), key=_natural):
        for port in rdma.ports(host, device):
            if rdma.link_layer(host, device, port) not in (None, "Ethernet"):
                continue  # InfiniBand ports have no RoCE GIDs
            gid = next((g for g in rdma.gids(host, device, port)
                        if g.type == rdma.ROCE_V2 and g.ipv4 and g.ndev in up), None)
            if gid is not None:
                found.append(gid)
    return found


def resolve_auto(host, env: dict) -> tuple:
    """env with its `auto` values resolved, and a note saying from what."""
    auto = [n for n in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX") if str(env.get(n)).lower() == AUTO]
    if not auto:
        return env, ""
    gids = roce_ports(host)
    if not gids:
        raise AutoUnresolved(
            f"{' and '.join(auto)}: auto found no RoCE port here: no RDMA port whose netdev is "
            "up has a RoCE v2 IPv4 GID (see /sys/class/infiniband/*/ports/*/gids); give the "
            "value explicitly or bring the rails up with their addresses first")
    resolved = dict(env)
    if "NCCL_IB_HCA" in auto:
        resolved["NCCL_IB_HCA"] = "=" + ",".join(f"{g.device}:{g.port}" for g in gids)
    if "NCCL_IB_GID_INDEX" in auto:
        indexes = {g.index for g in gids}
        if len(indexes) > 1:
            each = ", ".join(f"{g.device} port {g.port} ({g.ndev}) has it at {g.index}" for g in gids)
            raise AutoUnresolved(
                "NCCL_IB_GID_INDEX: auto needs one RoCE v2 IPv4 GID index common to every RoCE "
                f"port, but {each}; set NCCL_IB_GID_INDEX per host, or give the ports the same "
                "address layout")
        resolved["NCCL_IB_GID_INDEX"] = gids[0].index
    note = "auto: " + ", ".join(f"{g.device} port {g.port} GID {g.index} (RoCE v2, {g.ipv4})"
                                for g in gids)
    return resolved, note


# One NCCL_IB_HCA item: device[:port[:rail[:plane]]] (NCCL's src/misc/param.cc
# and src/transport/net_ib.cc parse it; ncclIbMatchIfList compares names).
HCA_ITEM = r"[A-Za-z0-9_.-]{1,64}(:[0-9]{1,3}){0,3}"


def nccl_list(value: str) -> tuple:
    """NCCL's list syntax (NCCL_IB_HCA, NCCL_SOCKET_IFNAME): an optional '^'
    (exclude), an optional '=' (exact names, not prefixes), then names
    joined by commas.  Returns ([names], exclude, exact)."""
    exclude = value.startswith("^")
    value = value[1:] if exclude else value
    exact = value.startswith("=")
    value = value[1:] if exact else value
    return [item for item in value.split(",") if item], exclude, exact


def _matches(name: str, candidates: list, exact: bool) -> bool:
    return any(c == name if exact else c.startswith(name) for c in candidates)


class NcclFamily(Family):
    name = "nccl"
    position = 20
    position_note = "with the sysctls, before any device setting: a file cannot cut the management path"
    host_sections = ("nccl",)
    settings = ("nccl.path", "nccl.env", "nccl.env.NCCL_IB_GID_INDEX", "nccl.env.NCCL_IB_HCA",
                "nccl.adopt", "nccl.allowed_dirs")

    @classmethod
    def schema(cls, s):
        env = s.mapping("NCCL variables; true and false are written as 1 and 0.",
                        s.text(NCCL_NAME, 69),
                        {"anyOf": [s.text(NCCL_VALUE, 900), {"type": "integer"}, {"type": "boolean"}]},
                        128)
        env["properties"] = {
            "NCCL_IB_GID_INDEX": {
                "anyOf": [{"const": AUTO}, s.integer(-1, 255)],
                "description": "GID index; auto: the RoCE v2 IPv4 GID index of this host's RoCE ports, resolved on the host.",
            },
            "NCCL_IB_HCA": {
                "anyOf": [{"const": AUTO}, s.text(NCCL_VALUE, 900)],
                "description": "HCA list; auto: =dev:port of this host's RoCE ports that are up with an IPv4 GID.",
            },
        }
        dirs = " or ".join(OWNED_FILE_DIRS)
        path = {**s.text(OWNED_PATH, 256, f"Where to write it (default {DEFAULT_PATH}): below {dirs}, "
                                          "or below a directory of allowed_dirs."),
                "not": {"pattern": NOT_NORMALISED}}
        adopt = {"type": "boolean",
                 "description": "Replace a file at path that nictune did not write (one without its "
                                "header line); without it, such a file is refused unless it already "
                                "sets the same variables. Its text stays on the host, for rollback. "
                                "Covers the path named in the same file; an inventory cannot set it."}
        allowed = {"type": "array", "maxItems": 16,
                   "items": {**s.text(OWNED_DIR, 256), "not": {"pattern": NOT_NORMALISED}},
                   "description": f"More directories the file may be below, besides {dirs}; never "
                                  "/proc, /sys, /dev or /run. An inventory cannot set it."}
        return {"host": {"nccl": s.section("The NCCL configuration file.",
                                           {"path": path, "env": env, "adopt": adopt,
                                            "allowed_dirs": allowed})}}

    def __init__(self, host):
        super().__init__(host)
        self._notes: dict = {}
        self._unresolved: dict = {}  # key -> why its `auto` values have no answer here
        self._policy: dict = {}      # key -> _Policy (none in rollback and show: no profile)
        self._foreign: set = set()   # keys whose file nictune did not write, from read()
        self._created: dict = {}     # key -> what the note says of a file apply would create
        # Keys whose namespace file, once created, would hide a host file
        # nictune did not write (ip netns exec binds it over that file).
        self._hides: dict = {}       # key -> the host file's path

    @classmethod
    def shown(cls, value: Any) -> Any:
        if isinstance(value, str) and not nictune_wrote(value):
            return placeholder(value)
        return value

    def expand(self, target, sections, source):
        section = sections.get("nccl")
        if not section:
            return []
        extra = tuple(check_owned_dir(d, "host.nccl.allowed_dirs item")
                      for d in section.get("allowed_dirs") or ())
        path_source = source("nccl", "path")
        path = check_owned_path(section.get("path", DEFAULT_PATH), list(extra),
                                "host.nccl.path" + (f" ({path_source})" if path_source else ""))
        key = Key(self.name, HOST, path)
        self._policy[key] = self._policy_of(section, extra, source)
        env = section.get("env", {})
        try:
            env, self._notes[key] = resolve_auto(self.host, env)
        except AutoUnresolved as e:
            # The file as asked for, `auto` and all: read() answers
            # Unsupported for it, so on_unsupported decides, as for any key.
            self._unresolved[key] = e.message
        return [Desired(key, Want(render(env)), source("nccl"))]

    @staticmethod
    def _policy_of(section: dict, extra: tuple, source) -> _Policy:
        policy = _Policy(OWNED_FILE_DIRS + extra, section.get("adopt") is True)
        path_source, adopt_source = source("nccl", "path"), source("nccl", "adopt")
        # An adopt: true covers the path its own file names (or the default):
        # a path set elsewhere (an inventory, a child profile) is not adopted.
        if policy.adopt and path_source and _file_of(path_source) != _file_of(adopt_source):
            policy.adopt = False
            policy.not_adopted = (f"the adopt: true of {adopt_source} covers only a path named in "
                                  f"its own file, and this path comes from {path_source}")
        return policy

    def check(self, key, want) -> Optional[str]:
        problems = []
        policy = self._policy.get(key)
        adopted = policy is not None and policy.adopt
        unadopted = f" ({policy.not_adopted})" if policy and policy.not_adopted else ""
        if key in self._foreign and not adopted:
            problems.append(
                f"{self._place(key).shown} was not written by nictune (it does not start with "
                "nictune's header) and differs from the profile: nictune replaces such a file only "
                "when the profile says host.nccl.adopt: true" + unadopted)
        if key in self._hides and not adopted:
            problems.append(
                f"creating {self._place(key).shown} would hide the host's {self._hides[key]}, which "
                f"nictune did not write, from every program started in {self.host.netns} (ip netns "
                "exec binds it over that file): nictune does that only when the profile says "
                "host.nccl.adopt: true" + unadopted)
        env = parse(want.value) if isinstance(want.value, str) else {}
        hca = env.get("NCCL_IB_HCA")
        # Without /sys/class/infiniband the RDMA stack is not loaded (yet):
        # absence of a device then proves nothing.
        if hca and os.path.isdir(self.host.path(rdma.IB_CLASS)):
            names, exclude, exact = nccl_list(hca)
            devices = rdma.devices(self.host)
            missing = [n for n in names if not _matches(n.split(":")[0], devices, exact)]
            if missing and not exclude:
                problems.append(f"NCCL_IB_HCA names {', '.join(missing)}, which this host does not "
                                f"have (RDMA devices here: {', '.join(devices) or 'none'})")
        ifname = env.get("NCCL_SOCKET_IFNAME")
        if ifname:
            names, exclude, exact = nccl_list(ifname)
            here = [i.name for i in self.host.interfaces()]
            missing = [n for n in names if not _matches(n, here, exact)]
            if missing and not exclude:
                problems.append(f"NCCL_SOCKET_IFNAME names {', '.join(missing)}, which matches no "
                                f"interface here ({', '.join(here) or 'none'})")
        return "; ".join(problems) or None

    def met(self, key, want, current) -> bool:
        if want.satisfied_by(current):
            return True
        # Someone else's file that already says the same is left as it is.
        return key in self._foreign and parse(current) == parse(want.value)

    def note(self, key):
        notes = [self._notes.get(key, "")]
        place = self._place(key)
        if place.netns:
            notes.append(f"the namespace's own file {place.shown}" + self._created.get(key, ""))
        policy = self._policy.get(key)
        if key in self._foreign and policy and policy.adopt:
            notes.append("adopts a file nictune did not write; its text stays on the host, "
                         "in the journal, for rollback")
        return "; ".join(n for n in notes if n)

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
        return os.path.realpath(self.host.path(path.lstrip("/")))

    def _check_directory(self, key: Key, place: _Place) -> None:
        """Refuse a file whose directory resolves (through symlinks) into
        the kernel's directories, or out of those the profile allows."""
        real = os.path.realpath(os.path.dirname(place.file))
        root = self._real("/")
        shown = "/" + os.path.relpath(real, root) if real != root else "/"
        if any(within(real, self._real(d)) for d in KERNEL_DIRS):
            raise UnsafeFile(f"{place.shown}: its directory is {shown}, where nictune never writes")
        policy = self._policy.get(key)
        if policy and not any(within(real, self._real(d)) for d in policy.dirs):
            raise UnsafeFile(f"{place.shown}: its directory is {shown}, outside the directories "
                             f"nictune may write ({', '.join(policy.dirs)})")

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
        place = self._place(key)
        self._check_directory(key, place)
        data = read_owned(place.file, place.shown)
        if data is None:
            return self._absent(key, place)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UnsafeFile(f"{place.shown} is not UTF-8 text, so not an NCCL file") from None
        self._foreign.discard(key)
        if nictune_wrote(text):
            return text
        self._foreign.add(key)
        return Foreign(text)

    def _absent(self, key: Key, place: _Place):
        """None (no file, apply may create it), or why it cannot be created."""
        directory = os.path.dirname(place.file)
        if not os.path.isdir(directory) and not place.creatable:
            why = f"directory {os.path.dirname(place.shown)} does not exist"
            if place.netns:  # ip netns exec binds it whole over its /etc twin
                why += (": creating it would hide the host's "
                        f"{os.path.dirname(key.name)} in the namespace; create it yourself")
            return Unsupported(why)
        if place.netns:
            self._created[key] = ", created"
            if self._host_file_not_ours(key):
                self._hides[key] = key.name
            if not os.path.lexists(self.host.path(key.name.lstrip("/"))):
                self._created[key] += (f"; ip netns exec binds it over {key.name} only where that "
                                       f"file exists, and this host has none: create an empty "
                                       f"{key.name} for programs in {place.netns} to read it")
        return None

    def _host_file_not_ours(self, key: Key) -> bool:
        """Whether the host has a file at key.name that nictune did not
        write (anything there but a nictune file, or nothing, counts)."""
        shown = key.name
        try:
            data = read_owned(self.host.path(shown.lstrip("/")), shown)
        except (UnsafeFile, OSError):
            return os.path.lexists(self.host.path(shown.lstrip("/")))
        if data is None:
            return False
        try:
            return not nictune_wrote(data.decode("utf-8"))
        except UnicodeDecodeError:
            return True

    # -- values -> host ------------------------------------------------------------
    def apply(self, items):
        for key, text in items:
            place = self._place(key)
            self._check_directory(key, place)
            if text is None:  # reverting to "there was no file"
                remove_owned(place.file, place.shown)
                continue
            if place.creatable:
                os.makedirs(os.path.dirname(place.file), mode=0o755, exist_ok=True)
            # A namespace's own file is the source of bind mounts: other mount
            # namespaces (a shell, an sshd in it) see it only if it keeps its inode.
            write_owned(place.file, text, place.shown, keep_inode=bool(place.netns))

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
                removed = remove_stale_temps(os.path.dirname(place.file))
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
        key = Key(self.name, HOST, DEFAULT_PATH)
        text = self.read([key])[key]
        env = parse(text) if isinstance(text, str) else {}
        # Only what a profile can say: the printed profile must validate.
        env = {n: v for n, v in env.items() if matches(NCCL_NAME, n) and matches(NCCL_VALUE, v)}
        if not env:
            return {}  # no file, or nothing NCCL would read from it
        return {"nccl": {"path": DEFAULT_PATH, "env": env}}
