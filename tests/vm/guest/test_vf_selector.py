"""`match: {vf_of: ENTRY, vfs: [...]}` on a real kernel (netdevsim, built
and loaded by tests/vm/guest/netdevsim.py), read back with iproute2 and
ethtool, never with nictune.

A first profile puts the PF's eswitch in switchdev with 2 VFs; a second
one selects, through vf_of, the representor of VF 1 only (devlink flavour
pcivf on the devlink instance and switch of the PF its `uplinks` entry
matched, vfnum 1) and turns hw-tc-offload on there.  ethtool -k shows that exactly that
representor changed.  Before the first apply, the same selector matches
nothing: interfaces are matched as they are when the plan runs.
(netdevsim VFs have no netdev of their own: the VF netdev half of vf_of
is covered by the unit tests on a fake sysfs.)
"""

from __future__ import annotations

import json

from nictune_cli import changes, nictune
from rxe import sh




def uplink_profile(ifname: str) -> str:
    return f"""\
nictune: 1
interfaces:
  uplinks:
    match: {{name: {ifname}, flavour: physical}}
    eswitch: {{mode: switchdev}}
    sriov: {{numvfs: 2}}
"""


def vf_profile(ifname: str, settings: bool = False) -> str:
    uplink = uplink_profile(ifname).split("interfaces:\n", 1)[1] if settings else \
        f"  uplinks:\n    match: {{name: {ifname}, flavour: physical}}\n"
    return f"""\
nictune: 1
interfaces:
{uplink}  vf1:
    match: {{vf_of: uplinks, vfs: [1]}}
    features: {{hw-tc-offload: true}}
"""


def _reps(handle: str) -> dict:
    """VF number -> representor netdev, from devlink port show."""
    ports = json.loads(sh("devlink", "-j", "port", "show").stdout)["port"]
    return {p["vfnum"]: p["netdev"] for name, p in ports.items()
            if name.startswith(handle + "/") and p["flavour"] == "pcivf"}


def _hw_tc(ifnames) -> dict:
    out = {}
    for ifname in ifnames:
        (features,) = json.loads(sh("ethtool", "--json", "-k", ifname).stdout)
        out[ifname] = features["hw-tc-offload"]["active"]
    return out


def test_vf_of_selects_one_representor_of_the_matched_pf(pf, tmp_path):
    handle, ifname = pf
    first, second = tmp_path / "uplink.yaml", tmp_path / "vf1.yaml"
    first.write_text(uplink_profile(ifname))
    second.write_text(vf_profile(ifname))
    both = tmp_path / "both.yaml"
    both.write_text(vf_profile(ifname, settings=True))
    state1, state2 = (["--state-dir", str(tmp_path / d)] for d in ("state1", "state2"))
    before_pf = _hw_tc([ifname])

    # One profile that makes the VFs and sets their representors: its plan
    # cannot match representors that do not exist yet.
    code, report, _ = nictune("plan", str(both), *state1)
    assert code == 2, report
    planned = changes(report)
    assert (ifname, "sriov", "numvfs") in planned
    assert not [k for k in planned if k[1] == "features"], planned

    code, report, _ = nictune("apply", str(first), *state1)
    assert code == 0, report
    reps = _reps(handle)
    assert sorted(reps) == [0, 1], reps
    watched = [ifname, *reps.values()]
    before = _hw_tc(watched)
    assert before[reps[1]] is False, before

    code, report, _ = nictune("plan", str(second), *state2)
    assert code == 2, report
    assert set(changes(report)) == {(reps[1], "features", "hw-tc-offload")}
    code, report, _ = nictune("apply", str(second), *state2)
    assert code == 0, report
    assert _hw_tc(watched) == {**before, reps[1]: True}
    code, report, _ = nictune("verify", str(second), *state2)
    assert code == 0, report

    code, report, _ = nictune("rollback", *state2)
    assert code == 0, report
    assert _hw_tc(watched) == before
    code, report, _ = nictune("rollback", *state1)
    assert code == 0, report
    assert _reps(handle) == {} and _hw_tc([ifname]) == before_pf
