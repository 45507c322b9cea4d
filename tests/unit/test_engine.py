"""apply / verify / rollback logic of the engine, on the fake kernel.

The hosts are recorded ConnectX-7 and MANA states (tests/fakes.py): the
fake kernel stands in for hardware no kernel here has.  The same paths on
a real kernel (veth in namespaces) are tested in tests/netns.
"""

from __future__ import annotations

import copy
import errno
import json
import os

import pytest

from fakes import FakeHost
from nictune.host import agent
from nictune.host import model as m
from nictune.host.transaction.engine import Engine
from nictune.host.errors import Interrupted, NoJournal
from nictune.host.knobs import FAMILIES
from nictune.host.knobs.base import Family

from nictune.profile.loader import load_profile_text
from shipped import CX7, MAIA, MAIA_TSO, P0, P1, VF

pytestmark = pytest.mark.recorded



class Run:
    """One fake host, its state directory, and engines over them."""

    def __init__(self, state: str, tmp_path):
        self.host = FakeHost(state, tmp_path / "root")
        self.kernel = self.host.kernel
        self.state_dir = str(tmp_path / "state")
        self.initial = self.kernel.snapshot()

    def engine(self) -> Engine:
        # A fresh engine per command, as each CLI run is a fresh process.
        return Engine(self.host, self.state_dir)

    def apply(self, profile, doc=None):
        return self.engine().apply(doc or profile.doc, profile.sources, profile.path)

    def journal(self) -> dict:
        with open(os.path.join(self.state_dir, "journal.json")) as f:
            return json.load(f)

    def history(self) -> list:
        return sorted(os.listdir(os.path.join(self.state_dir, "history")))


def statuses(out) -> dict:
    return {(c.key.family, c.key.target, c.key.name): c.status for c in out.changes}


def change(out, family, target, name):
    return next(c for c in out.changes if (c.key.family, c.key.target, c.key.name) == (family, target, name))


def exit_code(out) -> int:
    return agent.report(out, "test", 0.0)["exit_code"]


@pytest.fixture
def cx7(tmp_path):
    return Run("cx7-host", tmp_path)


@pytest.fixture
def maia(tmp_path):
    return Run("maia-host", tmp_path)


# -- apply ------------------------------------------------------------------

def with_enroot(run: "Run") -> "Run":
    """The host with enroot installed: the shipped profile binds /etc/nccl.conf
    into its containers (on a host without it, that key is skipped)."""
    os.makedirs(run.host.path("etc/enroot/mounts.d"))
    return run


def test_apply_writes_verifies_and_commits(cx7):
    with_enroot(cx7)
    out = cx7.apply(CX7)
    assert out.error is None and exit_code(out) == 0
    assert set(statuses(out).values()) == {m.APPLIED, m.OK}
    link = cx7.kernel.links[P1]
    assert (link.mtu, link.txqlen, link.up) == (9000, 10000, True)
    assert cx7.kernel.ops["rings"][P0]["rx"] == 8192
    assert cx7.kernel.ops["channels"][P0]["combined"] == 32  # the bound, written as is
    assert cx7.kernel.ops["coalesce"][P1]["adaptive-tx"] is True
    assert cx7.kernel.read_file(f"proc/sys/net/ipv4/conf/{P0}/arp_announce") == "2"
    nccl = cx7.kernel.read_file("etc/nccl.conf")
    assert nccl.startswith("# Managed by nictune") and "NCCL_IB_TC=106\n" in nccl
    assert "/etc/nccl.conf /etc/nccl.conf none " in cx7.kernel.read_file(
        "etc/enroot/mounts.d/90-nictune.fstab")

    record = cx7.journal()
    assert record["status"] == "committed" and record["profile"] == CX7.path
    befores = {(c["key"]["target"], c["key"]["name"]): c["before"] for c in record["changes"]}
    assert befores[(P1, "mtu")] == 1500 and befores[(P1, "state")] == "down"
    assert "\nNCCL_DEBUG=INFO\n" in befores[("host", "/etc/nccl.conf")]
    # Only pending keys are journalled.
    assert (P0, "state") not in befores
    assert cx7.history() == [record["id"] + ".json"]


def test_second_apply_is_a_no_op(cx7):
    with_enroot(cx7)
    assert cx7.apply(CX7).error is None
    journal_before = cx7.journal()
    writes = len(cx7.kernel.writes)
    snap = cx7.kernel.snapshot()

    out = cx7.apply(CX7)
    assert out.error is None and exit_code(out) == 0
    assert set(statuses(out).values()) == {m.OK}
    assert len(cx7.kernel.writes) == writes
    assert cx7.kernel.snapshot() == snap
    assert cx7.journal() == journal_before  # no new journal for nothing to do

    verify = cx7.engine().plan(CX7.doc, CX7.sources, "verify")
    assert set(statuses(verify).values()) == {m.OK} and exit_code(verify) == 0


def test_journal_is_on_disk_before_the_first_write(cx7, tmp_path):
    profile = load_profile_text(
        "nictune: 1\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n"
        "    features: {hw-tc-offload: true}\n    channels: {combined: 24}\n    mtu: 9000\n")
    seen = []

    def at_write(op, ifname, values):
        if not seen:
            seen.append(cx7.journal())

    cx7.kernel.on_write.append(at_write)
    assert cx7.apply(profile).error is None
    first = seen[0]
    assert first["status"] == "applying"
    assert {(c["key"]["target"], c["key"]["name"]): c["before"] for c in first["changes"]} == {
        (P0, "hw-tc-offload"): False, (P1, "hw-tc-offload"): False,
        (P0, "combined"): 16, (P1, "combined"): 16,
        (P0, "mtu"): 1500, (P1, "mtu"): 1500,
    }


def test_a_refused_write_rolls_everything_back_in_reverse_order(cx7, monkeypatch):
    reverted = []
    original = Family.revert

    def spy(self, items):
        reverted.extend((k.family, k.target, k.name) for k, _ in items)
        original(self, items)

    monkeypatch.setattr(Family, "revert", spy)
    # The second port refuses its channel count; port 0's was already written.
    cx7.kernel.fail("set_channels", P1, errno.EBUSY)
    out = cx7.apply(CX7)

    assert out.error["kind"] == "rolled-back" and exit_code(out) == 3
    assert "channels combined on enp23s0f1np1" in out.error["message"]
    assert "EBUSY" in out.error["message"] and "every change was restored" in out.error["message"]
    st = statuses(out)
    failed = [k for k, s in st.items() if s == m.FAILED]
    assert failed == [("channels", P1, "combined")]
    assert "write refused" in change(out, "channels", P1, "combined").note
    # Written before the failure: restored.
    for key in [("sysctl", "host", "net.core.rmem_max"), ("nccl", "host", "/etc/nccl.conf"),
                ("sysctl", P0, f"net.ipv4.conf.{P0}.arp_ignore"), ("channels", P0, "combined")]:
        assert st[key] == m.REVERTED, key
    # Never reached: not applied, and never written.
    for key in [("rings", P0, "rx"), ("coalesce", P1, "adaptive-tx"), ("link", P0, "mtu"),
                ("link", P1, "state")]:
        assert st[key] == m.NOT_APPLIED, key
    assert st[("link", P0, "state")] == m.OK
    assert not [w for w in cx7.kernel.writes if w[0] in ("set_rings", "set_coalesce", "set_link")]

    # Restored newest first: exactly the applied keys, in reverse apply
    # order (family by family in FAMILIES order, profile order within one).
    order = [f.name for f in FAMILIES]
    applied = sorted((k for k, s in st.items() if s == m.REVERTED), key=lambda k: order.index(k[0]))
    assert applied[-1] == ("channels", P0, "combined")
    assert reverted == list(reversed(applied))
    assert cx7.kernel.snapshot() == cx7.initial
    assert cx7.journal()["status"] == "rolled-back"


def test_a_family_raising_leaves_a_rolled_back_journal(cx7):
    cx7.kernel.fail("set_rings", P0, errno.ENOMEM, "failed to allocate rings")
    out = cx7.apply(CX7)
    assert out.error["kind"] == "rolled-back"
    assert "failed to allocate rings" in change(out, "rings", P0, "rx").note
    record = cx7.journal()
    assert record["status"] == "rolled-back" and "finished" in record
    assert cx7.history() == [record["id"] + ".json"]
    assert cx7.kernel.snapshot() == cx7.initial


def test_mana_ring_sizes_it_would_round_are_refused_before_writing(maia):
    doc = copy.deepcopy(MAIA.doc)
    doc["interfaces"]["mana-vf"]["rings"] = {"rx": 6000, "tx": 4096}
    out = maia.apply(MAIA, doc)
    assert out.error["kind"] == "unsupported" and maia.kernel.writes == []
    assert "6000 would become 8192" in change(out, "rings", VF, "rx").note


def test_a_driver_rounding_rings_up_fails_read_back_and_rolls_back(maia, monkeypatch):
    # As with a driver nictune has no capability table for: only the read-back
    # can tell that the kernel's ACK did not mean "as written".
    monkeypatch.setattr("nictune.host.knobs.ethtool.nicclass.rings_effective", lambda d, n, v: v)
    doc = copy.deepcopy(MAIA.doc)
    doc["interfaces"]["mana-vf"]["rings"] = {"rx": 6000, "tx": 4096}
    out = maia.apply(MAIA, doc)
    assert out.error["kind"] == "rolled-back" and exit_code(out) == 3
    rx = change(out, "rings", VF, "rx")
    assert rx.status == m.FAILED and rx.note == "read back 8192 after writing 6000"
    # The write itself was accepted: read-back decides, not the kernel's ACK.
    assert ("set_rings", VF, {"rx": 6000, "tx": 4096}) in maia.kernel.writes
    assert change(out, "rings", VF, "tx").status == m.REVERTED
    assert change(out, "link", "eth0", "mtu").status == m.NOT_APPLIED
    assert maia.kernel.ops["rings"][VF]["rx"] == 512 and maia.kernel.ops["rings"][VF]["tx"] == 256
    assert maia.kernel.snapshot() == maia.initial


def test_mana_ring_sizes_that_are_powers_of_two_apply(maia):
    out = maia.apply(MAIA)
    assert out.error is None, out.error
    assert maia.kernel.ops["rings"][VF] == {**maia.kernel.ops["rings"][VF], "rx": 8192, "tx": 8192}
    # hv_netvsc set the VF's MTU too.
    assert maia.kernel.links["eth0"].mtu == maia.kernel.links[VF].mtu == 9000


def test_a_mixed_feature_group_is_restored_bit_by_bit(maia):
    # tso on MANA: tx-tcp-segmentation and tx-tcp6 on, tx-tcp-mangleid off.
    maia.kernel.fail("set_rings", VF, errno.EBUSY)
    out = maia.apply(MAIA_TSO)
    assert out.error["kind"] == "rolled-back", out.error
    tso = change(out, "features", VF, "tso")
    assert tso.before == {"tx-tcp-mangleid-segmentation": False, "tx-tcp-segmentation": True,
                          "tx-tcp6-segmentation": True}
    assert tso.status == m.REVERTED
    assert maia.kernel.features[VF]["active"]["tx-tcp-mangleid-segmentation"] is False
    assert maia.kernel.snapshot() == maia.initial


def test_a_later_family_undoing_an_earlier_one_is_caught_and_rolled_back(cx7):
    # An MTU change resets net.ipv6.conf.<if>.mtu (addrconf): the final
    # whole-plan read-back sees it, though each family verified alone.
    profile = load_profile_text(
        "nictune: 1\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n"
        "    mtu: 9000\n    sysctl: {ipv6.mtu: 1400}\n")
    out = cx7.apply(profile)
    assert out.error["kind"] == "rolled-back", out.error
    bad = change(out, "sysctl", P0, f"net.ipv6.conf.{P0}.mtu")
    assert bad.status == m.FAILED and bad.note == "read back 9000 after writing 1400"
    assert change(out, "link", P0, "mtu").status == m.REVERTED
    assert cx7.kernel.snapshot() == cx7.initial
    assert cx7.journal()["status"] == "rolled-back"


def test_a_write_the_precheck_cannot_see_is_rolled_back(maia):
    # 9216 is below hv_netvsc's maximum, but netvsc sets the MANA VF first,
    # and the VF's maximum is 9000: EINVAL after the other families applied.
    doc = copy.deepcopy(MAIA.doc)
    doc["interfaces"]["synthetic"]["mtu"] = 9216
    out = maia.apply(MAIA, doc)
    assert out.error["kind"] == "rolled-back"
    mtu = change(out, "link", "eth0", "mtu")
    assert mtu.status == m.FAILED and "Invalid argument" in mtu.note
    assert "mtu greater than device maximum" in mtu.note
    assert change(out, "rings", VF, "rx").status == m.REVERTED
    assert maia.kernel.snapshot() == maia.initial


def test_a_revert_the_kernel_refuses_is_rollback_failed(cx7):
    cx7.kernel.fail("set_rings", P1, errno.EINVAL)
    # Restoring 16 channels is refused (every time).
    cx7.kernel.fail("set_channels", P0, errno.EBUSY, when=lambda v: v == {"combined": 16})
    out = cx7.apply(CX7)
    assert out.error["kind"] == "rollback-failed" and exit_code(out) == 4
    assert "channels:enp23s0f0np0:combined" in out.error["message"]
    assert "a human must look" in out.error["message"]
    stuck = change(out, "channels", P0, "combined")
    assert stuck.status == m.REVERT_FAILED
    assert stuck.note.startswith("still 32") and "EBUSY" in stuck.note
    assert change(out, "rings", P1, "rx").status == m.FAILED
    assert change(out, "sysctl", "host", "net.core.rmem_max").status == m.REVERTED
    assert cx7.journal()["status"] == "rollback-failed"
    # Everything else is back.
    snap = cx7.kernel.snapshot()
    assert snap["ops"]["channels"][P0]["combined"] == 32
    snap["ops"]["channels"][P0]["combined"] = 16
    assert snap == cx7.initial


def test_unsupported_keys_write_nothing_and_journal_nothing(cx7):
    doc = copy.deepcopy(CX7.doc)
    doc["interfaces"]["rails"]["rings"] = {"rx": 16384}
    out = cx7.apply(CX7, doc)
    assert out.error["kind"] == "unsupported" and exit_code(out) == 1
    assert "above the device maximum 8192" in out.error["message"]
    assert cx7.kernel.writes == []
    assert cx7.kernel.snapshot() == cx7.initial
    assert not os.path.exists(os.path.join(cx7.state_dir, "journal.json"))


def test_warn_policy_applies_the_rest(maia):
    doc = copy.deepcopy(MAIA.doc)
    doc["interfaces"]["mana-vf"]["on_unsupported"] = "warn"
    doc["interfaces"]["mana-vf"]["pause"] = {"rx": False}
    out = maia.apply(MAIA, doc)
    assert out.error is None and exit_code(out) == 0
    assert change(out, "pause", VF, "rx").status == m.SKIPPED
    assert out.warnings == [f"skipped pause rx on {VF}: the driver does not support pause settings"]
    assert maia.kernel.links["eth0"].mtu == 9000


# -- verify -----------------------------------------------------------------

def test_verify_reports_drift_and_changes_nothing(cx7):
    assert cx7.apply(CX7).error is None
    cx7.kernel.links[P0].mtu = 1500
    cx7.kernel.ops["channels"][P1]["combined"] = 48  # still meets {min: 32}
    cx7.kernel.ops["rings"][P1]["tx"] = 4096
    writes = len(cx7.kernel.writes)
    out = cx7.engine().plan(CX7.doc, CX7.sources, "verify")
    drift = {k: (c.before, c.after) for c in out.changes if c.status == m.DRIFT
             for k in [(c.key.target, c.key.name)]}
    assert drift == {(P0, "mtu"): (1500, 9000), (P1, "tx"): (4096, 8192)}
    assert exit_code(out) == 2
    assert len(cx7.kernel.writes) == writes


# -- rollback ---------------------------------------------------------------

def test_rollback_restores_the_last_apply_from_its_journal(cx7):
    assert cx7.apply(CX7).error is None
    assert cx7.kernel.snapshot() != cx7.initial
    out = cx7.engine().rollback()
    assert out.error is None and exit_code(out) == 0
    assert set(statuses(out).values()) == {m.REVERTED}
    assert out.extra["journal"] == cx7.journal()["id"]
    assert cx7.kernel.snapshot() == cx7.initial
    assert cx7.journal()["status"] == "rolled-back"
    report = agent.report(out, "test", 0.0)
    assert report["changed"] is True

    again = cx7.engine().rollback()
    assert again.changes == [] and "already rolled back" in again.warnings[0]
    assert cx7.kernel.snapshot() == cx7.initial


def test_rollback_after_an_interrupted_apply(cx7):
    class Crash(BaseException):
        """The process dies mid-apply (SIGKILL, power loss): nothing catches it."""

    cx7.kernel.fail("set_rings", P0, error=Crash())
    with pytest.raises(Crash):
        cx7.apply(CX7)
    assert cx7.journal()["status"] == "applying"
    assert cx7.kernel.ops["channels"][P0]["combined"] == 32  # written before the crash
    cx7.kernel.faults.clear()
    # The journal holds the only record of what it overwrote: no new apply
    # until that one is rolled back.
    with pytest.raises(Interrupted):
        cx7.apply(CX7)
    assert cx7.journal()["status"] == "applying"

    out = cx7.engine().rollback()
    assert out.error is None
    assert any("had not finished" in w for w in out.warnings)
    # Only what the crashed apply wrote is reported as restored.
    restored = {c.key.name for c in out.changes if c.status == m.REVERTED}
    untouched = [c for c in out.changes if c.status == m.OK]
    assert "combined" in restored and "rx" not in restored  # rings: never written
    assert untouched and all(c.note == "already at its before-value" for c in untouched)
    assert cx7.kernel.snapshot() == cx7.initial
    assert cx7.journal()["status"] == "rolled-back"
    assert cx7.apply(CX7).error is None  # and now it may apply again


def test_rollback_that_cannot_restore_says_so(cx7):
    assert cx7.apply(CX7).error is None
    cx7.kernel.fail("set_link", P1, errno.EPERM)
    out = cx7.engine().rollback()
    assert out.error["kind"] == "rollback-failed" and exit_code(out) == 4
    assert {c.status for c in out.changes if c.key.target == P1 and c.key.family == "link"} == {m.REVERT_FAILED}
    assert cx7.journal()["status"] == "rollback-failed"


def test_rollback_without_a_journal(cx7):
    with pytest.raises(NoJournal):
        cx7.engine().rollback()


# -- show -------------------------------------------------------------------

def test_show_is_a_profile_that_plans_to_nothing(maia, tmp_path):
    import yaml

    out = maia.engine().show()
    assert out.facts[VF]["pci_id"] == "1414:00ba" and out.facts[VF]["driver"] == "mana"
    assert "pci_id" not in out.facts["eth0"]  # a VMBus device, not PCI
    doc = out.extra["profile"]
    assert doc["interfaces"]["enp30832p0s0"]["match"] == {"name": VF}
    shown = load_profile_text(yaml.safe_dump(doc, sort_keys=False))
    plan = Engine(FakeHost("maia-host", tmp_path / "other"), str(tmp_path / "s2")).plan(shown.doc, shown.sources)
    assert plan.error is None and set(statuses(plan).values()) == {m.OK}


def _sriov_on_a_pf_without_it(tmp_path, vfs: int, policy: str):
    entries = "".join(f"        '{i}': {{mac: '02:00:00:00:{i // 256:02x}:{i % 256:02x}', "
                      "vlan: 100, trust: true}\n" for i in range(vfs))
    profile = load_profile_text(
        f"nictune: 1\non_unsupported: {policy}\ninterfaces:\n  mgmt:\n    match: {{name: eth0}}\n"
        f"    sriov:\n      numvfs: {vfs}\n      vfs:\n" + entries, "p.yaml")
    return agent.run({"nictune_request": 1, "command": "plan", "state_dir": str(tmp_path / "s"),
                      "profile": {"path": profile.path, "doc": profile.doc,
                                  "sources": profile.sources}},
                     host=FakeHost("cx7-host", tmp_path / "root"))


def test_many_settings_refused_for_one_reason_are_counted_not_listed(tmp_path):
    """1,024 VFs on the igb port, which has no SR-IOV: 3,073 settings, one
    reason.  The error says the count and the first keys once (it was one
    line of a quarter of a megabyte); every key is still in the changes."""
    report = _sriov_on_a_pf_without_it(tmp_path, 1024, "fail")
    assert len(report["changes"]) == 3073
    assert all(c["status"] == "unsupported" for c in report["changes"])
    assert report["error"]["message"] == (
        "3073 setting(s) cannot be applied on this host, so nothing was written: eth0 sriov "
        "numvfs, vfs.0.mac, vfs.0.vlan and 3070 more: eth0 has no SR-IOV (no "
        "device/sriov_numvfs) (p.yaml:7). Set on_unsupported: warn or skip to apply the rest.")
    warned = _sriov_on_a_pf_without_it(tmp_path / "warn", 1024, "warn")
    assert warned["error"] is None and warned["warnings"] == [
        "skipped sriov numvfs, vfs.0.mac, vfs.0.vlan and 3070 more on eth0: eth0 has no SR-IOV "
        "(no device/sriov_numvfs)"]


def test_a_few_settings_refused_for_one_reason_are_each_listed(tmp_path):
    report = _sriov_on_a_pf_without_it(tmp_path, 1, "fail")  # numvfs and 3 attributes: 4
    assert report["error"]["message"].count("eth0 has no SR-IOV") == 4
    assert "eth0 sriov vfs.0.trust: eth0 has no SR-IOV (no device/sriov_numvfs) (p.yaml:9)" in \
        report["error"]["message"]
