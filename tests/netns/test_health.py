"""Health facts and expect: on a real veth, in a namespace: the facts match
what `ethtool -i`, `ethtool -S` and /sys report there, and an unmet
expectation is drift that apply reports without writing anything for it."""

from __future__ import annotations

import json
import re

import pytest

from nictune.control.remote.targets import NetnsTarget

pytestmark = pytest.mark.netns


def request(command: str, expect: dict = None, **settings) -> dict:
    doc = {"nictune": 1}
    if expect is not None or settings:
        entry = {"match": {"name": "ntv0"}, **settings}
        if expect is not None:
            entry["expect"] = expect
        doc["interfaces"] = {"rail": entry}
    req = {"nictune_request": 1, "command": command}
    if command != "show":
        req["profile"] = {"path": "p.yaml", "doc": doc, "sources": {}}
    return req


def run(veth_pair, tmp_path, command, expect=None, **settings) -> dict:
    return NetnsTarget(veth_pair.ns_a, str(tmp_path)).run(request(command, expect, **settings))


def tool(veth_pair, *argv) -> str:
    r = veth_pair.run(veth_pair.ns_a, list(argv))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_health_facts_are_what_ethtool_and_sysfs_report(veth_pair, tmp_path):
    facts = run(veth_pair, tmp_path, "show")["facts"]["ntv0"]
    driver = re.search(r"^driver: (\S+)$", tool(veth_pair, "ethtool", "-i", "ntv0"), re.M).group(1)
    speed = int(tool(veth_pair, "cat", "/sys/class/net/ntv0/speed"))
    assert (facts["driver"], facts["link_speed_mbps"]) == (driver, speed) == ("veth", 10000)
    assert "pcie_width" not in facts and "rdma_device" not in facts  # a veth has neither


def test_expectations_met_and_unmet(veth_pair, tmp_path):
    # The ioctl reader against `ethtool -S`: veth's peer_ifindex statistic.
    peer = int(re.search(r"peer_ifindex: (\d+)", tool(veth_pair, "ethtool", "-S", "ntv0")).group(1))
    met = run(veth_pair, tmp_path, "verify",
              {"driver": "veth", "link_speed_mbps": {"min": 10000}, "counters": {"peer_ifindex": peer}})
    assert met["exit_code"] == 0, met
    assert {c["status"] for c in met["changes"]} == {"ok"} and len(met["changes"]) == 3
    assert met["facts"]["ntv0"]["driver"] == "veth"

    unmet = run(veth_pair, tmp_path, "verify", {"driver": "mlx5_core", "link_speed_mbps": 400000})
    assert unmet["exit_code"] == 2
    drift = {c["key"]["name"]: (c["before"], c["after"]) for c in unmet["changes"] if c["status"] == "drift"}
    assert drift == {"driver": ("veth", "mlx5_core"), "link_speed_mbps": (10000, 400000)}


def test_apply_writes_settings_and_reports_unmet_expectations(veth_pair, tmp_path):
    out = run(veth_pair, tmp_path, "apply", {"link_speed_mbps": 400000}, mtu=9000)
    assert out["exit_code"] == 2 and out["error"] is None
    status = {(c["key"]["family"], c["key"]["name"]): c["status"] for c in out["changes"]}
    assert status == {("link", "mtu"): "applied", ("expect", "link_speed_mbps"): "drift"}
    link = json.loads(tool(veth_pair, "ip", "-j", "link", "show", "ntv0"))[0]
    assert link["mtu"] == 9000
    assert int(tool(veth_pair, "cat", "/sys/class/net/ntv0/speed")) == 10000  # untouched
