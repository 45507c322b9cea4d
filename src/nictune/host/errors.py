"""The one error vocabulary: error kinds, exit codes, and how they combine.

Deep code raises a NictuneError (or, inside a knob family, what
knobs/base.py allows); only the boundaries (the agent entry, the CLI, the
fleet runner) turn errors into report dicts, always through error(), and
into exit codes, always through exit_code() and combined_exit().  Nothing
below them calls sys.exit.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Iterable, Optional

EXIT_OK = 0           # nothing to do, or done
EXIT_ERROR = 1        # bad input, unsupported keys, host unreachable...
EXIT_PENDING = 2      # plan: changes pending; verify/audit: drift
EXIT_ROLLED_BACK = 3  # apply failed and every change was restored
EXIT_ROLLBACK_FAILED = 4  # apply failed and some change could not be restored
EXIT_INTERRUPTED = 130    # Ctrl-C: 128 + SIGINT, as shells report it

# With many hosts (or batches), the most serious code wins: a host a human
# must look at, then one rolled back, then an error, then drift.
SEVERITY = (EXIT_ROLLBACK_FAILED, EXIT_ROLLED_BACK, EXIT_ERROR, EXIT_PENDING)

# Error kinds: a report's "error.kind" is always one of these.
INVALID_INPUT = "invalid-input"      # a request, option or value that must not reach the system
PROFILE = "profile"                  # a profile, inventory or playbook that does not load
UNSUPPORTED = "unsupported"          # keys this host cannot take, with on_unsupported: fail
CONFLICT = "conflict"                # two profile entries set one key to different values
LOCKED = "locked"                    # another apply holds the host, or awaits confirmation
NO_JOURNAL = "no-journal"            # rollback with nothing to roll back
INTERRUPTED = "interrupted"          # an earlier apply did not finish
SYSTEM = "system"                    # the host failed us (OSError, internal error)
TRANSPORT = "transport"              # the host could not be reached or did not answer
ROLLED_BACK = "rolled-back"          # apply failed and every change was restored
ROLLBACK_FAILED = "rollback-failed"  # apply failed and some change could not be restored

# Why a playbook's rollout stopped (a rollout's stop.kind), besides
# ROLLBACK_FAILED; the rollout's exit code comes from its hosts'.
MAX_FAIL = "max-fail"        # more of a batch failed than max_fail_percentage allows
HEALTH_GATE = "health-gate"  # a host of the batch did not pass verify after its apply
TRAFFIC_GATE = "traffic-gate"      # the play's gate: (measurements) did not pass after verify
HOOK_FAILED = "hook-failed"        # a before_batch/after_batch hook failed, timed out or did not start
DRAIN_REQUIRED = "drain-required"  # require_drain: disruptive changes and no before_batch hook, or no plan

EXIT_CODES = {
    INVALID_INPUT: EXIT_ERROR,
    PROFILE: EXIT_ERROR,
    UNSUPPORTED: EXIT_ERROR,
    CONFLICT: EXIT_ERROR,
    LOCKED: EXIT_ERROR,
    NO_JOURNAL: EXIT_ERROR,
    INTERRUPTED: EXIT_ERROR,
    SYSTEM: EXIT_ERROR,
    TRANSPORT: EXIT_ERROR,
    ROLLED_BACK: EXIT_ROLLED_BACK,
    ROLLBACK_FAILED: EXIT_ROLLBACK_FAILED,
}
# The kind that stands for an exit code, where only the code is known
# (a playbook host's outcome).
KIND_OF_EXIT = {EXIT_ROLLED_BACK: ROLLED_BACK, EXIT_ROLLBACK_FAILED: ROLLBACK_FAILED}


def error(kind: str, message: str, **extra) -> dict:
    """A report's error: {"kind", "message"} and any extra fields."""
    return {"kind": kind, "message": message, **extra}


def exit_code(kind: Optional[str]) -> int:
    return EXIT_OK if kind is None else EXIT_CODES.get(kind, EXIT_ERROR)


def combined_exit(codes: Iterable[int], default: int = EXIT_OK) -> int:
    """One exit code for many hosts: the most serious wins."""
    codes = set(codes)
    return next((code for code in SEVERITY if code in codes), default)


class NictuneError(Exception):
    kind = SYSTEM

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def as_dict(self) -> dict:
        return error(self.kind, self.message)


class InvalidInput(NictuneError, ValueError):
    """A value that must not reach the system: a bad name, path or request.
    Also a ValueError, which is what a bad value is to Python code."""

    kind = INVALID_INPUT


class Conflict(NictuneError):
    kind = CONFLICT


class Locked(NictuneError):
    kind = LOCKED


class NoJournal(NictuneError):
    kind = NO_JOURNAL


class Interrupted(NictuneError):
    kind = INTERRUPTED


class TransportError(NictuneError):
    kind = TRANSPORT


class StateDirError(NictuneError):
    """The state directory (or the per-target lock directory) cannot be
    trusted, created or written; the message names the path."""


class JournalDamaged(StateDirError):
    """A journal or history record that is not a well-formed record."""
