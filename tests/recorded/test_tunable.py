"""Recorded exchanges: nictune's ethtool tunable ioctls against ethtool's.

`roce.pfc_prevention_timeout` is the ETHTOOL_PFC_PREVENTION_TOUT tunable,
which exists only as SIOCETHTOOL ioctls.  tests/recorded/ethtool/*.json hold
the struct ethtool_tunable bytes ethtool 6.1 handed the kernel for
--set-tunable / --get-tunable (recorded under tools/ioctlshim.c, see
tools/tunable_recorder.py); nictune must hand over the same bytes.  No
device here has tunables (mlx5 is not here), so the shim answers; the real
kernel is asked only about a veth, which has no get_tunable.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nictune.host.transports.netlink import ethtool_ioctl as ei
from nictune.host.transports.netlink.errors import NetlinkError
from nsenter import in_netns
from recorded.tools import tunable_recorder as rec

CASE_FILES = sorted(rec.RECORDINGS.glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _ours(spec: dict) -> bytes:
    if spec["method"] == "get":
        return ei.tunable_request(ei.ETHTOOL_GTUNABLE, ei.ETHTOOL_PFC_PREVENTION_TOUT)
    return ei.tunable_request(ei.ETHTOOL_STUNABLE, ei.ETHTOOL_PFC_PREVENTION_TOUT, spec["value"])


def test_every_case_is_recorded():
    assert {p.stem for p in CASE_FILES} == {c["case"] for c in rec.CASES}


@pytest.mark.recorded
@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_encoder_matches_ethtool_recording(path):
    case = _load(path)
    assert [[rec.IFNAME, _ours(case["nictune"]).hex()]] == case["sent"]


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    why = rec.missing_tools()
    if why:
        pytest.skip(why)
    return rec.build_shim(tmp_path_factory.mktemp("ioctlshim"))


def _run_nictune(shim: Path, tmp_path: Path, calls: list, value=None, fail=None) -> tuple:
    log = tmp_path / "nictune.hex"
    log.unlink(missing_ok=True)
    env = rec.shim_env(shim, log, value, fail)
    env["PYTHONPATH"] = os.pathsep.join([str(rec.HERE), *sys.path])
    r = subprocess.run([sys.executable, str(rec.HERE / "tunable_under_shim.py")],
                       input=json.dumps({"ifname": rec.IFNAME, "calls": calls}), env=env,
                       capture_output=True, text=True, check=False, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), rec.read_log(log)


@pytest.mark.recorded
def test_tunables_hand_the_kernel_the_recorded_bytes(shim, tmp_path):
    """Tunables over its real socket and fcntl.ioctl: the shim logs what
    leaves the process and answers the GET as the kernel copies it out."""
    cases = [_load(p) for p in CASE_FILES]
    results, sent = _run_nictune(shim, tmp_path, [c["nictune"] for c in cases], value=100)
    assert sent == [c["sent"][0] for c in cases]
    assert results == [{"value": 100} if c["nictune"]["method"] == "get" else {"ok": True} for c in cases]


@pytest.mark.recorded
def test_a_refused_tunable_is_the_ioctls_errno(shim, tmp_path):
    results, _ = _run_nictune(shim, tmp_path, [{"method": "set", "value": 9000}, {"method": "get"}],
                              fail=errno.EINVAL)
    assert results == [{"errno": errno.EINVAL}, {"errno": errno.EINVAL}]


@pytest.mark.recorded
@pytest.mark.parametrize("case", rec.CASES, ids=[c["case"] for c in rec.CASES])
def test_installed_ethtool_still_sends_what_nictune_sends(case, shim, tmp_path):
    fresh = rec.record_case(case, shim, tmp_path)
    assert fresh["sent"] == [[rec.IFNAME, _ours(case["nictune"]).hex()]]


@pytest.mark.parametrize("cmd, tid, value", [
    (ei.ETHTOOL_STUNABLE, ei.ETHTOOL_PFC_PREVENTION_TOUT, 65536),
    (ei.ETHTOOL_STUNABLE, ei.ETHTOOL_PFC_PREVENTION_TOUT, -1),
    (ei.ETHTOOL_STUNABLE, ei.ETHTOOL_PFC_PREVENTION_TOUT, True),
    (ei.ETHTOOL_STUNABLE, 1, 100),  # ETHTOOL_RX_COPYBREAK: not a request nictune makes
    (0x49 + 1, ei.ETHTOOL_PFC_PREVENTION_TOUT, 100),
])
def test_bad_tunable_requests_are_refused_before_the_ioctl(cmd, tid, value):
    with pytest.raises(ValueError):
        ei.tunable_request(cmd, tid, value)


# --- the real kernel --------------------------------------------------------------


@pytest.mark.netns
def test_kernel_refuses_the_tunable_on_veth():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    ns = f"nt{secrets.token_hex(3)}t"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace")
    try:
        r = subprocess.run(["ip", "-n", ns, "link", "add", "nttun0", "type", "veth", "peer", "name", "nttun1"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with in_netns(ns), ei.Tunables() as tunables:
            # net/ethtool/ioctl.c ethtool_get_tunable: no ops->get_tunable.
            with pytest.raises(NetlinkError) as e:
                tunables.get("nttun0", ei.ETHTOOL_PFC_PREVENTION_TOUT)
            assert e.value.errno == errno.EOPNOTSUPP
            with pytest.raises(NetlinkError) as e:
                tunables.set("nttun0", ei.ETHTOOL_PFC_PREVENTION_TOUT, 100)
            assert e.value.errno == errno.EOPNOTSUPP
            with pytest.raises(NetlinkError) as e:
                tunables.get("ntnosuchdev", ei.ETHTOOL_PFC_PREVENTION_TOUT)
            assert e.value.errno == errno.ENODEV
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
