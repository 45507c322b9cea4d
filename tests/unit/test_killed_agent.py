"""What the controller says when a host's agent ends without a report (killed,
crashed) during an apply or a rollback over SSH: not only "no report", but
what may be left on the host and what undoes it (control/remote/ssh.py).  The
channel is a stand-in for paramiko's (no sshd needed to hand over an exit
status); the namespace side, with a really killed agent and its journal, is
tests/netns/test_journal_faults.py."""

from __future__ import annotations

import pytest

from nictune.control.remote.ssh import SshHost, SshOptions, SshTarget


class DeadChannel:
    """A session whose command was killed: no exit-status (paramiko keeps
    -1 when sshd sends exit-signal), nothing on stderr."""

    def __init__(self, status: int = -1):
        self.status = status

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return self.status

    def recv_stderr_ready(self) -> bool:
        return False


def _target(confirm_timeout: float = 30.0) -> SshTarget:
    return SshTarget(SshHost("h07", "198.18.0.7", state_dir="/var/lib/nictune"),
                     SshOptions(confirm_timeout=confirm_timeout))


def _message(target: SshTarget, command: str, confirm: bool) -> str:
    return str(target._failed(DeadChannel(), "the agent sent no report",
                              target._left_behind(command, confirm)))


def test_a_killed_confirmed_apply_says_the_watchdog_undoes_it():
    message = _message(_target(30.0), "apply", confirm=True)
    assert message.startswith("h07: the agent sent no report (no exit status: killed by a signal")
    assert "the host's watchdog restores the before-values it journaled in " \
           "/var/lib/nictune/journal.json" in message
    assert "at once when the apply was cut off mid-write, 30 s after it finished" in message


def test_a_killed_unconfirmed_apply_says_a_rollback_is_needed():
    message = _message(_target(0.0), "apply", confirm=False)
    assert "the host may be partly changed: /var/lib/nictune/journal.json holds the " \
           "before-values" in message
    assert "`nictune rollback -i INVENTORY --limit h07` restores them" in message


def test_a_killed_rollback_says_to_run_it_again():
    message = _message(_target(), "rollback", confirm=False)
    assert "the rollback may have stopped part-way" in message and "--limit h07" in message


@pytest.mark.parametrize("command", ["plan", "verify", "show"])
def test_a_read_only_command_adds_nothing(command):
    assert _message(_target(), command, confirm=False) == (
        "h07: the agent sent no report (no exit status: killed by a signal, or the session "
        "was cut): no error output")


def test_an_exit_status_is_still_shown_as_it_came():
    target = _target()
    assert "(exit 3)" in str(target._failed(DeadChannel(3), "the agent sent no report"))
