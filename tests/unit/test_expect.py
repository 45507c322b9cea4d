"""expect: health expectations are read-only keys.  The ExpectFamily on its
own, the schema fragment, and the engine: plan shows unmet ones, verify and
apply report them as drift (exit 2), apply writes the rest and never them.

The host is the recorded ConnectX-7 state on the fake kernel (tests/fakes.py)
with the sysfs tree of tests/fixtures/health/mlx5-host under its root.
"""

from __future__ import annotations

import os
import shutil

import pytest

from fakes import FakeHost
from nictune.host import agent
from nictune.host import model as m
from nictune.host.transaction.engine import Engine, Families
from nictune.host.knobs.expect import ExpectFamily, version_met
from nictune.host.model import Key
from nictune.profile import check as profile_check
from nictune.profile import schema as s
from nictune.profile.errors import ProfileError
from nictune.profile.yamlpos import parse_text

pytestmark = pytest.mark.recorded

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "fixtures", "health", "mlx5-host")
P0, P1 = "enp23s0f0np0", "enp23s0f1np1"  # firmware 28.39.1002 (MT_0000000838) in cx7-host


@pytest.fixture
def host(tmp_path):
    root = tmp_path / "root"
    fake = FakeHost("cx7-host", root)
    # The fake kernel made sys/class/net/X/device directories; merge the
    # fixture's PCI device files into them.
    shutil.copytree(os.path.join(FIXTURE, "sys"), root / "sys", symlinks=False, dirs_exist_ok=True)
    fake.state_dir = str(tmp_path / "state")
    return fake


def doc(**entries) -> dict:
    return {"nictune": 1, "interfaces": {name: e for name, e in entries.items()}}


def rail(name, expect, **settings):
    return {"match": {"name": name}, "expect": expect, **settings}


def by_key(out) -> dict:
    return {(c.key.target, c.key.name): c for c in out.changes if c.key.family == "expect"}


def exit_code(out) -> int:
    return agent.report(out, "test", 0.0)["exit_code"]


@pytest.mark.parametrize("wanted,actual,met", [
    (">=28.39", "28.39.1002 (MT_0000000838)", True),
    (">=28.40", "28.39.1002 (MT_0000000838)", False),
    ("<28.39.1003", "28.39.1002", True),
    (">28.39.1002", "28.39.1002", False),
    ("28.39", "28.39.0", True),           # missing parts count as 0
    ("==28.39", "28.39.1002", False),
    ("28.39.1002", "28.39.1002 (MT_0000000838)", True),
    (">=14.9", "14.23.1020 (MT_2420110034)", True),   # numeric, not text: 23 > 9
    (">=1", "3.30, 0x800005cc", False),   # igb's text is no dotted number: unmet
    (">=1", None, False),
])
def test_firmware_versions_compare_numerically_per_part(wanted, actual, met):
    assert version_met(wanted, actual) is met


def test_plan_shows_met_and_unmet_expectations(host):
    out = Engine(host, host.state_dir).plan(doc(
        a=rail(P0, {"driver": "mlx5_core", "firmware": ">=28.39", "link_speed_mbps": 400000,
                    "pcie_speed_gts": 32, "pcie_width": 16, "counters": {"out_of_sequence": {"max": 0}}}),
        b=rail(P1, {"firmware": ">=28.40", "pcie_width": 16, "link_speed_mbps": 400000,
                    "counters": {"rp_cnp_handled": {"min": 1}}})), {})
    status = {k: (c.status, c.before) for k, c in by_key(out).items()}
    assert status == {
        (P0, "driver"): (m.OK, "mlx5_core"),
        (P0, "firmware"): (m.OK, "28.39.1002 (MT_0000000838)"),
        (P0, "link_speed_mbps"): (m.OK, 400000),
        (P0, "pcie_speed_gts"): (m.OK, 32),
        (P0, "pcie_width"): (m.OK, 16),
        (P0, "counters.out_of_sequence"): (m.OK, 0),
        (P1, "firmware"): (m.DRIFT, "28.39.1002 (MT_0000000838)"),
        (P1, "pcie_width"): (m.DRIFT, 8),            # trained at x8
        (P1, "link_speed_mbps"): (m.DRIFT, None),    # link down: not reported
        (P1, "counters.rp_cnp_handled"): (m.DRIFT, None),
    }
    assert exit_code(out) == 2
    assert not out.error


def test_apply_writes_the_rest_and_reports_unmet_expectations_as_drift(host):
    before = host.kernel.snapshot()
    out = Engine(host, host.state_dir).apply(
        doc(a=rail(P1, {"pcie_width": 16, "driver": "mlx5_core"}, mtu=9000)), {}, "p.yaml")
    assert out.error is None
    statuses = {(c.key.family, c.key.name): c.status for c in out.changes}
    assert statuses == {("link", "mtu"): m.APPLIED, ("expect", "pcie_width"): m.DRIFT,
                        ("expect", "driver"): m.OK}
    assert exit_code(out) == 2
    after = host.kernel.snapshot()
    changed_files = {path for path in after["files"] if after["files"][path] != before["files"].get(path)}
    # The MTU, and what the kernel changes with it (addrconf's ipv6 mtu); no
    # write for the expectations.
    assert changed_files == {f"proc/sys/net/ipv6/conf/{P1}/mtu"}
    assert {k for k in after if after[k] != before[k]} == {"links", "files"}


def test_apply_with_only_unmet_expectations_writes_nothing(host):
    before = host.kernel.snapshot()
    out = Engine(host, host.state_dir).apply(doc(a=rail(P1, {"pcie_width": 16})), {}, "p.yaml")
    assert [c.status for c in out.changes] == [m.DRIFT] and exit_code(out) == 2
    assert host.kernel.snapshot() == before
    assert not os.path.exists(os.path.join(host.state_dir, "journal.json"))


def test_verify_reports_drift_and_health_facts(host):
    out = Engine(host, host.state_dir).plan(doc(a=rail(P1, {"pcie_width": 16})), {}, "verify")
    assert [c.status for c in out.changes] == [m.DRIFT]
    assert sorted(out.facts) == [P1]
    assert out.facts[P1]["pcie_width"] == 8 and out.facts[P1]["rdma_device"] == "mlx5_1"


def test_show_includes_health_facts(host):
    facts = Engine(host, host.state_dir).show().facts
    assert facts[P0]["pcie_speed_gts"] == 32 and facts[P0]["link_speed_mbps"] == 400000
    assert facts[P0]["driver"] == "mlx5_core"  # the interface facts stay


def test_nothing_writes_a_read_only_family(host):
    fams = Families(host)
    with pytest.raises(RuntimeError, match="read-only"):
        fams.write("expect", [(Key("expect", P0, "driver"), "igb")])


def test_hostile_counter_names_are_refused(host):
    with pytest.raises(ValueError):
        ExpectFamily(host).expand(P0, {"expect": {"counters": {"../x": 1}}}, lambda *a: "")


# -- the schema fragment, as schema.py hooks it into the profile schema ---------

def _check(text: str) -> None:
    parsed = parse_text(text, "p.yaml")
    profile_check.check(parsed.doc, parsed.positions, parsed.plain, schema=s.SCHEMA)


def test_schema_accepts_an_expect_section():
    _check("nictune: 1\ninterfaces:\n  rail:\n    match: {driver: mlx5_core}\n    expect:\n"
           "      driver: mlx5_core\n      firmware: \">=28.39\"\n      link_speed_mbps: 400000\n"
           "      pcie_width: {min: 16}\n      pcie_speed_gts: 32\n"
           "      counters: {rx_out_of_buffer: {max: 0}, np_cnp_sent: 0}\n")


@pytest.mark.parametrize("bad,words", [
    ('firmware: "newest"', "dotted version"),
    ("pcie_speed_gts: 30", "one of"),
    ("colour: blue", "colour"),
    ('counters: {"a b": 1}', "counter name"),
])
def test_schema_refuses_bad_expectations_with_line_and_words(bad, words):
    with pytest.raises(ProfileError) as e:
        _check(f"nictune: 1\ninterfaces:\n  rail:\n    match: {{driver: mlx5_core}}\n    expect:\n      {bad}\n")
    assert "p.yaml:6" in str(e.value) and words in str(e.value)
