"""NVSHMEM's variables, exported by a profile.d file nictune owns whole
(host.nvshmem; the rules all owned files share are in knobs/envfile.py).

NVSHMEM reads its environment and no file: every setting is an
NVSHMEMI_ENV_DEF read with getenv (src/include/host/env/env_defs.h,
src/modules/transport/common/env_defs.h, read by nvshmemi_getenv_*
in src/include/bootstrap_host_transport/env_defs_internal.h).  So the
nearest thing to a system-wide setting is a file a shell sources:
host.nvshmem.path defaults to /etc/profile.d/nvshmem.sh, which nictune
writes as `export NAME='VALUE'` lines.

What reads it: login shells of sh and bash (/etc/profile sources
/etc/profile.d/*.sh), and what they start, such as mpirun or srun typed at
an interactive login (Slurm passes the submitting shell's environment on).
What does not: systemd services, cron jobs, containers, non-login shells
(`ssh host command`, so mpirun's remote daemons started over ssh), and any
program whose environment was set before the file changed: a running job
keeps its environment, and a new login is needed to see a change.  A
Slurm task gets the submitting shell's environment and never sources the
compute node's profile.d.  The outputs that do reach jobs are in
knobs/jobenv.py (a Slurm TaskProlog, enroot's environ.d, /etc/environment);
the launcher (mpirun -x, srun --export) is the other way.  The plan says so.

Values are checked against SHELL_VALUE (no blanks, quotes or shell
metacharacters) and single-quoted besides, so the file never runs
anything.  parse() reads `export NAME=VALUE` lines, VALUE bare, in single
quotes or in double quotes without $, ` or \\; the last assignment wins,
as in the shell.  Anything else (a command, an assignment without export)
is keyed by its line, so such a file never equals a profile.

`auto`.  NVSHMEM_HCA_LIST: auto becomes this host's RoCE ports as
dev:port,dev:port (NVSHMEM compares the names exactly:
transport_common.cpp nvshmemt_parse_hca_list, ibrc.cpp strcmp), and
NVSHMEM_IB_GID_INDEX: auto their common RoCE v2 IPv4 GID index, resolved
on the host as NCCL's are (nccl.auto_as).  NVSHMEM uses NVSHMEM_HCA_LIST
only with NVSHMEM_ENABLE_NIC_PE_MAPPING=1 (env_defs.h), which the plan
says when the profile sets one without the other.
"""

from __future__ import annotations

import re
from typing import Dict

from nictune.host.knobs.envfile import OwnedFileFamily, Syntax, auto_schema
from nictune.host.knobs.nccl import auto_as
from nictune.host.validate import NVSHMEM_NAME, SHELL_VALUE

DEFAULT_PATH = "/etc/profile.d/nvshmem.sh"
_EXPORT = re.compile(r"export[ \t]+([A-Za-z_][A-Za-z0-9_]*)="
                     r"(?:'([^']*)'|\"([^\"$`\\]*)\"|([A-Za-z0-9_.,:/+=@%^-]*))[ \t]*")
READERS = ("read by login shells (/etc/profile) and what they start, not by services, cron, "
           "`ssh host command`, Slurm tasks, containers or running jobs: host.slurm_task_prolog, "
           "host.enroot_environ and host.environment reach those (or pass them with the launcher: "
           "mpirun -x, srun --export)")


class ShellSyntax(Syntax):
    what = "NVSHMEM variable"
    family = "nvshmem"
    name_pattern = NVSHMEM_NAME
    value_pattern = SHELL_VALUE

    def line(self, name: str, text: str) -> str:
        return f"export {name}='{text}'\n"

    def parse(self, text: str) -> Dict[str, str]:
        env: dict = {}
        for number, line in enumerate(text.split("\n"), 1):
            stripped = line.strip(" \t")
            if not stripped or stripped.startswith("#"):
                continue
            match = _EXPORT.fullmatch(stripped)
            if match:
                name, *values = match.groups()
                env[name] = next(v for v in values if v is not None)
            else:
                env[f"(line {number}, not an export nictune reads)"] = stripped
        return env


class NvshmemFamily(OwnedFileFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
host:
  nvshmem:
    env: {NVSHMEM_IB_TRAFFIC_CLASS: 106, NVSHMEM_HCA_LIST: auto}
"""
    name = "nvshmem"
    position = 19
    host_sections = ("nvshmem",)
    settings = ("nvshmem.path", "nvshmem.env", "nvshmem.env.NVSHMEM_HCA_LIST",
                "nvshmem.env.NVSHMEM_IB_GID_INDEX", "nvshmem.adopt", "nvshmem.allowed_dirs")
    section = "nvshmem"
    default_path = DEFAULT_PATH
    syntax = ShellSyntax()
    title = ("NVSHMEM's variables, exported by a shell file (NVSHMEM reads only its environment: "
             "login shells read the file, services and running jobs do not).")
    values_description = "NVSHMEM variables such as NVSHMEM_IB_TRAFFIC_CLASS; true and false are written as 1 and 0."
    max_value_length = 256
    auto_properties = auto_schema("NVSHMEM_HCA_LIST", "HCAs NVSHMEM uses (with "
                                  "NVSHMEM_ENABLE_NIC_PE_MAPPING: 1)", "dev:port", SHELL_VALUE, 256,
                                  "NVSHMEM_IB_GID_INDEX", -1)

    def resolve(self, env):
        env, note = auto_as(self, env, "NVSHMEM_HCA_LIST", "NVSHMEM_IB_GID_INDEX")
        notes = [note, READERS]
        mapping = str(env.get("NVSHMEM_ENABLE_NIC_PE_MAPPING", "")).lower()
        if "NVSHMEM_HCA_LIST" in env and mapping not in ("1", "true", "y", "yes"):
            notes.append("NVSHMEM uses NVSHMEM_HCA_LIST only with NVSHMEM_ENABLE_NIC_PE_MAPPING: 1")
        return env, "; ".join(n for n in notes if n)
