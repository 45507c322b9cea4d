"""The Slurm health check's reason and drain-storm arithmetic
(control/slurmhealth.py); the daemons are in tests/fleet/test_slurm_health_fleet.py."""

from __future__ import annotations

from nictune.control.slurmhealth import MAX_REASON, drift_reason, is_storm


def change(name, before, after, target="host", family="link", status="drift"):
    return {"key": {"family": family, "target": target, "name": name}, "before": before, "after": after,
            "status": status}


def test_the_reason_names_the_first_drifted_setting_and_counts_the_others():
    report = {"exit_code": 2, "changes": [change("mtu", 9000, 9000, "rail0", status="ok"),
                                          change("mtu", 1500, 9000, "rail1"), change("txqueuelen", 1000, 20000, "rail1")]}
    assert drift_reason(report) == "nictune: rail1 link mtu 1500 != 9000 (+1 more)"


def test_a_clean_report_has_no_reason_and_an_error_has_one():
    assert drift_reason({"exit_code": 0, "changes": [change("mtu", 9000, 9000, "rail0", status="ok")]}) == ""
    reason = drift_reason({"exit_code": 1, "changes": [], "error": {"kind": "error", "message": "no rail1\nat all"}})
    assert reason == "nictune: verify failed: no rail1 at all"


def test_a_long_reason_is_cut_to_one_short_line():
    reason = drift_reason({"exit_code": 2, "changes": [change("x" * 300, None, "y")]})
    assert len(reason) == MAX_REASON and reason.endswith("...") and "\n" not in reason


def test_the_storm_threshold_counts_nodes_drained_for_the_same_reason_only():
    r = "nictune: sysctl net.ipv4.tcp_ecn 2 != 1"
    table = {f"n{i}": ("idle", "") for i in range(10)}
    table.update(n1=("drained", r), n2=("draining", r), n3=("drained", "disk replacement"))
    assert not is_storm(table, "n4", r, 30)       # 3 of 10 with this one: allowed
    assert is_storm(table, "n4", r, 20)           # 3 of 10 > 2
    assert not is_storm({"n0": ("idle", "")}, "n0", r, 0)   # one node may always be drained
