"""Every registered family plans from a recorded `show` as it plans live.

For each family in the registry (host/knobs/__init__.py REGISTRY), a host
is recorded by a show (host/replay/snapshot.py, as `show --save` does), the
family's profile is planned from that snapshot, offline, and planned live
on the same host; the two plans must be equal key for key (before, after,
status, note, source).  The host is whichever the family has here:

- the recorded ConnectX-7 host on the fake kernel (tests/fakes.py), with
  the family's example from the profile reference
  (each family's `example`), unless CASES says otherwise: a golden
  host (RDMA, DCB, the libraries' files), the ConnectX-7 port as a PCI
  function with a devlink eswitch and SR-IOV (eswitch, sriov), the port
  in a DGX-class PCIe tree (pcie, gpudirect: tests/pcie_tree.py), a MACsec
  handle with no links yet (this kernel has no macsec module);
- a veth in a namespace (tests/netns/conftest.py veth_pair) for IPsec
  (this kernel has xfrm policies), through the CLI as a user runs it;
- a real ovsdb-server (tests/ovsdb.py) for OVS.

A family whose class declares `offline_plan` (why it cannot be planned
offline) must in fact plan differently offline: a declaration that has
stopped being true fails here, as does a family that neither plans
offline nor says why.  A live plan with nothing really read of the family
(every row unsupported or skipped) proves nothing and fails too.
"""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import nictune.host.knobs as knobs
from fakes import FakeHost, load_state
import pcie_tree
from nictune.cli.app import app
from nictune.host import agent
from nictune.host.replay import snapshot
from nictune.host.transports.netlink.devlink import Eswitch, Param
from nictune.profile.loader import load_profile
from nictune.profile.reference import examples
from ovsdb import running_ovsdb

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
P0 = "enp23s0f0np0"  # a ConnectX-7 port of the recorded host (tests/golden/states/cx7-host.json)
PCI = "0000:17:00.0"
# Statuses that show the family read the host (or a value it read, below).
READ = ("ok", "pending", "drift")


# -- the fake kernel ------------------------------------------------------------

class _FakeDevlink:
    """The devlink eswitch of P0's PCI function: the one devlink call a
    plan of eswitch: makes (Host.devlink(), which the fakes lack)."""

    def __init__(self, mode: str):
        self.mode = mode

    def devices(self) -> list:
        return [f"pci/{PCI}"]

    def ports(self) -> list:
        return []

    def params(self, handle: str) -> list:
        """mlx5's permanent nv params (lib/nv_param.c), as stored."""
        if handle != f"pci/{PCI}":
            raise OSError(19, f"no devlink device {handle}")
        return [Param(handle, "enable_sriov", "bool", {"permanent": True}),
                Param(handle, "total_vfs", "u32", {"permanent": 8})]

    def info(self, handle: str):
        raise OSError(95, "no dev info here")

    def eswitch(self, handle: str) -> Eswitch:
        if handle != f"pci/{PCI}":
            raise OSError(19, f"no devlink device {handle}")
        return Eswitch(mode=self.mode, inline_mode="none", encap="basic")

    def close(self) -> None:
        pass


class _PciHost(FakeHost):
    """The recorded ConnectX-7 host, P0 a PCI function with a devlink
    eswitch in legacy mode and SR-IOV (8 VFs allowed, none made)."""

    def __init__(self, state, root):
        super().__init__(state, root)
        device = os.path.join(root, "sys/devices/pci0000:16/0000:16:01.0", PCI)
        os.makedirs(device)
        os.makedirs(os.path.join(root, "sys/bus/pci"))
        _relative_link(os.path.join(root, "sys/bus/pci"), os.path.join(device, "subsystem"))
        for name, value in (("sriov_numvfs", "0"), ("sriov_totalvfs", "8"),
                            ("sriov_drivers_autoprobe", "1")):
            with open(os.path.join(device, name), "w") as f:
                f.write(value + "\n")
        # The recorded state has P0's device/vendor and device/device as
        # plain files: they move into the PCI function's directory.
        link = os.path.join(root, "sys/class/net", P0, "device")
        for name in os.listdir(link):
            os.rename(os.path.join(link, name), os.path.join(device, name))
        os.rmdir(link)
        _relative_link(device, link)
        self._fake_devlink = _FakeDevlink("legacy")

    def devlink(self):
        return self._fake_devlink


def _relative_link(target: str, link: str) -> None:
    """A symlink as sysfs makes them: relative, so it resolves under any root."""
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def _stable(report: dict, roots) -> dict:
    text = json.dumps({k: report[k] for k in ("error", "changes")})
    for root in roots:
        text = text.replace(str(root), "<tmp>")
    return json.loads(text.replace(REPO + os.sep, ""))


def on_fakes(tmp_path, text: str, host_class=FakeHost, state="cx7-host", path=None) -> tuple:
    """(live report, offline report) of the profile `text` (or the file
    `path`) on a recorded host (`state`, the ConnectX-7 one unless named):
    a show recorded on one copy of it, the live plan on another."""
    if path is None:
        path = tmp_path / "p.yaml"
        path.write_text("nictune: 1\non_unsupported: warn\n" + text)
    profile = load_profile(str(path))
    request = {"nictune_request": 1, "command": "plan",
               "profile": {"path": profile.path, "doc": profile.doc, "sources": profile.sources}}
    shown = agent.run({"nictune_request": 1, "command": "show", "record": True,
                       "state_dir": str(tmp_path / "state-show")},
                      host=host_class(state, tmp_path / "recorded"))
    assert shown["error"] is None, shown["error"]
    snap = json.loads(json.dumps(shown["snapshot"]))  # as the file stores it
    live = agent.run(dict(request, state_dir=str(tmp_path / "state-live")),
                     host=host_class(state, tmp_path / "live"))
    replay = snapshot.RecordedHost(snap["reads"])
    with replay.replaying():
        offline = agent.run(request, host=replay)
    roots = [tmp_path / "recorded", tmp_path / "live", snapshot.FAKE_ROOT]
    return _stable(live, roots), _stable(offline, roots)


# -- a real kernel, a real ovsdb-server ---------------------------------------

def _cli(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    try:
        (host,) = json.loads(result.stdout)["hosts"]
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}, no JSON: {result.output}")
    return host


def in_namespace(ns: str, tmp_path, text: str) -> tuple:
    """(live report, offline report) through the CLI: `show --netns NS
    --save DIR`, `plan --netns NS`, `plan --from-snapshots DIR`."""
    path = tmp_path / "p.yaml"
    path.write_text("nictune: 1\n" + text)
    state, snaps = str(tmp_path / "state"), str(tmp_path / "snaps")
    shown = _cli("show", "--netns", ns, "--state-dir", state, "--save", snaps)
    assert shown["error"] is None, shown["error"]
    live = _cli("plan", str(path), "--netns", ns, "--state-dir", state)
    offline = _cli("plan", str(path), "--netns", ns, "--from-snapshots", snaps)
    return _stable(live, []), _stable(offline, [])


def ipsec_case(request, tmp_path) -> tuple:
    pair = request.getfixturevalue("veth_pair")
    # A policy of someone else's (an IKE daemon's reqid), and two of ours.
    r = pair.run(pair.ns_a, ["ip", "xfrm", "policy", "add", "src", "198.18.0.3/32", "dst",
                             "198.18.0.1/32", "dir", "in", "tmpl", "src", "198.18.0.3", "dst",
                             "198.18.0.1", "proto", "esp", "reqid", "9", "mode", "transport"])
    assert r.returncode == 0, r.stderr
    return in_namespace(pair.ns_a, tmp_path, f"""\
on_unsupported: warn
interfaces:
  rail:
    match: {{name: {pair.ifname}}}
    ipsec:
      policies:
        - {{src: 198.18.0.1/32, dst: 198.18.0.2/32, dir: out,
           tmpl: {{src: 198.18.0.1, dst: 198.18.0.2, reqid: 1}}}}
        - {{src: 198.18.0.3/32, dst: 198.18.0.1/32, dir: in,
           tmpl: {{src: 198.18.0.3, dst: 198.18.0.1, reqid: 3}}}}
""")


def ovs_case(request, tmp_path) -> tuple:
    pair = request.getfixturevalue("veth_pair")
    with running_ovsdb(tmp_path) as db:
        db.set_other(**{"hw-offload": "false"})
        return in_namespace(pair.ns_a, tmp_path, "on_unsupported: warn\nhost:\n  ovs:\n"
                            f"    hw_offload: true\n    tc_policy: skip_sw\n    db: {db.sock}\n")


class _NoMacsecLinks:
    """The MACsec generic netlink family of a kernel that has it, with no
    MACsec link yet (this kernel has no macsec module: tests/recorded/macsec).
    Made as Host.macsec() makes the real one, with the port's socket opener."""

    def __init__(self, opener=None):
        self.opener = opener

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass

    def links(self) -> list:
        return []

    def secys(self) -> dict:
        return {}


def _cannot_run(why: str) -> None:
    """Skip (a failure under CI, tests/skips.py, where everything a case needs is there)."""
    pytest.skip(why)


def macsec_case(request, tmp_path) -> tuple:
    if os.geteuid() != 0:
        _cannot_run("key files must be root's: run as root")
    request.getfixturevalue("monkeypatch").setattr(
        "nictune.host.transports.netlink.macsec.Macsec", _NoMacsecLinks)
    keys = []
    for name in ("tx", "rx"):
        path = tmp_path / f"ms0-{name}"
        path.write_text("0a1b2c3d4e5f60718293a4b5c6d7e8f9\n")
        os.chmod(path, 0o600)
        keys.append(path)
    return on_fakes(tmp_path, f"""\
interfaces:
  rail:
    match: {{name: eth0}}
    macsec:
      name: ms0
      cipher: gcm-aes-xpn-128
      tx_sa: {{an: 0, pn: 1, ssci: 1, salt: 000102030405060708090a0b, key_file: {keys[0]}}}
      rx:
        - {{address: "02:00:00:00:00:02", port: 1,
           sa: {{an: 0, ssci: 2, salt: 0b0a09080706050403020100, key_file: {keys[1]}}}}}
""")


def example(name: str):
    """The family's example from the profile reference, on the fakes."""
    return lambda request, tmp_path: on_fakes(tmp_path, examples()[name])


def golden(case: str):
    """A golden case's host state and profile (tests/golden/CASE)."""
    here = os.path.join(REPO, "tests", "golden", case)
    return lambda request, tmp_path: on_fakes(
        tmp_path, "", state=load_state(os.path.join(here, "observed.json")),
        path=os.path.join(here, "profile.yaml"))


class _PcieHost(FakeHost):
    """The recorded ConnectX-7 host with P0 in the DGX-class PCIe tree of
    tests/pcie_tree.py (a switch shared with a GPU, recorded registers)."""

    def __init__(self, state, root):
        super().__init__(state, root)
        pcie_tree.build(str(root), P0)


def fakes(text: str, host_class=FakeHost):
    return lambda request, tmp_path: on_fakes(tmp_path, text, host_class)


def irq_case(request, tmp_path) -> tuple:
    """The recorded ConnectX-7 host with a real mlx5 host's IRQs (tests/irq_tree.py)."""
    from irq_tree import irq_state

    return on_fakes(tmp_path, examples()["irq"], state=irq_state())


# Families whose example does not suit the recorded ConnectX-7 host on the
# fake kernel, and where each is planned instead.  Every other registered
# family is planned from its example there.
CASES = {
    "eswitch": fakes(f"interfaces:\n  p:\n    match: {{name: {P0}}}\n"
                     "    eswitch: {mode: switchdev, inline_mode: none, encap: basic}\n", _PciHost),
    "firmware": fakes(f"interfaces:\n  p:\n    match: {{name: {P0}}}\n"
                      "    firmware: {sriov_enabled: true, total_vfs: 16}\n", _PciHost),
    "sriov": fakes(f"interfaces:\n  p:\n    match: {{name: {P0}}}\n"
                   "    sriov:\n      numvfs: 4\n      drivers_autoprobe: false\n"
                   "      vfs:\n        '0': {trust: true, spoofchk: false}\n", _PciHost),
    # PCI configuration space, which a snapshot does not record.
    "pcie": fakes(f"interfaces:\n  p:\n    match: {{name: {P0}}}\n    pcie:\n"
                  "      max_read_request: 4096\n      acs_redirect: false\n", _PcieHost),
    "gpudirect": fakes(f"interfaces:\n  p:\n    match: {{name: {P0}}}\n    pcie:\n"
                       "      ats: true\n      link_at_max: true\n", _PcieHost),
    # Expectations without a counter's rise, which one instant cannot hold
    # (tests/unit/test_snapshots.py RISES).
    "expect": fakes("interfaces:\n  rails:\n    match: {driver: mlx5_core}\n    expect:\n"
                    "      driver: mlx5_core\n      link_speed_mbps: 400000\n"
                    "      counters: {rx_discards_phy: {max: 0}}\n"),
    # Hosts with RDMA devices, DCB and the PFC storm tunable, or the
    # communication libraries' files, as the golden cases record them.
    "roce": golden("cx7-roce-lossless"),
    "dcb": golden("cx7-roce-lossless"),
    "tunable": golden("cx7-roce-headroom"),
    "nccl": golden("rdma-library-files"),
    "ucx": golden("rdma-library-files"),
    "mpi": golden("rdma-library-files"),
    "nvshmem": golden("rdma-library-files"),
    # A Slurm node with enroot: the directories the job outputs go in.
    "slurm_task_prolog": golden("job-outputs"),
    "enroot_environ": golden("job-outputs"),
    "enroot_mounts": golden("job-outputs"),
    "environment": golden("job-outputs"),
    "irq": irq_case,
    "macsec": macsec_case,
    "ipsec": ipsec_case,
    "ovs": ovs_case,
}
FAMILIES = list(knobs.CATALOG)


def test_the_cases_are_the_registered_families():
    assert len(FAMILIES) >= 20 and len(FAMILIES) == len(knobs.REGISTRY)
    assert FAMILIES == [f.name for f in knobs.REGISTERED]
    assert set(CASES) <= set(FAMILIES)


def _rows(report: dict, family: str) -> list:
    return [c for c in report["changes"] if c["key"]["family"] == family]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_plan_from_a_recorded_show_is_the_live_plan(name, request, tmp_path):
    family = knobs.load(name)
    case = CASES.get(name) or example(name)
    live, offline = case(request, tmp_path)
    assert live["error"] is None or live["error"]["kind"] == "unsupported", live["error"]
    mine = _rows(live, name)
    assert [c for c in mine if c["status"] in READ or c["before"] is not None], (
        f"the live plan of {name}'s case read nothing of it: {mine}")
    if family.offline_plan is None:
        # The case's profile may hold keys of families that declare they
        # cannot be planned offline (pcie: config space): theirs differ.
        plannable = lambda c: knobs.load(c["key"]["family"]).offline_plan is None  # noqa: E731
        by_key = {json.dumps(c["key"], sort_keys=True): c for c in offline["changes"] if plannable(c)}
        for row in filter(plannable, live["changes"]):
            assert by_key.pop(json.dumps(row["key"], sort_keys=True), None) == row, (
                f"{name} plans {row['key']} offline otherwise; if it cannot be planned "
                "offline, its class says why in offline_plan")
        assert by_key == {} and offline["error"] == live["error"]
    else:
        assert _rows(offline, name) != mine, (
            f"{name} declares it cannot be planned offline ({family.offline_plan}), "
            "yet its offline plan is the live one: drop the declaration")
