"""Recorded exchanges: nictune's dcbnl requests against iproute2's `dcb`.

No device here implements DCB, so the peer is `dcb` itself: each
tests/recorded/dcb/<case>.json holds the argv and every RTM_GETDCB /
RTM_SETDCB message `dcb` sent for it (recorded under the LD_PRELOAD shim
tests/recorded/tools/nlshim.c, which answers in the kernel's layout; see
tools/dcb_recorder.py).  nictune must send the same bytes; only nlmsg_seq
and nlmsg_pid are normalised.

Re-record after an iproute2 upgrade with
    python tests/recorded/tools/dcb_recorder.py --write
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nictune.host.transports.netlink import dcb as nd
from recorded.tools import dcb_calls as calls
from recorded.tools import dcb_recorder as rec
from recorded.tools.dcb_calls import DCB_CMD_SDCBX, RecordedDcb, call_for, encode_call

pytestmark = pytest.mark.recorded

CASE_FILES = sorted(p for p in rec.RECORDINGS.glob("*.json") if not p.name.startswith("state-"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _state(name: str) -> nd.DcbState:
    data = _load(rec.RECORDINGS / f"state-{name}.json")
    return calls.decode_reply(bytes.fromhex(data["ieee_get_reply"]))


def _explain(ours: bytes, theirs: bytes) -> str:
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return (f"first difference at byte {at} (lengths {len(ours)} vs {len(theirs)})\n"
            f"  nictune: {ours.hex()}\n  dcb:     {theirs.hex()}")


def _expected_messages(case: dict, ifname: str) -> list:
    """What nictune sends for the case: the IEEE_GET `dcb` reads first (the
    same request as Dcb.get), then the change."""
    method, arg = call_for(case["nictune"], _state(case["state"]))
    get = calls.encode_request(nd.DCB_CMD_IEEE_GET, ifname, [])
    return [get] * (len(case["sent"]) - 1) + [encode_call(method, arg, ifname)]


def test_every_brief_case_is_recorded():
    names = {p.stem for p in CASE_FILES}
    assert rec.CASES and names
    for case in rec.CASES:
        assert case["case"] in names or case.get("needs"), f"no recording for {case['case']}"


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_encoder_matches_dcb_recording(path):
    case = _load(path)
    ifname = case["argv"][case["argv"].index("dev") + 1]
    sent = [bytes.fromhex(m) for m in case["sent"]]
    ours = _expected_messages(case, ifname)
    assert len(ours) == len(sent)
    for mine, theirs in zip(ours, sent):
        assert mine == theirs, f"{case['tool']}: {' '.join(case['argv'])}\n" + _explain(mine, theirs)


# --- through the real socket, under the shim ---------------------------------


def _run_under_shim(shim: Path, jobs: list) -> list:
    env = rec.shim_env(shim, Path("/dev/null"), Path("/nonexistent"))
    env["PYTHONPATH"] = str(rec.HERE)
    r = subprocess.run([sys.executable, str(rec.HERE / "dcb_under_shim.py")], input=json.dumps(jobs),
                       env=env, capture_output=True, text=True, check=False, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_dcb_sends_the_recorded_bytes_over_its_socket(shim, tmp_path):
    """Dcb over NetlinkSocket (not just encode_request): the shim logs what
    actually leaves the process, including the IEEE_GET that set_ets /
    set_pfc callers read first, and feeds back the crafted replies."""
    jobs = []
    for path in CASE_FILES:
        case = _load(path)
        replies = tmp_path / f"replies-{case['state']}"
        state = _load(rec.RECORDINGS / f"state-{case['state']}.json")
        rec.write_replies(replies, {**rec.replies_for(case["state"]),
                                    f"{nd.RTM_GETDCB}-{nd.DCB_CMD_IEEE_GET}.bin":
                                    bytes.fromhex(state["ieee_get_reply"])})
        ifname = case["argv"][case["argv"].index("dev") + 1]
        jobs.append({"log": str(tmp_path / f"{path.stem}.hex"), "replies": str(replies),
                     "ifname": ifname, "spec": case["nictune"]})
    results = _run_under_shim(shim, jobs)
    assert len(results) == len(jobs) == len(CASE_FILES) > 0, results
    for path, job, result in zip(CASE_FILES, jobs, results):
        assert result == {"ok": True}, path.stem
        sent = [rec.normalised(bytes.fromhex(line)) for line in Path(job["log"]).read_text().split()]
        recorded = [bytes.fromhex(m) for m in _load(path)["sent"]]
        assert sent == recorded, path.stem + "\n" + _explain(sent[-1], recorded[-1])


def test_driver_errors_in_the_set_reply_are_raised(shim, tmp_path):
    """dcbnl_ieee_set() ACKs with 0 and puts the driver's -errno in a u8
    DCB_ATTR_IEEE; an SDCBX refusal is a non-zero DCB_ATTR_DCBX."""
    replies = tmp_path / "refusing"
    rec.write_replies(replies, {
        **rec.replies_for("mlx5"),
        f"{nd.RTM_SETDCB}-{nd.DCB_CMD_IEEE_SET}.bin": rec.status_reply(nd.DCB_CMD_IEEE_SET, 13, -22),
        f"{nd.RTM_SETDCB}-{nd.DCB_CMD_IEEE_DEL}.bin": rec.status_reply(nd.DCB_CMD_IEEE_DEL, 13, -2),
        f"{nd.RTM_SETDCB}-{DCB_CMD_SDCBX}.bin": rec.status_reply(DCB_CMD_SDCBX, 14, 1),
    })
    log = str(tmp_path / "log.hex")
    specs = [
        {"method": "add_apps", "apps": [[5, 3, 26]]},
        {"method": "del_apps", "apps": [[5, 3, 26]]},
        {"method": "set_dcbx", "mode": 0x09},
    ]
    jobs = [{"log": log, "replies": str(replies), "ifname": "ens1f0np0", "spec": s} for s in specs]
    # And a device without DCB: no reply file at all -> the ACK says EOPNOTSUPP.
    jobs.append({"log": log, "replies": str(tmp_path / "none"), "ifname": "ens1f0np0", "get": True})
    assert _run_under_shim(shim, jobs) == [{"errno": 22}, {"errno": 2}, {"errno": 22}, {"errno": 95}]


# --- live: the installed dcb against the encoder ------------------------------


@pytest.mark.parametrize("case", rec.CASES, ids=[c["case"] for c in rec.CASES])
def test_installed_dcb_still_sends_what_nictune_sends(case, shim, tmp_path):
    """Re-records with whatever `dcb` is installed now, so a newer iproute2
    that encodes differently is noticed."""
    if case.get("needs") and not rec.dcb_supports(case["needs"]):
        pytest.skip(f"{rec.dcb_version()} has no 'dcb {case['needs']}' (iproute2 >= 6.2)")
    fresh = rec.record_case(case, shim, tmp_path)
    ifname = case["argv"][case["argv"].index("dev") + 1]
    # Against the state the recorder crafts now (the stored one may be older).
    method, arg = call_for(case["nictune"], calls.decode_reply(rec.ieee_get_reply(rec.STATES[case["state"]])))
    ours = [calls.encode_request(nd.DCB_CMD_IEEE_GET, ifname, [])] * (len(fresh["sent"]) - 1)
    ours.append(encode_call(method, arg, ifname))
    theirs = [bytes.fromhex(m) for m in fresh["sent"]]
    for mine, sent in zip(ours, theirs):
        assert mine == sent, f"{fresh['tool']}: {' '.join(fresh['argv'])}\n" + _explain(mine, sent)
    assert len(ours) == len(theirs)


# --- input checks: refused before anything is sent -----------------------------


class _NoSocket:
    def request(self, *args, **kwargs):
        raise AssertionError("a request was sent for invalid input")


def _ets(**change) -> nd.Ets:
    base = nd.Ets(ets_cap=8, tc_tsa=[2, 0, 0, 2, 0, 0, 0, 0], tc_tx_bw=[50, 0, 0, 50, 0, 0, 0, 0],
                  prio_tc=list(range(8)))
    for key, value in change.items():
        setattr(base, key, value)
    return base


@pytest.mark.parametrize("call", [
    lambda d: d.get("eth0; reboot"),
    lambda d: d.get("a" * 16),
    lambda d: d.set_ets("eth0", _ets(prio_tc=[0, 1, 2, 3, 4, 5, 6, 8])),
    lambda d: d.set_ets("eth0", _ets(prio_tc=[0] * 7)),
    lambda d: d.set_ets("eth0", _ets(tc_tx_bw=[101, 0, 0, 0, 0, 0, 0, 0])),
    lambda d: d.set_ets("eth0", _ets(tc_tx_bw=[50, 0, 0, 40, 0, 0, 0, 0])),  # sums to 90
    lambda d: d.set_ets("eth0", _ets(tc_tsa=[2, 0, 0, 2, 0, 0, 0, 7])),
    lambda d: d.set_ets("eth0", _ets(willing=True)),
    lambda d: d.set_pfc("eth0", nd.Pfc(pfc_en=0x100)),
    lambda d: d.set_pfc("eth0", nd.Pfc(delay=65536)),
    lambda d: d.add_apps("eth0", [nd.App(nd.SEL_DSCP, 3, 64)]),
    lambda d: d.add_apps("eth0", [nd.App(nd.SEL_DSCP, 8, 26)]),
    lambda d: d.add_apps("eth0", [nd.App(6, 3, 26)]),
    lambda d: d.del_apps("eth0", [(5, 3, 26)]),
    lambda d: d.set_trust("eth0", [nd.SEL_DSCP, nd.SEL_DSCP]),
    lambda d: d.set_trust("eth0", [7]),
    lambda d: d.set_dcbx("eth0", 0x20),
    lambda d: d.set_dcbx("eth0", -1),
    lambda d: d.set_buffer("eth0", nd.Buffer(prio2buffer=[0, 0, 0, 8, 0, 0, 0, 0])),
    lambda d: d.set_buffer("eth0", nd.Buffer(buffer_size=[-1] + [0] * 7)),
    lambda d: d.set_buffer("eth0", nd.Buffer(buffer_size=[2**32] + [0] * 7)),
    lambda d: d.set_buffer("eth0", nd.Buffer(prio2buffer=[0] * 7)),
])
def test_bad_input_is_refused_before_sending(call):
    with pytest.raises(ValueError):
        call(RecordedDcb(_NoSocket()))


def test_valid_ets_recipes_pass_the_checks():
    # The two recipes of the recordings, built from scratch: ETS 50/50, all strict.
    nd.ets_attrs(_ets())
    nd.ets_attrs(_ets(tc_tsa=[0] * 8, tc_tx_bw=[0] * 8))
    nd.ets_attrs(_ets(tc_tsa=[255] * 8, tc_tx_bw=[0] * 8))


def test_unsupported_command_is_refused():
    with pytest.raises(ValueError):
        calls.encode_request(99, "eth0", [])
