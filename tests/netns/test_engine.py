"""plan / apply / verify / rollback against the real kernel, in namespaces.

Every effect is read back with independent tools (`ip -j`, `ethtool`,
`sysctl`), and every rollback is checked against a full snapshot of the
namespace taken before the first write.
"""

from __future__ import annotations

import fcntl
import json
import textwrap

import pytest
from netns_helpers import nictune
from typer.testing import CliRunner

from nictune.cli.app import app

pytestmark = pytest.mark.netns


@pytest.fixture
def lab(veth_pair, tmp_path):
    """A veth pair plus a state directory and NCCL path of the test's own."""
    veth_pair.state = tmp_path / "state"
    veth_pair.nccl = tmp_path / "nccl.conf"
    veth_pair.dir = tmp_path
    return veth_pair


def write_profile(lab, body: str, name: str = "p.yaml") -> str:
    path = lab.dir / name
    path.write_text(body.replace("@NCCL@", str(lab.nccl)).replace("@DIR@", str(lab.dir)))
    return str(path)


FULL = textwrap.dedent("""\
    nictune: 1
    host:
      sysctl:
        net.ipv4.tcp_ecn: 1
        net.ipv4.tcp_rmem: [4096, 131072, 6291456]
      nccl:
        path: @NCCL@
        allowed_dirs: ["@DIR@"]
        env:
          NCCL_IB_TC: 106
          NCCL_SOCKET_IFNAME: "=ntv0"
    interfaces:
      rail:
        match: {name: ntv0, driver: veth}
        mtu: 9000
        txqueuelen: 5000
        channels: {rx: 2, tx: 2}
        features: {gro: on, rx-udp-gro-forwarding: on, tso: off}
        sysctl: {ipv4.arp_ignore: 1, ipv4.rp_filter: 2}
""")


def snapshot(lab) -> dict:
    """Everything a profile here could touch, read with the system's tools."""
    links = json.loads(lab.run(lab.ns_a, ["ip", "-j", "-d", "link", "show"]).stdout)
    for link in links:
        link.pop("operstate", None)  # follows carrier asynchronously
    return {
        "links": links,
        "features": lab.run(lab.ns_a, ["ethtool", "-k", "ntv0"]).stdout,
        "channels": lab.run(lab.ns_a, ["ethtool", "-l", "ntv0"]).stdout,
        "sysctl": lab.run(lab.ns_a, ["sysctl", "-a", "-r", r"^net\.(ipv4|ipv6|core)\."]).stdout,
        "nccl": lab.nccl.read_text() if lab.nccl.exists() else None,
    }


def link(lab, name="ntv0") -> dict:
    return json.loads(lab.run(lab.ns_a, ["ip", "-j", "-d", "link", "show", name]).stdout)[0]


def sysctl(lab, key: str) -> str:
    return lab.run(lab.ns_a, ["sysctl", "-n", key]).stdout.strip()


def ethtool_k(lab) -> dict:
    out = {}
    for line in lab.run(lab.ns_a, ["ethtool", "-k", "ntv0"]).stdout.splitlines()[1:]:
        name, _, rest = line.strip().partition(": ")
        out[name] = rest.split()[0] == "on"
    return out


def statuses(report) -> dict:
    return {(c["key"]["family"], c["key"]["name"]): c["status"] for c in report["hosts"][0]["changes"]}


def test_plan_shows_diff_and_changes_nothing(lab):
    before = snapshot(lab)
    code, report = nictune(lab, "plan", write_profile(lab, FULL))
    assert code == 2
    host = report["hosts"][0]
    assert report["nictune_report"] == 1 and host["exit_code"] == 2
    changes = {(c["key"]["family"], c["key"]["name"]): c for c in host["changes"]}
    assert changes[("link", "mtu")]["before"] == 1500
    assert changes[("link", "mtu")]["after"] == 9000
    assert changes[("link", "mtu")]["source"].endswith("p.yaml:15")
    assert changes[("features", "rx-gro")]["status"] == "pending"
    assert snapshot(lab) == before


def test_apply_reads_back_and_is_idempotent(lab):
    profile = write_profile(lab, FULL)
    code, report = nictune(lab, "apply", profile)
    assert code == 0, report
    assert report["hosts"][0]["summary"].get("applied", 0) >= 10
    # Read back with independent tools.
    dev = link(lab)
    assert (dev["mtu"], dev["txqlen"]) == (9000, 5000)
    feats = ethtool_k(lab)
    assert feats["generic-receive-offload"] and feats["rx-udp-gro-forwarding"]
    assert not feats["tx-tcp-segmentation"]
    assert "RX:\t\t2" in lab.run(lab.ns_a, ["ethtool", "-l", "ntv0"]).stdout.split("Current")[1]
    assert sysctl(lab, "net.ipv4.tcp_ecn") == "1"
    assert sysctl(lab, "net.ipv4.tcp_rmem").split() == ["4096", "131072", "6291456"]
    assert sysctl(lab, "net.ipv4.conf.ntv0.arp_ignore") == "1"
    assert lab.nccl.read_text().splitlines()[1:] == ["NCCL_IB_TC=106", "NCCL_SOCKET_IFNAME==ntv0"]
    # The namespace next door is untouched.
    assert lab.run(lab.ns_b, ["sysctl", "-n", "net.ipv4.tcp_ecn"]).stdout.strip() != "1"

    after_first = snapshot(lab)
    code, report = nictune(lab, "apply", profile)
    assert code == 0
    assert set(statuses(report).values()) == {"ok"}
    assert snapshot(lab) == after_first

    code, report = nictune(lab, "verify", profile)
    assert code == 0 and set(statuses(report).values()) == {"ok"}


def test_verify_reports_drift_with_expected_and_actual(lab):
    profile = write_profile(lab, FULL)
    assert nictune(lab, "apply", profile)[0] == 0
    lab.run(lab.ns_a, ["ip", "link", "set", "ntv0", "mtu", "1400"])
    lab.run(lab.ns_a, ["sysctl", "-w", "net.ipv4.tcp_ecn=0"])
    code, report = nictune(lab, "verify", profile)
    assert code == 2
    drift = {(c["key"]["family"], c["key"]["name"]): (c["before"], c["after"])
             for c in report["hosts"][0]["changes"] if c["status"] == "drift"}
    assert drift == {("link", "mtu"): (1400, 9000), ("sysctl", "net.ipv4.tcp_ecn"): (0, 1)}


def test_rollback_restores_the_snapshot(lab):
    before = snapshot(lab)
    assert nictune(lab, "apply", write_profile(lab, FULL))[0] == 0
    assert snapshot(lab) != before
    code, report = nictune(lab, "rollback")
    assert code == 0, report
    assert set(statuses(report).values()) == {"reverted"}
    assert snapshot(lab) == before
    # A second rollback has nothing left to do and says so.
    code, report = nictune(lab, "rollback")
    assert code == 0 and report["hosts"][0]["warnings"]


def test_failure_mid_plan_rolls_everything_back(lab):
    # A macvlan advertises max_mtu 65535, but the kernel refuses an MTU
    # above its lower device's: the pre-check passes, the write fails, after
    # the sysctls, the NCCL file, features and channels were applied.
    assert lab.run(lab.ns_a, ["ip", "link", "add", "link", "ntv0", "name", "ntmv0",
                              "type", "macvlan"]).returncode == 0
    before = snapshot(lab)
    profile = write_profile(lab, FULL.replace("mtu: 9000", "mtu: 1500") + textwrap.indent(
        "upper:\n  match: {name: ntmv0}\n  mtu: 9000\n", "  "))
    code, report = nictune(lab, "apply", profile)
    assert code == 3, report
    host = report["hosts"][0]
    assert host["error"]["kind"] == "rolled-back"
    failed = [c for c in host["changes"] if c["status"] == "failed"]
    assert [(c["key"]["target"], c["key"]["name"]) for c in failed] == [("ntmv0", "mtu")]
    assert "Invalid argument" in failed[0]["note"]
    st = statuses(report)
    assert st[("sysctl", "net.ipv4.tcp_ecn")] == st[("features", "rx-gro")] == "reverted"
    assert snapshot(lab) == before
    assert json.loads((lab.state / "netns" / lab.ns_a / "journal.json").read_text())["status"] == "rolled-back"


def test_stacked_mtu_goes_through_whatever_the_entry_order(lab):
    # The upper device comes first in the profile: its MTU is refused until
    # the lower device's has been raised, and nictune retries it.
    assert lab.run(lab.ns_a, ["ip", "link", "add", "link", "ntv0", "name", "ntmv0",
                              "type", "macvlan"]).returncode == 0
    body = FULL.replace("interfaces:\n", "interfaces:\n  upper:\n    match: {name: ntmv0}\n"
                                          "    mtu: 9000\n")
    code, report = nictune(lab, "apply", write_profile(lab, body))
    assert code == 0, report
    assert link(lab, "ntmv0")["mtu"] == link(lab)["mtu"] == 9000
    code, report = nictune(lab, "rollback")
    assert code == 0 and link(lab, "ntmv0")["mtu"] == link(lab)["mtu"] == 1500


def test_an_interrupted_apply_must_be_rolled_back_first(lab):
    before = snapshot(lab)
    journal_dir = lab.state / "netns" / lab.ns_a
    journal_dir.mkdir(parents=True)
    # What a crash after the first write leaves: the journal, still "applying".
    lab.run(lab.ns_a, ["sysctl", "-w", "net.ipv4.tcp_ecn=1"])
    (journal_dir / "journal.json").write_text(json.dumps({
        "journal": 1, "id": "crashed", "status": "applying", "profile": "p.yaml",
        "changes": [{"key": {"family": "sysctl", "target": "host", "name": "net.ipv4.tcp_ecn"},
                     "before": int(before_ecn(before)), "after": 1},
                    {"key": {"family": "link", "target": "ntv0", "name": "mtu"},
                     "before": 1500, "after": 9000}]}))
    code, report = nictune(lab, "apply", write_profile(lab, FULL))
    assert code == 1 and report["hosts"][0]["error"]["kind"] == "interrupted"
    code, report = nictune(lab, "rollback")
    assert code == 0, report
    assert snapshot(lab) == before
    assert nictune(lab, "apply", write_profile(lab, FULL))[0] == 0


def before_ecn(snap: dict) -> str:
    line = next(x for x in snap["sysctl"].splitlines() if x.startswith("net.ipv4.tcp_ecn ="))
    return line.split("=")[1].strip()


def test_kernel_refusing_a_sysctl_rolls_back(lab):
    before = snapshot(lab)
    profile = write_profile(lab, FULL.replace("net.ipv4.tcp_rmem: [4096, 131072, 6291456]",
                                              "net.ipv4.tcp_ecn_fallback: 9"))
    code, report = nictune(lab, "apply", profile)
    assert code == 3, report
    assert snapshot(lab) == before


def test_unsupported_keys_stop_everything_unless_told(lab):
    body = FULL + "    rings: {rx: 512}\n"
    before = snapshot(lab)
    code, report = nictune(lab, "apply", write_profile(lab, body))
    assert code == 1
    host = report["hosts"][0]
    assert host["error"]["kind"] == "unsupported"
    assert "rings" in host["error"]["message"] and "p.yaml:" in host["error"]["message"]
    assert snapshot(lab) == before

    code, report = nictune(lab, "apply", write_profile(lab, "on_unsupported: warn\n" + body))
    assert code == 0, report
    assert statuses(report)[("rings", "rx")] == "skipped"
    assert any("rings" in w for w in report["hosts"][0]["warnings"])
    assert link(lab)["mtu"] == 9000


def test_global_sysctl_is_read_only_in_a_namespace(lab):
    profile = write_profile(lab, "nictune: 1\nhost:\n  sysctl: {net.core.rmem_max: 1048576}\n")
    code, report = nictune(lab, "plan", profile)
    assert code == 1
    change = report["hosts"][0]["changes"][0]
    assert change["status"] == "unsupported" and "global" in change["note"]


def test_unknown_key_is_a_profile_error(lab):
    before = snapshot(lab)
    profile = write_profile(lab, FULL.replace("features:", "chanels: {rx: 1}\n    features:"))
    code, report = nictune(lab, "apply", profile)
    assert code == 1 and report["error"]["kind"] == "profile"
    message = report["error"]["message"]
    assert "chanels" in message and "channels" in message and "p.yaml:18" in message
    assert snapshot(lab) == before


def test_channels_above_maximum_are_unsupported(lab):
    before = snapshot(lab)
    code, report = nictune(lab, "apply", write_profile(lab, FULL.replace("rx: 2, tx: 2", "rx: 64")))
    assert code == 1
    change = [c for c in report["hosts"][0]["changes"] if c["key"]["family"] == "channels"][0]
    assert change["status"] == "unsupported" and "maximum 2" in change["note"]
    assert snapshot(lab) == before


def test_one_apply_at_a_time(lab):
    lab.state.mkdir(parents=True, exist_ok=True)
    lock_dir = lab.state / "netns" / lab.ns_a
    lock_dir.mkdir(parents=True)
    with open(lock_dir / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, report = nictune(lab, "apply", write_profile(lab, FULL))
    assert code == 1 and report["hosts"][0]["error"]["kind"] == "locked"
    assert link(lab)["mtu"] == 1500


def test_show_prints_a_valid_profile(lab, tmp_path):
    result = CliRunner().invoke(app, ["show", "--netns", lab.ns_a, "--state-dir", str(lab.state)])
    assert result.exit_code == 0, result.output
    shown = tmp_path / "shown.yaml"
    shown.write_text(result.stdout)
    assert CliRunner().invoke(app, ["validate", str(shown)]).exit_code == 0
    assert "ntv0" in result.stdout and "mtu: 1500" in result.stdout
    # Applying what show printed changes nothing.
    code, report = nictune(lab, "plan", str(shown))
    assert code == 0, report


@pytest.mark.parametrize("bad", [
    "interfaces:\n  x:\n    match: {name: ntv0}\n    mtu: [9000\n",  # malformed YAML
    "interfaces:\n  x:\n    match: {name: ntv0}\n    mtu: 70000\n",  # schema
    "interfaces:\n  x:\n    match: {name: 'ntv0; reboot'}\n    mtu: 9000\n",
    "host:\n  nccl: {path: ../../etc/passwd}\n",
    "host:\n  sysctl: {net.ipv4.tcp_ecn: \"1\\nnet.core.rmem_max=1\"}\n",
    "host:\n  sysctl: {'net.ipv4.conf.all/../../x': 1}\n",
    "host:\n  nccl: {env: {NCCL_DEBUG: '" + "x" * 10_000_000 + "'}}\n",
])
def test_hostile_input_is_refused_and_nothing_applied(lab, bad):
    before = snapshot(lab)
    code, report = nictune(lab, "apply", write_profile(lab, "nictune: 1\n" + bad))
    assert code == 1
    message = report["error"]["message"]
    assert "p.yaml:" in message and "\n" not in message and len(message) < 600
    assert snapshot(lab) == before
