"""`nictune audit -i` of switch: checks over real sshd: on one host a real
lldpd on the far end of its rail (rail1, the rail0 veth's peer) advertises a
1500-byte maximum frame size; the other host's rail hears nothing.  The
audit finds both, as switch-mismatch, in its report, its JUnit and its
Prometheus files, and the probe never answers for a neighbour (every audit
of such a profile runs the agent)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET

import pytest
from fleet_helpers import audit, profile_file

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
interfaces:
  rails:
    match: {name: rail0}
    mtu: 1500
    switch: {lldp: required}
"""


def test_an_audit_finds_a_small_frame_limit_and_a_silent_rail(make_fleet, tmp_path):
    if shutil.which("lldpd") is None and not os.path.exists("/usr/sbin/lldpd"):
        pytest.skip("lldpd is not installed (scripts/setup installs it)")
    fleet = make_fleet(2)
    loud, silent = fleet.of_kind("sshd")
    sockets = tempfile.mkdtemp(prefix="nt-lldp-")
    os.chmod(sockets, 0o755)  # lldpcli drops to lldpd's user before it connects
    sock = f"{sockets}/lldpd.sock"
    lldpd = subprocess.Popen(["ip", "netns", "exec", loud.netns, "lldpd", "-d", "-u", sock, "-I", "rail1",
                              "-O", "/dev/null"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.1)
        for conf in (["system", "hostname", "leaf07"], ["lldp", "tx-interval", "1"],
                     ["lldp", "custom-tlv", "oui", "00,12,0f", "subtype", "4", "oui-info", "05,dc"]):
            subprocess.run(["lldpcli", "-u", sock, "configure", *conf], check=True, capture_output=True)
        profile = profile_file(tmp_path, PROFILE, "switch.yaml")
        junit, prom = tmp_path / "audit.xml", tmp_path / "audit.prom"
        for _ in range(2):  # the second audit too: no probe learned to answer for the neighbour
            hosts = audit(fleet, profile, "--lldp-wait", "3", "--junit", str(junit), "--prometheus", str(prom))
            assert {h["via"] for h in hosts.values()} == {"zipapp"}
        found = {name: {c["key"]["name"]: c for c in h["changes"] if c["status"] == "switch-mismatch"}
                 for name, h in hosts.items()}
        assert set(found[loud.name]) == {"max_frame_size"}
        note = found[loud.name]["max_frame_size"]["note"]
        assert "leaf07" in note and "says 1500 bytes" in note and "1500 + 18" in note
        assert set(found[silent.name]) == {"lldp"}
        assert "no LLDP neighbour heard on rail0" in found[silent.name]["lldp"]["note"]
        assert [h["exit_code"] for h in hosts.values()] == [2, 2]
        cases = ET.parse(junit).getroot().findall(".//testcase")
        assert {c.get("name") for c in cases if c.find("failure[@type='switch-mismatch']") is not None} >= {
            loud.name, silent.name}
        text = prom.read_text()
        assert f'nictune_audit_switch_mismatch{{host="{loud.name}",family="switch",target="rail0",key="max_frame_size"}} 1' in text
        assert f'nictune_audit_switch_mismatch{{host="{silent.name}",family="switch",target="rail0",key="lldp"}} 1' in text
    finally:
        os.killpg(lldpd.pid, signal.SIGTERM)
        lldpd.wait(10)
        shutil.rmtree(sockets, ignore_errors=True)
