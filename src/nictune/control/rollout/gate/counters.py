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
            if counter not in then or counter not in now:
                fail(r, f"{name} has no counter {counter} on {rail}")
                continue
            rise = now[counter] - then[counter]
            if rise < 0:
                fail(r, f"{counter} went down ({then[counter]} to {now[counter]}): reset during the traffic")
                continue
            r["figures"][counter] = rise
            if rise > limit:
                fail(r, f"{counter} rose by {rise} during the traffic, more than its limit {limit}")
    return out
