"""The one door from nictune's host side to the kernel: `Host.io`.

Knob families and the helpers they call (files.py, rdma.py, health.py,
ibauto.py, machine.py, the netlink classes, ovsdb.py) reach the host only
through these operations, never through `open`, `os` or `socket` of their
own (tests/unit/test_knob_io.py checks host/knobs/).  So the other hosts
are adapters of one small interface, not patches of the process:

- LiveIO (here): the running kernel and file system;
- host/replay/snapshot.py: a recording IO (a LiveIO whose reads are logged into a
  snapshot) and a replaying IO (reads answered from a snapshot);
- host/replay/probe_reads.py: the probe's learning IO (netlink requests, ioctls and
  file reads noted as questions) and its replaying IO (the answers);
- tests/fakes.py: a LiveIO over a temporary root with a fake clock.

The operations are those the families need, at the level the recorders
see them: file reads (open for reading, os_open, stat, lstat, listdir,
scandir, readlink, access, and isdir/isfile/exists/lexists/realpath made
of those, as os.path makes them), the writes (open for writing, mkdir,
rmdir, unlink, replace, mkstemp and the descriptor calls an atomic write
makes), sockets (netlink per protocol, the AF_INET socket SIOCETHTOOL
goes through and the ioctl itself, a unix stream socket for OVSDB), key
files, the page size, the clock the counter source waits on, and running
a vendor tool by argv (mstconfig: the firmware configuration).
"""

from __future__ import annotations

import os
import stat as stat_mod

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional


class LiveIO:
    """The running host.  Adapters subclass it and replace the primitive
    operations; the derived ones (isdir, realpath, makedirs...) are built
    on the primitives, so an adapter sees the same calls os.path makes."""

    # -- file reads -------------------------------------------------------------
    def open(self, path: str, mode: str = "r", *args, **kwargs):
        return open(path, mode, *args, **kwargs)

    def os_open(self, path: str, flags: int, mode: int = 0o777) -> int:
        """A descriptor (host/files.py's owned files, opened without following)."""
        return os.open(path, flags, mode)

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def listdir(self, path: str) -> list:
        return os.listdir(path)

    def scandir(self, path: str):
        return os.scandir(path)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def access(self, path: str, mode: int) -> bool:
        return os.access(path, mode)

    # -- file writes ------------------------------------------------------------
    def mkdir(self, path: str, mode: int = 0o777) -> None:
        os.mkdir(path, mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def mkstemp(self, prefix: str, directory: str) -> tuple:
        """(descriptor, path) of a new temporary file in directory."""
        import tempfile  # only writers pay for it (plan, verify and audit never write)

        return tempfile.mkstemp(prefix=prefix, dir=directory)

    # -- descriptors this IO opened: plain calls on them ---------------------------
    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    def fchown(self, fd: int, uid: int, gid: int) -> None:
        os.fchown(fd, uid, gid)

    def listdir_at(self, dfd: int) -> list:
        return os.listdir(dfd)

    def lstat_at(self, dfd: int, name: str) -> os.stat_result:
        return os.lstat(name, dir_fd=dfd)

    def unlink_at(self, dfd: int, name: str) -> None:
        os.unlink(name, dir_fd=dfd)

    # -- sockets ------------------------------------------------------------------
    def netlink(self, protocol: int):
        """An unbound netlink socket of `protocol` (NetlinkSocket binds it)."""
        import socket  # not at import: a verify of files alone opens none

        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)

    def inet_socket(self):
        """The socket SIOCETHTOOL ioctls go through (netlink/ioctl.py),
        tied to this IO: its ioctls come back to ioctl() below."""
        import socket

        return IoctlSocket(self, socket.socket(socket.AF_INET,
                                               socket.SOCK_DGRAM | socket.SOCK_CLOEXEC))

    def ioctl(self, sock, ifname: str, buf) -> int:
        """SIOCETHTOOL on ifname with buf (an array the kernel fills)."""
        from nictune.host.transports.netlink.ioctl import kernel_siocethtool

        return kernel_siocethtool(sock, ifname, buf)

    def unix_connect(self, path: str, timeout: float):
        """A stream socket connected to the unix socket at path (OVSDB)."""
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return sock

    # -- commands --------------------------------------------------------------------
    def run(self, argv: list, timeout: float) -> tuple:
        """(exit status, stdout, stderr) of a vendor tool run with `argv` (a
        list, never a shell string; stdin /dev/null), for the settings no
        kernel interface offers (knobs/firmware.py: mstconfig).
        FileNotFoundError when the program is not installed; OSError
        (ETIMEDOUT) when it runs past `timeout` (it is killed)."""
        import subprocess

        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            import errno

            raise OSError(errno.ETIMEDOUT, f"{argv[0]} did not finish in {timeout:g} s") from None
        return (proc.returncode, proc.stdout[:1 << 20].decode("utf-8", "replace"),
                proc.stderr[:1 << 16].decode("utf-8", "replace"))

    # -- key files, page size, clock -------------------------------------------------
    def key_load(self, path: str, length: Optional[int] = None, uid: int = 0) -> tuple:
        """(key, fingerprint) of a key file (host/transports/keyfile.py)."""
        from nictune.host.transports import keyfile

        return keyfile.load(path, length, uid)

    def page_size(self) -> int:
        return os.sysconf("SC_PAGE_SIZE")

    def now(self) -> float:
        import time

        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        import time

        time.sleep(seconds)

    # -- derived: as os.path makes them of the primitives ------------------------------
    def isdir(self, path: str) -> bool:
        return self._mode_is(self.stat, path, stat_mod.S_ISDIR)

    def isfile(self, path: str) -> bool:
        return self._mode_is(self.stat, path, stat_mod.S_ISREG)

    def exists(self, path: str) -> bool:
        return self._mode_is(self.stat, path, None)

    def lexists(self, path: str) -> bool:
        return self._mode_is(self.lstat, path, None)

    @staticmethod
    def _mode_is(get, path: str, test) -> bool:
        try:
            st = get(path)
        except (OSError, ValueError):
            return False
        return test is None or test(st.st_mode)

    def realpath(self, path: str) -> str:
        """os.path.realpath, each component through lstat/readlink here."""
        resolved, _ = self._join_real("", path, {})
        return os.path.abspath(resolved)

    def _join_real(self, path: str, rest: str, seen: dict) -> tuple:
        # posixpath._joinrealpath (CPython 3.11), non-strict.
        if os.path.isabs(rest):
            rest, path = rest[1:], "/"
        while rest:
            name, _, rest = rest.partition("/")
            if not name or name == ".":
                continue
            if name == "..":
                if path:
                    path, name = os.path.split(path)
                    if name == "..":
                        path = os.path.join(path, "..", "..")
                else:
                    path = ".."
                continue
            newpath = os.path.join(path, name)
            try:
                is_link = stat_mod.S_ISLNK(self.lstat(newpath).st_mode)
            except OSError:
                is_link = False
            if not is_link:
                path = newpath
                continue
            if newpath in seen:
                path = seen[newpath]
                if path is not None:
                    continue
                return os.path.join(newpath, rest), False  # a symlink loop
            seen[newpath] = None
            path, ok = self._join_real(path, self.readlink(newpath), seen)
            if not ok:
                return os.path.join(path, rest), False
            seen[newpath] = path
        return path, True

    def makedirs(self, path: str, mode: int = 0o777) -> None:
        """os.makedirs(path, mode, exist_ok=True) through mkdir here."""
        head, tail = os.path.split(path)
        if not tail:
            head, tail = os.path.split(head)
        if head and tail and not self.exists(head):
            self.makedirs(head, mode)
        try:
            self.mkdir(path, mode)
        except OSError:
            if not self.isdir(path):
                raise

    def read_text(self, path: str) -> str:
        with self.open(path) as f:
            return f.read()

    def write_text(self, path: str, text: str) -> None:
        """A sysfs/procfs write: one write of the whole value."""
        with self.open(path, "w") as f:
            f.write(text)


class IoctlSocket:
    """An AF_INET socket whose SIOCETHTOOL calls go to the IO that made it
    (netlink/ioctl.py siocethtool), so an adapter sees each one."""

    def __init__(self, io: LiveIO, sock):
        self.io, self.sock = io, sock

    def siocethtool(self, ifname: str, buf) -> int:
        return self.io.ioctl(self.sock, ifname, buf)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()


LIVE = LiveIO()
W_OK = os.W_OK  # for access(): families import no os of their own
