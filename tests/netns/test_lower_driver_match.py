"""`match: {lower_driver: ...}` on real kernel devices:
a bridge in namespace A of the veth_pair fixture with the veth end ntv0
enslaved to it, so the kernel itself makes /sys/class/net/ntbr0/lower_ntv0
(net/core/dev.c netdev_adjacent_sysfs_add), as it does for an Azure
hv_netvsc NIC and its VF."""

from __future__ import annotations

import json
import subprocess

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app

pytestmark = pytest.mark.netns

PROFILE = """\
nictune: 1
interfaces:
  master:
    match: {driver: bridge, lower_driver: veth}
    txqueuelen: 1234
  mana-master:
    match: {lower_driver: [mana, mlx5_core]}
    mtu: 9000
"""


@pytest.fixture
def bridged(veth_pair, tmp_path):
    for argv in (["ip", "-n", veth_pair.ns_a, "link", "add", "ntbr0", "type", "bridge"],
                 ["ip", "-n", veth_pair.ns_a, "link", "set", "ntv0", "master", "ntbr0"]):
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot make a bridge here: {proc.stderr.strip()}")
    veth_pair.profile = tmp_path / "p.yaml"
    veth_pair.profile.write_text(PROFILE)
    veth_pair.state = str(tmp_path / "state")
    return veth_pair


def test_an_entry_matches_the_master_by_the_driver_of_its_lower_device(bridged):
    result = CliRunner().invoke(app, ["plan", str(bridged.profile), "--netns", bridged.ns_a,
                                      "--state-dir", bridged.state, "--json"])
    assert result.exit_code == 2, result.output
    [host] = json.loads(result.stdout)["hosts"]
    assert [(c["key"]["target"], c["key"]["name"], c["after"]) for c in host["changes"]] == [
        ("ntbr0", "txqueuelen", 1234)]
    # ntv0 has no lower device, and nothing here carries a MANA or Mellanox VF.
    assert "interfaces.mana-master matched no interface on this host" in host["warnings"]
