"""The cabling plan: its strict CSV reader, the fleet checks over the
neighbours the hosts saw (wrong switch or port, swapped rails, one port
claimed twice, no neighbour), and what an audit makes of it: the exit
code, the JSON document, the table, JUnit and Markdown."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from nictune.cli import fleet_cmds
from nictune.cli.app import app
from nictune.control.review import cabling
from nictune.control.review.cabling import CablingError, Expected, check, parse_plan
from nictune.host.facts.lldp import Neighbour

PLAN = """# the lab's two hosts, two rails each
host,rail,switch,port
gpu01,rail0,leaf1,swp1
gpu01,rail1,leaf2*,swp1
gpu02,rail0,leaf1,swp2
gpu02,rail1,leaf2*,swp2
"""


def nb(switch: str, port: str, chassis: str = "") -> Neighbour:
    """A neighbour as lldpd sends it: the port's name in the port description."""
    return Neighbour(chassis_id=chassis or f"chassis of {switch}", chassis_subtype="local",
                     port_id=f"{switch} ifindex {port[-1]}", port_subtype="local", ttl=120,
                     port_description=port, system_name=switch)


def as_planned() -> dict:
    return {"gpu01": {"rail0": nb("leaf1", "swp1"), "rail1": nb("leaf2-r1", "swp1")},
            "gpu02": {"rail0": nb("leaf1", "swp2"), "rail1": nb("leaf2-r1", "swp2")}}


def rows_by_rail(doc: dict) -> dict:
    return {(r["host"], r["rail"]): r for r in doc["rails"]}


# -- the plan's reader --------------------------------------------------------------

def test_a_plan_reads_with_comments_crlf_quotes_and_a_bom():
    text = "\ufeff" + PLAN.replace("\n", "\r\n") + '\r\n"gpu03","rail0","leaf 3","Ethernet1/1"\r\n'
    rows = parse_plan(text, "cabling.csv")
    assert [(r.host, r.rail, r.switch, r.port, r.source) for r in rows] == [
        ("gpu01", "rail0", "leaf1", "swp1", "cabling.csv:3"),
        ("gpu01", "rail1", "leaf2*", "swp1", "cabling.csv:4"),
        ("gpu02", "rail0", "leaf1", "swp2", "cabling.csv:5"),
        ("gpu02", "rail1", "leaf2*", "swp2", "cabling.csv:6"),
        ("gpu03", "rail0", "leaf 3", "Ethernet1/1", "cabling.csv:8")]


@pytest.mark.parametrize("text, where, words", [
    ("gpu01,rail0,leaf1,swp1\n", "p.csv:1", "header"),
    ("# only a comment\n\n", "p.csv", "empty"),
    ("host,rail,switch,port\ngpu01,rail0,leaf1\n", "p.csv:2", "3 column(s), expected 4"),
    ("host,rail,switch,port\ngpu01,rail0,leaf1,swp1,extra\n", "p.csv:2", "5 column(s)"),
    ("host,rail,switch,port\ngpu01, ,leaf1,swp1\n", "p.csv:2", "column rail is empty"),
    ("host,rail,switch,port\ngpu01,rail0,leaf1,swp1\n\ngpu01,rail0,leaf9,swp9\n", "p.csv:4",
     "planned twice (first at line 2)"),
    ("host,rail,switch,port\ngpu01,averyveryverylongrail,leaf1,swp1\n", "p.csv:2",
     "column rail is 21 characters, at most 15"),
    ("host,rail,switch,port\ngpu01,rail0,leaf\x1b[31m,swp1\n", "p.csv:2", "control or invisible character: 'leaf\\x1b[31m'"),
    ("host,rail,switch,port\ngpu01,\rrail0,leaf1,swp1\n", "p.csv:2", "column rail holds a control"),
    ("host,rail,switch,port\ngpu01,rail0,leaf\u202e1,swp1\n", "p.csv:2", "control or invisible character"),
    ('host,rail,switch,port\ngpu01,rail0,"leaf1,swp1\n', "p.csv:2", "not a CSV record"),
    ("host,rail,switch,port\ngpu*,rail0,leaf1,swp1\n", "p.csv:2", "column host is a name, not a pattern"),
    ("host,rail,switch,port\ngpu01,rail0,leaf1,swp[12]\n", "p.csv:2", "column port is a name"),
])
def test_a_bad_plan_is_one_error_naming_file_and_line(text, where, words):
    with pytest.raises(CablingError) as e:
        parse_plan(text, "p.csv")
    assert str(e.value).startswith(where + ":") or str(e.value).startswith(where + " ")
    assert words in str(e.value)
    assert "\x1b" not in str(e.value)


def test_a_plan_file_that_is_too_large_or_not_utf8_is_refused(tmp_path):
    big = tmp_path / "big.csv"
    big.write_bytes(b"host,rail,switch,port\n" + b"#" * cabling.MAX_BYTES)
    with pytest.raises(CablingError, match=r"big.csv: a cabling plan is at most"):
        cabling.load_plan(str(big))
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"host,rail,switch,port\ngpu01,rail0,leaf\xe9,swp1\n")
    with pytest.raises(CablingError, match=r"latin.csv:2: not UTF-8"):
        cabling.load_plan(str(latin))
    with pytest.raises(CablingError, match=r"cannot read the cabling plan .*absent.csv"):
        cabling.load_plan(str(tmp_path / "absent.csv"))


def test_a_plan_has_at_most_max_rows(monkeypatch):
    monkeypatch.setattr(cabling, "MAX_ROWS", 3)
    text = "host,rail,switch,port\n" + "".join(f"h{i},rail0,leaf1,swp{i}\n" for i in range(4))
    with pytest.raises(CablingError, match=r"p.csv:5: a cabling plan has at most 3 rows"):
        parse_plan(text, "p.csv")


def test_hostile_plans_give_cabling_errors_only():
    """Seeded mutations of a good plan: every one reads or is a
    CablingError naming the file; nothing else escapes."""
    rng = random.Random(24)
    alphabet = ',"\n\r#*?[]\x00\x1b\u202e ab1' + "x" * 4
    read = refused = 0
    for _ in range(3000):
        text = list(PLAN)
        for _ in range(rng.randint(1, 6)):
            text.insert(rng.randrange(len(text) + 1), rng.choice(alphabet))
        try:
            rows = parse_plan("".join(text), "fuzz.csv")
            assert all(len(r.rail) <= 15 and "\x00" not in r.host for r in rows)
            read += 1
        except CablingError as e:
            assert str(e).startswith("fuzz.csv")
            refused += 1
    print(f"hostile plans: {read} read, {refused} refused")
    assert read + refused == 3000 and read > 100 and refused > 100


def test_default_plan_is_cabling_csv_next_to_the_inventory(tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu01\n")
    assert cabling.default_path(str(inventory)) is None
    (tmp_path / "cabling.csv").write_text(PLAN)
    assert cabling.default_path(str(inventory)) == str(tmp_path / "cabling.csv")
    assert cabling.default_path(str(tmp_path)) == str(tmp_path / "cabling.csv")


# -- the fleet checks ---------------------------------------------------------------

def test_a_fleet_cabled_as_planned_passes():
    doc = check(parse_plan(PLAN, "c.csv"), as_planned(), "c.csv")
    assert doc["summary"]["rails"] == 4 and doc["summary"]["ok"] == 4 and doc["summary"]["failing"] == 0
    assert {r["status"] for r in doc["rails"]} == {"ok"}


def test_two_hosts_with_crossed_rails_name_each_other():
    seen = as_planned()
    seen["gpu01"]["rail0"], seen["gpu02"]["rail0"] = nb("leaf1", "swp2"), nb("leaf1", "swp1")
    doc = check(parse_plan(PLAN, "c.csv"), seen, "c.csv")
    rows = rows_by_rail(doc)
    one, two = rows[("gpu01", "rail0")], rows[("gpu02", "rail0")]
    assert (one["status"], one["planned_for"]) == ("wrong-port", "gpu02 rail0")
    assert (two["status"], two["planned_for"]) == ("wrong-port", "gpu01 rail0")
    assert one["expected"] == {"switch": "leaf1", "port": "swp1", "source": "c.csv:3"}
    assert (one["seen"]["system_name"], one["seen"]["port_description"]) == ("leaf1", "swp2")
    # lldpd's port id is not the port's name: the description is shown
    assert "expected leaf1 port swp1 (c.csv:3), seen leaf1 port swp2," in one["message"]
    assert one["seen"]["port"] == "swp2"
    assert "which the plan gives gpu02 rail0" in one["message"]
    assert doc["summary"]["wrong-port"] == 2 and doc["summary"]["failing"] == 2


def test_swapped_rails_within_a_host():
    seen = as_planned()
    seen["gpu01"] = {"rail0": nb("leaf2-r1", "swp1"), "rail1": nb("leaf1", "swp1")}
    rows = rows_by_rail(check(parse_plan(PLAN, "c.csv"), seen))
    assert rows[("gpu01", "rail0")]["status"] == "swapped"
    assert rows[("gpu01", "rail0")]["swapped_with"] == "rail1"
    assert rows[("gpu01", "rail1")]["swapped_with"] == "rail0"
    assert "gpu01 rail0 and rail1 are swapped" in rows[("gpu01", "rail0")]["message"]
    assert rows[("gpu02", "rail0")]["status"] == "ok"


def test_wrong_switch_no_neighbour_and_a_rail_the_report_lacks():
    seen = as_planned()
    seen["gpu01"]["rail0"] = nb("spine7", "swp1")
    seen["gpu02"]["rail0"] = None
    del seen["gpu02"]["rail1"]
    rows = rows_by_rail(check(parse_plan(PLAN, "c.csv"), seen))
    wrong = rows[("gpu01", "rail0")]
    assert wrong["status"] == "wrong-switch" and "planned_for" not in wrong
    assert "seen spine7 port" in wrong["message"]
    assert rows[("gpu02", "rail0")]["status"] == "no-neighbour"
    assert rows[("gpu02", "rail0")]["seen"] is None
    assert "no LLDP neighbour heard" in rows[("gpu02", "rail0")]["message"]
    assert rows[("gpu02", "rail1")]["status"] == "no-neighbour"
    assert "no such rail in its report" in rows[("gpu02", "rail1")]["message"]


def test_two_hosts_claiming_one_switch_port():
    seen = as_planned()
    seen["gpu02"]["rail1"] = nb("leaf2-r1", "swp1")  # the port gpu01 rail1 sees too
    seen["gpu03"] = {"rail0": nb("leaf1", "swp2")}  # a host the plan does not name
    rows = rows_by_rail(check(parse_plan(PLAN, "c.csv"), seen))
    assert rows[("gpu01", "rail1")]["status"] == "duplicate-port"
    assert rows[("gpu01", "rail1")]["claimed_by"] == ["gpu02 rail1"]
    assert rows[("gpu02", "rail1")]["claimed_by"] == ["gpu01 rail1"]
    assert rows[("gpu02", "rail0")]["claimed_by"] == ["gpu03 rail0"]
    doc = check(parse_plan(PLAN, "c.csv"), seen)
    assert doc["unplanned"] == ["gpu03"] and doc["summary"]["duplicate-port"] == 3


def test_port_id_or_description_and_the_chassis_when_no_name():
    plan = [Expected("h", "rail0", "aa:bb:*", "swp9", "c.csv:2")]
    cumulus = Neighbour(chassis_id="aa:bb:cc:dd:ee:ff", chassis_subtype="mac", port_id="swp9",
                        port_subtype="interface-name", ttl=120)
    assert check(plan, {"h": {"rail0": cumulus}})["rails"][0]["status"] == "ok"


def test_hosts_not_read_are_not_checked():
    plan = parse_plan(PLAN, "c.csv")
    reports = [{"host": "gpu01", "error": None, "facts": {
                    "rail0": {"driver": "veth", "neighbour": nb("leaf1", "swp1").to_dict()},
                    "rail1": {"neighbour": {"chassis_id": 7}}}},   # does not read: none heard
               {"host": "gpu02", "error": {"kind": "transport", "message": "unreachable"}}]
    doc = cabling.for_audit(reports, plan, "c.csv")
    rows = rows_by_rail(doc)
    assert set(rows) == {("gpu01", "rail0"), ("gpu01", "rail1")}
    assert rows[("gpu01", "rail0")]["status"] == "ok"
    assert rows[("gpu01", "rail1")]["status"] == "no-neighbour"
    assert doc["not_read"] == ["gpu02"]
    assert "not checked (could not be audited): gpu02" in cabling.text_lines(doc)[-1]


def test_hostile_reports_never_break_the_check():
    """A host's report is its word: seeded junk where the facts and the
    neighbour go gives rows (no-neighbour where nothing reads), never an
    exception."""
    rng = random.Random(7)
    good = nb("leaf1", "swp1").to_dict()
    junk = [None, 1, "x", [], {}, [good], {"rail0": 3}, dict(good, system_name=7),
            dict(good, port_id="a" * 10_000), dict(good, source="elsewhere"), dict(good, ttl=-1),
            dict(good, apps=[{"selector": 9}]), {"neighbour": "leaf1"}, good]
    plan = parse_plan(PLAN, "c.csv")
    statuses: dict = {}
    for _ in range(2000):
        facts = rng.choice([None, "facts", [1], {
            "rail0": rng.choice([{"neighbour": rng.choice(junk)}, rng.choice(junk)]),
            "rail1": {"neighbour": rng.choice(junk)}}])
        doc = cabling.for_audit([{"host": "gpu01", "error": None, "facts": facts}], plan, "c.csv")
        assert doc["summary"]["rails"] == 2
        for row in doc["rails"]:
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    print(f"hostile reports: {statuses}")
    # rail1 is planned on leaf2: the good neighbour there is the wrong switch,
    # and on both rails one port claimed twice.
    assert set(statuses) == {"ok", "no-neighbour", "wrong-switch", "duplicate-port"}
    assert sum(statuses.values()) == 4000 and statuses["no-neighbour"] > 3000


# -- the audit ------------------------------------------------------------------

PROFILE = "nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n"


def _fleet_files(tmp_path, plan: str = PLAN):
    (tmp_path / "hosts.ini").write_text("[gpus]\ngpu01 ansible_host=198.18.0.1\ngpu02 ansible_host=198.18.0.2\n")
    (tmp_path / "p.yaml").write_text(PROFILE)
    (tmp_path / "cabling.csv").write_text(plan)
    return str(tmp_path / "hosts.ini"), str(tmp_path / "p.yaml")


def _fake_run_jobs(monkeypatch, seen: dict, asked: list):
    """The hosts' verify reports, with each rail's neighbour as the lldp
    reader puts it in the facts (host/facts/lldp.py to_dict)."""
    def run_jobs(command, jobs, opts, tick):
        asked.append(command)
        return [{"host": job.label, "command": command, "ok": True, "exit_code": 0, "changed": False,
                 "summary": {}, "changes": [], "warnings": [], "error": None, "seconds": 0.01,
                 "facts": {rail: {"neighbour": None if n is None else n.to_dict()}
                           for rail, n in seen[job.label].items()}} for job in jobs]
    monkeypatch.setattr(fleet_cmds, "run_jobs", run_jobs)


def test_audit_names_crossed_rails_in_json_table_junit_and_markdown(tmp_path, monkeypatch):
    inventory, profile = _fleet_files(tmp_path)
    seen = as_planned()
    seen["gpu01"]["rail0"], seen["gpu02"]["rail0"] = nb("leaf1", "swp2"), nb("leaf1", "swp1")
    asked: list = []
    _fake_run_jobs(monkeypatch, seen, asked)
    junit = tmp_path / "audit.xml"
    result = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--json", "--junit", str(junit)])
    assert result.exit_code == 2, result.output
    assert asked == ["verify"]  # one pass over the hosts, nothing more
    doc = json.loads(result.stdout)["cabling"]
    assert doc["plan"] == str(tmp_path / "cabling.csv")
    assert [(r["host"], r["rail"], r["status"], r.get("planned_for")) for r in doc["rails"]] == [
        ("gpu01", "rail0", "wrong-port", "gpu02 rail0"), ("gpu01", "rail1", "ok", None),
        ("gpu02", "rail0", "wrong-port", "gpu01 rail0"), ("gpu02", "rail1", "ok", None)]

    suites = ET.parse(junit).getroot()
    cab = suites.find("testsuite[@name='nictune cabling']")
    assert cab is not None and cab.get("tests") == "4" and cab.get("failures") == "2"
    failures = {c.get("name"): c.find("failure") for c in cab}
    assert failures["gpu01 rail0"].get("type") == "wrong-port"
    assert "which the plan gives gpu02 rail0" in failures["gpu01 rail0"].get("message")
    assert failures["gpu01 rail1"] is None
    assert suites.get("failures") == "2" and suites.get("tests") == "6"

    text = CliRunner().invoke(app, ["audit", profile, "-i", inventory])
    assert text.exit_code == 2
    assert "cabling (" in text.stdout and "2 of 4 rail(s) as planned, 2 not" in text.stdout
    assert "  gpu01 rail0 is on the wrong port: expected leaf1 port swp1" in text.stdout

    md = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--format", "markdown"])
    assert "#### Cabling" in md.stdout and "planned for gpu02 rail0" in md.stdout
    assert "`leaf1 port swp1`" in md.stdout


def test_audit_of_a_fleet_cabled_as_planned_exits_0(tmp_path, monkeypatch):
    inventory, profile = _fleet_files(tmp_path)
    _fake_run_jobs(monkeypatch, as_planned(), [])
    result = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cabling"]["summary"]["ok"] == 4


def test_a_bad_plan_stops_the_audit_before_any_host(tmp_path, monkeypatch):
    inventory, profile = _fleet_files(tmp_path, PLAN + "gpu01,rail0,leaf1\n")
    asked: list = []
    _fake_run_jobs(monkeypatch, as_planned(), asked)
    result = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--json"])
    assert result.exit_code == 1 and asked == []
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "invalid-input"
    assert error["message"].startswith(str(tmp_path / "cabling.csv") + ":7: 3 column(s)")
    other = tmp_path / "other.csv"
    other.write_text(PLAN)
    result = CliRunner().invoke(app, ["audit", profile, "-i", inventory, "--json", "--cabling", str(other)])
    assert result.exit_code == 0 and json.loads(result.stdout)["cabling"]["plan"] == str(other)
