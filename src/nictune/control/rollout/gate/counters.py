"""The gate's counters (`counters: max:`): read on both ends of every pair
before the first run and after the last (COUNTERS_SCRIPT over SSH, no
agent process), and their rises judged against their limits."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from nictune.control.rollout.gate.parallel import parallel
from nictune.control.rollout.gate.parsers import COUNTERS_SCRIPT, parse_counters
from nictune.control.rollout.gate.rows import fail, row
from nictune.control.rollout.gate.spec import GateSpec
from nictune.host.errors import NictuneError


def read_counters(gate: GateSpec, sessions: Dict[str, Any]) -> Dict[Tuple[str, str], Any]:
    """{(host, rail): {counter: value} or why not}."""
    def one(item):
        name, rail = item
        try:
            result = sessions[name].run(["sh", "-c", COUNTERS_SCRIPT, "sh", rail], 20)
        except NictuneError as e:
            return item, str(e)
        if not result.ok:
            return item, result.why()
        return item, parse_counters(result.stdout)

    items = [(n, rail) for n in sessions for rail in gate.rails]
    return dict(parallel(one, items))


def _rise(r: dict, name: str, rail: str, counter: str, then: dict, now: dict):
    """How much counter rose, kept in the row's figures; None (and the row
    failed) when it is missing or went down."""
    if counter not in then or counter not in now:
        fail(r, f"{name} has no counter {counter} on {rail}" + (
            " (no /proc/net/tls_stat: the tls module is not loaded)" if counter.startswith("Tls") else ""))
        return None
    rise = now[counter] - then[counter]
    if rise < 0:
        fail(r, f"{counter} went down ({then[counter]} to {now[counter]}): reset during the traffic")
        return None
    r["figures"][counter] = rise
    return rise


def counter_rows(gate: GateSpec, before: Dict, after: Dict) -> List[dict]:
    """A row per host and rail: each limited counter's rise between before and after."""
    out = []
    for (name, rail), then in before.items():
        r = row(name, None, rail, "counters")
        now = after.get((name, rail))
        out.append(r)
        for source in (then, now):
            if not isinstance(source, dict):
                fail(r, f"cannot read its counters: {source}")
        if not r["passed"]:
            continue
        for counter, limit in gate.counters.items():
            rise = _rise(r, name, rail, counter, then, now)
            if rise is not None and rise > limit:
                fail(r, f"{counter} rose by {rise} during the traffic, more than its limit {limit}")
        for counter, least in gate.counters_min.items():
            rise = _rise(r, name, rail, counter, then, now)
            if rise is not None and rise < least:
                fail(r, f"{counter} rose by {rise} during the traffic, less than its minimum {least}: "
                        "what it counts was not in use")
    return out
