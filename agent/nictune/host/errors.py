"""Error kinds, and the one table that maps them to exit codes.

Deep code raises; only the agent entry and the CLI turn errors into reports
and exit codes.  Nothing below them calls sys.exit.
"""

from __future__ import annotations

EXIT_OK = 0           # nothing to do, or done
EXIT_ERROR = 1        # bad input, unsupported keys, host unreachable...
EXIT_PENDING = 2      # plan: changes pending; verify/audit: drift
EXIT_ROLLED_BACK = 3  # apply failed and every change was restored
EXIT_ROLLBACK_FAILED = 4  # apply failed and some change could not be restored

# kind -> exit code.  A report's "error.kind" is always one of these.
EXIT_CODES = {
    "invalid-input": EXIT_ERROR,
    "profile": EXIT_ERROR,
    "unsupported": EXIT_ERROR,
    "conflict": EXIT_ERROR,
    "locked": EXIT_ERROR,
    "no-journal": EXIT_ERROR,
    "interrupted": EXIT_ERROR,
    "system": EXIT_ERROR,
    "transport": EXIT_ERROR,
    "rolled-back": EXIT_ROLLED_BACK,
    "rollback-failed": EXIT_ROLLBACK_FAILED,
}


class NictuneError(Exception):
    kind = "system"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def as_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message}


class InvalidRequest(NictuneError):
    kind = "invalid-input"


class Conflict(NictuneError):
    kind = "conflict"


class Locked(NictuneError):
    kind = "locked"


class NoJournal(NictuneError):
    kind = "no-journal"


class Interrupted(NictuneError):
    kind = "interrupted"


class TransportError(NictuneError):
    kind = "transport"


def exit_code(kind: str | None) -> int:
    return EXIT_OK if kind is None else EXIT_CODES.get(kind, EXIT_ERROR)
