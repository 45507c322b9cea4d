"""Checks for every user-supplied string that reaches the system.

The JSON Schema (controller side) uses these same patterns, and the host
side checks again before touching anything: a request may come from
anywhere.  WORDS says what each pattern accepts, for the schema's
descriptions and error messages.
"""

from __future__ import annotations

import os
import re

from nictune.host.errors import InvalidInput

# Kernel rule (dev_valid_name): 1..15 bytes, not "." or "..", no "/", ":" or
# whitespace.  We also refuse shell and glob metacharacters outright.
IFNAME = r"^(?!\.{1,2}$)[A-Za-z0-9_.@-]{1,15}$"
# A glob over interface names: the same alphabet plus * ? [ ] !.
IFGLOB = r"^[A-Za-z0-9_.@*?\[\]!-]{1,64}$"
# Host-level sysctls: dotted names under net., no empty or dot-dot parts.
SYSCTL_KEY = r"^net(\.[A-Za-z0-9_-]+){1,6}$"
# Per-interface sysctls are named relative to net.<family>.conf.<ifname>.
IF_SYSCTL_KEY = r"^ipv[46]\.[A-Za-z0-9_-]{1,64}$"
# A sysctl value: numbers, words and the separators multi-value keys use.
SYSCTL_VALUE = r"^[A-Za-z0-9_ \t.,:/+-]{0,256}$"
# NCCL exports every name its file sets (src/misc/param.cc setEnvFile);
# nictune takes NCCL_* and the CUDA_* ones images put there (azhpc-images
# sets CUDA_DEVICE_ORDER in /etc/nccl.conf), never LD_* and the like.
NCCL_NAME = r"^(NCCL|CUDA)_[A-Z0-9_]{1,64}$"
# The values of the owned files (knobs/envfile.py): text that their reader
# and a POSIX shell alike take literally.  NCCL (nccl.conf: NAME=VALUE,
# nothing trimmed), UCX (inih: blanks trimmed, ';' and '#' comments) and
# Open MPI (keyval_lex.l: the rest of the line, quotes kept) cannot quote
# a value, and their NAME=VALUE lines are what job scripts source
# (`set -a; . /etc/nccl.conf`): so no blank, quote, '$', '`', ';', '&',
# '|', '<', '>', '(', ')', '\\', '#', '~', '*', '?', '[', '{', '!' and no
# control character, only letters, digits and _ . , : / + = @ % ^ -.
# NCCL reads lines of at most 1023 bytes.
NCCL_VALUE = r"^[A-Za-z0-9_.,:/+=@%^-]{0,900}$"
FEATURE_NAME = r"^[a-z0-9_-]{1,64}$"
# UCX's ucx.conf (knobs/ucx.py): inih lines of at most 199 bytes: the
# literal characters of NCCL_VALUE, short enough that UCX_NAME=VALUE fits.
UCX_NAME = r"^UCX_[A-Z0-9_]{1,60}$"
UCX_VALUE = r"^[A-Za-z0-9_.,:/+=@%^-]{0,128}$"
# Open MPI's openmpi-mca-params.conf (knobs/mpi.py): MCA parameter names as
# the file spells them, without the OMPI_MCA_ prefix of the environment;
# values take NCCL_VALUE.  A name is a shell identifier as well, so that
# the name=value lines nictune writes only assign, even to a shell.
MCA_NAME = r"^[a-z][a-z0-9_]{0,127}$"
# NVSHMEM's variables, exported by a shell file (knobs/nvshmem.py): values
# without blanks, quotes or any shell metacharacter, so that nothing in
# them is ever interpreted, even outside the quotes nictune puts them in.
NVSHMEM_NAME = r"^NVSHMEM_[A-Z0-9_]{1,60}$"
SHELL_VALUE = r"^[A-Za-z0-9_.,:/+=@%^-]{0,256}$"
# The variables nictune delivers to jobs (knobs/jobenv.py: a Slurm TaskProlog,
# enroot's environ.d, /etc/environment): those of the libraries it tunes
# and nothing else (never PATH, LD_*, HOME...), which every job on the node
# would get.  Open MPI's and PMIx's MCA names are lower case after the
# prefix.  Values take SHELL_VALUE: the TaskProlog's lines pass through a
# shell (in single quotes) and slurmd, pam_env and enroot take them
# literally.
JOB_ENV_NAME = r"^(NCCL_[A-Z0-9_]{1,64}|CUDA_[A-Z0-9_]{1,64}|UCX_[A-Z0-9_]{1,60}|NVSHMEM_[A-Z0-9_]{1,60}|UCC_[A-Z0-9_]{1,60}|OMPI_MCA_[a-z][a-z0-9_]{0,63}|PMIX_MCA_[a-z][a-z0-9_]{0,63})$"
# A file enroot binds into its containers (knobs/jobenv.py, mounts.d): a
# plain absolute path, no blank (an fstab field) and no ',' (an option).
MOUNT_PATH = r"^/[A-Za-z0-9_./+-]{1,255}$"
MAC = r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$"
PCI_ID = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$"
DRIVER = r"^[A-Za-z0-9_-]{1,32}$"
# A name under /run/netns: "." and ".." would leave that directory.
NETNS = r"^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,64}$"
# An apply's id, as its journal record and its history copy's name have it
# (transaction/journal.py _RECORD_ID).
APPLY_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
ABS_PATH = r"^/[A-Za-z0-9_./+-]{0,255}$"
# A file nictune owns (host.nccl.path) and a directory a profile lets it be
# in: ABS_PATH, but never in the kernel's pseudo-filesystems or runtime
# state, and a directory is never "/" (which holds them).
OWNED_PATH = r"^(?!/(proc|sys|dev|run)(/|$))/[A-Za-z0-9_./+-]{0,255}$"
OWNED_DIR = r"^(?!/(proc|sys|dev|run)(/|$))/[A-Za-z0-9_./+-]{1,255}$"
# What check_path() refuses beyond ABS_PATH ('.' or '..' parts, '//', a
# trailing '/'), as a pattern, so that the schema and editors enforce it too.
NOT_NORMALISED = r"(^|/)\.\.?(/|$)|//|/$"
# A counter as ethtool -S or an RDMA port's hw_counters names it.
COUNTER_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
# An optional comparison and a dotted numeric version: ">=28.39", "28.39.1002".
VERSION_WANT = r"^(==|>=|<=|>|<)?[0-9]{1,9}(\.[0-9]{1,9}){0,7}$"
# An RDMA device name as /sys/class/infiniband lists it ("." and ".." are
# directory entries, not devices).
IBDEV = r"^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,64}$"
# A DCQCN parameter: a file name under /sys/class/net/<if>/ecn/roce_{np,rp}/.
ECN_PARAM = r"^[a-z][a-z0-9_]{0,63}$"
DSCP = r"^(6[0-3]|[1-5]?[0-9])$"
# A devlink param of a device (devlink dev param), and a string value of one
# (DEVLINK_PARAM_MAX_STRING_VALUE is 32 bytes with the NUL).
DEVLINK_PARAM = r"^[a-z][a-z0-9_]{0,47}$"
DEVLINK_PARAM_VALUE = r"^[A-Za-z0-9_.-]{1,31}$"

# What each pattern accepts, in the words of error messages.  Looked up by
# the pattern's text, so two meanings never share one pattern.
WORDS = {
    IFNAME: "an interface name: 1-15 letters, digits, '_', '.', '@' or '-'",
    IFGLOB: "an interface name or glob: 1-64 letters, digits, '_', '.', '@', '-' or the glob characters * ? [ ] !",
    SYSCTL_KEY: "a sysctl name under net. such as net.ipv4.tcp_ecn: 2 to 7 parts of letters, digits, '_' or '-' joined by dots",
    IF_SYSCTL_KEY: "a per-interface sysctl name such as ipv4.rp_filter: ipv4. or ipv6. and then 1-64 letters, digits, '_' or '-'",
    SYSCTL_VALUE: "text of up to 256 letters, digits, spaces, tabs and _ . , : / + -",
    NCCL_NAME: "an NCCL variable name: NCCL_ (or CUDA_) and then 1-64 capital letters, digits or '_'",
    NCCL_VALUE: "up to 900 letters, digits and _ . , : / + = @ % ^ -: no blanks, quotes or shell metacharacters, which NCCL would take literally but a shell sourcing the file would not",
    UCX_NAME: "a UCX variable name: UCX_ and then 1-60 capital letters, digits or '_'",
    UCX_VALUE: "up to 128 letters, digits and _ . , : / + = @ % ^ -: no blanks, quotes, ';' or other shell metacharacters",
    MCA_NAME: "an Open MPI MCA parameter name as its file spells it, without the OMPI_MCA_ prefix: a lowercase letter and then up to 127 lowercase letters, digits or '_'",
    NVSHMEM_NAME: "an NVSHMEM variable name: NVSHMEM_ and then 1-60 capital letters, digits or '_'",
    SHELL_VALUE: "up to 256 letters, digits and _ . , : / + = @ % ^ -: no blanks, quotes or shell metacharacters",
    FEATURE_NAME: "an ethtool feature name: 1-64 lowercase letters, digits, '_' or '-'",
    MAC: "a MAC address such as 0c:42:a1:00:00:01",
    PCI_ID: "a PCI vendor:device id such as 15b3:1021",
    DRIVER: "a driver name: 1-32 letters, digits, '_' or '-'",
    ABS_PATH: "an absolute, normalised path: '/' and then up to 255 letters, digits and _ . / + -, with no '.' or '..' parts, no '//' and no trailing '/'",
    OWNED_PATH: "an absolute, normalised path outside /proc, /sys, /dev and /run: '/' and then up to 255 letters, digits and _ . / + -, with no '.' or '..' parts, no '//' and no trailing '/'",
    JOB_ENV_NAME: "a variable of the tuned libraries: NCCL_, CUDA_, UCX_, NVSHMEM_ or UCC_ and then capital letters, digits or '_', or OMPI_MCA_ or PMIX_MCA_ and then a lower-case name",
    MOUNT_PATH: "an absolute path: '/' and then 1-255 letters, digits and _ . / + - (no blank, no ',')",
    OWNED_DIR: "an absolute, normalised directory outside /proc, /sys, /dev and /run, not '/' itself: '/' and then 1-255 letters, digits and _ . / + -, with no '.' or '..' parts, no '//' and no trailing '/'",
    VERSION_WANT: "a dotted version such as 28.39.1002, optionally after ==, >=, <=, > or <",
    COUNTER_NAME: "a counter name: 1-64 letters, digits, '_', '.' or '-'",
    DSCP: "a DSCP value from 0 to 63",
    ECN_PARAM: "a DCQCN parameter name as the driver's ecn directory names it: a lowercase letter and then up to 63 lowercase letters, digits or '_'",
    DEVLINK_PARAM: "a devlink param name such as total_vfs: a lowercase letter and then up to 47 lowercase letters, digits or '_'",
    DEVLINK_PARAM_VALUE: "a devlink param's string value: 1-31 letters, digits, '_', '.' or '-'",
    IBDEV: "an RDMA device name such as mlx5_0: 1-64 letters, digits, '_', '.' or '-' (not . or ..)",
}

_compiled: dict = {}


def matches(pattern: str, value: object) -> bool:
    if not isinstance(value, str):
        return False
    rx = _compiled.get(pattern)
    if rx is None:
        rx = _compiled[pattern] = re.compile(pattern)
    return rx.fullmatch(value) is not None and "\n" not in value


def check(pattern: str, value: object, what: str) -> str:
    if not matches(pattern, value):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise InvalidInput(f"invalid {what}: {shown}")
    return value  # type: ignore[return-value]


def check_path(value: object, what: str = "path") -> str:
    """An absolute, already-normalised path with no '..' part."""
    path = check(ABS_PATH, value, what)
    if os.path.normpath(path) != path or "/../" in path + "/" or path.endswith("/"):
        raise InvalidInput(f"invalid {what}: {path!r} must be absolute and normalised")
    return path


# The kernel's pseudo-filesystems and runtime state: an owned file is never
# in them, whatever a profile says, and a path that resolves into them
# (through a symlinked directory) is refused on the host.
KERNEL_DIRS = ("/proc", "/sys", "/dev", "/run")
# Paths whose content some program runs or obeys as root: a shell, the
# dynamic loader, cron, sudo, PAM, sshd, systemd and init, udev, modprobe,
# package managers, the boot loader.  An owned file is never at or below
# one of them, whatever a profile says (except a family's own conventional
# file, NVSHMEM's /etc/profile.d/nvshmem.sh), checked on the path as
# written and again, on the host, on the path with symlinks resolved.
# A name ending in '*' stands for every name that starts so (/etc/cron*:
# /etc/crontab, /etc/cron.d, /etc/cron.daily...).  This list backs up the
# positive rule (a family's own path, or a directory the profile lists),
# which does most of the work.
READERS = (
    ("login and interactive shells read it as commands",
     ("/etc/profile", "/etc/profile.d", "/etc/bash*", "/etc/zsh*", "/etc/zprofile", "/etc/zlogin",
      "/etc/zlogout", "/etc/csh*", "/etc/ksh*", "/etc/fish", "/etc/environment",
      "/etc/environment.d", "/etc/skel", "/etc/inputrc", "/etc/X11", "/etc/xdg",
      "/etc/update-motd.d", "/root", "/home")),
    ("the dynamic loader reads it (preloads and library paths)",
     ("/etc/ld.so*", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin",
      "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local/bin",
      "/usr/local/sbin", "/usr/local/lib", "/usr/local/lib64", "/etc/python*")),
    ("cron and at run what it says",
     ("/etc/cron*", "/etc/anacrontab", "/etc/at.allow", "/etc/at.deny", "/var/spool")),
    ("sudo, PAM, polkit or sshd read it to decide who may do what",
     ("/etc/sudo*", "/etc/doas.conf", "/etc/polkit-1", "/etc/security", "/etc/pam.d",
      "/etc/pam.conf", "/etc/ssh", "/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow",
      "/etc/subuid", "/etc/subgid", "/etc/nsswitch.conf", "/etc/login.defs", "/etc/securetty",
      "/etc/selinux", "/etc/apparmor*", "/etc/audit", "/etc/ssl", "/etc/pki",
      "/etc/ca-certificates*")),
    ("systemd, init, udev or the kernel's loaders run or obey it at boot and on events",
     ("/etc/systemd", "/etc/init.d", "/etc/init", "/etc/rc*", "/etc/inittab", "/etc/xinetd*",
      "/etc/tmpfiles.d", "/etc/binfmt.d", "/etc/modules", "/etc/modules-load.d", "/etc/modprobe*",
      "/etc/sysctl*", "/etc/udev", "/etc/default", "/etc/sysconfig", "/etc/network",
      "/etc/NetworkManager", "/etc/netplan", "/etc/dhcp", "/etc/ppp", "/etc/acpi", "/etc/kernel",
      "/etc/initramfs-tools", "/etc/dracut*", "/etc/grub*", "/boot", "/etc/rsyslog*",
      "/etc/logrotate*", "/etc/netns", "/var/lib/systemd")),
    ("Slurm's daemons or enroot run what it names, for every job on the node",
     ("/etc/slurm", "/etc/slurm-llnl", "/etc/enroot")),
    ("package managers and other tools run commands it names",
     ("/etc/apt", "/etc/yum*", "/etc/dnf", "/etc/zypp", "/etc/gitconfig", "/etc/vim",
      "/etc/needrestart", "/etc/containers", "/etc/docker")),
)
# Directories too broad to list in allowed_dirs: name the directory the
# program reads its file from (/opt/hpcx/ucx/etc), not a whole tree.
BROAD_DIRS = ("/etc", "/usr", "/usr/local", "/usr/share", "/usr/local/share", "/var", "/var/lib",
              "/opt", "/srv", "/mnt", "/media", "/tmp", "/var/tmp")


def within(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or below it (both normalised)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _under(path: str, entry: str) -> bool:
    if not entry.endswith("*"):
        return within(path, entry)
    parent, _, stem = entry[:-1].rpartition("/")
    rest = path[len(parent) + 1:] if path.startswith(parent + "/") else ""
    return rest.split("/")[0].startswith(stem) if rest else False


def reader_of(path: str) -> str:
    """Why a program would run or obey what `path` says ("" if none we
    know of): `path` is at or below one of READERS."""
    for why, entries in READERS:
        for entry in entries:
            if _under(path, entry):
                return f"{entry.rstrip('*') + ('...' if entry.endswith('*') else '')}: {why}"
    return ""


def check_owned_path(path: object, own: str, extra_dirs: list, what: str) -> str:
    """A path a family may write: normalised, outside KERNEL_DIRS, never
    where READERS are (unless it is `own`, the family's conventional
    path), and either `own` or below one of `extra_dirs` (the profile's
    allowed_dirs, already checked with check_owned_dir)."""
    path = check_path(check(OWNED_PATH, path, what), what)
    reader = reader_of(path)
    if reader and path != own:
        raise InvalidInput(f"invalid {what}: nictune never writes {path!r} ({reader})")
    if path != own and not any(within(os.path.dirname(path), d) for d in extra_dirs):
        dirs = f"nor below {', '.join(extra_dirs)}" if extra_dirs else "and the profile lists no allowed_dirs"
        raise InvalidInput(f"invalid {what}: {path!r} is not this file's own path {own} {dirs}; "
                           "a profile names the directories of other paths in allowed_dirs")
    return path


def check_owned_dir(value: object, what: str) -> str:
    """A directory a profile lets a family's file be in: normalised, not
    a whole system tree (BROAD_DIRS), not where READERS are."""
    path = check_path(check(OWNED_DIR, value, what), what)
    if path in BROAD_DIRS:
        raise InvalidInput(f"invalid {what}: {path!r} is a whole system tree; name the directory the "
                           "program reads its file from (such as /opt/hpcx/ucx/etc)")
    reader = reader_of(path)
    if reader:
        raise InvalidInput(f"invalid {what}: nictune never writes below {path!r} ({reader})")
    return path
