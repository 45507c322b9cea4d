"""The eswitch and sriov families and the switch-port selectors, on a
sysfs tree made in a temp dir (no kernel here has SR-IOV or devlink: the
real thing runs in tests/vm/guest/test_asap2.py against netdevsim)."""

from __future__ import annotations

import os

import pytest

from nictune.host.transports.io import LiveIO
from nictune.host.knobs import sriov as sriov_mod
from nictune.host.knobs.eswitch import EswitchFamily, devlink_handle
from nictune.host.knobs.sriov import SriovFamily
from nictune.host.machine import Host, Interface
from nictune.host.model import Key, Unsupported
from nictune.host.transports.netlink.devlink import Eswitch
from nictune.host.transports.netlink.vf import VfConfig
from nictune.host.validate import InvalidInput


def _src(*parts):
    return "profile.yaml:1"


@pytest.fixture
def root(tmp_path):
    """pf0: a PCI PF with SR-IOV (8 VFs at most, 0 now); nsim0: a netdevsim
    port (sriov_numvfs, no sriov_totalvfs); veth0: no device at all."""
    pci = tmp_path / "sys/devices/pci0000:00/0000:03:00.0"
    pci.mkdir(parents=True)
    (pci / "sriov_numvfs").write_text("0\n")
    (pci / "sriov_totalvfs").write_text("8\n")
    (pci / "sriov_drivers_autoprobe").write_text("1\n")
    nsim = tmp_path / "sys/devices/netdevsim1"
    nsim.mkdir(parents=True)
    (nsim / "sriov_numvfs").write_text("2\n")
    for bus in ("pci", "netdevsim"):
        (tmp_path / "sys/bus" / bus).mkdir(parents=True)
    os.symlink("../../../bus/pci", pci / "subsystem")
    os.symlink("../../bus/netdevsim", nsim / "subsystem")
    net = tmp_path / "sys/class/net"
    for name, dev in (("pf0", "../../../devices/pci0000:00/0000:03:00.0"),
                      ("nsim0", "../../../devices/netdevsim1")):
        (net / name).mkdir(parents=True)
        os.symlink(dev, net / name / "device")
    (net / "veth0").mkdir(parents=True)
    return tmp_path


def test_the_devlink_device_is_found_through_sysfs(root):
    host = Host(str(root))
    assert devlink_handle(host, "pf0") == "pci/0000:03:00.0"
    assert devlink_handle(host, "nsim0") == "netdevsim/netdevsim1"
    assert devlink_handle(host, "veth0") is None


class _FakeDevlink:
    def __init__(self):
        self.state = {"pci/0000:03:00.0": Eswitch("legacy", "none", "none")}
        self.sent = []

    def eswitch(self, handle):
        if handle not in self.state:
            raise OSError(95, "Operation not supported")
        return self.state[handle]

    def set_eswitch(self, handle, **values):
        self.sent.append((handle, list(values.items())))
        for name, value in values.items():
            setattr(self.state[handle], name, value)


def test_eswitch_keys_are_per_device_and_the_mode_goes_first(root, monkeypatch):
    host = Host(str(root))
    fake = _FakeDevlink()
    monkeypatch.setattr(host, "devlink", lambda: fake)
    fam = EswitchFamily(host)
    desired = fam.expand("pf0", {"eswitch": {"encap": "basic", "mode": "switchdev"}}, _src)
    assert {d.key for d in desired} == {Key("eswitch", "pci/0000:03:00.0", "mode"),
                                         Key("eswitch", "pci/0000:03:00.0", "encap")}
    (veth,) = fam.expand("veth0", {"eswitch": {"mode": "switchdev"}}, _src)
    current = fam.read([d.key for d in desired] + [veth.key])
    assert current[Key("eswitch", "pci/0000:03:00.0", "mode")] == "legacy"
    assert current[veth.key] == Unsupported("veth0 has no devlink device")
    assert "vports are rebuilt" in fam.disruptive(Key("eswitch", "pci/0000:03:00.0", "mode"),
                                                  "legacy", "switchdev")
    assert fam.disruptive(Key("eswitch", "pci/0000:03:00.0", "encap"), "none", "basic") == ""
    fam.apply([(d.key, d.want.value) for d in desired])
    # One request per setting, mode first whatever the profile's order.
    assert fake.sent == [("pci/0000:03:00.0", [("mode", "switchdev"), ("encap", "basic")])]
    assert fam.show("pf0") == {"eswitch": {"mode": "switchdev", "inline_mode": "none",
                                           "encap": "basic"}}


def test_an_eswitch_without_the_operation_is_unsupported_per_key(root, monkeypatch):
    host = Host(str(root))
    monkeypatch.setattr(host, "devlink", lambda: _FakeDevlink())
    fam = EswitchFamily(host)
    (d,) = fam.expand("nsim0", {"eswitch": {"mode": "switchdev"}}, _src)
    assert isinstance(fam.read([d.key])[d.key], Unsupported)


@pytest.fixture
def vfs(monkeypatch):
    """The VF list as RTM_GETLINK would give it, and the requests sent."""
    state = {"pf0": {}}
    sent = []

    class _Vfs:
        def all(self):
            return {k: dict(v) for k, v in state.items()}

        def set(self, index, vf, cfg):
            sent.append((index, vf, cfg))

        def close(self):
            pass

    monkeypatch.setattr(sriov_mod, "_vfs", lambda host: _Vfs())  # Host.vfs()
    return state, sent


def _sriov(root, section, target="pf0"):
    fam = SriovFamily(Host(str(root)))
    desired = fam.expand(target, {"sriov": section}, _src)
    current = fam.read([d.key for d in desired])
    return fam, desired, current


def test_vfs_that_do_not_exist_yet_read_as_none(root, vfs):
    fam, desired, current = _sriov(root, {"numvfs": 4, "vfs": {"1": {"mac": "02:00:00:00:00:AA",
                                                                       "trust": True}}})
    keys = [d.key.name for d in desired]
    assert keys == ["numvfs", "vfs.1.mac", "vfs.1.trust"]
    assert desired[1].want.value == "02:00:00:00:00:aa"  # as the kernel prints it
    assert [current[d.key] for d in desired] == [0, None, None]
    assert all(fam.check(d.key, d.want) is None for d in desired)
    assert "VFs and, in switchdev, their representors are created" in fam.disruptive(
        desired[0].key, 0, 4)


def test_limits_are_said_in_the_plan(root, vfs):
    fam, desired, _ = _sriov(root, {"numvfs": 9, "vfs": {"9": {"trust": True}}})
    assert fam.check(desired[0].key, desired[0].want) == "pf0 allows at most 8 VFs (sriov_totalvfs)"
    assert fam.check(desired[1].key, desired[1].want) == "VF 9 does not exist: pf0 has 9 VFs"
    with pytest.raises(InvalidInput):
        _sriov(root, {"vfs": {"x": {"trust": True}}})


def test_drivers_autoprobe_is_written_before_the_vfs_are_made(root, vfs, monkeypatch):
    written = []
    real_open = open

    def tracking_open(path, mode="r", *a, **kw):
        if "w" in mode:
            written.append(os.path.basename(str(path)))
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr(LiveIO, "open", lambda io, *a, **kw: tracking_open(*a, **kw))  # Host.io
    fam, desired, current = _sriov(root, {"numvfs": 2, "drivers_autoprobe": False})
    assert [(d.key.name, current[d.key]) for d in desired] == [("numvfs", 0), ("drivers_autoprobe", True)]
    fam.apply([(d.key, d.want.value) for d in desired])
    assert written == ["sriov_drivers_autoprobe", "sriov_numvfs"]
    pci = root / "sys/devices/pci0000:00/0000:03:00.0"
    assert (pci / "sriov_drivers_autoprobe").read_text() == "0"
    assert (pci / "sriov_numvfs").read_text() == "2"
    _, desired, current = _sriov(root, {"drivers_autoprobe": False}, target="nsim0")
    assert isinstance(current[desired[0].key], Unsupported)


def test_a_device_without_sr_iov_is_unsupported(root, vfs):
    _, desired, current = _sriov(root, {"numvfs": 2}, target="veth0")
    assert current[desired[0].key] == Unsupported("veth0 has no SR-IOV (no device/sriov_numvfs)")


def test_a_vf_count_change_goes_through_zero_and_attributes_follow(root, vfs, monkeypatch):
    state, sent = vfs
    numvfs = root / "sys/devices/netdevsim1/sriov_numvfs"
    writes = []
    real_open = open

    def tracking_open(path, mode="r", *a, **kw):
        if "w" in mode and str(path).endswith("sriov_numvfs"):
            writes.append(str(path))
            f = real_open(path, mode, *a, **kw)
            orig = f.write
            f.write = lambda text: (writes.append(text), orig(text))[1]
            return f
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr(LiveIO, "open", lambda io, *a, **kw: tracking_open(*a, **kw))  # Host.io
    host = Host(str(root))
    monkeypatch.setattr(host, "links", lambda: [type("L", (), {"name": "nsim0", "index": 7})()])
    fam = SriovFamily(host)
    desired = fam.expand("nsim0", {"sriov": {"numvfs": 3, "vfs": {"0": {"vlan": 5},
                                                                   "2": {"trust": True}}}}, _src)
    current = fam.read([d.key for d in desired])
    assert "2 VFs are removed first" in fam.disruptive(desired[0].key, current[desired[0].key], 3)
    state["nsim0"] = {0: VfConfig(vlan=0, qos=4), 1: VfConfig(), 2: VfConfig()}
    fam.apply([(d.key, d.want.value) for d in desired])
    assert [w for w in writes if not w.startswith("/")] == ["0", "3"]
    assert numvfs.read_text() == "3"
    # vlan travels with the qos it had; one request per VF, in VF order.
    assert [(i, vf, (c.vlan, c.qos, c.trust)) for i, vf, c in sent] == [
        (7, 0, (5, 4, None)), (7, 2, (None, None, True))]
    # A revert to "no VF" writes nothing for attributes of VFs now gone.
    sent.clear()
    state["nsim0"] = {}
    fam.revert([(desired[0].key, 0)] + [(d.key, None) for d in desired[1:]])
    assert numvfs.read_text() == "0" and sent == []


def test_switch_port_selectors():
    rep = Interface("eth3", 5, "netdevsim", None, None, None, None,
                    phys_port_name="pf0vf1", phys_switch_id="ABCDEF01", flavour="pcivf")
    up = Interface("eth0", 2, "netdevsim", None, None, None, None,
                   phys_port_name="p0", phys_switch_id="abcdef01", flavour="physical")
    plain = Interface("veth0", 9, "veth", None, None, None, None)
    assert rep.matches({"flavour": "pcivf", "phys_switch_id": "abcdef01"})
    assert rep.matches({"phys_port_name": "pf0vf*"}) and not up.matches({"phys_port_name": "pf0vf*"})
    assert up.matches({"flavour": ["physical", "pcipf"], "phys_switch_id": "ABCDEF01"})
    assert not plain.matches({"flavour": "physical"})
    assert not rep.matches({"flavour": "pcivf", "phys_switch_id": "abcdef02"})


def test_the_profile_schema_takes_the_new_sections():
    from nictune.profile.loader import load_profile_text

    load_profile_text(
        "nictune: 1\ninterfaces:\n  up:\n    match: {flavour: physical, phys_port_name: p0}\n"
        "    eswitch: {mode: switchdev, inline_mode: none, encap: basic}\n"
        "    sriov: {numvfs: 4, vfs: {'0': {mac: '02:00:00:00:00:10', vlan: 10, qos: 1,"
        " trust: true, spoofchk: false, link_state: auto, max_tx_rate: 100}}}\n")
    for bad in ("eswitch: {mode: offloads}", "sriov: {numvfs: -1}",
                "sriov: {vfs: {'0': {vlan: 4096}}}", "sriov: {vfs: {'0': {mac: nope}}}"):
        with pytest.raises(Exception) as info:
            load_profile_text(f"nictune: 1\ninterfaces:\n  up:\n    match: {{name: x}}\n    {bad}\n")
        assert "Traceback" not in str(info.value)
