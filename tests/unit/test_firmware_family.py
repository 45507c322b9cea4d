"""The firmware family on the mstconfig path: the strict parser over
recorded real outputs (tests/recorded/mstconfig/), and plan/apply/verify/
rollback through the engine with a labelled stand-in for mstconfig
(tests/unit/fake_mstconfig.py) on PATH: query, set, pending-reset, "no
change", the no-reboot-loop rule, an absent tool, the resident agent.
The devlink path runs against netdevsim in tests/vm/guest/test_firmware.py."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from fakes import FakeHost, cx7_eswitch_state
from nictune.host import model as m
from nictune.host.knobs.firmware import FirmwareFamily
from nictune.host.machine import Host, Interface
from nictune.host.model import Key, Unsupported
from nictune.host.transaction.engine import Engine
from nictune.host.transports import mstconfig
from nictune.host.transports.netlink import devlink as dl
from nictune.host.validate import InvalidInput

RECORDED = Path(__file__).parent.parent / "recorded" / "mstconfig"
FAKE = Path(__file__).parent / "fake_mstconfig.py"
PCI = "0000:03:00.0"
HANDLE = "pci/" + PCI
BOOL = {"0": "False", "1": "True"}


# -- the parser over real outputs ------------------------------------------------------
def test_recorded_outputs_parse_to_their_columns():
    cx4 = mstconfig.parse_query((RECORDED / "cx4_pending.txt").read_text(),
                                ["MEMIC_SIZE_LIMIT", "KEEP_IB_LINK_UP_P2"])
    assert (cx4["MEMIC_SIZE_LIMIT"].current, cx4["MEMIC_SIZE_LIMIT"].next_boot) == (1, 0)
    assert (cx4["KEEP_IB_LINK_UP_P2"].default, cx4["KEEP_IB_LINK_UP_P2"].current) == (0, 1)
    cx6 = mstconfig.parse_query((RECORDED / "cx6lx_e_q.txt").read_text(),
                                ["CQE_COMPRESSION", "PCI_ATOMIC_MODE", "LRO_LOG_TIMEOUT0"])
    assert cx6["CQE_COMPRESSION"].next_boot == 0 and cx6["LRO_LOG_TIMEOUT0"].current == 6
    ib = mstconfig.parse_query((RECORDED / "sriov_ib_routing_pending.txt").read_text(),
                               ["SRIOV_IB_ROUTING_MODE_P1"])["SRIOV_IB_ROUTING_MODE_P1"]
    assert (ib.current, ib.next_boot) == (1, 0)  # stored, not running: a reset is due
    pr = mstconfig.parse_query((RECORDED / "cx6lx_pr358.txt").read_text(), ["ROCE_NEXT_PROTOCOL"])
    assert pr["ROCE_NEXT_PROTOCOL"].next_boot == 254


@pytest.mark.parametrize("text, why", [
    ("Configurations:      Next Boot\n  SRIOV_EN   True(1)\n", "no 'Configurations"),
    ("Configurations:   Default  Current  Next Boot\n  NUM_OF_VFS  8 8 8\n  NUM_OF_VFS  8 8 8\n",
     "printed twice"),
    ("Configurations:   Default  Current  Next Boot\n  NUM_OF_VFS  8 eight 8\n", "not a number"),
    ("Configurations:   Default  Current  Next Boot\n  NUM_OF_VFS  Array[0..7] 8 8\n",
     "not a number"),
    ("Configurations:   Default  Current  Next Boot\n", "no row for NUM_OF_VFS"),
    ("-E- Failed to open device\n", "no 'Configurations"),
])
def test_hostile_output_is_a_value_error_naming_what(text, why):
    with pytest.raises(ValueError, match=why):
        mstconfig.parse_query(text, ["NUM_OF_VFS"])


def test_mutated_real_outputs_never_raise_anything_but_value_error():
    rng = random.Random(25)
    sources = [p.read_text() for p in sorted(RECORDED.glob("*.txt"))]
    assert len(sources) == 4
    parsed = refused = 0
    for n in range(400):
        text = list(rng.choice(sources))
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(text))
            text[at:at + rng.randint(0, 4)] = rng.choice(["", "(", ")", "*", " ", "\n", "\x00",
                                                          "9" * 30, "é", "Next Boot"])
        try:
            mstconfig.parse_query("".join(text), ["MEMIC_SIZE_LIMIT"])
            parsed += 1
        except ValueError:
            refused += 1
    print(f"mstconfig fuzz: {parsed} parsed, {refused} refused")
    assert parsed + refused == 400 and refused > 0


def test_argv_lists_and_what_they_refuse():
    assert mstconfig.query_argv(PCI, ["SRIOV_EN"]) == ["mstconfig", "-e", "-d", PCI, "q", "SRIOV_EN"]
    assert mstconfig.set_argv(PCI, {"NUM_OF_VFS": 16}) == \
        ["mstconfig", "-y", "-d", PCI, "set", "NUM_OF_VFS=16"]
    for bad in (lambda: mstconfig.query_argv("03:00.0; reboot", ["X"]),
                lambda: mstconfig.query_argv(PCI, ["X Y"]),
                lambda: mstconfig.set_argv(PCI, {"NUM_OF_VFS": -1}),
                lambda: mstconfig.set_argv(PCI, {"SRIOV_EN": True})):
        with pytest.raises(ValueError):
            bad()


# -- devlink params: the message as iproute2 lays it out -------------------------------
def test_param_set_messages_round_trip_and_a_false_bool_carries_no_data():
    msg = dl.param_set_message("netdevsim/netdevsim7", "max_macs", "u32", "driverinit", 16)
    msg.encode()
    back = dl.devlinkmsg(msg.data)
    back.decode()
    assert back.get_attr("DEVLINK_ATTR_PARAM_NAME") == "max_macs"
    assert bytes(back.get_attr("DEVLINK_ATTR_PARAM_VALUE_DATA")) == (16).to_bytes(4, "little")
    assert back.get_attr("DEVLINK_ATTR_PARAM_VALUE_CMODE") == 1
    off = dl.param_set_message("netdevsim/netdevsim7", "test1", "bool", "driverinit", False)
    assert "DEVLINK_ATTR_PARAM_VALUE_DATA" not in [name for name, _ in off["attrs"]]
    with pytest.raises(InvalidInput):
        dl.param_set_message("pci/0000:03:00.0", "total_vfs", "u32", "permanent", 1 << 40)


# -- the family through the engine, with the stand-in --------------------------------
class _Host(Host):
    """A Host over a temp root with one mlx5 PF and no devlink (this
    machine's kernel has none): every key goes to mstconfig."""

    def interfaces(self):
        return [Interface("pf0", 2, "mlx5_core", None, "15b3:1021", PCI, "28.39.1002")]

    def devlink(self):
        raise OSError(2, "no devlink here")


def _sysfs(root: Path, pci: str) -> None:
    """pf0, an interface of the PCI function `pci`, in a sysfs tree at root."""
    dev = root / "sys/devices/pci0000:00" / pci
    dev.mkdir(parents=True)
    (root / "sys/bus/pci").mkdir(parents=True)
    os.symlink("../../../bus/pci", dev / "subsystem")
    (root / "sys/class/net/pf0").mkdir(parents=True)
    os.symlink(f"../../../devices/pci0000:00/{pci}", root / "sys/class/net/pf0/device")


@pytest.fixture
def nic(tmp_path, monkeypatch):
    root = tmp_path / "root"
    _sysfs(root, PCI)
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("boot-one\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(FAKE, bindir / "mstconfig")
    state = tmp_path / "mstconfig.json"
    rows = {"SRIOV_EN": _row(0, BOOL), "NUM_OF_VFS": _row(0), "LINK_TYPE_P1":
            _row(2, {"1": "IB", "2": "ETH", "3": "VPI"}), "ROCE_CC_PRIO_MASK_P1": _row(255),
            "CNP_DSCP_P1": _row(48), "CNP_802P_PRIO_P1": _row(6), "ATS_ENABLED": _row(0, BOOL),
            "PCI_WR_ORDERING": _row(0, {"0": "per_mkey", "1": "force_relax"}),
            "MAX_ACC_OUT_READ": _row(0), "CQE_COMPRESSION": _row(0, {"0": "BALANCED",
                                                                     "1": "AGGRESSIVE"})}
    state.write_text(json.dumps({"device": PCI, "rows": rows}))
    monkeypatch.setenv("NICTUNE_FAKE_MSTCONFIG", str(state))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return _Nic(root, state, tmp_path / "state")


def _row(value, words=None):
    return {"default": value, "current": value, "next": value, **({"words": words} if words else {})}


class _Nic:
    def __init__(self, root, state, state_dir):
        self.root, self.state, self.state_dir = root, state, state_dir

    def engine(self):
        return Engine(_Host(str(self.root)), str(self.state_dir))

    def tool(self) -> dict:
        return json.loads(self.state.read_text())

    def reboot(self, runs: bool) -> None:
        """A new boot; with `runs`, the firmware runs what was stored."""
        (self.root / "proc/sys/kernel/random/boot_id").write_text("boot-two\n")
        if runs:
            state = self.tool()
            for row in state["rows"].values():
                row["current"] = row["next"]
            self.state.write_text(json.dumps(state))


PROFILE = {"nictune": 1, "interfaces": {"uplinks": {
    "match": {"driver": "mlx5_core"},
    "firmware": {"sriov_enabled": True, "total_vfs": 16, "link_type": "eth",
                 "roce_cc_prio_mask": 8, "ats": True}}}}
SOURCES = {f"interfaces/uplinks/firmware/{k}": f"cx7.yaml:{n}" for n, k in enumerate(
    PROFILE["interfaces"]["uplinks"]["firmware"], 5)}


def _by_name(out) -> dict:
    return {c.key.name: c for c in out.changes}


def test_plan_shows_running_stored_and_wanted_and_the_reset_each_needs(nic):
    out = _by_name(nic.engine().plan(PROFILE, SOURCES))
    vfs = out["total_vfs"]
    assert (vfs.status, vfs.before, vfs.after) == (m.PENDING, 0, 16)
    assert "running now: 0" in vfs.note and "mstconfig NUM_OF_VFS" in vfs.note
    assert "a reboot" in vfs.note
    assert out["link_type"].status == m.OK and out["link_type"].before == "eth"
    assert "fw_activate" in out["roce_cc_prio_mask"].note
    assert vfs.key == Key("firmware", HANDLE, "total_vfs") and vfs.source == "cx7.yaml:6"


def test_apply_stores_once_then_waits_for_the_reset_without_writing_again(nic):
    out = nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    assert out.error is None, out.error
    assert {c.key.name: c.status for c in out.changes}["total_vfs"] == m.APPLIED
    (written,) = nic.tool()["log"]  # one set, of the keys that differ, link_type not among them
    assert sorted(written) == ["ATS_ENABLED=1", "NUM_OF_VFS=16", "ROCE_CC_PRIO_MASK_P1=8",
                               "SRIOV_EN=1"]
    again = nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    staged = _by_name(again)["total_vfs"]
    assert staged.status == m.STAGED and "a reboot" in staged.note
    assert len(nic.tool()["log"]) == 1  # the no-change rule: nothing written twice
    verify = nic.engine().plan(PROFILE, SOURCES, "verify")
    assert _by_name(verify)["total_vfs"].status == m.STAGED
    asked = json.loads((nic.state_dir / "resets.json").read_text())
    assert asked[str(staged.key)]["boot_id"] == "boot-one"


def test_a_reboot_that_runs_the_values_makes_them_ok_and_forgets_the_ask(nic):
    nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    nic.reboot(runs=True)
    out = nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    assert out.error is None and {c.status for c in out.changes} == {m.OK}
    assert not (nic.state_dir / "resets.json").exists()


def test_a_reboot_that_does_not_run_them_fails_and_asks_for_nothing_more(nic):
    nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    nic.reboot(runs=False)
    out = nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    vfs = _by_name(out)["total_vfs"]
    assert vfs.status == m.FAILED and "does not ask for another reset" in vfs.note
    assert out.error and "still do not run after the host rebooted" in out.error["message"]
    assert len(nic.tool()["log"]) == 1
    assert _by_name(nic.engine().plan(PROFILE, SOURCES, "verify"))["total_vfs"].status == m.FAILED


def test_rollback_restores_the_stored_value(nic):
    nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    out = nic.engine().rollback()
    assert out.error is None, out.error
    rows = nic.tool()["rows"]
    assert (rows["NUM_OF_VFS"]["next"], rows["SRIOV_EN"]["next"]) == (0, 0)


def test_the_resident_agent_never_writes_firmware_config(nic):
    engine = nic.engine()
    engine.apply({"nictune": 1}, {}, "empty.yaml")
    desired = engine.journal.load_desired()
    out = nic.engine().apply(PROFILE, SOURCES, "cx7.yaml", remember=False, keeping=desired)
    assert {c.key.name: c.status for c in out.changes}["total_vfs"] == m.DRIFT
    assert "log" not in nic.tool()


def test_the_resident_agent_runs_mstconfig_at_start_and_at_its_slow_poll_only(nic, monkeypatch):
    from nictune.host.resident import daemon

    queries = []
    real = mstconfig.query
    monkeypatch.setattr(mstconfig, "query", lambda *a: queries.append(a) or real(*a))
    assert nic.engine().apply(PROFILE, SOURCES, "cx7.yaml").error is None
    nic.reboot(runs=True)
    queries.clear()
    agent = daemon.Resident(str(nic.state_dir), log=lambda line: None, listen=False)
    agent.host = _Host(str(nic.root))
    monkeypatch.setattr(agent, "first_start_since_boot", lambda: False)
    assert agent.refresh_desired()
    agent.take_up("start", at_start=True)
    assert len(queries) == 1
    key = str(Key("firmware", HANDLE, "total_vfs"))
    assert agent.status["keys"][key]["drifted"] is False
    # Someone stores another value with the tool: reported by the slow poll only.
    state = nic.tool()
    state["rows"]["NUM_OF_VFS"]["next"] = 4
    nic.state.write_text(json.dumps(state))
    agent.cycle([], due=True)   # the --interval poll
    agent.verify("link event")  # what a netlink event asks for
    assert len(queries) == 1 and not agent.status["keys"][key]["drifted"]
    agent.slow_at = 0.0  # SLOW_POLL seconds later
    agent.cycle([], due=True)
    assert len(queries) == 2
    assert agent.status["keys"][key]["drifted"] and agent.status["keys"][key]["drifts"] == 1
    # Until the next slow poll, the verifies that leave it out do not call the host as wanted.
    ok = agent.status["last_verify_ok"]
    agent.cycle([], due=True)
    assert len(queries) == 2 and agent.status["last_verify_ok"] == ok
    assert len(nic.tool()["log"]) == 1  # the user's apply's set: the agent never writes it


def test_without_mstconfig_each_key_is_unsupported_saying_so(nic, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    fam = FirmwareFamily(_Host(str(nic.root)))
    keys = [d.key for d in fam.expand("pf0", {"firmware": {"link_type": "eth"}}, lambda *a: "")]
    (value,) = fam.read(keys).values()
    assert isinstance(value, Unsupported) and "mstconfig is not installed" in value.reason
    assert "LINK_TYPE_P1" in value.reason


def test_the_tool_refusing_is_unsupported_not_a_traceback(nic):
    state = nic.tool()
    state["device"] = "0000:99:00.0"
    nic.state.write_text(json.dumps(state))
    out = nic.engine().plan(PROFILE, SOURCES)
    assert {c.status for c in out.changes} == {m.UNSUPPORTED}
    assert "exited 3: -E- Failed to open the device" in out.changes[0].note


def test_a_bound_is_refused_naming_the_file_and_line(nic):
    doc = {"nictune": 1, "interfaces": {"uplinks": {"match": {"driver": "mlx5_core"},
                                                    "firmware": {"total_vfs": {"min": 8}}}}}
    with pytest.raises(InvalidInput, match=r"cx7.yaml:9: firmware.total_vfs takes one exact"):
        nic.engine().plan(doc, {"interfaces/uplinks/firmware/total_vfs": "cx7.yaml:9"})


def test_apply_exits_0_over_keys_waiting_for_their_reset_and_verify_2():
    from nictune.host.agent import verdict

    assert verdict("apply", [m.STAGED, m.OK], None)["exit_code"] == 0
    assert verdict("verify", [m.STAGED, m.OK], None)["exit_code"] == 2
    assert verdict("plan", [m.STAGED], None)["exit_code"] == 2


def test_a_flashed_firmware_waiting_for_a_reset_joins_the_pending_note(nic, monkeypatch):
    class _Info:
        running, stored = {"fw.version": "28.39.1002"}, {"fw.version": "28.41.1000"}

        def pending_firmware(self):
            return ["fw.version"]

    class _Devlink:
        def params(self, handle):
            raise OSError(95, "no params")

        def info(self, handle):
            return _Info()

    nic.engine().apply(PROFILE, SOURCES, "cx7.yaml")
    monkeypatch.setattr(_Host, "devlink", lambda self: _Devlink())
    staged = _by_name(nic.engine().plan(PROFILE, SOURCES, "verify"))["total_vfs"]
    assert staged.status == m.STAGED
    assert "fw.version 28.39.1002 -> 28.41.1000" in staged.note and "firmware_pending_reset" in staged.note


def test_show_gives_the_stored_values_as_profile_and_running_beside_them(tmp_path):
    host = FakeHost(cx7_eswitch_state(), tmp_path / "root")
    host._fake_devlink.set_param("pci/0000:17:00.0", "total_vfs", "u32", "permanent", 16)
    out = Engine(host, str(tmp_path / "state")).show()
    entries = out.extra["profile"]["interfaces"]
    (uplink,) = [e for e in entries.values() if e.get("firmware", {}).get("total_vfs") == 16]
    assert uplink["firmware"] == {"sriov_enabled": True, "total_vfs": 16,
                                  "cqe_compress_type": "balanced"}
    facts = out.facts[uplink["match"]["name"]]["firmware_config"]
    assert facts["total_vfs"] == {"running": 8, "stored": 16}


def test_a_devlink_param_value_of_the_wrong_type_is_refused_at_plan(tmp_path):
    host = FakeHost(cx7_eswitch_state(), tmp_path / "root")
    fam = FirmwareFamily(host)
    (iface,) = [i for i in host.interfaces() if i.name == "enp23s0f0np0"]
    (d,) = fam.expand(iface.name, {"firmware": {"params": {"total_vfs": True}}}, lambda *a: "")
    assert fam.read([d.key])[d.key] == 8
    assert "is a u32; True is not one" in fam.check(d.key, d.want)


def test_param_replies_that_do_not_decode_are_value_errors():
    msg = dl.devlinkmsg()
    msg["cmd"] = dl.DEVLINK_CMD_PARAM_GET
    msg["version"] = 0
    msg["attrs"] = [("DEVLINK_ATTR_BUS_NAME", "pci"), ("DEVLINK_ATTR_DEV_NAME", PCI)]
    msg.encode()
    back = dl.devlinkmsg(msg.data)
    back.decode()
    with pytest.raises(ValueError, match="without DEVLINK_ATTR_PARAM"):
        dl.decode_param(back)
    with pytest.raises(ValueError, match="type u32: 2 bytes"):
        dl._param_value("u32", b"\x01\x02")
    assert dl._param_value("bool", None) is False and dl._param_value("string", b"balanced\0") == "balanced"


def test_the_real_mstconfig_refuses_a_missing_device_as_the_stand_in_does(tmp_path, monkeypatch):
    """mstflint's own mstconfig (scripts/setup installs it), on a PCI
    address no machine has (domain ffff, bus ff): our argv is taken, the
    device refused, on stdout with status 3, and each key says so."""
    real = shutil.which("mstconfig", path="/usr/bin:/usr/sbin:/bin:/sbin")
    assert real, "scripts/setup installs mstflint"
    monkeypatch.setenv("PATH", os.path.dirname(real))
    _sysfs(tmp_path, "ffff:ff:1f.7")
    fam = FirmwareFamily(_Host(str(tmp_path)))
    keys = [d.key for d in fam.expand("pf0", {"firmware": {"total_vfs": 8, "ats": True}},
                                      lambda *a: "")]
    values = fam.read(keys)
    assert len(values) == 2
    for value in values.values():
        assert isinstance(value, Unsupported)
        assert "exited 3: -E- Failed to open the device" in value.reason, value.reason


def test_a_tool_that_hangs_is_an_os_error_not_a_traceback(tmp_path):
    from nictune.host.transports.io import LiveIO

    with pytest.raises(OSError, match="did not finish in 0.2 s"):
        LiveIO().run(["sleep", "5"], 0.2)
