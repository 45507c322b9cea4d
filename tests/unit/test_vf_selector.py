"""`match: {vf_of: ENTRY, vfs: [...]}`: the VFs (representors and VF
netdevs) of the PFs an earlier entry matched.

FAKE HARDWARE: no kernel here has SR-IOV or devlink, so the interfaces are
made by hand (the facts Host.interfaces() reads: devlink port flavour,
PF/VF numbers, phys_switch_id, PCI addresses) and the PCI side on a sysfs
tree in a temp dir.  The real thing runs in tests/vm/guest/
test_vf_selector.py against netdevsim.
"""

from __future__ import annotations

import os

import pytest

from nictune.host.transaction.engine import Families, expand
from nictune.host.machine import Host, Interface, vfs_of
from nictune.host.validate import InvalidInput
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile_text

SW = "0123abcd"  # mlx5: both PFs of one card share the switch id


def iface(name, **facts):
    return Interface(name, 1, facts.pop("driver", "mlx5_core"), None, None, None, None, **facts)


# A ConnectX-like card: PF 0 and PF 1 (uplinks p0, p1), 2 VF representors
# each, and VF netdevs of PF 0 (in the host, bound to mlx5_core).
P0 = iface("p0", flavour="physical", port_handle="pci/0000:03:00.0", phys_port_name="p0",
           phys_switch_id=SW, pci_address="0000:03:00.0")
P1 = iface("p1", flavour="physical", port_handle="pci/0000:03:00.1", phys_port_name="p1",
           phys_switch_id=SW, pci_address="0000:03:00.1")
REPS = [iface(f"pf{pf}vf{vf}", flavour="pcivf", port_handle=f"pci/0000:03:00.{pf}", port_pf=pf,
              port_vf=vf, phys_port_name=f"pf{pf}vf{vf}", phys_switch_id=SW.upper())
        for pf in (0, 1) for vf in (0, 1)]
VF0 = iface("ens3v0", pci_address="0000:03:00.2", physfn="0000:03:00.0", vf_index=0)
VF1 = iface("ens3v1", pci_address="0000:03:00.3", physfn="0000:03:00.0", vf_index=1)
# Another device's representor: same PF/VF numbers, another instance and switch.
OTHER = iface("pf0vf0x", flavour="pcivf", port_handle="netdevsim/netdevsim1", port_pf=0,
              port_vf=0, phys_switch_id="ffff0000", driver="netdevsim")
ALL = [P0, P1, *REPS, VF0, VF1, OTHER]


def names(found):
    return [i.name for i in found]


def test_representors_and_vf_netdevs_of_the_matched_pfs():
    assert names(vfs_of([P0], ALL)) == ["pf0vf0", "pf0vf1", "ens3v0", "ens3v1"]
    # PF 1 shares the switch id: its devlink instance keeps PF 0's VFs out.
    assert names(vfs_of([P1], ALL)) == ["pf1vf0", "pf1vf1"]
    # netdevsim: uplink p1 (port number 1), VF representors pf0vfN.
    nsim = iface("eth0", flavour="physical", port_handle="netdevsim/netdevsim1",
                 phys_switch_id="FFFF0000", driver="netdevsim")
    assert names(vfs_of([nsim], ALL)) == ["pf0vf0x"]
    assert names(vfs_of([P0, P1], ALL, [1])) == ["pf0vf1", "pf1vf1", "ens3v1"]
    assert names(vfs_of([P0], ALL, 0)) == ["pf0vf0", "ens3v0"]
    assert vfs_of([], ALL) == [] and vfs_of([P0], ALL, [7]) == []
    # Neither a representor nor a VF is a PF: nothing hangs off them.
    assert vfs_of([REPS[0], VF0], ALL) == []
    # A pcipf port (a PF seen from an eswitch manager) also needs its PF number.
    hpf = iface("pf1hpf", flavour="pcipf", port_handle="pci/0000:03:00.1", port_pf=1,
                phys_switch_id=SW)
    assert names(vfs_of([hpf], ALL)) == ["pf1vf0", "pf1vf1"]
    assert vfs_of([iface("pf0hpf", flavour="pcipf", port_handle="pci/0000:03:00.1",
                         port_pf=0, phys_switch_id=SW)], ALL) == []


def test_the_other_selectors_still_apply():
    assert REPS[0].matches({"vf_of": "uplinks", "vfs": [5], "driver": "mlx5_core"})
    assert not REPS[0].matches({"vf_of": "uplinks", "driver": "netdevsim"})
    assert VF0.matches({"vf_of": "x", "vfs": 3})  # vfs_of does those two
    assert not VF0.matches({"vf_of": "x", "flavour": "pcivf"})


@pytest.fixture
def sysfs(tmp_path):
    """A PF 0000:03:00.0 with VFs 0000:03:00.2 (virtfn0) and .3 (virtfn1),
    netdevs ens3 (PF), ens3v0, ens3v1; nsim0 on a non-PCI device."""
    devices = tmp_path / "sys/devices/pci0000:00"
    net = tmp_path / "sys/class/net"
    net.mkdir(parents=True)
    for addr in ("0000:03:00.0", "0000:03:00.2", "0000:03:00.3"):
        (devices / addr).mkdir(parents=True)
        (devices / addr / "vendor").write_text("0x15b3\n")
    for n, addr in enumerate(("0000:03:00.2", "0000:03:00.3")):
        os.symlink(f"../{addr}", devices / "0000:03:00.0" / f"virtfn{n}")
        os.symlink("../0000:03:00.0", devices / addr / "physfn")
    for name, addr in (("ens3", "0000:03:00.0"), ("ens3v0", "0000:03:00.2"), ("ens3v1", "0000:03:00.3")):
        (net / name).mkdir()
        os.symlink(f"../../../devices/pci0000:00/{addr}", net / name / "device")
    (tmp_path / "sys/bus/netdevsim/devices/netdevsim1").mkdir(parents=True)
    (net / "nsim0").mkdir()
    os.symlink("../../../bus/netdevsim/devices/netdevsim1", net / "nsim0" / "device")
    (net / "veth0").mkdir()
    return Host(str(tmp_path))


def test_vf_netdevs_are_found_through_physfn_and_virtfn(sysfs):
    assert sysfs._pci_place("ens3") == ("0000:03:00.0", None, None)
    assert sysfs._pci_place("ens3v0") == ("0000:03:00.2", "0000:03:00.0", 0)
    assert sysfs._pci_place("ens3v1") == ("0000:03:00.3", "0000:03:00.0", 1)
    assert sysfs._pci_place("nsim0") == (None, None, None)
    assert sysfs._pci_place("veth0") == (None, None, None)


class _Host(Host):
    """A host whose interfaces are ALL (no file under its root is read)."""

    def __init__(self):
        super().__init__("/nonexistent-nictune-root")

    def interfaces(self):
        return ALL


def _expand(text):
    profile = load_profile_text(text, "p.yaml")
    return expand(_Host(), Families(_Host()), profile.doc, profile.sources)


UPLINKS = "nictune: 1\ninterfaces:\n  uplinks:\n    match: {flavour: physical, name: p0}\n"


def test_expand_sets_the_entry_on_the_vfs_it_selects():
    desire = _expand(UPLINKS + "  reps:\n    match: {vf_of: uplinks, vfs: [1], flavour: pcivf}\n"
                     "    features: {hw-tc-offload: true}\n")
    assert [(k.target, k.name) for k in desire.items] == [("pf0vf1", "hw-tc-offload")]
    assert set(desire.owner.values()) == {"interfaces.reps"}


def test_expand_refuses_a_vf_of_it_cannot_resolve():
    # What reaches an agent is not always what the loader checked.
    doc = {"nictune": 1, "interfaces": {
        "reps": {"match": {"vf_of": "uplinks"}, "features": {"hw-tc-offload": True}},
        "uplinks": {"match": {"name": "p0"}}}}
    with pytest.raises(InvalidInput, match=r"p\.yaml:7: interfaces\.reps\.match\.vf_of names 'uplinks'"):
        expand(_Host(), Families(_Host()), doc, {"interfaces/reps/match/vf_of": "p.yaml:7"})
    doc["interfaces"]["reps"]["match"] = {"vfs": [1]}
    with pytest.raises(InvalidInput, match=r"match\.vfs needs vf_of"):
        expand(_Host(), Families(_Host()), doc, {})


@pytest.mark.parametrize("reps, why", [
    ("  reps:\n    match: {vf_of: nosuch}\n", "there is no such entry"),
    ("  reps:\n    match: {vf_of: reps}\n", "it is this entry"),
    ("  reps:\n    match: {vf_of: later}\n  later:\n    match: {name: p0}\n",
     "that entry comes after this one"),
])
def test_the_profile_check_refuses_a_vf_of_not_before_it(reps, why):
    with pytest.raises(ProfileError) as e:
        load_profile_text(UPLINKS + reps, "p.yaml")
    assert str(e.value).startswith("p.yaml:6: interfaces.reps.match.vf_of: "), str(e.value)
    assert why in str(e.value)


def test_the_profile_check_refuses_vfs_without_vf_of_and_bad_numbers():
    with pytest.raises(ProfileError, match=r"^p\.yaml:6: interfaces\.reps\.match\.vfs: vfs needs vf_of"):
        load_profile_text(UPLINKS + "  reps:\n    match: {flavour: pcivf, vfs: [1]}\n", "p.yaml")
    with pytest.raises(ProfileError, match=r"p\.yaml:6: interfaces\.reps\.match\.vfs"):
        load_profile_text(UPLINKS + "  reps:\n    match: {vf_of: uplinks, vfs: [-1]}\n", "p.yaml")
