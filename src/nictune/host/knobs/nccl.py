"""The NCCL configuration file, owned whole by nictune (the machinery all
owned files share, and its rules, are in knobs/envfile.py).

NCCL reads the file in src/misc/param.cc (setEnvFile, called by
initEnvFunc for $NCCL_CONF_FILE or else ~/.nccl.conf, then /etc/nccl.conf):
line by line, skipping lines that start with '#' (since 2.26; before,
such a line set a variable whose name starts with '#', which nothing
reads), split at the first '=', nothing trimmed, each set with
setenv(name, value, 0) so that the environment and the first definition
win.  parse() does the same; a '\r' before the newline stays in the value
(NCCL strips it only since 2.30), so a CRLF file is rewritten.  nictune
renders NAME=VALUE lines.  NCCL takes a value literally, but job scripts
source the file (`set -a; . /etc/nccl.conf`), and NCCL cannot read a
quoted value: so a value is refused unless a shell takes it literally
too (validate.NCCL_VALUE: no blanks, quotes, $, `, ;, &, | and the like).
NCCL_ALGO's per-collective form with ';' is left to the job environment.

Names.  NCCL_* names, and CUDA_* ones: NCCL exports whatever the file
sets, and Azure's HPC images put CUDA_DEVICE_ORDER=PCI_BUS_ID in
/etc/nccl.conf (azhpc-images), so `nictune show` of such a host gives a
profile that verifies clean.  Other names (LD_PRELOAD...) are refused.

NCCL_IB_HCA: auto and NCCL_IB_GID_INDEX: auto are resolved on the host,
from its GID tables (host/facts/ibauto.py): the RoCE ports under the interfaces
the profile's roce: entries matched, and the GID index NCCL would select
on them (NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE).  Each plan and verify
resolves them anew, and a written index that no longer points at that GID
is said in the note (ibauto.gid_index_problem).  A plan shows what they
resolved to; an `auto` this host cannot resolve makes the file's
key unsupported here, with the reason, and on_unsupported decides.  Every
owned file resolves its `auto` values through auto_values() (UCX's and
NVSHMEM's device lists and GID indexes too).  Names in NCCL_IB_HCA and
NCCL_SOCKET_IFNAME that match nothing on the host are reported before
anything is written.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Dict

from nictune.host.facts import ibauto
# AutoUnresolved is part of this module's interface (UCX's and NVSHMEM's

from nictune.host.facts import rdma
# families, tests): ibauto raises it.
from nictune.host.facts.ibauto import AutoUnresolved  # noqa: F401
# Foreign, HEADER, nictune_wrote and placeholder are part of this module's
# interface (tests, the journal's readers): they live in envfile now.
from nictune.host.knobs.envfile import (AUTO, Foreign, OwnedFileFamily, Syntax,  # noqa: F401
                                        auto_schema, header_of, nictune_wrote, placeholder)
from nictune.host.validate import NCCL_NAME, NCCL_VALUE

DEFAULT_PATH = "/etc/nccl.conf"
HEADER = header_of("nccl")


class NcclSyntax(Syntax):
    what = "NCCL variable"
    family = "nccl"
    name_pattern = NCCL_NAME
    value_pattern = NCCL_VALUE

    def line(self, name: str, text: str) -> str:
        return f"{name}={text}\n"

    def parse(self, text: str) -> Dict[str, str]:
        """The variables NCCL takes from the file (src/misc/param.cc
        setEnvFile: '#' lines skipped, split at the first '=', setenv
        without overwriting, so the first definition wins; setenv refuses
        an empty name)."""
        env: dict = {}
        for line in text.split("\n"):
            if line and not line.startswith("#") and "=" in line:
                name, value = line.split("=", 1)
                if name:
                    env.setdefault(name, value)
        return env


SYNTAX = NcclSyntax()


def render(env: dict) -> str:
    return SYNTAX.render(env)


def parse(text: str) -> dict:
    return SYNTAX.parse(text)


def resolve_auto(host, env: dict, interfaces=None) -> tuple:
    """env with its `auto` values resolved (host/facts/ibauto.py), and a note."""
    return ibauto.resolve_auto(host, env, interfaces)


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


def auto_values(family, env: dict) -> tuple:
    """The one place every owned file resolves its `auto` values: env in
    NCCL's names (NCCL_IB_HCA, NCCL_IB_GID_INDEX) with them resolved on
    family.host, and a note saying from what: the RoCE ports under the
    interfaces the profile's entries matched (Family.profile_interfaces).
    Raises AutoUnresolved, or InvalidInput for a bad NCCL_IB_ADDR_FAMILY /
    NCCL_IB_ADDR_RANGE."""
    return resolve_auto(family.host, env, ibauto.interfaces_for_auto(family.profile_interfaces))


def auto_as(family, env: dict, devices: str, gid_index: str) -> tuple:
    """`auto` in another library's device list and GID index variables
    (UCX_NET_DEVICES, NVSHMEM_HCA_LIST...), resolved through auto_values
    as NCCL's are: the ports as dev:port,dev:port (both libraries match
    those names exactly, without NCCL's '=').  Raises AutoUnresolved."""
    asked = {nccl: AUTO for nccl, own in (("NCCL_IB_HCA", devices), ("NCCL_IB_GID_INDEX", gid_index))
             if str(env.get(own)).lower() == AUTO}
    if not asked:
        return env, ""
    try:
        got, note = auto_values(family, asked)
    except AutoUnresolved as e:
        raise AutoUnresolved(e.message.replace("NCCL_IB_HCA", devices)
                             .replace("NCCL_IB_GID_INDEX", gid_index)) from None
    out = dict(env)
    if "NCCL_IB_HCA" in asked:
        out[devices] = got["NCCL_IB_HCA"].lstrip("=")
    if "NCCL_IB_GID_INDEX" in asked:
        out[gid_index] = got["NCCL_IB_GID_INDEX"]
    return out, note


class NcclFamily(OwnedFileFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
host:
  nccl:
    path: /etc/nccl.conf
    env: {NCCL_IB_TC: 106, NCCL_IB_GID_INDEX: auto, NCCL_IB_HCA: auto}
"""
    name = "nccl"
    host_sections = ("nccl",)
    settings = ("nccl.path", "nccl.env", "nccl.env.NCCL_IB_GID_INDEX", "nccl.env.NCCL_IB_HCA",
                "nccl.env.NCCL_IB_ADDR_FAMILY", "nccl.adopt", "nccl.allowed_dirs")
    section = "nccl"
    default_path = DEFAULT_PATH
    syntax = SYNTAX
    title = "The NCCL configuration file."
    values_description = ("NCCL variables (and CUDA_* ones, which NCCL exports too); true and "
                          "false are written as 1 and 0.")
    auto_properties = auto_schema("NCCL_IB_HCA", "HCA list", "=dev:port", NCCL_VALUE, 900,
                                  "NCCL_IB_GID_INDEX", -1)
    auto_properties["NCCL_IB_ADDR_FAMILY"] = lambda s: {
        "enum": list(ibauto.FAMILIES),
        "description": "The GID family NCCL selects (and auto resolves) with NCCL_IB_GID_INDEX "
                       "unset or auto: AF_INET (NCCL's default) or AF_INET6."}

    @classmethod
    def plan_reads(cls, host) -> None:
        host.io.isdir(host.path(rdma.IB_CLASS))  # whether NCCL_IB_HCA can be derived

    def resolve(self, env):
        return auto_values(self, env)

    def note(self, key):
        # A written NCCL_IB_GID_INDEX that no longer points at the GID NCCL
        # would pick (an address changed, a port flapped): verify says why.
        # Only of nictune's own file: a foreign file's values stay on the host.
        text = self._text.get(key)
        stale = ""
        if isinstance(text, str) and key not in self._foreign:
            stale = ibauto.gid_index_problem(self.host, self.syntax.parse(text),
                                             ibauto.interfaces_for_auto(self.profile_interfaces))
        return "; ".join(n for n in (super().note(key), stale) if n)

    def problems(self, key, env):
        problems = []
        hca = env.get("NCCL_IB_HCA")
        # Without /sys/class/infiniband the RDMA stack is not loaded (yet):
        # absence of a device then proves nothing.
        if hca and self.host.io.isdir(self.host.path(rdma.IB_CLASS)):
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
        return problems
