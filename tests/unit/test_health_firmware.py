"""The health fact "a firmware update waits for a reset": devlink `dev info`
of the devlink device that has a port for the interface, stored (flashed)
versions against running ones, and `expect: {firmware_pending_reset: ...}`.

The dev info replies are CONSTRUCTED from the uapi by
tests/recorded/tools/devlink_record.py (not by nictune; the host kernel has
no devlink, and tests/recorded/test_devlink.py checks that `devlink -j dev
info` reads such a reply as nictune does); the devlink socket is a
stand-in that hands them to nictune's real decoder.  netdevsim's real
answer is read in tests/vm/guest/test_asap2.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fakes import FixtureHost

from nictune.host.facts.health import Health
from nictune.host.knobs.expect import ExpectFamily
from nictune.host.machine import Interface
from nictune.host.model import Key, Unsupported, Want
from nictune.host.transports.netlink import devlink as dl
from nictune.host.transports.netlink.errors import NetlinkError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recorded" / "tools"))
import devlink_record as rec  # noqa: E402

HANDLE = "pci/0000:03:00.0"
P0 = Interface("enp3s0f0np0", 3, "mlx5_core", None, "15b3:1021", "0000:03:00.0", "28.39.1002 (MT_0000000834)")
REP = Interface("pf0vf0", 7, "mlx5_core", None, None, None, None)
VETH = Interface("veth0", 9, "veth", None, None, None, None)


class StandInDevlink:
    """ports() and info() of netlink/devlink.py's Devlink, answering with
    constructed replies run through the real decoder."""

    def __init__(self, running: dict, stored: dict, info_errno: int = 0):
        self.reply = rec.info_reply(HANDLE, "mlx5_core", "MT2232X00001",
                                    {"fw.psid": "MT_0000000834"}, running, stored)
        self.info_errno = info_errno
        self.asked: list = []

    def ports(self):
        return [dl.Port(HANDLE, 0, "physical", P0.name, 0, 0, None),
                dl.Port(HANDLE, 1, "pcivf", REP.name, None, 0, 0),
                dl.Port(HANDLE, 2, "pcivf", None, None, 0, 1)]

    def info(self, handle):
        self.asked.append(handle)
        if self.info_errno:
            raise NetlinkError(self.info_errno)
        msg = dl.devlinkmsg(self.reply)
        msg.decode()
        return dl.decode_info(msg)


FLASHED = ({"fw.version": "28.39.1002", "fw": "28.39.1002"},
           {"fw.version": "28.41.1000", "fw": "28.41.1000"})


def test_a_flashed_firmware_waiting_for_a_reset_is_a_fact_of_each_port(tmp_path):
    devlink = StandInDevlink(*FLASHED)
    health = Health(FixtureHost(str(tmp_path), [P0, REP, VETH]), devlink=devlink)
    facts = health.of(P0)
    assert facts["firmware_pending_reset"] is True
    assert facts["firmware_pending"] == {
        "fw": {"running": "28.39.1002", "stored": "28.41.1000"},
        "fw.version": {"running": "28.39.1002", "stored": "28.41.1000"}}
    assert health.of(REP)["firmware_pending_reset"] is True  # same devlink device
    assert "firmware_pending_reset" not in health.of(VETH)  # no devlink port
    assert devlink.asked == [HANDLE]  # one INFO_GET per device and command


def test_same_versions_read_false_and_no_info_leaves_the_fact_out(tmp_path):
    same = {"fw.version": "28.39.1002"}
    facts = Health(FixtureHost(str(tmp_path), [P0]), devlink=StandInDevlink(same, same)).of(P0)
    assert facts["firmware_pending_reset"] is False and "firmware_pending" not in facts
    # Running only (no stored version, as some drivers answer): nothing pending.
    only = Health(FixtureHost(str(tmp_path), [P0]), devlink=StandInDevlink(same, {})).of(P0)
    assert only["firmware_pending_reset"] is False
    # A driver without info_get (EOPNOTSUPP): no fact, no error.
    none = Health(FixtureHost(str(tmp_path), [P0]), devlink=StandInDevlink(same, same, 95)).of(P0)
    assert "firmware_pending_reset" not in none
    # A fixture root never asks the running kernel's devlink.
    assert "firmware_pending_reset" not in Health(FixtureHost(str(tmp_path), [P0])).of(P0)


@pytest.mark.parametrize("versions,met", [(FLASHED, False), (({"fw": "1"}, {"fw": "1"}), True)])
def test_expect_firmware_pending_reset_false(tmp_path, versions, met):
    fam = ExpectFamily(FixtureHost(str(tmp_path), [P0]))
    fam.health = Health(fam.host, devlink=StandInDevlink(*versions))
    (desired,) = fam.expand(P0.name, {"expect": {"firmware_pending_reset": False}}, lambda *a: "p:1")
    assert desired.key == Key("expect", P0.name, "firmware_pending_reset")
    (current,) = fam.read([desired.key]).values()
    assert current is (not met)
    assert fam.met(desired.key, Want(False), current) is met
    note = fam.note(desired.key)
    if met:
        assert note == "expected; nictune reads it, never sets it"
    else:
        assert note == ("expected; flashed, waiting for a reset: fw running 28.39.1002, stored "
                        "28.41.1000, fw.version running 28.39.1002, stored 28.41.1000")


def test_expect_firmware_pending_reset_without_dev_info_is_unsupported(tmp_path):
    fam = ExpectFamily(FixtureHost(str(tmp_path), [VETH]))
    fam.health = Health(fam.host, devlink=StandInDevlink({"fw": "1"}, {"fw": "1"}))
    (desired,) = fam.expand(VETH.name, {"expect": {"firmware_pending_reset": False}}, lambda *a: "p:1")
    (current,) = fam.read([desired.key]).values()
    assert isinstance(current, Unsupported)
    assert "running kernel only" in current.reason  # a fixture root
    live = ExpectFamily(FixtureHost("/", [VETH]))
    live.health = Health(live.host, devlink=StandInDevlink({"fw": "1"}, {"fw": "1"}),
                         stats=lambda ifname: {})
    (current,) = live.read([desired.key]).values()
    assert current == Unsupported("no devlink device with a port for veth0 answers dev info")
