"""Baseline files: what `nictune gate record` writes, and the comparison of
a batch's throughput figures with them (max_regression)."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from typing import Dict, List, Tuple

from nictune.control.rollout.gate.parsers import MAX_BPS, BadOutput, bounded_number
from nictune.control.rollout.gate.rows import fail
from nictune.host.errors import NictuneError

BASELINE_FORMAT = 1
# Figures compared with their baseline, all "higher is better".
REGRESSION_FIGURES = ("gbps", "avg_busbw_gbytes")


def _key(row: dict) -> Tuple[str, str, str, str]:
    return (row["client"], row["server"] or "", row["rail"], row["tool"])


def read_baseline(path: str) -> Dict[Tuple[str, str, str, str], Dict[str, float]]:
    """{(client, server, rail, tool): figures} of a baseline file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise NictuneError(f"baseline {path}: {e.strerror or e}") from None
    except (ValueError, RecursionError):
        raise NictuneError(f"baseline {path}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("nictune_gate_baseline") != BASELINE_FORMAT \
            or not isinstance(doc.get("entries"), list):
        raise NictuneError(f"baseline {path}: not a baseline written by `nictune gate record`")
    out = {}
    for entry in doc["entries"]:
        try:
            key = tuple(str(entry[k] or "") for k in ("client", "server", "rail", "tool"))
            figures = {k: bounded_number(v, k, 0, MAX_BPS) for k, v in entry["figures"].items()}
        except (KeyError, TypeError, AttributeError, BadOutput):
            raise NictuneError(f"baseline {path}: an entry is not {{client, server, rail, tool, "
                               "figures}}") from None
        out[key] = figures
    return out


def write_baseline(path: str, rows: List[dict]) -> int:
    """Merge the figures of rows (those with figures) into the baseline
    file, an entry per (client, server, rail, tool), replacing the same
    keys and keeping the others; atomically.  The count written."""
    try:
        kept = read_baseline(path) if os.path.exists(path) else {}
    except NictuneError:
        kept = {}  # unreadable: replaced whole
    for row in rows:
        if row.get("figures") and row["tool"] != "counters":
            kept[_key(row)] = dict(row["figures"])
    doc = {"nictune_gate_baseline": BASELINE_FORMAT,
           "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "entries": [{"client": k[0], "server": k[1], "rail": k[2], "tool": k[3], "figures": v}
                       for k, v in sorted(kept.items())]}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".baseline-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(doc["entries"])


def compare(rows: List[dict], baseline: Dict, max_regression: float, path: str) -> None:
    """Fail the rows whose throughput fell more than max_regression below
    the baseline, or that have no baseline entry; add "baseline" to each."""
    for row in rows:
        if row["tool"] == "counters" or not row.get("figures"):
            continue
        base = baseline.get(_key(row))
        if base is None:
            fail(row, f"no baseline for this pair, rail and tool in {path} "
                       "(record one with `nictune gate record`)")
            continue
        row["baseline"] = {k: base[k] for k in REGRESSION_FIGURES if k in base}
        for name in REGRESSION_FIGURES:
            if name not in base or name not in row["figures"] or base[name] <= 0:
                continue
            now, then = row["figures"][name], base[name]
            fell = 100.0 * (then - now) / then
            if fell > max_regression:
                fail(row, f"{name} regressed {fell:.1f}% from the baseline (baseline {then:g}, now "
                           f"{now:g}; max_regression {max_regression:g}%)")
