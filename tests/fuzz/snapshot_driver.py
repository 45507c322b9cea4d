"""Plans every host of a directory of (hostile) snapshot files, in a child
process that tests/unit/test_fuzz_snapshots.py starts with a memory limit.

    snapshot_driver.py DIR REQUEST.json LABEL...

For each label, `control/snapshots.run` of the request, each under its own
time bound (SIGALRM: a FIFO that blocks or a file that never ends is a
hang, not a stalled CI); then one `run_jobs` over every label, as `plan -i
INVENTORY --from-snapshots DIR` runs them.  Prints one JSON line per host
({"label", "outcome", "message"}) and a last line {"fleet": [...]} with the
run_jobs reports' errors; an exception that escapes is an outcome, with its
traceback.
"""

from __future__ import annotations

import json
import signal
import sys
import traceback
from types import SimpleNamespace

from nictune.control.review import snapshots

CASE_BOUND = 10  # seconds: a file at the size cap parses in about one


class _Hang(BaseException):  # not an Exception: no `except Exception` swallows it
    pass


def _alarm(signum, frame):
    raise _Hang()


def _one(request: dict, directory: str, label: str) -> dict:
    signal.alarm(CASE_BOUND)
    try:
        report = snapshots.run(request, label, directory, None)
    except _Hang:
        return {"label": label, "outcome": "hang"}
    except MemoryError:
        return {"label": label, "outcome": "memory"}
    except BaseException:  # noqa: BLE001 - the finding
        return {"label": label, "outcome": "traceback", "message": traceback.format_exc()}
    finally:
        signal.alarm(0)
    failure = report.get("error")
    if failure is None:
        return {"label": label, "outcome": "planned"}
    return {"label": label, "outcome": "error", "kind": failure["kind"],
            "message": failure["message"]}


def main(directory: str, request_file: str, labels: list) -> None:
    with open(request_file) as f:
        request = json.load(f)
    signal.signal(signal.SIGALRM, _alarm)
    for label in labels:
        print(json.dumps(_one(request, directory, label)), flush=True)
    jobs = [SimpleNamespace(label=label, request=request, error=None) for label in labels]
    signal.alarm(CASE_BOUND * 4)
    try:
        reports = snapshots.run_jobs(jobs, directory, None)
        fleet = [{"label": r["host"], "error": r["error"]} for r in reports]
    except BaseException:  # noqa: BLE001 - the finding
        fleet = traceback.format_exc()
    finally:
        signal.alarm(0)
    print(json.dumps({"fleet": fleet}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
