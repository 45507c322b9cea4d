"""Recorded exchanges: nictune's decoder against kernel-layout DCB replies,
and the real kernel's refusals on a veth.

tests/recorded/dcb/state-*.json hold DCB_CMD_IEEE_GET replies crafted after
the kernel's dcbnl_ieee_fill() (tools/dcb_recorder.py packs them with
struct, independently of nictune), the values they were packed from
("spec"), and what iproute2's `dcb -j ... show` made of the same bytes.
decode_reply() must agree with both.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import shutil
import subprocess

import pytest

from nictune.host.transports.netlink import dcb as nd
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.socket import NETLINK_ROUTE, NetlinkSocket
from nsenter import in_netns
from recorded.tools import dcb_calls as calls
from recorded.tools import dcb_recorder as rec

STATE_FILES = sorted(rec.RECORDINGS.glob("state-*.json"))
_TSA_NAMES = {v: k for k, v in nd.TSA.items()}


def _load(path):
    return json.loads(path.read_text())


def _decoded(data: dict) -> nd.DcbState:
    return calls.decode_reply(bytes.fromhex(data["ieee_get_reply"]))


@pytest.mark.recorded
@pytest.mark.parametrize("path", STATE_FILES, ids=[p.stem for p in STATE_FILES])
def test_decoder_reads_back_what_was_packed(path):
    data = _load(path)
    spec = data["spec"]
    state = _decoded(data)
    assert (dataclasses.asdict(state.ets) if state.ets else None) == spec.get("ets")
    assert (dataclasses.asdict(state.pfc) if state.pfc else None) == spec.get("pfc")
    assert state.maxrate == spec.get("maxrate")
    assert [[a.selector, a.priority, a.protocol] for a in state.apps] == spec.get("apps", [])
    assert state.trust == spec.get("trust")
    assert state.dcbx == spec.get("dcbx")
    assert (dataclasses.asdict(state.buffer) if state.buffer else None) == spec.get("buffer")


def _check_against_dcb_show(state: nd.DcbState, shows: dict) -> None:
    """Compare with `dcb -j <obj> show` output, field by field (iproute2's names)."""
    if "ets" in shows:
        ets, show = state.ets, shows["ets"]
        assert (bool(ets.willing), ets.ets_cap, bool(ets.cbs)) == (show["willing"], show["ets_cap"], show["cbs"])
        assert ets.tc_tx_bw == show["tc_bw"] and ets.tc_rx_bw == show["pg_bw"]
        assert [_TSA_NAMES[t] for t in ets.tc_tsa] == show["tc_tsa"]
        assert ets.prio_tc == show["prio_tc"]
        assert ets.tc_reco_bw == show["reco_tc_bw"] and ets.reco_prio_tc == show["reco_prio_tc"]
        assert [_TSA_NAMES[t] for t in ets.tc_reco_tsa] == show["reco_tc_tsa"]
    if "pfc" in shows:
        pfc, show = state.pfc, shows["pfc"]
        assert (pfc.pfc_cap, bool(pfc.mbc), pfc.delay) == (show["pfc_cap"], show["macsec_bypass"], show["delay"])
        assert [bool(pfc.pfc_en >> p & 1) for p in range(nd.PRIOS)] == show["prio_pfc"]
        assert pfc.requests == show["requests"] and pfc.indications == show["indications"]
    if "maxrate" in shows:
        assert state.maxrate == shows["maxrate"]["tc_maxrate"]
    if "app" in shows:
        ours = sorted([a.protocol, a.priority] for a in state.apps if a.selector == nd.SEL_DSCP)
        # iproute2 6.8 adds a stray third element to each pair in JSON.
        assert ours == [pair[:2] for pair in shows["app"]["dscp_prio"]]
        # pcp_prio appears with iproute2 >= 6.2 only; 6.1 warns and skips PCP entries.
        if "pcp_prio" in shows["app"]:
            assert len(shows["app"]["pcp_prio"]) == sum(a.selector == nd.SEL_PCP for a in state.apps)
    if "dcbx" in shows:
        flags = {"host": calls.DCBX_HOST, "lld_managed": calls.DCBX_LLD_MANAGED,
                 "cee": calls.DCBX_VER_CEE, "ieee": calls.DCBX_VER_IEEE, "static": calls.DCBX_STATIC}
        assert state.dcbx == sum(bit for name, bit in flags.items() if shows["dcbx"].get(name))
    if "buffer" in shows:
        buffer, show = state.buffer, shows["buffer"]
        assert (buffer.prio2buffer, buffer.buffer_size, buffer.total_size) == (
            show["prio_buffer"], show["buffer_size"], show["total_size"])
    if "apptrust" in shows:
        names = {"dscp": nd.SEL_DSCP, "pcp": nd.SEL_PCP}
        assert state.trust == [names[n] for n in shows["apptrust"]["order"]]


@pytest.mark.recorded
@pytest.mark.parametrize("path", STATE_FILES, ids=[p.stem for p in STATE_FILES])
def test_decoder_agrees_with_recorded_dcb_show(path):
    data = _load(path)
    assert data["dcb_show"], "no dcb show output recorded"
    _check_against_dcb_show(_decoded(data), {k: v["json"] for k, v in data["dcb_show"].items()})


@pytest.mark.recorded
@pytest.mark.parametrize("path", STATE_FILES, ids=[p.stem for p in STATE_FILES])
def test_decoder_agrees_with_installed_dcb_show(path, shim, tmp_path):
    """The same stored reply bytes, shown live by whatever dcb is installed."""
    data = _load(path)
    replies = {f"{nd.RTM_GETDCB}-{nd.DCB_CMD_IEEE_GET}.bin": bytes.fromhex(data["ieee_get_reply"])}
    shows = {}
    runs = rec.run_shows(data["state"], shim, tmp_path, replies)
    assert runs, data["state"]
    for obj, _, r in runs:
        assert r.returncode == 0, r.stderr
        shows[obj] = json.loads(r.stdout)
    _check_against_dcb_show(_decoded(data), shows)


# --- the real kernel -----------------------------------------------------------


def _ip(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)


@pytest.fixture
def veth_ns():
    """A namespace nt<hex>d holding a veth pair (veth has no dcbnl_ops)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    ns = f"nt{secrets.token_hex(3)}d"
    r = _ip("netns", "add", ns)
    if r.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
    try:
        r = _ip("-n", ns, "link", "add", "ntdcb0", "type", "veth", "peer", "name", "ntdcb1")
        assert r.returncode == 0, r.stderr
        yield ns
    finally:
        _ip("netns", "del", ns)


@pytest.mark.netns
def test_kernel_refuses_dcb_on_veth_and_unknown_devices(veth_ns):
    with in_netns(veth_ns), NetlinkSocket(NETLINK_ROUTE) as sock:
        dcb = nd.Dcb(sock)
        with pytest.raises(NetlinkError) as e:
            dcb.get("ntdcb0")
        assert e.value.errno == errno.EOPNOTSUPP
        with pytest.raises(NetlinkError) as e:
            dcb.set_pfc("ntdcb0", nd.Pfc(pfc_cap=8, pfc_en=0x08))
        assert e.value.errno == errno.EOPNOTSUPP
        with pytest.raises(NetlinkError) as e:
            dcb.get("ntnosuchdev")
        assert e.value.errno == errno.ENODEV
        # The socket is still usable after errors: the same answer again.
        with pytest.raises(NetlinkError) as e:
            dcb.add_apps("ntdcb1", [nd.App(nd.SEL_DSCP, 3, 26)])
        assert e.value.errno == errno.EOPNOTSUPP
