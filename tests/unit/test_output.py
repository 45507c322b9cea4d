"""Human output of reports, as plain text (not a terminal): what logs and
change reviews show.  Reports come from the engine on the fake kernel
(recorded ConnectX-7 / MANA state, tests/fakes.py)."""

from __future__ import annotations

import copy
import errno
import json
import os
import re

import pytest

from fakes import FakeHost
from shipped import CX7, MAIA, MAIA_TSO, P0, P1
from nictune.host import agent
from nictune.cli.output import Printer, _summary, _value, envelope
from nictune.host.transaction.engine import Engine



class Box:
    def __init__(self, state, tmp_path):
        self.host = FakeHost(state, tmp_path / "root")
        self.state_dir = str(tmp_path / "state")

    def run(self, command, profile=None, doc=None):
        engine = Engine(self.host, self.state_dir)
        if command == "apply":
            out = engine.apply(doc or profile.doc, profile.sources, profile.path)
        elif command == "rollback":
            out = engine.rollback()
        else:
            out = engine.plan(doc or profile.doc, profile.sources, command)
        return agent.report(out, "fake", 0.0)


def render(host_report: dict, capsys, show_ok=False, profile="p.yaml") -> tuple:
    Printer(False).report(envelope(host_report["command"], [host_report]), show_ok, profile)
    captured = capsys.readouterr()
    return captured.out, captured.err


def _has(columns: list, cells: tuple) -> bool:
    """cells appear among the columns, in order; a long cell may be part of one."""
    i = 0
    for col in columns:
        if i < len(cells) and (col == cells[i] or (len(cells[i]) >= 12 and cells[i] in col)):
            i += 1
    return i == len(cells)


def row(out: str, *cells: str) -> str:
    """The one table line holding every cell, in order (columns are
    separated by two or more spaces in plain output)."""
    found = [line for line in out.splitlines() if _has(re.split(r"\s{2,}", line.strip()), cells)]
    assert len(found) == 1, (cells, out)
    return found[0]


@pytest.fixture
def cx7(tmp_path):
    return Box("cx7-host", tmp_path)


@pytest.fixture
def maia(tmp_path):
    return Box("maia-host", tmp_path)


def test_plan_rows(cx7, capsys):
    out, err = render(cx7.run("plan", CX7), capsys, profile="profiles/connectx7-training.yaml")
    lines = out.splitlines()
    assert lines[0] == "fake: plan profiles/connectx7-training.yaml"
    assert lines[1].split() == ["target", "setting", "before", "after", "status", "source", "note"]
    assert row(out, P1, "link mtu", "1500", "9000", "pending", "connectx7-training.yaml:16")
    assert row(out, P1, "link state", "down", "up", "pending")
    assert row(out, P0, "coalesce adaptive-tx", "off", "on", "pending")
    assert row(out, "host", "sysctl net.ipv4.tcp_rmem", "4096 131072 6291456", "4096 131072 134217728")
    # Interface sysctls read as the profile spells them.
    assert row(out, P0, "sysctl ipv4.arp_announce", "0", "2", "pending")
    assert row(out, "host", "sysctl net.core.rmem_max", "212992", "268435456", "pending",
               "global: one value for every network namespace")
    # Settings already as wanted are left out unless asked for.
    assert "rx-gro" not in out and "rp_filter" not in out
    assert err == ""
    # P0 is up: its MTU, rings and channels changes re-create mlx5's channels.
    assert lines[-1] == ("33 change(s) pending, 13 setting(s) already as wanted. 4 of them "
                         "disruptive (the link drops or queues are reset: see DISRUPTIVE).")
    assert row(out, P0, "link mtu", "1500", "9000", "pending", "connectx7-training.yaml:16",
               "DISRUPTIVE: mlx5")

    out, _ = render(cx7.run("plan", CX7), capsys, show_ok=True)
    assert row(out, P0, "features rx-gro", "on", "on", "ok")
    assert row(out, P1, "sysctl ipv4.rp_filter", "2", "2", "ok")


def test_bounds_are_rendered_as_words(cx7, capsys):
    doc = copy.deepcopy(CX7.doc)
    doc["interfaces"]["rails"]["txqueuelen"] = {"max": 500}
    out, _ = render(cx7.run("plan", CX7, doc), capsys)
    assert row(out, P0, "channels combined", "16", "at least 32", "pending")
    assert row(out, P0, "link txqueuelen", "1000", "at most 500", "pending")


def test_nccl_file_is_a_unified_diff(cx7, capsys):
    out, _ = render(cx7.run("plan", CX7), capsys)
    # In the table, a count of lines; below it, the diff.
    assert row(out, "host", "nccl /etc/nccl.conf", "(4 lines)", "(11 lines)", "pending")
    diff = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    assert diff[:2] == ["--- /etc/nccl.conf (before)", "+++ /etc/nccl.conf (after)"]
    assert diff[2].startswith("@@")
    assert "-NCCL_DEBUG=INFO" in diff and "-NCCL_IB_HCA=mlx5" in diff
    # The file's header, from before headers named their family, is rewritten.
    assert "-# Managed by nictune: edit the profile, not this file." in diff
    assert "+# Managed by nictune (nccl): edit the profile, not this file." in diff
    assert "+NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7" in diff
    assert "+NCCL_IB_TC=106" in diff


def test_a_new_nccl_file_and_a_mixed_feature_group(maia, capsys):
    out, _ = render(maia.run("plan", MAIA_TSO), capsys)
    assert row(out, "host", "nccl /etc/nccl.conf", "(none)", "(6 lines)", "pending")
    diff = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    before = ("--- /etc/nccl.conf (before)", "--- /etc/enroot/mounts.d/90-nictune.fstab (before)")
    assert "+NCCL_IB_HCA==mana_0" in diff and not [d for d in diff if d.startswith("-") and d not in before]
    assert row(out, "enP30832p0s0", "features tso", "mixed (off: tx-tcp-mangleid-segmentation)", "on", "pending")


@pytest.mark.parametrize("value, text", [
    (True, "on"), (False, "off"), (None, "(none)"), ("", '""'), (9000, "9000"),
    ("4096 131072 6291456", "4096 131072 6291456"), ("a\nb\n", "(2 lines)"),
    ({"a": True, "b": False, "c": False}, "mixed (on: a)"),
    ({"a": True, "b": True, "c": False}, "mixed (off: c)"),
])
def test_values(value, text):
    assert _value(value) == text


def test_apply_verify_rollback_summaries(cx7, capsys):
    out, _ = render(cx7.run("apply", CX7), capsys)
    assert row(out, P1, "link mtu", "1500", "9000", "applied")
    assert out.splitlines()[-1] == (
        "Applied 33 change(s), each verified by reading it back; 13 already as wanted.")

    out, _ = render(cx7.run("apply", CX7), capsys)
    assert out.splitlines()[-1] == "Nothing to change: 46 setting(s) already as wanted."

    out, _ = render(cx7.run("verify", CX7), capsys)
    assert out.splitlines()[-1] == "No drift: 46 setting(s) as wanted."

    cx7.host.kernel.links[P0].mtu = 1500
    out, _ = render(cx7.run("verify", CX7), capsys)
    assert row(out, "actual", "expected", "status")  # what the value columns mean for verify
    assert row(out, P0, "link mtu", "1500", "9000", "drift")
    assert out.splitlines()[-1] == "Drift: 1 setting(s) differ from the profile, 45 as wanted."

    cx7.host.kernel.links[P0].mtu = 9000
    report = cx7.run("rollback")
    out, _ = render(report, capsys)
    # restored (the before-value), then undone (what the apply had written)
    assert row(out, "restored", "undone", "status")
    assert row(out, P1, "link mtu", "1500", "9000", "reverted")
    assert out.splitlines()[-1] == f"Restored 33 setting(s) from apply {report['journal']}."

    out, _ = render(cx7.run("plan", CX7), capsys)
    assert out.splitlines()[-1].startswith("33 change(s) pending, 13 setting(s) already as wanted. 4 of")


def test_a_failed_apply_prints_the_error_last(cx7, capsys):
    cx7.host.kernel.fail("set_rings", P1, errno.ENOMEM)
    out, err = render(cx7.run("apply", CX7), capsys)
    assert row(out, P1, "rings rx", "1024", "8192", "failed", "write refused: Cannot allocate memory")
    assert row(out, P0, "rings rx", "1024", "8192", "reverted")
    assert row(out, P1, "link mtu", "1500", "9000", "not-applied")
    assert out.splitlines()[-1] == "Apply failed; see below."
    assert err.startswith("error: rings rx on enp23s0f1np1 failed")
    assert err.strip().endswith("every change was restored")


def test_warnings_go_to_stderr(maia, capsys):
    doc = copy.deepcopy(MAIA.doc)
    doc["interfaces"]["mana-vf"]["on_unsupported"] = "warn"
    doc["interfaces"]["mana-vf"]["pause"] = {"rx": False}
    out, err = render(maia.run("plan", MAIA, doc), capsys)
    assert err == "warning: skipped pause rx on enP30832p0s0: the driver does not support pause settings\n"
    assert row(out, "enP30832p0s0", "pause rx", "(none)", "off", "skipped", "does not support pause")


def test_an_error_before_any_host(capsys):
    Printer(False).report(envelope("plan", [], error={"kind": "profile", "message": "p.yaml:3: bad"}))
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "error: p.yaml:3: bad\n"


def test_json_output_is_the_report(cx7, capsys):
    report = envelope("plan", [cx7.run("plan", CX7)])
    Printer(True).report(report)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))


@pytest.mark.parametrize("codes, combined", [
    ([], 0), ([0, 0], 0), ([0, 2], 2), ([2, 1], 1), ([1, 3], 3), ([3, 4, 2], 4),
])
def test_envelope_exit_code_is_the_most_serious(codes, combined):
    hosts = [{"exit_code": c} for c in codes]
    assert envelope("apply", hosts)["exit_code"] == combined
    assert envelope("apply", hosts, error={"kind": "profile", "message": "x"})["exit_code"] == 1


def test_summary_of_an_unknown_command_is_empty():
    assert _summary({"command": "show", "summary": {}}) == ""


def test_diffs_of_verify_and_rollback_read_in_their_direction(cx7, capsys):
    assert cx7.run("apply", CX7)["exit_code"] == 0
    # (Appending NCCL_DEBUG=TRACE would change nothing: NCCL takes a
    # variable's first line, and verify compares variables.)
    path = os.path.join(cx7.host.root, "etc/nccl.conf")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("NCCL_DEBUG=WARN", "NCCL_DEBUG=TRACE"))
    out, _ = render(cx7.run("verify", CX7), capsys)
    diff = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    assert diff[:2] == ["--- /etc/nccl.conf (actual)", "+++ /etc/nccl.conf (expected)"]
    assert "-NCCL_DEBUG=TRACE" in diff

    out, _ = render(cx7.run("rollback"), capsys)
    diff = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    # From what the apply wrote back to the hand-written file it replaced.
    assert diff[:2] == ["--- /etc/nccl.conf (undone)", "+++ /etc/nccl.conf (restored)"]
    assert "+NCCL_DEBUG=INFO" in diff and "-NCCL_DEBUG=WARN" in diff


def test_a_summary_says_how_many_settings_wait_for_a_reset():
    from nictune.cli.output import _summary

    text = _summary({"command": "verify", "summary": {"ok": 3, "pending-reset": 2}, "changes": []})
    assert "2 setting(s) stored, running only after a reset or reboot" in text
