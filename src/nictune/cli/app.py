"""Root of the `nictune` command."""

from __future__ import annotations

import os
import sys

import typer

from nictune import __version__
from nictune.cli import gate_cmds, host_cmds, lab_cmds, lint_cmds, profile_cmds, resident_cmds, slurm_cmds
from nictune.host.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK

# Typer's usage errors (an unknown option, a missing argument, a bad value)
# and its other click errors: the click exception class typer.BadParameter
# derives from, whichever click this typer carries (typer >= 0.28 vendors it).
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

app = typer.Typer(
    name="nictune",
    help="Plan, apply, verify and roll back NIC tuning on AI hosts.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"nictune {__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of internal errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """nictune: YAML profiles in, reviewed diffs out, verified changes on hosts."""


profile_cmds.register(app)
lint_cmds.register(app)
host_cmds.register(app)
slurm_cmds.register(app)
app.add_typer(lab_cmds.lab, name="lab")
app.add_typer(resident_cmds.agent, name="agent")
app.add_typer(gate_cmds.gate, name="gate")


def run() -> int:
    """The whole command; returns its exit code and never raises, unless
    debugging.

    Typer runs in non-standalone mode, so that a usage error comes here and
    exits 1 (click's 2 is nictune's "changes pending / drift": a typo in a
    cron job must not read as drift); a command's own exit code comes back
    as the return value."""
    debug = "--debug" in sys.argv[1:] or os.environ.get("NICTUNE_DEBUG") == "1"
    code = EXIT_OK
    try:
        result = app(standalone_mode=False)
        code = result if isinstance(result, int) else EXIT_OK
    except _CLICK_ERROR as e:
        e.show()  # click's own words: usage line, hint, error
        code = EXIT_ERROR
    except typer.Abort:
        sys.stderr.write("Aborted!\n")
        code = EXIT_ERROR
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_ERROR)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = EXIT_INTERRUPTED
    except Exception as e:  # the last line of defence: no tracebacks for users
        if debug:
            raise
        sys.stderr.write(f"nictune: internal error: {type(e).__name__}: {e} "
                         "(run with --debug for the traceback, and please report it)\n")
        code = EXIT_ERROR
    return code


def main() -> None:
    code = run()
    # Interpreter shutdown (typer, pydantic, rich) costs 50-80 ms and does
    # nothing we need: flush what we printed and leave.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
