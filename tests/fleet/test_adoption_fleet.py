"""`nictune show` on one host, then `nictune audit` of hosts like it with
that output (issue 11 item 8), end to end: real sshd hosts in namespaces
(lab/fleet.py), each with its own /etc/nccl.conf, holding the file Azure's
HPC image writes (azhpc-images, from the real-world reference directory)
with no nictune header.  The files are written and read back with cat in
each namespace, never through nictune.
"""

from __future__ import annotations

import pytest
from fleet_helpers import nictune
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.lab.fleet import run_in
from real_world import REAL_WORLD, require

pytestmark = pytest.mark.netns


def write_in_place(host, text: str) -> None:
    # The namespace's own file is bound over /etc/nccl.conf for its sshd:
    # only a write to that inode reaches what its logins read.
    with open(f"/etc/netns/{host.netns}/nccl.conf", "w") as f:
        f.write(text)


def drift_of(report) -> dict:
    return {h["host"]: [(c["key"]["family"], c["key"]["name"]) for c in h["changes"]
                        if c["status"] == "drift"] for h in report["hosts"]}


def test_show_on_one_host_then_audit_of_its_twins_reports_zero_drift(make_fleet, tmp_path):
    image = (require(REAL_WORLD / "nccl") / "azhpc-nccl.conf.legacy-2021-ndv4").read_text()
    # The lab's hosts have no eth0: NCCL_SOCKET_IFNAME names their management
    # interface instead, so that the file is one this host could take (a
    # profile naming a missing interface is unsupported, not drift).
    assert "NCCL_SOCKET_IFNAME=eth0" in image
    image = image.replace("NCCL_SOCKET_IFNAME=eth0", "NCCL_SOCKET_IFNAME=mgmt0")
    fleet = make_fleet(3)
    hosts = fleet.of_kind("sshd")
    for h in hosts:
        write_in_place(h, image)
        assert run_in(h, ["cat", "/etc/nccl.conf"]).stdout == image

    result = CliRunner().invoke(app, ["show", "--netns", hosts[0].netns])
    assert result.exit_code == 0, result.output
    shown = tmp_path / "shown.yaml"
    shown.write_text(result.stdout)
    assert "CUDA_DEVICE_ORDER: PCI_BUS_ID" in result.stdout

    code, report = nictune("audit", str(shown), "-i", fleet.inventory, "--limit", "fleet")
    assert code == 0, report
    assert drift_of(report) == {h.name: [] for h in hosts}
    assert all(c["status"] == "ok" for h in report["hosts"] for c in h["changes"]
               if c["key"]["family"] == "nccl")

    # Reordered and commented, NCCL reads the same: still no drift.  A value
    # NCCL reads differently makes the file differ, on that host only: drift
    # (exit 2), and, as the file is not nictune's, the note says an apply
    # would need adopt: true and names only the profile's side.
    lines = image.splitlines(keepends=True)
    write_in_place(hosts[1], "# tuned by hand\n" + "".join(reversed(lines)))
    write_in_place(hosts[2], image.replace("NCCL_IB_PCI_RELAXED_ORDERING=1", "NCCL_IB_PCI_RELAXED_ORDERING=0"))
    code, report = nictune("audit", str(shown), "-i", fleet.inventory, "--limit", "fleet")
    assert code == 2, report
    # The second audit is answered by the probe (control/remote/probe.py),
    # which says drift as the agent does.
    assert {h.get("via") for h in report["hosts"]} == {"probe"}
    differing = {h["host"]: [(c["key"]["family"], c["status"]) for c in h["changes"] if c["status"] != "ok"]
                 for h in report["hosts"]}
    assert differing == {hosts[0].name: [], hosts[1].name: [], hosts[2].name: [("nccl", "drift")]}
    [change] = [c for c in report["hosts"][2]["changes"] if c["status"] != "ok"]
    assert "host.nccl.adopt: true" in change["note"] and "the profile wants " in change["note"]
    assert change["before"] == f"<file not written by nictune: {len(image)} bytes>"
    assert run_in(hosts[1], ["cat", "/etc/nccl.conf"]).stdout.startswith("# tuned by hand\n")
