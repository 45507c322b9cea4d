"""Outputs that reach jobs: the NCCL, UCX and NVSHMEM settings where the
processes of a training job actually start, each a file nictune owns whole
(the rules all owned files share are in knobs/envfile.py), and one block of
lines in /etc/environment.

Why.  /etc/nccl.conf and /etc/ucx/ucx.conf are read by the library itself,
so a job that runs on the host sees them; a job in a container does not
(NGC images bring their own UCX under /opt/hpcx, and the host's /etc is
not the container's).  /etc/profile.d (knobs/nvshmem.py) is read by login
shells only: a Slurm task inherits the submitting shell's environment and
never sources a compute node's profile.d, `ssh host command` starts no
login shell, and containers see neither.  NVSHMEM reads only its
environment.  So:

  host.slurm_task_prolog  /etc/slurm/nictune-task-prolog.sh, a script
      printing `export NAME=VALUE` lines.  slurmstepd runs slurm.conf's
      TaskProlog as the job's user before every task and sets each such
      line in the task's environment, taking the value literally
      (src/slurmd/slurmstepd/task.c _proc_stdout; the script is run with
      execve, so it needs its "#!" line and the x bits: 0755).  nictune
      never edits slurm.conf: point TaskProlog= at this file, or call it
      from the site's own TaskProlog (its stdout is the lines to pass on).
      Reaches: every Slurm task on the node (batch scripts and srun steps),
      whatever environment the job brought from the submit host.
  host.enroot_environ  /etc/enroot/environ.d/90-nictune.env, NAME=VALUE
      lines that enroot adds to every container's environment when it
      starts one (ENROOT_SYSCONF_PATH/environ.d/*.env, merged with the
      image's /etc/environment).  Reaches: enroot containers, pyxis's
      (srun --container-image) among them.
  host.enroot_mounts  /etc/enroot/mounts.d/90-nictune.fstab, fstab lines
      binding host files into every container enroot starts, read-only,
      created if the image lacks them, skipped where the host lacks them
      (enroot's own conf/mounts/20-config.fstab options, and nofail).
      Mounting /etc/nccl.conf lets NCCL in the container read the file
      nictune keeps on the host.  Reaches: enroot and pyxis containers.
  host.environment  nictune's own lines at the end of /etc/environment,
      between a header line and an end line.  pam_env reads the file for
      every PAM session: ssh logins and `ssh host command` (so the
      daemons mpirun starts over ssh), su, console logins.  Not Slurm
      tasks (unless slurm.conf's UsePAM runs pam_env), containers,
      services or sessions already open.  The file is the system's: the
      rest of it is someone else's, never read into a report, never
      replaced; only the block is nictune's, and a rollback removes or
      restores the block alone.  adopt is not needed, but in a network
      namespace: there nictune writes the namespace's own
      /etc/netns/NS/environment, which ip netns exec binds over the whole
      of the host's file (envfile.py), hiding its lines from the
      namespace's programs, so creating it takes adopt: true.
      pam_env takes the last assignment of a name, and the block is
      written last, so its values win over the file's own lines.

The plan says which jobs each output reaches (REACHES, in every note).

Names and values.  Only the libraries' variables (validate.JOB_ENV_NAME:
NCCL_, CUDA_, UCX_, NVSHMEM_, UCC_, OMPI_MCA_, PMIX_MCA_; never PATH, LD_*
or HOME, which every job on the node would get), with values of
validate.SHELL_VALUE: no blank, quote, '$', '\\' or other shell
metacharacter.  So the TaskProlog's single-quoted printf arguments print
them as they are, and slurmd, enroot and pam_env (which take a value
literally, or expand only '$') read what the profile says.  `auto` is not
taken here: a job sees these values as written, and an `auto` resolved
once would go stale unseen; host.nccl's file resolves them on every plan,
and enroot_mounts carries that file into containers.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Tuple

from nictune.host.errors import InvalidInput
from nictune.host.files import UnsafeFile, read_owned, remove_owned, write_owned
from nictune.host.knobs.envfile import AUTO, SHEBANG, OwnedFileFamily, Syntax
from nictune.host.model import Unsupported
from nictune.host.validate import (JOB_ENV_NAME, KERNEL_DIRS, MOUNT_PATH, SHELL_VALUE, check_path,
                                   reader_of, within)

# What each output reaches, said in the plan's note of its file.
REACHES = {
    "slurm_task_prolog": (
        "reaches every Slurm task on this node once slurm.conf's TaskProlog names this file "
        "(nictune never edits slurm.conf; a site TaskProlog may run it and pass its output on): "
        "slurmstepd sets its export lines in each task's environment"),
    "enroot_environ": (
        "reaches every enroot container started on this node, pyxis's (srun --container-image) "
        "among them; not jobs outside containers"),
    "enroot_mounts": (
        "binds these host files into every enroot container started on this node (pyxis's among "
        "them), read-only; a container already running keeps what it had"),
    "environment": (
        "reaches every PAM session that runs pam_env: ssh logins and `ssh host command` (so the "
        "daemons mpirun starts over ssh), su and console logins; not Slurm tasks (unless "
        "slurm.conf's UsePAM runs pam_env), containers, services or sessions already open"),
}


def _keyed_line(number: int, line: str) -> tuple:
    """A line no reader takes as a setting of ours: keyed by itself, so a
    file holding one never equals a profile."""
    return f"(line {number}, not a setting nictune writes)", line


class JobEnvSyntax(Syntax):
    """NAME=VALUE lines ('#' comments): enroot's environ.d and
    /etc/environment (pam_env) alike."""

    what = "job variable"
    name_pattern = JOB_ENV_NAME
    value_pattern = SHELL_VALUE

    def __init__(self, family: str):
        self.family = family

    def line(self, name: str, text: str) -> str:
        return f"{name}={text}\n"

    def setting(self, line: str) -> Optional[Tuple[str, str]]:
        """(name, value) of a line that sets a variable, else None."""
        name, sep, value = line.partition("=")
        return (name, value) if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else None

    def parse(self, text: str) -> Dict[str, str]:
        env: dict = {}
        for number, line in enumerate(text.split("\n"), 1):
            stripped = line.strip(" \t")
            if not stripped or stripped.startswith("#"):
                continue
            found = self.setting(stripped)
            if found:
                env[found[0]] = found[1]  # the last assignment wins (pam_env, enroot, slurmstepd)
            else:
                key, line_text = _keyed_line(number, stripped)
                env[key] = line_text
        return env


# printf, not echo: dash's echo would interpret a backslash (none can be
# in a value, but printf '%s' never interprets anything).
_PRINTF = re.compile(r"printf '%s\\n' 'export ([A-Za-z_][A-Za-z0-9_]*)=([^']*)'")


class TaskPrologSyntax(JobEnvSyntax):
    """A shell script whose output is `export NAME=VALUE` lines, as
    slurmstepd reads a TaskProlog's stdout."""

    preamble = SHEBANG

    def line(self, name: str, text: str) -> str:
        return f"printf '%s\\n' 'export {name}={text}'\n"

    def setting(self, line: str) -> Optional[Tuple[str, str]]:
        match = _PRINTF.fullmatch(line)
        return (match.group(1), match.group(2)) if match else None


# enroot's own options for the host files it binds (conf/mounts/20-config.fstab),
# and nofail: a host without the file still starts its containers.
MOUNT_OPTIONS = "x-create=file,bind,ro,nosuid,nodev,noexec,nofail"


class MountsSyntax(Syntax):
    """fstab lines `SOURCE TARGET none OPTIONS`: setting name the path in
    the container, value the host file bound there."""

    what = "container path"
    family = "enroot_mounts"
    name_pattern = MOUNT_PATH
    value_pattern = MOUNT_PATH

    def line(self, name: str, text: str) -> str:
        check_path(name, "container path")
        check_path(text, f"host file bound at {name}")
        for path in (name, text):
            if any(within(path, d) for d in KERNEL_DIRS):
                raise InvalidInput(f"invalid mount {text} -> {name}: {path} is the kernel's "
                                   "(/proc, /sys, /dev, /run), never bound by nictune")
        why = reader_of(text)
        if why:  # /etc/shadow, /etc/ssh...: never handed to every job's container
            raise InvalidInput(f"invalid mount {text} -> {name}: nictune never binds {text} into "
                               f"containers ({why})")
        return f"{text} {name} none {MOUNT_OPTIONS}\n"

    def parse(self, text: str) -> Dict[str, str]:
        env: dict = {}
        for number, line in enumerate(text.split("\n"), 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) == 4 and fields[2:] == ["none", MOUNT_OPTIONS]:
                env[fields[1]] = fields[0]
            else:
                key, line_text = _keyed_line(number, " ".join(fields))
                env[key] = line_text
        return env


class _JobOutput(OwnedFileFamily):
    """An owned file that reaches jobs: its plan note says which."""

    position_note = ("with the other owned files, before any device setting: a file cannot cut "
                     "the management path")
    max_value_length = 256

    absent_hint: str = ""  # what a missing directory says about the host

    def resolve(self, env):
        autos = [name for name, value in env.items() if value == AUTO]
        if autos:  # written as is, the library would read the word "auto"
            raise InvalidInput(
                f"{', '.join(autos)}: auto is resolved only in the libraries' own files (host.nccl, "
                f"host.ucx, host.nvshmem), on every plan; host.{self.section} gives jobs values "
                "as written, so write the value (or bind host.nccl's file with enroot_mounts)")
        return env, REACHES[self.section]

    def _absent(self, key, place):
        absent = super()._absent(key, place)
        if isinstance(absent, Unsupported) and self.absent_hint and not place.netns:
            return Unsupported(f"{absent.reason} ({self.absent_hint})")
        return absent


class SlurmTaskPrologFamily(_JobOutput):
    example = """\
host:
  slurm_task_prolog:
    env: {NVSHMEM_IB_TRAFFIC_CLASS: 106, UCX_IB_TRAFFIC_CLASS: 106}
"""
    position = 13
    name = "slurm_task_prolog"
    host_sections = ("slurm_task_prolog",)
    settings = ("slurm_task_prolog.path", "slurm_task_prolog.env", "slurm_task_prolog.adopt",
                "slurm_task_prolog.allowed_dirs")
    section = "slurm_task_prolog"
    default_path = "/etc/slurm/nictune-task-prolog.sh"
    syntax = TaskPrologSyntax("slurm_task_prolog")
    new_file_mode = 0o755  # slurmstepd checks R_OK|X_OK and execve()s it as the job's user
    absent_hint = "Slurm is not installed here"
    title = ("A Slurm TaskProlog script printing `export NAME=VALUE` for every task on the node "
             "(point slurm.conf's TaskProlog at it; nictune never edits slurm.conf).")
    values_description = ("Variables of NCCL, CUDA, UCX, NVSHMEM, UCC or Open MPI/PMIx MCA "
                          "(OMPI_MCA_, PMIX_MCA_) every Slurm task gets; true and false are "
                          "written as 1 and 0.")


class EnrootEnvironFamily(_JobOutput):
    example = """\
host:
  enroot_environ:
    env: {NCCL_IB_TC: 106, UCX_IB_TRAFFIC_CLASS: 106}
"""
    position = 14
    name = "enroot_environ"
    host_sections = ("enroot_environ",)
    settings = ("enroot_environ.path", "enroot_environ.env", "enroot_environ.adopt",
                "enroot_environ.allowed_dirs")
    section = "enroot_environ"
    default_path = "/etc/enroot/environ.d/90-nictune.env"
    syntax = JobEnvSyntax("enroot_environ")
    absent_hint = "enroot is not installed here"
    title = "Variables enroot adds to every container it starts (environ.d: pyxis's containers too)."
    values_description = SlurmTaskPrologFamily.values_description.replace(
        "every Slurm task gets", "every enroot container gets")


class EnrootMountsFamily(_JobOutput):
    example = """\
host:
  enroot_mounts:
    mounts: {/etc/nccl.conf: /etc/nccl.conf}
"""
    position = 20  # after host.nccl (12), whose file it binds
    name = "enroot_mounts"
    host_sections = ("enroot_mounts",)
    settings = ("enroot_mounts.path", "enroot_mounts.mounts", "enroot_mounts.adopt",
                "enroot_mounts.allowed_dirs")
    section = "enroot_mounts"
    values_key = "mounts"
    default_path = "/etc/enroot/mounts.d/90-nictune.fstab"
    syntax = MountsSyntax()
    absent_hint = "enroot is not installed here"
    title = ("Host files enroot binds, read-only, into every container it starts (mounts.d): "
             "/etc/nccl.conf, which containers do not see otherwise.")
    values_description = ("Path in the container -> host file bound there (read-only, created in "
                          "the container if absent, skipped when the host has no such file).")


# /etc/environment: nictune's block, from its header line to END_LINE.
END_LINE = "# End of nictune's lines.\n"


class BlockSyntax(JobEnvSyntax):
    """JobEnvSyntax's lines, closed by END_LINE (a comment to pam_env)."""

    def render(self, env: dict) -> str:
        return super().render(env) + END_LINE


class EnvironmentFamily(_JobOutput):
    """nictune's lines in /etc/environment (see the module docstring): the
    key's value is the block, never the rest of the file."""

    example = """\
host:
  environment:
    env: {UCX_IB_TRAFFIC_CLASS: 106, NVSHMEM_IB_TRAFFIC_CLASS: 106}
"""
    position = 16
    name = "environment"
    host_sections = ("environment",)
    settings = ("environment.path", "environment.env", "environment.adopt",
                "environment.allowed_dirs")
    section = "environment"
    default_path = "/etc/environment"
    syntax = BlockSyntax("environment")
    title = ("nictune's lines at the end of /etc/environment (pam_env: ssh sessions, so "
             "mpirun's remote daemons); the rest of the file is left as it is.")
    values_description = SlurmTaskPrologFamily.values_description.replace(
        "every Slurm task gets", "every PAM session gets")

    def _read(self, key):
        self._created.pop(key, None)
        self._hides.pop(key, None)
        place = self._place(key)
        self._check_directory(key, place)
        data = read_owned(place.file, place.shown, io=self.host.io)
        if data is None:
            self._text[key] = None
            return self._absent(key, place)
        text = self._decoded(data, place)
        block = split_block(text, self.syntax.header)[1]
        self._text[key] = block
        return block  # nictune's own lines ("" for none): never the rest

    def _decoded(self, data: bytes, place) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise UnsafeFile(f"{place.shown} is not UTF-8 text, so not an environment file") from None

    def apply(self, items):
        for key, block in items:
            place = self._place(key)
            self._check_directory(key, place)
            data = read_owned(place.file, place.shown, io=self.host.io)
            others = "" if data is None else "".join(split_block(self._decoded(data, place),
                                                                 self.syntax.header)[::2])
            if block is None and not others.strip():  # back to "there was no file"
                remove_owned(place.file, place.shown, io=self.host.io)
                continue
            if others and not others.endswith("\n"):
                others += "\n"
            if place.creatable:  # /etc/netns/NAME (envfile.py: the namespace's own file)
                self.host.io.makedirs(os.path.dirname(place.file), mode=0o755)
            write_owned(place.file, others + (block or ""), place.shown,
                        keep_inode=bool(place.netns), io=self.host.io)


def split_block(text: str, header: str) -> tuple:
    """(before, block, after) of a file holding nictune's block: from the
    header line to END_LINE (or to the end of the file, when the end line
    was lost).  No block: (text, "", "")."""
    lines = text.splitlines(keepends=True)
    if header not in lines:
        return text, "", ""
    start = lines.index(header)
    end = next((i for i in range(start + 1, len(lines)) if lines[i] == END_LINE), len(lines) - 1)
    return "".join(lines[:start]), "".join(lines[start:end + 1]), "".join(lines[end + 1:])


def task_prolog_exports(output: str) -> Dict[str, str]:
    """What slurmstepd sets from a TaskProlog's stdout (src/slurmd/slurmstepd/
    task.c _proc_stdout): each "export NAME=value" line, the name trimmed,
    the value taken literally to the end of the line."""
    env: dict = {}
    for line in output.split("\n"):
        if line.startswith("export "):
            name, sep, value = line[7:].lstrip().partition("=")
            if sep and name.strip():
                env[name.strip()] = value
    return env
