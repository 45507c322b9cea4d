"""The switch port's view, for real: a "switch" namespace running lldpd
(system name, port, maximum frame size) and lldpad (ETS, PFC and APP,
configured with lldptool), joined to a host namespace by a veth
(tests/netns/lldp_lab.py).  `nictune verify` of a profile with switch:
checks hears them and finds what was injected -- PFC on priority 4, a DSCP
map entry to another priority, a 1500-byte frame limit, a willing switch --
and passes a switch that matches.  nictune's own decoder is checked against
lldpcli and lldptool on the same frames."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

import lldp_lab
import nictune
from netns_helpers import wait_for
from nictune.cli.app import app
from nictune.host.facts import lldp
from nictune.host.transports import lldpsock
from recorded.tools import dcb_recorder as rec

PROFILE = textwrap.dedent("""\
    nictune: 1
    on_unsupported: warn          # a veth has no DCB: only the switch: checks are read
    interfaces:
      rails:
        match: {name: rail0}
        mtu: 9000
        roce:
          trust: dscp
          dscp_map: {26: 3, 48: 6}
          pfc: [3]
          ets: {prio_tc: [0, 0, 0, 3, 0, 0, 6, 0], tc_bw: [50, 0, 0, 50, 0, 0, 0, 0],
                tc_tsa: [ets, strict, strict, ets, strict, strict, strict, strict]}
          dcbx: host
        switch: {lldp: required}
    """)
WAIT = "4"  # seconds: lldpad's fast start sends 4 frames a second apart


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    why = lldp_lab.missing()
    if why:
        pytest.skip(why)
    return rec.build_shim(tmp_path_factory.mktemp("shim"))


@pytest.fixture
def lab(tmp_path, shim):
    lab = lldp_lab.SwitchLab(tmp_path, shim)
    try:
        lab.start_switch_lldpd()
        lab.start_lldpad("switch")
        lab.configure_dcbx()
        yield lab
    finally:
        lab.close()


def verify(lab, tmp_path, *extra: str) -> dict:
    profile = tmp_path / "rails.yaml"
    profile.write_text(PROFILE)
    with lab.chatty():
        result = CliRunner().invoke(app, ["verify", str(profile), "--netns", lab.host_ns, "--state-dir",
                                          str(tmp_path / "state"), "--json", *extra])
    report = json.loads(result.stdout)
    return {c["key"]["name"]: c for c in report["hosts"][0]["changes"] if c["key"]["family"] == "switch"} | {
        "_exit": result.exit_code}


def mismatched(checks: dict) -> dict:
    return {name: c["note"] for name, c in checks.items() if name != "_exit" and c["status"] == "switch-mismatch"}


def test_a_matching_switch_passes_every_check(lab, tmp_path):
    checks = verify(lab, tmp_path, "--lldp-wait", WAIT)
    assert set(checks) == {"lldp", "pfc", "ets", "dscp_map", "max_frame_size", "willing", "_exit"}
    assert mismatched(checks) == {}
    assert checks["lldp"]["before"].startswith("leaf03 port swp1")
    assert "from wait" in checks["lldp"]["before"]
    # What the switch said, each TLV heard: not a pass by absence.
    assert checks["pfc"]["before"] == [3]
    assert checks["dscp_map"]["before"] == {"26": 3, "48": 6}
    assert checks["max_frame_size"]["before"] == 9216
    assert checks["ets"]["before"]["tc_bw"] == [50, 0, 0, 50, 0, 0, 0, 0]
    assert checks["willing"]["before"] == []


def test_injected_mismatches_are_found_each_with_its_tlv_and_profile_line(lab, tmp_path):
    lab.set_mfs(1500)
    lab.configure_dcbx(pfc=(3, 4), apps=((3, 5, 26), (5, 5, 48)), willing=True)
    checks = verify(lab, tmp_path, "--lldp-wait", WAIT)
    found = mismatched(checks)
    assert set(found) == {"pfc", "dscp_map", "max_frame_size", "willing"}, found
    assert checks["_exit"] == 2
    assert "PFC Configuration TLV" in found["pfc"] and "priorities 3, 4" in found["pfc"]
    assert re.search(r"roce\.pfc \(.*rails\.yaml:\d+\)", found["pfc"]), found["pfc"]
    assert "Application Priority TLV" in found["dscp_map"]
    assert "DSCP 48 -> priority 5 there, 6 in the profile" in found["dscp_map"]
    assert "Maximum Frame Size TLV (from wait) says 1500 bytes" in found["max_frame_size"]
    assert "9000 + 18" in found["max_frame_size"]
    assert "willing bit" in found["willing"] and "roce.dcbx" in found["willing"]


def test_an_ets_class_with_bandwidth_where_the_host_has_strict_is_found(lab, tmp_path):
    lab.configure_dcbx(tsa="0:ets,1:strict,2:strict,3:ets,4:strict,5:strict,6:ets,7:strict",
                       tcbw="40,0,0,40,0,0,20,0")
    found = mismatched(verify(lab, tmp_path, "--lldp-wait", WAIT))
    assert set(found) == {"ets"}, found
    assert "TC 6 is ets with 20% on the switch, strict in the profile" in found["ets"]
    assert "TC 0 has 40% on the switch, 50% in the profile" in found["ets"]


def test_a_rail_with_no_lldp_is_reported_with_the_sources_tried(tmp_path, shim):
    lab = lldp_lab.SwitchLab(tmp_path, shim)  # no daemon on the switch
    try:
        checks = verify(lab, tmp_path, "--lldp-wait", "1")
    finally:
        lab.close()
    found = mismatched(checks)
    assert set(found) == {"lldp"}
    assert "no LLDP neighbour heard on rail0" in found["lldp"]
    assert "listener: nothing heard" in found["lldp"] and "waited 1 s: no frame" in found["lldp"]
    assert checks["pfc"]["status"] == "ok" and "not compared" in checks["pfc"]["note"]


def _heard(lab, seconds: float = 3) -> list:
    """The frames on rail0 in `seconds`, caught by nictune's listener, decoded by its decoder."""
    with lab.chatty():
        out = lab.run(lab.host_ns, sys.executable, "-c", (
            "import json; from nictune.host.transports import lldpsock; "
            f"print(json.dumps(lldpsock.wait_for_frames(['rail0'], {seconds})))"))
    return [lldp.decode(bytes.fromhex(e["frame"])) for e in json.loads(out)["rails"].get("rail0", [])]


def test_the_decoder_agrees_with_lldpcli_and_lldptool_on_the_same_frames(tmp_path, shim):
    lab = lldp_lab.SwitchLab(tmp_path, shim)
    try:
        # lldpd alone first: lldpd keeps one chassis record per chassis id,
        # which a second agent of the same chassis (lldpad) would overwrite.
        lab.start_switch_lldpd(mfs=9216)
        lab.start_host_lldpd()
        (ident,) = _heard(lab)
        cli = json.loads(lab.lldpcli("-f", "json0", "show", "neighbors", "details", sock=lab.host_lldpd_socket))
        (seen,) = cli["lldp"][0]["interface"]
        assert seen["chassis"][0]["id"][0] == {"type": "mac", "value": ident.chassis_id}
        assert seen["chassis"][0]["name"][0]["value"] == ident.system_name == "leaf03"
        assert seen["port"][0]["id"][0] == {"type": "ifname", "value": ident.port_id} == {
            "type": "ifname", "value": "swp1"}
        assert seen["port"][0]["descr"][0]["value"] == ident.port_description == "to host rail0"
        assert int(seen["port"][0]["mfs"][0]["value"]) == ident.max_frame_size == 9216
        assert int(seen["port"][0]["ttl"][0]["value"]) == ident.ttl
        # nictune's lldpd source reads the same neighbour through lldpcli.
        from nictune.host.facts import neighbours

        (via_lldpd,) = neighbours.parse_lldpcli(json.dumps(cli), "rail0")
        assert (via_lldpd.chassis_id, via_lldpd.port_id, via_lldpd.system_name, via_lldpd.max_frame_size) == (
            ident.chassis_id, ident.port_id, ident.system_name, ident.max_frame_size)

        lab.start_lldpad("switch")
        lab.configure_dcbx(pfc=(3,), apps=((3, 5, 26), (6, 5, 48)))
        lab.start_lldpad("host")
        # lldpad on the host keeps the last frame it heard: lldpad's alone now.
        lab.stop_switch_lldpd()
        (dcbx,) = _heard(lab)
        text = {tlv: lab.run(lab.host_ns, "lldptool", "-t", "-n", "-i", "rail0", "-V", tlv)
                for tlv in ("PFC", "ETS-CFG", "APP")}
        print(text)
        said = _lldptool_view(text)
        assert said["pfc"] == (dcbx.pfc.enabled, dcbx.pfc.willing, dcbx.pfc.mbc, dcbx.pfc.pfc_cap) == (
            (3,), False, False, 8)
        assert said["ets"] == (dcbx.ets.prio_tc, dcbx.ets.tc_bw, dcbx.ets.tc_tsa, dcbx.ets.willing,
                               dcbx.ets.max_tcs)
        assert dcbx.ets.prio_tc == (0, 0, 0, 3, 0, 0, 6, 0)
        assert said["dscp"] == dcbx.dscp_map() == {26: 3, 48: 6}
    finally:
        lab.close()


def _lldptool_view(text: dict) -> dict:
    """lldptool -t -n's text of the peer's PFC, ETS-CFG and APP TLVs, parsed."""
    def field(tlv, name):
        return re.search(rf"{name}:\s*(.*?)\s*$", text[tlv], re.M).group(1)
    yes = lambda value: value == "yes"  # noqa: E731
    pfc = (tuple(int(p) for p in field("PFC", "PFC enabled").split()), yes(field("PFC", "Willing")),
           yes(field("PFC", "MACsec Bypass Capable")), int(field("PFC", "PFC capable traffic classes")))
    prio_map = dict(pair.split(":") for pair in field("ETS-CFG", "PRIO_MAP").split())
    tsa_map = dict(pair.split(":") for pair in field("ETS-CFG", "TSA_MAP").split())
    ets = (tuple(int(prio_map[str(p)]) for p in range(8)),
           tuple(int(b.rstrip("%")) for b in field("ETS-CFG", "TC Bandwidth").split()),
           tuple(tsa_map[str(tc)] for tc in range(8)), yes(field("ETS-CFG", "Willing")),
           int(field("ETS-CFG", "MAX_TCS")))
    dscp = {int(d): int(p) for p, d in re.findall(r"Prio:(\d)\s+dscp:\s*(\d+)", text["APP"])}
    return {"pfc": pfc, "ets": ets, "dscp": dscp}


def test_the_resident_agent_listens_on_the_rails_and_verify_reads_its_frames(lab, tmp_path):
    profile = tmp_path / "rails.yaml"
    profile.write_text(PROFILE)
    state = tmp_path / "state"
    applied = CliRunner().invoke(app, ["apply", str(profile), "--netns", lab.host_ns, "--state-dir",
                                       str(state), "--json"])
    # 2: the rail had no neighbour yet (no listener ran, no wait): a
    # switch-mismatch, reported, never written; the desired state is kept.
    assert applied.exit_code == 2, applied.stdout
    assert (state / "netns" / lab.host_ns / "desired.json").exists()
    store = state / "netns" / lab.host_ns / lldpsock.STORE_FILE
    root = os.path.dirname(os.path.dirname(nictune.__file__))
    log = open(tmp_path / "agent.log", "w+")
    agent = subprocess.Popen(
        [sys.executable, "-c", "from nictune.cli.app import main; main()", "agent", "run", "--netns",
         lab.host_ns, "--state-dir", str(state), "--interval", "60", "--metrics-address", ""],
        env=dict(os.environ, PYTHONPATH=root), stdout=log, stderr=subprocess.STDOUT)
    try:
        def heard_dcbx() -> bool:
            rails = lldpsock.load_store(str(store))
            frames = [lldp.decode(bytes.fromhex(e["frame"])) for e in rails.get("rail0", [])]
            return any(n.pfc for n in frames) and any(n.system_name for n in frames)
        with lab.chatty():
            assert wait_for(heard_dcbx, 15), open(tmp_path / "agent.log").read()
        checks = verify(lab, tmp_path)  # no --lldp-wait: the agent's frames
        assert "from listener" in checks["lldp"]["before"], checks["lldp"]
        assert checks["pfc"]["before"] == [3] and mismatched(checks) == {}
        assert os.stat(store).st_mode & 0o777 == 0o600
    finally:
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(5)
        log.close()
