"""bench/bench_fleet.py's judgement, without a fleet: the thousand-host
targets (per-host wall at 1,000 no worse than at 100, controller CPU, peak
memory) and the --apply mode's verdict on a run (the tool's own account,
then the bench's read-back: drifted before, as wanted after an apply,
unchanged after a plan)."""

from __future__ import annotations

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)
import bench_fleet  # noqa: E402

checks = bench_fleet.fleet_checks()


def _fig(wall: float, ctl: float, peak_mb: float) -> dict:
    return {"wall": wall, "ctl_cpu_per_host": ctl, "peak_pss_kb": peak_mb * 1024}


def _verdicts(summary: dict) -> list:
    return [ok for ok, _what, _detail in bench_fleet.thousand_host_checks(summary, sorted({n for n, _ in summary}))]


def test_the_thousand_host_targets_are_judged_met_or_missed():
    good = {(100, "nictune"): _fig(2.0, 0.008, 150), (1000, "nictune"): _fig(19.0, 0.009, 190)}
    assert _verdicts(good) == [True, True, True]
    slower = {**good, (1000, "nictune"): _fig(21.0, 0.009, 190)}  # 21 ms a host against 20
    assert _verdicts(slower) == [False, True, True]
    costly = {**good, (1000, "nictune"): _fig(19.0, 0.013, 190)}
    assert _verdicts(costly) == [True, False, True]
    heavy = {**good, (100, "nictune"): _fig(2.0, 0.008, 201)}  # any size over 200 MB
    assert _verdicts(heavy) == [True, True, False]
    assert _verdicts({(100, "nictune"): _fig(2.0, 0.008, 150)}) == [None, None, True]
    texts = [what for _ok, what, _d in bench_fleet.thousand_host_checks(good, [100, 1000])]
    assert len(texts) == 3 and "1,000" in texts[0] and "200 MB" in texts[2]


def test_the_drift_script_sets_every_setting_of_the_apply_profile_off_its_value():
    off = "\n".join(f"{name}: off" for name in checks.FEATURES)
    assert checks.drifts(checks.DRIFTED_SYSCTLS, checks.DRIFTED_MTU, "up", off, checks.NCCL) == checks.DRIFTED
    assert all(checks.DRIFTED_SYSCTLS[k] != v for k, v in checks.SYSCTLS.items())
    assert bench_fleet.APPLY_CHANGES == len(checks.SYSCTLS) + 1 + len(checks.FEATURES) == 11
    for flag in checks.FEATURE_FLAGS:
        assert f"{flag} off" in checks.DRIFT_SCRIPT


def _report(changes_per_host: int, hosts=("h1", "h2")) -> str:
    return json.dumps({"hosts": [{"host": h, "ok": True, "changes": [{"status": "pending"}] * changes_per_host
                                  + [{"status": "ok"}]} for h in hosts]})


def _run(said: str, drift: dict, hosts: int = 2) -> dict:
    return {"said": said, "readback": {"hosts": hosts, "drift": drift, "error": ""}}


@pytest.mark.parametrize("tool", ["nictune-apply", "pyinfra-apply", "ansible-apply"])
def test_an_apply_run_is_good_only_when_every_host_reads_back_as_wanted(tool):
    assert bench_fleet.apply_problems(tool, _run("", {}), 2) == []
    left = bench_fleet.apply_problems(tool, _run("", {"h2": checks.DRIFTED[:1]}), 2)
    assert len(left) == 1 and "1 hosts not as wanted" in left[0]
    short = bench_fleet.apply_problems(tool, _run("", {}, hosts=1), 2)
    assert len(short) == 1 and "1 hosts read" in short[0]


def test_a_plan_must_find_every_change_and_change_nothing():
    assert bench_fleet.apply_said("nictune-plan", _report(11), 2, 2) == ""
    assert "10 changes planned, not 11" in bench_fleet.apply_said("nictune-plan", _report(10), 2, 2)
    assert bench_fleet.apply_said("nictune-plan", _report(11), 2, 0) == "exit 0"
    drifted = {"h1": checks.DRIFTED, "h2": checks.DRIFTED}
    assert bench_fleet.apply_problems("nictune-plan", _run("", drifted), 2) == []
    changed = bench_fleet.apply_problems("nictune-plan", _run("", {"h1": checks.DRIFTED}), 2)
    assert len(changed) == 1 and "a plan changed hosts" in changed[0]


def test_the_tools_own_failures_are_reported():
    assert bench_fleet.apply_said("nictune-apply", _report(0), 2, 0) == ""
    failed = json.dumps({"hosts": [{"host": "h1", "ok": False, "error": {"message": "verify failed"}}]})
    said = bench_fleet.apply_said("nictune-apply", failed, 2, 1)
    assert "exit 1" in said and "1 hosts" in said and "h1: verify failed" in said
    recap = "h1 : ok=4 changed=3 unreachable=0 failed=0\nh2 : ok=1 changed=0 unreachable=0 failed=1\n"
    assert "h2: unreachable=0 failed=1" in bench_fleet.apply_said("ansible-apply", recap, 2, 2)
    assert bench_fleet.apply_said("pyinfra-apply", "--> Errors: 1", 2, 1).startswith("exit 1")


def test_apply_mode_takes_its_own_tools():
    assert bench_fleet.apply_tools(",".join(bench_fleet.TOOLS)) == list(bench_fleet.APPLY_TOOLS)
    assert bench_fleet.apply_tools("pyinfra-apply,nictune-apply") == ["nictune-apply", "pyinfra-apply"]
    with pytest.raises(bench_fleet.BenchError, match="--tools with --apply"):
        bench_fleet.apply_tools("nictune,ssh")
