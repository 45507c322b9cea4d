"""nictune's ethtool families on netdevsim (built for the test VM's kernel by
tests/vm/run.py): what veth cannot take -- rings, channels, coalesce
(adaptive-rx included), pause and hw-tc-offload -- planned, applied,
verified and rolled back on both ports of one device, each value read back
with the ethtool tool; a ring size above the device's maximum is refused
before anything is written.

The CLI runs in-process (Typer's CliRunner), and runs few times: guest
userspace is slow under emulation.
"""

from __future__ import annotations

import re

from nictune.host.machine import Host
from netdevsim import ethtool_state
from nictune_cli import changes, nictune
from rxe import sh

# Each differs from what netdevsim starts with (rings 0, 4 queues, all
# coalescing 0 and off, pause off, hw-tc-offload off).
WANT = {
    ("rings", "rx"): 2048,
    ("rings", "tx"): 1024,
    ("channels", "combined"): 2,
    ("coalesce", "adaptive-rx"): True,
    ("coalesce", "rx-usecs"): 64,
    ("coalesce", "tx-frames"): 32,
    ("pause", "rx"): True,
    ("pause", "tx"): True,
    ("features", "hw-tc-offload"): True,
}
PROFILE = """\
nictune: 1
interfaces:
  sim:
    match: {driver: netdevsim}
    rings: {rx: 2048, tx: 1024}
    channels: {combined: 2}
    coalesce: {adaptive-rx: true, rx-usecs: 64, tx-frames: 32}
    pause: {rx: true, tx: true}
    features: {hw-tc-offload: true}
"""


def states(nsim) -> dict:
    return {ifname: ethtool_state(ifname) for ifname in nsim.ifnames}


def test_host_interfaces_report_the_netdevsim_driver(nsim):
    drivers = {i.name: i.driver for i in Host("/").interfaces()}
    assert {name: drivers.get(name) for name in nsim.ifnames} == dict.fromkeys(nsim.ifnames,
                                                                              "netdevsim")


def test_ethtool_families_plan_apply_verify_rollback(nsim, tmp_path):
    profile = tmp_path / "netdevsim.yaml"
    profile.write_text(PROFILE)
    state = ["--state-dir", str(tmp_path / "state")]
    before = states(nsim)
    assert all(s[key] != value for s in before.values() for key, value in WANT.items()), before

    code, report, _ = nictune("plan", str(profile), *state)
    assert code == 2, report
    planned = changes(report)
    for ifname in nsim.ifnames:
        for (family, name), value in WANT.items():
            change = planned[(ifname, family, name)]
            assert (change["before"], change["after"], change["status"]) == (
                before[ifname][(family, name)], value, "pending"), change
    assert states(nsim) == before  # plan wrote nothing

    code, report, _ = nictune("apply", str(profile), *state)
    assert code == 0, report
    # Exactly the wanted values changed, on both ports; nothing else did.
    assert states(nsim) == {ifname: {**before[ifname], **WANT} for ifname in nsim.ifnames}

    code, report, _ = nictune("verify", str(profile), *state)
    assert code == 0, report

    code, report, _ = nictune("rollback", *state)
    assert code == 0, report
    assert states(nsim) == before


def test_rings_above_the_device_maximum_are_refused_before_any_write(nsim, tmp_path):
    maximum = int(re.search(r"Pre-set maximums:\s*RX:\s*(\d+)",
                            sh("ethtool", "-g", nsim.ifnames[0]).stdout).group(1))
    assert maximum == 4096
    profile = tmp_path / "too-big.yaml"
    # features and channels are written before rings: neither may be.
    profile.write_text(PROFILE.replace("rx: 2048", f"rx: {maximum * 2}"))
    before = states(nsim)

    code, report, _ = nictune("apply", str(profile), "--state-dir", str(tmp_path / "state"))
    assert code == 1, report
    assert report["hosts"][0]["error"]["kind"] == "unsupported", report
    for ifname in nsim.ifnames:
        change = changes(report)[(ifname, "rings", "rx")]
        assert change["status"] == "unsupported", change
        assert f"{maximum * 2} is above the device maximum {maximum}" in change["note"], change
    assert states(nsim) == before
