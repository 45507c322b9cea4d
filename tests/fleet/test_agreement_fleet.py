"""Fleet agreement over real sshd (control/review/agreement.py): two groups,
two profiles, one fabric.  Every host matches its own profile (no drift),
yet the group `canary` runs NCCL_IB_TC 0 and MTU 4200 where `rest` runs
106 and 9000: `nictune audit` names the outlier, the values and the
failure they predict, from the reports the audit read anyway: through
each host's agent, through the probe and through the resident agent.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from fleet_helpers import nictune
from test_resident_audit_fleet import start_agent, stop  # the resident agent, run as its unit runs it

from nictune.control.remote import agentzip
from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
host:
  nccl:
    env: {{NCCL_IB_TC: {tc}, NCCL_IB_GID_INDEX: 3}}
interfaces:
  rails:
    match: {{name: "rail*"}}
    mtu: {mtu}
"""


# The profiles' own say: the hosts (veth rails) take no part in comparing drivers.
SKIP_DRIVER = "agreement:\n  skip: [driver]\n"


def playbook(tmp_path) -> str:
    (tmp_path / "rest.yaml").write_text(PROFILE.format(tc=106, mtu=9000) + SKIP_DRIVER)
    (tmp_path / "canary.yaml").write_text(PROFILE.format(tc=0, mtu=4200) + SKIP_DRIVER)
    path = tmp_path / "fabric.yaml"
    path.write_text("- hosts: rest\n  profile: rest.yaml\n- hosts: canary\n  profile: canary.yaml\n")
    return str(path)


def with_fabric(fleet, tmp_path) -> str:
    """The fleet's inventory, its hosts in one fabric."""
    path = tmp_path / "inventory.ini"
    path.write_text(open(fleet.inventory).read() + "\n[fleet:vars]\nnictune_fabric=lab\n")
    return str(path)


def test_two_groups_that_each_match_their_profile_disagree_with_their_fabric(make_fleet, tmp_path):
    fleet = make_fleet(4)
    canary = fleet.of_kind("sshd")[0].name
    rest = sorted(h.name for h in fleet.of_kind("sshd")[1:])
    book, inventory = playbook(tmp_path), with_fabric(fleet, tmp_path)
    code, report = nictune("apply", book, "-i", inventory)
    assert code == 0, report

    junit, prom = tmp_path / "audit.xml", tmp_path / "audit.prom"
    audits = []
    for how in ("--no-probe", "--probe"):  # the agents' reports, then the probe's
        code, report = nictune("audit", book, "-i", inventory, "--junit", str(junit),
                               "--prometheus", str(prom), how)
        audits.append(report)
        assert {h["host"]: h["summary"] for h in report["hosts"]} == {
            h: {"ok": 3} for h in [canary] + rest}  # each host as its own profile wants
        assert code == 2  # and yet the fabric disagrees
        assert {h["fabric"] for h in report["hosts"]} == {"lab"}
        [fabric] = report["agreement"]["fabrics"]
        bad = {row["name"]: row for row in fabric["values"] if not row["agree"]}
        assert set(bad) == {"NCCL_IB_TC", "mtu"}
        assert bad["NCCL_IB_TC"]["majority"] == {"value": "106", "shown": "106", "count": 3}
        assert [(o["value"], o["hosts"]) for o in bad["NCCL_IB_TC"]["outliers"]] == [("0", [canary])]
        assert [(o["value"], o["hosts"]) for o in bad["mtu"]["outliers"]] == [(4200, [canary])]
        assert "hang" in bad["mtu"]["predicts"] and "PFC" in bad["NCCL_IB_TC"]["predicts"]
        # A value the two profiles share agrees; the one they skip is not compared.
        compared = {row["name"]: row["agree"] for row in fabric["values"]}
        assert compared["NCCL_IB_GID_INDEX"] is True and "driver" not in compared
    assert {h["via"] for h in audits[0]["hosts"]} == {"zipapp"}
    assert {h["via"] for h in audits[1]["hosts"]} == {"probe"}
    assert audits[0]["agreement"] == audits[1]["agreement"]

    # Through the hosts' resident agents: the same agreement again.
    procs = []
    try:
        procs = [start_agent(fleet, h, agentzip.build().data) for h in fleet.of_kind("sshd")]
        code, resident = nictune("audit", book, "-i", inventory, "--no-probe")
        assert code == 2 and {h["via"] for h in resident["hosts"]} == {"resident"}
        assert resident["agreement"] == audits[0]["agreement"]
    finally:
        stop(procs)

    failures = [c for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    assert sorted(c.get("name") for c in failures) == [f"NCCL_IB_TC on {canary}", f"mtu on {canary}"]
    text = prom.read_text()
    assert f'nictune_fabric_outlier{{fabric="lab",name="mtu",host="{canary}"}} 1' in text
    assert 'nictune_fabric_value_outliers{fabric="lab",name="NCCL_IB_TC"} 1' in text

    # The terminal: the sentence, with the outlier named.
    from typer.testing import CliRunner

    from nictune.cli.app import app

    out = CliRunner().invoke(app, ["audit", book, "-i", inventory]).output
    assert (f"fabric lab: NCCL_IB_TC 106 on 3 hosts, 0 on 1 ({canary}): their QPs use the peer's "
            "traffic class") in out
    assert "4 host(s): 4 ok; 2 fabric value(s) disagree on 1 host(s)." in out


def test_a_drifted_rail_makes_its_host_an_outlier_and_no_fabric_no_comparison(make_fleet, tmp_path):
    fleet = make_fleet(3)
    a, b, c = fleet.of_kind("sshd")
    profile = tmp_path / "p.yaml"
    profile.write_text(PROFILE.format(tc=106, mtu=9000))
    inventory = with_fabric(fleet, tmp_path)
    code, report = nictune("apply", str(profile), "-i", inventory, "--limit", "fleet")
    assert code == 0, report
    run_in(b, ["ip", "link", "set", "rail1", "mtu", "1500"])
    code, report = nictune("audit", str(profile), "-i", inventory, "--limit", "fleet")
    assert code == 2
    [fabric] = report["agreement"]["fabrics"]
    [mtu] = [row for row in fabric["values"] if row["name"] == "mtu"]
    [driver] = [row for row in fabric["values"] if row["name"] == "driver"]  # from the facts
    assert driver["agree"] and driver["majority"] == {"value": "veth", "shown": "veth", "count": 3}
    assert mtu["outliers"] == [{"value": {"rails": [1500, 9000]}, "shown": "1500|9000 (rails differ)",
                                "hosts": [b.name]}]
    # The lab's own inventory names no fabric: the same audit compares nothing.
    code, report = nictune("audit", str(profile), "-i", fleet.inventory, "--limit", "fleet")
    assert "agreement" not in report and all("fabric" not in h for h in report["hosts"])


def test_a_change_review_says_which_hosts_the_change_makes_disagree(make_fleet, tmp_path):
    # The canary's inventory pins its rails at 9000; the change lowers the
    # profile's MTU to 4200: the other three follow it, the canary does not.
    fleet = make_fleet(4)
    canary = fleet.of_kind("sshd")[0].name
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(open(fleet.inventory).read() + "\n[fleet:vars]\nnictune_fabric=lab\n\n"
                         '[canary:vars]\nnictune={"interfaces": {"rails": {"mtu": 9000}}}\n')
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(PROFILE.format(tc=106, mtu=9000))
    new.write_text(PROFILE.format(tc=106, mtu=4200))
    code, report = nictune("plan", str(new), "--base-file", str(old), "-i", str(inventory),
                           "--limit", "fleet")
    assert code == 2, report
    effect = report["change"]["agreement"]
    assert (effect["hosts"], effect["rows"], effect["fixed_hosts"]) == ([canary], ["lab: mtu"], [])
    from typer.testing import CliRunner

    from nictune.cli.app import app

    args = ["plan", str(new), "--base-file", str(old), "-i", str(inventory), "--limit", "fleet"]
    text = CliRunner().invoke(app, args).output
    assert f"This change makes 1 host(s) disagree with their fabric ({canary}) on lab: mtu." in text
    markdown = CliRunner().invoke(app, args + ["--format", "markdown"]).output
    assert "#### Fabric disagreements once this change is applied" in markdown
