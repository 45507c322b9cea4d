"""nccl-tests' all_reduce_perf over a batch: once, under the site's
launcher, on the batch's first host; without a launcher, on each host by
itself (control/rollout/nccltests.py parses its table)."""

from __future__ import annotations

from typing import Any, Dict, List

from nictune.control.rollout.gate.parallel import parallel
from nictune.control.rollout.gate.rows import fail, row
from nictune.control.rollout.gate.spec import GateSpec
from nictune.host.errors import NictuneError
from nictune.host.text import printable


def run_nccl_tests(gate: GateSpec, hosts: Dict[str, Any], batch: List[str],
                   sessions: Dict[str, Any], number: int = 0, rollout: str = "") -> List[dict]:
    """all_reduce_perf over the batch: once, launched on its first host,
    with a launcher; else on each host by itself, at once.  number and
    rollout fill the launcher's {batch} and {rollout}."""
    runs = [batch] if gate.nccl_tests.launcher else [[h] for h in batch]
    return parallel(lambda names: _all_reduce(gate, hosts, names, sessions, number, rollout), runs)


def _all_reduce(gate: GateSpec, hosts: Dict[str, Any], names: List[str], sessions, number: int,
                rollout: str) -> dict:
    from nictune.control.rollout import nccltests

    spec, first = gate.nccl_tests, names[0]
    r = row(",".join(names), None, "*", "nccl-tests")
    missing = [h for h in names if h not in sessions]
    if missing:
        fail(r, f"not run: {', '.join(missing)} not reachable")
        return r
    try:
        addresses = [getattr(hosts.get(h), "address", None) or h for h in names]
        argv = spec.argv(names, addresses, number, rollout)
        result = sessions[first].run(argv, spec.timeout)
    except NictuneError as e:
        fail(r, str(e))
        return r
    if result.timed_out:
        fail(r, f"{argv[0]} on {first} did not finish within {spec.timeout:g} s and was killed"
                 f"{_tail(result)}")
        return r
    if not result.ok:
        fail(r, f"{argv[0]} on {first} exited {result.exit_code}{_tail(result)}")
        return r
    try:
        report = nccltests.parse_all_reduce(result.stdout)
    except NictuneError as e:
        fail(r, f"{e}{_tail(result)}")
        return r
    largest = max(report.rows, key=lambda x: x.size)
    r["figures"] = {"avg_busbw_gbytes": report.avg_busbw,
                    "largest_busbw_gbytes": largest.out_of_place.busbw,
                    "largest_bytes": largest.size}
    for why in nccltests.problems(report):
        fail(r, why)
    if spec.min_busbw is not None and report.avg_busbw < spec.min_busbw:
        fail(r, f"avg bus bandwidth {report.avg_busbw:g} GB/s, less than min_busbw {spec.min_busbw:g}")
    return r


def _tail(result, lines: int = 3) -> str:
    """The last lines a failed command printed (stderr, else stdout),
    control characters escaped, for a row's why."""
    text = result.stderr.strip() or result.stdout.strip()
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return (": " + " | ".join(printable(line)[:300] for line in tail)) if tail else ": no output"
