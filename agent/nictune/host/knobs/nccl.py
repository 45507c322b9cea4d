"""The NCCL configuration file, owned whole by nictune.

NCCL reads NAME=VALUE lines, splits at the first '=' and trims nothing, so
the file is rendered exactly, written atomically, and compared as text.

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
from typing import Optional

from nictune.host import rdma
from nictune.host.errors import UNSUPPORTED, NictuneError
from nictune.host.files import write_atomic
from nictune.host.knobs.base import Family
from nictune.host.model import HOST, Desired, Key, Unsupported, Want
from nictune.host.validate import ABS_PATH, NCCL_NAME, NCCL_VALUE, NOT_NORMALISED, check, check_path

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
    env = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            env[name] = value
    return env


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
    settings = ("nccl.path", "nccl.env", "nccl.env.NCCL_IB_GID_INDEX", "nccl.env.NCCL_IB_HCA")

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
        path = {**s.text(ABS_PATH, 256, f"Where to write it (default {DEFAULT_PATH})."),
                "not": {"pattern": NOT_NORMALISED}}
        return {"host": {"nccl": s.section("The NCCL configuration file.", {"path": path, "env": env})}}

    def __init__(self, host):
        super().__init__(host)
        self._notes: dict = {}
        self._unresolved: dict = {}  # key -> why its `auto` values have no answer here

    def expand(self, target, sections, source):
        section = sections.get("nccl")
        if not section:
            return []
        path = check_path(section.get("path", DEFAULT_PATH), "NCCL config path")
        key = Key(self.name, HOST, path)
        env = section.get("env", {})
        try:
            env, self._notes[key] = resolve_auto(self.host, env)
        except AutoUnresolved as e:
            # The file as asked for, `auto` and all: read() answers
            # Unsupported for it, so on_unsupported decides, as for any key.
            self._unresolved[key] = e.message
        return [Desired(key, Want(render(env)), source("nccl"))]

    def check(self, key, want) -> Optional[str]:
        env = parse(want.value) if isinstance(want.value, str) else {}
        problems = []
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

    def note(self, key):
        return self._notes.get(key, "")

    def _file(self, key: Key) -> str:
        return self.host.path(check_path(key.name).lstrip("/"))

    def read(self, keys):
        out = {}
        for key in keys:
            if key in self._unresolved:
                out[key] = Unsupported(self._unresolved[key])
                continue
            path = self._file(key)
            try:
                with open(path) as f:
                    out[key] = f.read()
            except FileNotFoundError:
                parent = os.path.dirname(path)
                out[key] = None if os.path.isdir(parent) else Unsupported(
                    f"directory {os.path.dirname(key.name)} does not exist")
            except (OSError, UnicodeDecodeError) as e:
                out[key] = Unsupported(f"cannot read: {e}")
        return out

    def apply(self, items):
        for key, text in items:
            path = self._file(key)
            if text is None:  # reverting to "there was no file"
                if os.path.lexists(path):
                    os.unlink(path)
            else:
                write_atomic(path, text, 0o644, busy_in_place=True)

    def show(self, target):
        if target != HOST:
            return {}
        key = Key(self.name, HOST, DEFAULT_PATH)
        text = self.read([key])[key]
        if not isinstance(text, str) or not parse(text):
            return {}  # no file, or nothing NCCL would read from it
        return {"nccl": {"path": DEFAULT_PATH, "env": parse(text)}}

