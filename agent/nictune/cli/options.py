"""Option aliases shared by every command (Typer's Annotated style)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from nictune.journal import DEFAULT_STATE_DIR

ProfileArg = Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile YAML file.", show_default=False)]
ProfilesArg = Annotated[List[Path], typer.Argument(metavar="PROFILE...", help="Profile YAML files.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the JSON report (format: docs/report-format.md).")]
NetnsOpt = Annotated[Optional[str], typer.Option("--netns", "-n", metavar="NS",
                                                 help="Run inside this network namespace.")]
StateDirOpt = Annotated[str, typer.Option("--state-dir", metavar="DIR", envvar="NICTUNE_STATE_DIR",
                                          help="Where journals and the lock live on the target.")]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Also list settings already as wanted.")]
DEFAULT_STATE = DEFAULT_STATE_DIR
