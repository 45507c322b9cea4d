"""Snapshot files: `show --save DIR` / `audit --save DIR` write them,
`plan --from-snapshots DIR` plans from them, with no access to the hosts.

A snapshot is what host/recorded.py recorded while a show ran on the host:
every read nictune made there and its answer.  One file per host, named
by the host's label in the inventory (never by anything the host says):
DIR/<label>.json, where the label is percent-encoded if it holds anything
but letters, digits and "._-" (local: "local", a namespace: "netns:NAME").

File (format 1, docs/report-format.md "Snapshots"):

    {"nictune_snapshot": 1, "host": "<label>", "recorded": "2026-12-01T03:00:00Z",
     "agent": "<nictune version>", "reads": {"root_is_system": true,
     "recorded": ..., "calls": {...}, "files": {...}}}

The file holds the content of the files nictune reads on the host (owned
files such as /etc/nccl.conf included): it is the host's own state,
written with mode 0600, for the operator to keep where the profiles'
reviewers' CI can read it.  It holds no key material (host/recorded.py).

An offline plan runs the agent's own request (agent.run) in this process
against recorded.RecordedHost: the same engine and knob families as a live
plan; `--base` works unchanged (control/change.py takes the same reports).
A snapshot older than --max-age is flagged: a warning in the host's
report, and "snapshot": {"recorded", "age_seconds", "stale"} in --json.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from calendar import timegm
from typing import Callable, List, Optional
from urllib.parse import quote

from nictune.host.errors import INVALID_INPUT, InvalidInput, NictuneError, error

SNAPSHOT_FORMAT = 1
DEFAULT_MAX_AGE = "24h"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TIME = "%Y-%m-%dT%H:%M:%SZ"


def parse_age(text: str) -> float:
    """"90s", "30m", "24h", "7d" -> seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd])\s*", str(text))
    if not m:
        raise InvalidInput(f"--max-age {text!r}: give a number and a unit: 90s, 30m, 24h or 7d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def file_name(label: str) -> str:
    """The label, percent-encoded: "/" never leaves DIR ("..json" is a name)."""
    return quote(label, safe="") + ".json"


def path_of(directory: str, label: str) -> str:
    return os.path.join(directory, file_name(label))


# -- writing ----------------------------------------------------------------------

def save(reports: List[dict], directory: str) -> List[str]:
    """Write each report's snapshot to directory and take it out of the
    report (it says "snapshot_file" instead).  Returns warnings for hosts
    that sent none (unreachable, an error)."""
    os.makedirs(directory, exist_ok=True)
    warnings = []
    for report in reports:
        label = report["host"]
        snap = report.pop("snapshot", None)
        if not _looks_like(snap):
            warnings.append(f"{label}: no snapshot saved"
                            + (f" ({report['error']['message']})" if report.get("error") else ""))
            continue
        doc = {"nictune_snapshot": SNAPSHOT_FORMAT, "host": label, "recorded": snap["recorded"],
               "agent": snap.get("agent"), "reads": snap["reads"]}
        path = path_of(directory, label)
        _write(path, json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
        report["snapshot_file"] = path
    return warnings


def _looks_like(snap) -> bool:
    return (isinstance(snap, dict) and snap.get("nictune_snapshot") == SNAPSHOT_FORMAT
            and isinstance(snap.get("reads"), dict) and isinstance(snap.get("recorded"), str))


def _write(path: str, text: str) -> None:
    """Atomically, mode 0600: the file holds the host's owned files' text."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".snapshot-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- reading ----------------------------------------------------------------------

def load(directory: str, label: str) -> dict:
    """The snapshot of host `label`; InvalidInput naming the file when it
    is missing, unreadable or not a snapshot of that host."""
    path = path_of(directory, label)
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no snapshot of {label} (make one with "
                           f"`nictune show -i INVENTORY --save {directory}`)") from None
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{path}: not a readable snapshot: {e}") from None
    if not isinstance(doc, dict) or doc.get("nictune_snapshot") != SNAPSHOT_FORMAT:
        raise InvalidInput(f"{path}: not a nictune snapshot of format {SNAPSHOT_FORMAT}")
    if doc.get("host") != label:
        raise InvalidInput(f"{path}: a snapshot of {doc.get('host')!r}, not of {label!r}")
    reads = doc.get("reads")
    if (not isinstance(reads, dict) or not isinstance(reads.get("calls", {}), dict)
            or not isinstance(reads.get("files", {}), dict)):
        raise InvalidInput(f"{path}: its reads are not {{calls, files}}")
    recorded_at(doc, path)
    return doc


def recorded_at(doc: dict, path: str = "snapshot") -> float:
    try:
        return float(timegm(time.strptime(doc.get("recorded", ""), _TIME)))
    except (TypeError, ValueError):
        raise InvalidInput(f"{path}: recorded is not a UTC time like 2026-12-01T03:00:00Z") from None


# -- offline runs -----------------------------------------------------------------

def run(request: dict, label: str, directory: str, max_age: Optional[float],
        now: Optional[float] = None) -> dict:
    """The agent's report for `request` on host `label`, from its snapshot."""
    from nictune.control.fleet import failed_report
    from nictune.host import agent
    from nictune.host.recorded import RecordedHost

    command = request.get("command", "plan")
    if command != "plan":
        return failed_report(label, command, error(INVALID_INPUT, f"{label}: only plan runs "
                                                                 "from snapshots"))
    try:
        doc = load(directory, label)
    except NictuneError as e:
        return failed_report(label, command, e.as_dict())
    host = RecordedHost(doc["reads"])
    request = {k: v for k, v in request.items() if k != "netns"}  # the snapshot's, see RecordedHost
    with host.replaying():
        report = agent.run(dict(request, host=label), host=host)
    age = (time.time() if now is None else now) - recorded_at(doc)
    stale = max_age is not None and age > max_age
    report["snapshot"] = {"file": path_of(directory, label), "recorded": doc["recorded"],
                          "age_seconds": int(age), "stale": stale}
    if stale:
        report["warnings"].append(f"planned from a snapshot of {doc['recorded']}, "
                                  f"{_age_text(age)} old (more than --max-age {_age_text(max_age)}): "
                                  "the host may have changed since")
    return report


def _age_text(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit]:
            return f"{seconds / _UNITS[unit]:.3g}{unit}"
    return f"{seconds:.0f}s"


def run_jobs(jobs: list, directory: str, max_age: Optional[float],
             progress: Optional[Callable[[dict], None]] = None) -> List[dict]:
    """fleet.run_jobs for snapshots: every job's request against its host's
    snapshot, one after the other in this process (no host is reached)."""
    from nictune.control.fleet import failed_report

    reports = []
    for job in jobs:
        command = (job.request or {}).get("command", "plan")
        if job.error or job.request is None:
            report = failed_report(job.label, command, job.error or error(
                INVALID_INPUT, f"{job.label}: no request"))
        else:
            report = run(job.request, job.label, directory, max_age)
        reports.append(report)
        if progress:
            progress(report)
    return reports
