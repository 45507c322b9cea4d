"""Commands on hosts over SSH for the traffic gate (control/rollout/gate/):
bounded in time, quoted, and cleaned up.

One Session per host and gate run: one paramiko connection (ssh._open,
so inventory variables, ssh config, ProxyJump and host-key checks are the
fleet commands' own), several exec channels on it.  Every command is an
argv list, joined with shlex.quote (shlex.join): no shell string from
user input reaches the host.  Every command runs under coreutils
`timeout -k 2 SECONDS`, so that it ends on the host even when the
controller dies; the controller gives up a few seconds later still.

A background command (an iperf3 server) is started through a fixed
`sh -c 'echo $$; exec "$@"'`: its first line of output is the PID of the
`timeout` that runs it, so stop() can `kill` it (timeout passes the
signal on to its child, coreutils src/timeout.c cleanup()) when the run
fails before the server's one client came.

Output is bounded (MAX_OUTPUT): a host must not exhaust the controller.
"""

from __future__ import annotations

import shlex
import socket
import time
from dataclasses import dataclass
from typing import List, Optional

import paramiko

from nictune.control.remote import ssh
from nictune.control.remote.ssh import SshHost, SshOptions
from nictune.host.errors import TransportError

MAX_OUTPUT = 4 * 2**20
# After a command's own `timeout` ends it, sshd still has to report its
# exit status: the controller waits this much longer before giving up.
GRACE = 5.0
KILL_AFTER = 2
_PID_PREFIX = "nictune-pid "
_BACKGROUND = 'echo "nictune-pid $$"; exec "$@"'


@dataclass
class Result:
    argv: List[str]
    exit_code: Optional[int]  # None: no exit status came back in time
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def why(self) -> str:
        """One line on a failed command, for a gate row."""
        if self.timed_out:
            return f"{self.argv[0]} did not finish in time"
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"{self.argv[0]} exited {self.exit_code}: {tail[-1][:300] if tail else 'no output'}"


def bounded(argv: List[str], seconds: float) -> List[str]:
    """argv under coreutils timeout: TERM after `seconds`, KILL 2 s later."""
    return ["timeout", "-k", str(KILL_AFTER), f"{max(1, int(seconds + 0.999))}", *argv]


class Session:
    """One SSH connection to one host; close() it (a with block does)."""

    def __init__(self, host: SshHost, options: SshOptions):
        self.label = host.label
        self.options = options
        self.client, self._hops = ssh._open(host, options)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()
        for hop in self._hops:
            hop.close()

    def _channel(self, argv: List[str], combine: bool = False):
        try:
            chan = self.client.get_transport().open_session(timeout=self.options.connect_timeout)
            chan.set_combine_stderr(combine)
            chan.exec_command(shlex.join(argv))
        except (OSError, paramiko.SSHException, EOFError, AttributeError) as e:
            raise TransportError(f"{self.label}: cannot start {argv[0]}: {e or type(e).__name__}") from None
        return chan

    def run(self, argv: List[str], seconds: float) -> Result:
        """argv on the host, for at most `seconds`: its exit code and output."""
        wrapped = bounded(argv, seconds)
        chan = self._channel(wrapped)
        try:
            out, err, done = _drain(chan, time.monotonic() + seconds + KILL_AFTER + GRACE, self.label)
            code = chan.recv_exit_status() if done else None
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise TransportError(f"{self.label}: the session failed while {argv[0]} ran: {e}") from None
        finally:
            chan.close()
        # 124: timeout's "the command timed out"; 137: it had to KILL it.
        return Result(argv, code, out, err, timed_out=not done or code in (124, 137))

    def start(self, argv: List[str], seconds: float) -> "Background":
        """argv in the background on the host, ended after `seconds` at the
        latest; stop() the result (also on failure)."""
        chan = self._channel(["sh", "-c", _BACKGROUND, "sh", *bounded(argv, seconds)], combine=True)
        return Background(self, chan, argv, time.monotonic() + seconds + KILL_AFTER + GRACE)


class Background:
    """A command running on a host, started by Session.start."""

    def __init__(self, session: Session, chan, argv: List[str], deadline: float):
        self.session, self.chan, self.argv, self.deadline = session, chan, argv, deadline
        self.pid: Optional[int] = None
        self._buf = b""

    def wait_for(self, text: str, seconds: float) -> bool:
        """Until `text` is in the command's output (True), it ended, or
        `seconds` passed (False).  Reads the PID line on the way."""
        until = min(self.deadline, time.monotonic() + seconds)
        while True:
            self._take_pid()
            if text.encode() in self._buf:
                return True
            left = until - time.monotonic()
            if left <= 0 or self.chan.exit_status_ready() and not self.chan.recv_ready():
                return False
            self.chan.settimeout(min(left, 0.5))
            try:
                chunk = self.chan.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                return text.encode() in self._buf
            if len(self._buf) < MAX_OUTPUT:
                self._buf += chunk

    def output(self) -> str:
        """The last line of what the command printed, for an error message."""
        self._take_pid()
        lines = self._buf.decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else ""

    def _read_pid(self, seconds: float) -> None:
        """Read until the first line (the PID, printed at once by sh) is in."""
        until = time.monotonic() + seconds
        while self.pid is None and b"\n" not in self._buf and time.monotonic() < until:
            self.chan.settimeout(0.1)
            try:
                chunk = self.chan.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
            self._buf += chunk
        self._take_pid()

    def _take_pid(self) -> None:
        if self.pid is None and b"\n" in self._buf:
            line, _, rest = self._buf.partition(b"\n")
            text = line.decode("ascii", "replace")
            if text.startswith(_PID_PREFIX) and text[len(_PID_PREFIX):].isdigit():
                self.pid = int(text[len(_PID_PREFIX):])
                self._buf = rest

    def stop(self) -> None:
        """End the command if it still runs, and close its channel.  Never raises."""
        try:
            self._read_pid(2.0)
            if self.pid is not None and not self.chan.exit_status_ready():
                self.session.run(["kill", "-TERM", str(self.pid)], 5)
                end = time.monotonic() + KILL_AFTER + 1
                while not self.chan.exit_status_ready() and time.monotonic() < end:
                    time.sleep(0.05)
        except (TransportError, OSError, paramiko.SSHException, EOFError):
            pass  # the command's own timeout still ends it
        finally:
            self.chan.close()


def _drain(chan, deadline: float, label: str) -> tuple:
    """stdout and stderr of a channel until its command exits or the deadline;
    (stdout, stderr, exited)."""
    out, err = bytearray(), bytearray()
    while True:
        while chan.recv_ready():
            _keep(out, chan.recv(65536))
        while chan.recv_stderr_ready():
            _keep(err, chan.recv_stderr(65536))
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            # Whatever arrived with the exit status.
            return out.decode(errors="replace"), err.decode(errors="replace"), True
        left = deadline - time.monotonic()
        if left <= 0:
            return out.decode(errors="replace"), err.decode(errors="replace"), False
        chan.settimeout(min(left, 0.2))
        try:
            chunk = chan.recv(65536)
        except socket.timeout:
            continue
        if chunk:
            _keep(out, chunk)
        else:  # stdout closed: the exit status (or stderr) is still to come
            chan.status_event.wait(min(left, 0.2))


def _keep(buf: bytearray, chunk: bytes) -> None:
    if len(buf) < MAX_OUTPUT:
        buf += chunk[:MAX_OUTPUT - len(buf)]
