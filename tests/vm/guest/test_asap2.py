"""ASAP2 on a real kernel: the eswitch and sriov families against netdevsim
(tests/vm/guest/netdevsim.py builds and loads it), read back with the
iproute2 tools, never with nictune.

- round trip: plan, apply (switchdev + 4 VFs with their MACs, the shape
  of the shipped profiles/connectx7-asap2-switchdev.yaml, + hw-tc-offload
  on the PF), verify clean (and its health facts say, from devlink dev
  info as `devlink` reads it, that no firmware waits for a reset), VF 1's
  MAC changed by hand (`ip link set ... vf 1 mac ...`) and verify exits 2
  naming that one key, rollback, and a snapshot
  (`devlink -j dev eswitch show` and `port show`, `ip -j -d link`, sysfs
  sriov_numvfs, the PF's hw-tc-offload) identical before and after;
- mlx5's refusals (nicclass "mlx5 in switchdev"): netdevsim takes VF vlan,
  trust and spoofchk in either mode, mlx5 refuses them in switchdev.  With
  the netdevsim PF standing in for an mlx5 one (the driver nictune reads for
  it is mlx5_core), plan and apply refuse them, naming the rule and the
  profile line, before anything is written; as netdevsim itself, the same
  profile plans (the rules are the driver's);
- netdevsim's own rule, against the kernel: in switchdev it refuses VF
  rates (nsim_set_vf_rate, which `ip link set ... max_tx_rate` shows), and
  plan refuses them there by that rule;
- representors: interfaces are matched when an apply is planned, before
  the representors exist, so hw-tc-offload on them is a second apply: the
  representors the first one made are matched by `flavour: pcivf` and
  `phys_switch_id`, their hw-tc-offload is applied, verified and rolled
  back (its own state directory), then the first apply is rolled back and
  the snapshot is what it was;
- a failure in the middle rolls back everything before it: more VFs than
  the device allows (netdevsim: 4, ENOMEM; it has no sriov_totalvfs) after
  the eswitch went to switchdev, and a multicast VF MAC (EINVAL) after the
  VFs were made.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nictune.host.facts import nicclass
from nictune.host.machine import Host
from nictune_cli import changes, nictune
from rxe import sh

# The shipped ASAP2 profile's VFs: MACs (its rates netdevsim refuses in switchdev).
VFS = {0: "02:00:00:00:00:10", 1: "02:00:00:00:00:11", 2: "02:00:00:00:00:12",
       3: "02:00:00:00:00:13"}
# What the shipped profile had, and mlx5 refuses in switchdev.
REFUSED_BY_MLX5 = '{mac: "02:00:00:00:00:10", vlan: 100, trust: true, spoofchk: true}'


def profile(ifname: str, numvfs: int = 4, bad_mac: bool = False, vf0: str = "") -> str:
    vfs = "\n".join(
        f'        "{n}": ' + (vf0 if vf0 and n == 0 else
                              f'{{mac: "{"01:00:5e:00:00:01" if bad_mac and n == 1 else mac}"}}')
        for n, mac in VFS.items())
    return f"""\
nictune: 1
interfaces:
  uplink:
    match: {{name: {ifname}, flavour: physical}}
    eswitch: {{mode: switchdev}}
    sriov:
      numvfs: {numvfs}
      vfs:
{vfs}
    features: {{hw-tc-offload: true}}
"""


def representors_profile(switch_id: str) -> str:
    return f"""\
nictune: 1
interfaces:
  representors:
    match: {{flavour: pcivf, phys_switch_id: "{switch_id}"}}
    features: {{hw-tc-offload: true}}
"""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def snapshot(handle: str, ifname: str) -> dict:
    links = json.loads(sh("ip", "-j", "-d", "link", "show").stdout)
    (features,) = json.loads(sh("ethtool", "--json", "-k", ifname).stdout)
    return {
        "eswitch": json.loads(sh("devlink", "-j", "dev", "eswitch", "show", handle).stdout),
        "ports": json.loads(sh("devlink", "-j", "port", "show").stdout),
        "links": {link["ifname"]: link for link in links},
        "numvfs": _read(f"/sys/class/net/{ifname}/device/sriov_numvfs"),
        "hw-tc-offload": features["hw-tc-offload"]["active"],
    }


def _reps(handle: str) -> list:
    ports = json.loads(sh("devlink", "-j", "port", "show").stdout)["port"]
    return sorted(p["netdev"] for name, p in ports.items()
                  if name.startswith(handle + "/") and p["flavour"] == "pcivf")


def _hw_tc(ifname: str) -> bool:
    (features,) = json.loads(sh("ethtool", "--json", "-k", ifname).stdout)
    return features["hw-tc-offload"]["active"]


def _apply_uplink(handle: str, ifname: str, path, state: list) -> None:
    code, report, _ = nictune("apply", str(path), *state)
    assert code == 0, report
    esw = json.loads(sh("devlink", "-j", "dev", "eswitch", "show", handle).stdout)
    assert esw["dev"][handle]["mode"] == "switchdev"
    assert _read(f"/sys/class/net/{ifname}/device/sriov_numvfs") == "4"
    (link,) = json.loads(sh("ip", "-j", "-d", "link", "show", "dev", ifname).stdout)
    assert {vf["vf"]: vf["address"] for vf in link["vfinfo_list"]} == VFS
    assert len(_reps(handle)) == 4 and _hw_tc(ifname)


def test_switchdev_and_vfs_round_trip(pf, tmp_path):
    handle, ifname = pf
    path = tmp_path / "asap2.yaml"
    path.write_text(profile(ifname))
    state = ["--state-dir", str(tmp_path / "state")]
    before = snapshot(handle, ifname)
    assert before["eswitch"]["dev"][handle]["mode"] == "legacy" and before["numvfs"] == "0"

    code, report, _ = nictune("plan", str(path), *state)
    assert code == 2, report
    planned = changes(report)
    mode = planned[(handle, "eswitch", "mode")]
    assert (mode["before"], mode["after"], mode["status"]) == ("legacy", "switchdev", "pending")
    assert "vports are rebuilt" in mode["disruptive"]
    numvfs = planned[(ifname, "sriov", "numvfs")]
    assert (numvfs["before"], numvfs["after"]) == (0, 4) and "are created" in numvfs["disruptive"]
    assert planned[(ifname, "sriov", "vfs.2.mac")]["before"] is None  # no VF yet
    assert snapshot(handle, ifname) == before  # plan wrote nothing

    _apply_uplink(handle, ifname, path, state)
    code, report, _ = nictune("verify", str(path), *state)
    assert code == 0, report
    # devlink dev info as a health fact: netdevsim flashes nothing, so its
    # stored versions are its running ones, and no reset is pending.
    versions = json.loads(sh("devlink", "-j", "dev", "info", handle).stdout)["info"][handle]["versions"]
    assert versions["stored"] and versions["stored"] == versions["running"], versions
    facts = report["hosts"][0]["facts"][ifname]
    assert facts["firmware_pending_reset"] is False and "firmware_pending" not in facts, facts

    # Drift made by hand: VF 1's MAC; verify names it alone.
    sh("ip", "link", "set", "dev", ifname, "vf", "1", "mac", "02:00:00:00:00:99")
    code, report, _ = nictune("verify", str(path), *state)
    assert code == 2, report
    drift = {k: (c["before"], c["after"]) for k, c in changes(report).items()
             if c["status"] == "drift"}
    assert drift == {(ifname, "sriov", "vfs.1.mac"): ("02:00:00:00:00:99", VFS[1])}, drift

    code, report, _ = nictune("rollback", *state)
    assert code == 0, report
    assert snapshot(handle, ifname) == before


def test_what_mlx5_refuses_in_switchdev_is_refused_at_plan_before_the_device_is_touched(
        pf, tmp_path, monkeypatch):
    handle, ifname = pf
    path = tmp_path / "asap2.yaml"
    path.write_text(profile(ifname, vf0=REFUSED_BY_MLX5))
    state = ["--state-dir", str(tmp_path / "state")]
    before = snapshot(handle, ifname)
    # As netdevsim, which takes them in either mode: planned.
    code, report, _ = nictune("plan", str(path), *state)
    assert code == 2, report
    assert changes(report)[(ifname, "sriov", "vfs.0.trust")]["status"] == "pending"

    # The same PF standing in for an mlx5 one: ethtool -i says mlx5_core.
    def as_mlx5(self, name, real=Host._drvinfo):
        info = real(self, name)
        return replace(info, driver="mlx5_core") if name == ifname and info is not None else info

    monkeypatch.setattr(Host, "_drvinfo", as_mlx5)
    for command in ("plan", "apply"):
        code, report, _ = nictune(command, str(path), *state)
        assert code != 0, report
        (host,) = report["hosts"]
        assert host["error"]["kind"] == "unsupported", host["error"]
        planned = changes(report)
        for attr, rule in (("vlan", nicclass.MLX5_VF_VLAN_SWITCHDEV),
                           ("trust", nicclass.MLX5_VF_TRUST_SWITCHDEV),
                           ("spoofchk", nicclass.MLX5_VF_SPOOFCHK_SWITCHDEV)):
            refused = planned[(ifname, "sriov", f"vfs.0.{attr}")]
            assert refused["status"] == "unsupported" and rule.why in refused["note"], refused
            assert refused["source"].startswith(str(path) + ":")
        assert planned[(ifname, "sriov", "vfs.1.mac")]["status"] == "pending"
        assert snapshot(handle, ifname) == before  # nothing written


def test_netdevsim_refuses_vf_rates_in_switchdev_and_plan_says_so(pf, tmp_path):
    handle, ifname = pf
    uplink = tmp_path / "uplink.yaml"
    uplink.write_text(profile(ifname))
    state = ["--state-dir", str(tmp_path / "state")]
    before = snapshot(handle, ifname)
    _apply_uplink(handle, ifname, uplink, state)
    # The kernel's answer, which the rule states (nsim_set_vf_rate).
    rate = sh("ip", "link", "set", "dev", ifname, "vf", "0", "max_tx_rate", "100", check=False)
    assert rate.returncode != 0 and "not supported" in rate.stderr.lower(), rate.stderr
    rates = tmp_path / "rates.yaml"
    rates.write_text(profile(ifname, vf0='{mac: "02:00:00:00:00:10", max_tx_rate: 100}'))
    code, report, _ = nictune("plan", str(rates), "--state-dir", str(tmp_path / "state2"))
    assert code != 0, report
    refused = changes(report)[(ifname, "sriov", "vfs.0.max_tx_rate")]
    assert refused["status"] == "unsupported"
    assert nicclass.NSIM_VF_RATE_SWITCHDEV[0].source in refused["note"], refused
    code, report, _ = nictune("rollback", *state)
    assert code == 0, report
    assert snapshot(handle, ifname) == before


def test_representors_are_matched_by_flavour_and_switch_id(pf, tmp_path):
    handle, ifname = pf
    uplink, reps_path = tmp_path / "uplink.yaml", tmp_path / "reps.yaml"
    uplink.write_text(profile(ifname))
    reps_path.write_text(representors_profile(_read(f"/sys/class/net/{ifname}/phys_switch_id")))
    first, second = (["--state-dir", str(tmp_path / d)] for d in ("state1", "state2"))
    before = snapshot(handle, ifname)

    _apply_uplink(handle, ifname, uplink, first)
    reps = _reps(handle)
    assert not any(_hw_tc(rep) for rep in reps)
    code, report, _ = nictune("plan", str(reps_path), *second)
    assert code == 2, report
    assert set(changes(report)) == {(rep, "features", "hw-tc-offload") for rep in reps}
    code, report, _ = nictune("apply", str(reps_path), *second)
    assert code == 0, report
    assert all(_hw_tc(rep) for rep in reps)
    code, report, _ = nictune("verify", str(reps_path), *second)
    assert code == 0, report
    code, report, _ = nictune("rollback", *second)
    assert code == 0, report
    assert not any(_hw_tc(rep) for rep in reps)

    code, report, _ = nictune("rollback", *first)
    assert code == 0, report
    assert snapshot(handle, ifname) == before


@pytest.mark.parametrize("case", ["too-many-vfs", "bad-vf-mac"])
def test_a_failure_in_the_middle_rolls_back_what_came_before(pf, tmp_path, case):
    handle, ifname = pf
    path = tmp_path / "asap2.yaml"
    path.write_text(profile(ifname, numvfs=5 if case == "too-many-vfs" else 4,
                            bad_mac=case == "bad-vf-mac"))
    before = snapshot(handle, ifname)

    code, report, _ = nictune("apply", str(path), "--state-dir", str(tmp_path / "state"))
    assert code != 0, report
    (host,) = report["hosts"]
    assert host["error"]["kind"] == "rolled-back", host["error"]
    applied = changes(report)
    # The eswitch had gone to switchdev before the sriov write failed.
    assert applied[(handle, "eswitch", "mode")]["status"] == "reverted", applied
    failed = [c for c in applied.values() if c["status"] == "failed"]
    assert failed and all(c["key"]["family"] == "sriov" for c in failed), failed
    why = "more than it allows" if case == "too-many-vfs" else "Invalid argument"
    assert any(why in c["note"] for c in failed), failed
    assert snapshot(handle, ifname) == before
