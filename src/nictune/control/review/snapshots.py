"""Snapshot files: `show --save DIR` / `audit --save DIR` write them,
`plan --from-snapshots DIR` plans from them, with no access to the hosts.

A snapshot is what host/replay/snapshot.py recorded while a show ran on the host:
every read nictune made there and its answer.  One file per host, named
by the host's label in the inventory (never by anything the host says):
DIR/<label>.json, where the label is percent-encoded if it holds anything
but letters, digits and "._-" (local: "local", a namespace: "netns:NAME").

File (format 1, docs/reference/report-format.md "Snapshots"):

    {"nictune_snapshot": 1, "host": "<label>", "recorded": "2026-12-01T03:00:00Z",
     "agent": "<nictune version>", "reads": {"root_is_system": true,
     "recorded": ..., "calls": {...}, "files": {...}}}

The file holds the content of the files nictune reads on the host (owned
files such as /etc/nccl.conf included): it is the host's own state,
written with mode 0600, for the operator to keep where the profiles'
reviewers' CI can read it.  It holds no key material (host/replay/snapshot.py).

An offline plan runs the agent's own request (agent.run) in this process
against recorded.RecordedHost: the same engine and knob families as a live
plan; `--base` works unchanged (control/review/change.py takes the same reports).
A snapshot older than --max-age is flagged: a warning in the host's
report, and "snapshot": {"recorded", "age_seconds", "stale"} in --json.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import stat
import tempfile
import time
from calendar import timegm
from typing import Callable, List, Optional
from urllib.parse import quote

from nictune.host.errors import INVALID_INPUT, SYSTEM, InvalidInput, NictuneError, error
from nictune.host.files import read_capped
from nictune.host.replay.snapshot import shown
from nictune.host.replay.snapshot_check import BadSnapshot, check_reads

SNAPSHOT_FORMAT = 1
DEFAULT_MAX_AGE = "24h"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TIME = "%Y-%m-%dT%H:%M:%SZ"
# A snapshot of a large host is at most about 15 MiB (host/replay/snapshot.py
# walks at most 50,000 files under /proc/sys/net, about 130 per interface).
# The cap bounds what a hostile file costs: JSON of tiny lists and
# mappings takes about 25 times its size in memory, under 1 GiB here.
MAX_SNAPSHOT_BYTES = 32 << 20


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
    """The snapshot of host `label`; InvalidInput naming the file and what
    is wrong when it is missing, unreadable or not a snapshot of that host.
    The file may be anybody's (committed for reviewers' CI): it is read
    only as a regular file of at most MAX_SNAPSHOT_BYTES, and every field
    is checked before a replay uses it (host/replay/snapshot_check.py)."""
    path = path_of(directory, label)
    data = _read_regular(path, label, directory)
    try:
        doc = _parse(data)
    except MemoryError:
        raise InvalidInput(f"{path}: not a snapshot: too large to read into memory") from None
    except RecursionError:
        raise InvalidInput(f"{path}: not a snapshot: its JSON is nested more deeply than "
                           "Python can read") from None
    except ValueError as e:  # UnicodeDecodeError and a number too long for int() included
        raise InvalidInput(f"{path}: not a readable snapshot: {str(e)[:200]}") from None
    if not isinstance(doc, dict) or not _is_format(doc.get("nictune_snapshot")):
        raise InvalidInput(f"{path}: not a nictune snapshot of format {SNAPSHOT_FORMAT}")
    if doc.get("host") != label:
        raise InvalidInput(f"{path}: a snapshot of {shown(doc.get('host'))}, not of {label!r}")
    if not isinstance(doc.get("agent"), (str, type(None))):
        raise InvalidInput(f"{path}: agent is not a version text")
    recorded_at(doc, path)
    try:
        check_reads(doc.get("reads"))
    except BadSnapshot as e:
        raise InvalidInput(f"{path}: not a snapshot nictune recorded: {e}") from None
    return doc


def _parse(data: bytes):
    """json.loads, without the garbage collector: parsing makes no cycles,
    and collector passes over millions of new lists (a hostile file's)
    would take ten times as long as the parse."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(data)
    finally:
        if enabled:
            gc.enable()


def _is_format(value) -> bool:
    return type(value) is int and value == SNAPSHOT_FORMAT  # true == 1 in Python, not here


def _read_regular(path: str, label: str, directory: str) -> bytes:
    """The bytes of path if it is a regular file (not a link, a FIFO that
    would block for good, a device such as /dev/zero that never ends, a
    directory) of at most MAX_SNAPSHOT_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no snapshot of {label} (make one with "
                           f"`nictune show -i INVENTORY --save {directory}`)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InvalidInput(f"{path}: a symbolic link; snapshots are read only from regular "
                               "files (copy the snapshot here instead)") from None
        raise InvalidInput(f"{path}: not a readable snapshot: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{path}: {_file_kind(st.st_mode)}, not a regular file: "
                               "not a snapshot")
        if st.st_size > MAX_SNAPSHOT_BYTES:
            raise InvalidInput(f"{path}: {st.st_size} bytes, more than a snapshot may hold "
                               f"({MAX_SNAPSHOT_BYTES >> 20} MiB)")
        data = read_capped(os.read, fd, MAX_SNAPSHOT_BYTES)  # it may grow while read: the cap holds
        if data is None:
            raise InvalidInput(f"{path}: more than a snapshot may hold "
                               f"({MAX_SNAPSHOT_BYTES >> 20} MiB)")
        return data
    except OSError as e:
        raise InvalidInput(f"{path}: not a readable snapshot: {e.strerror}") from None
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def recorded_at(doc: dict, path: str = "snapshot") -> float:
    try:
        return float(timegm(time.strptime(doc.get("recorded", ""), _TIME)))
    except (TypeError, ValueError):
        raise InvalidInput(f"{path}: recorded is not a UTC time like 2026-12-01T03:00:00Z") from None


# -- offline runs -----------------------------------------------------------------

def run(request: dict, label: str, directory: str, max_age: Optional[float],
        now: Optional[float] = None) -> dict:
    """The agent's report for `request` on host `label`, from its snapshot."""
    from nictune.control.remote.fleet import failed_report
    from nictune.host import agent
    from nictune.host.replay.snapshot import RecordedHost

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
    _blame_the_file(report, path_of(directory, label))
    age = (time.time() if now is None else now) - recorded_at(doc)
    stale = max_age is not None and age > max_age
    report["snapshot"] = {"file": path_of(directory, label), "recorded": doc["recorded"],
                          "age_seconds": int(age), "stale": stale}
    if stale:
        report["warnings"].append(f"planned from a snapshot of {doc['recorded']}, "
                                  f"{_age_text(age)} old (more than --max-age {_age_text(max_age)}): "
                                  "the host may have changed since")
    return report


def _blame_the_file(report: dict, path: str) -> None:
    """An internal error of a replay (agent.run's report of an exception
    that is not nictune's) comes from a snapshot whose well-formed values
    are not what the engine expects of that read, e.g. a number where a
    recording holds a list: the host's error names the file."""
    failure = report.get("error") or {}
    message = failure.get("message") or ""
    if failure.get("kind") == SYSTEM and message.startswith("internal error: "):
        failure["message"] = (f"{path}: this snapshot does not replay, it may be damaged "
                              f"({message})")


def _age_text(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit]:
            return f"{seconds / _UNITS[unit]:.3g}{unit}"
    return f"{seconds:.0f}s"


def run_jobs(jobs: list, directory: str, max_age: Optional[float],
             progress: Optional[Callable[[dict], None]] = None) -> List[dict]:
    """fleet.run_jobs for snapshots: every job's request against its host's
    snapshot, one after the other in this process (no host is reached)."""
    from nictune.control.remote.fleet import failed_report

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
