"""expect: {ipsec_offload: ...} and the NETLINK_XFRM reader on this host's
real kernel, in a namespace with a veth.

The host kernel has xfrm (CONFIG_XFRM_USER) but no ESP, AH or IPcomp type,
so it holds policies and no SA: these tests cover what it can show -- the
dumps against `ip xfrm`, "no SA" as drift for an offload expectation, and
`none` met.  Software and offloaded SAs run in the VM tier
(tests/vm/guest/test_ipsec.py); the decoder on recorded NEWSA bytes in
tests/unit/test_xfrm_decode.py.
"""

from __future__ import annotations

import pytest

from nictune.control.remote.targets import NetnsTarget
from nictune.host.transports.netlink.xfrm import Template, Xfrm
from nsenter import in_netns

pytestmark = pytest.mark.netns


def verify(veth_pair, tmp_path, mode: str) -> dict:
    doc = {"nictune": 1, "interfaces": {"rail": {"match": {"name": "ntv0"},
                                                 "expect": {"ipsec_offload": mode}}}}
    req = {"nictune_request": 1, "command": "verify",
           "profile": {"path": "p.yaml", "doc": doc, "sources": {}}}
    return NetnsTarget(veth_pair.ns_a, str(tmp_path)).run(req)


def must(veth_pair, *argv):
    r = veth_pair.run(veth_pair.ns_a, list(argv))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_no_sa_is_drift_for_an_offload_expectation_and_none_is_met(veth_pair, tmp_path):
    must(veth_pair, "ip", "addr", "add", "198.18.0.1/24", "dev", "ntv0")
    for mode in ("crypto", "packet"):
        report = verify(veth_pair, tmp_path, mode)
        assert report["exit_code"] == 2, report
        (change,) = report["changes"]
        assert (change["status"], change["before"], change["after"]) == ("drift", None, mode)
        assert change["note"] == "no IPsec SA uses ntv0"
    report = verify(veth_pair, tmp_path, "none")
    assert report["exit_code"] == 0, report
    assert [c["status"] for c in report["changes"]] == ["ok"]
    assert "ipsec_sa_offloaded" not in report["facts"]["ntv0"]  # no SA concerns it


def test_policy_and_sa_dumps_match_ip_xfrm(veth_pair):
    must(veth_pair, "ip", "xfrm", "policy", "add", "src", "198.18.0.1/32", "dst", "198.18.0.2/32",
         "dir", "out", "priority", "7", "tmpl", "src", "198.18.0.1", "dst", "198.18.0.2",
         "proto", "esp", "reqid", "9", "mode", "transport")
    must(veth_pair, "ip", "-6", "xfrm", "policy", "add", "src", "2001:2::2/128", "dst", "2001:2::/64",
         "dir", "in", "tmpl", "src", "2001:2::1", "dst", "2001:2::2", "proto", "esp",
         "spi", "0x22", "mode", "tunnel")
    shown = must(veth_pair, "ip", "xfrm", "policy", "list")
    with in_netns(veth_pair.ns_a):
        reader = Xfrm()
    with reader:
        sas, policies = reader.sas(), reader.policies()
    assert sas == []  # this kernel cannot hold one (no ESP type)
    got = {(p.src, p.dst, p.dir, p.priority, p.offload, p.templates) for p in policies}
    assert got == {
        ("198.18.0.1/32", "198.18.0.2/32", "out", 7, None,
         (Template("198.18.0.1", "198.18.0.2", "esp", 0, "transport", 9),)),
        ("2001:2::2/128", "2001:2::/64", "in", 0, None,
         (Template("2001:2::1", "2001:2::2", "esp", 0x22, "tunnel", 0),)),
    }
    # What `ip xfrm` printed names the same selectors and directions.
    assert "src 198.18.0.1/32 dst 198.18.0.2/32" in shown and "dir out priority 7" in shown
    assert "src 2001:2::2/128 dst 2001:2::/64" in shown and "dir in priority 0" in shown


def test_if_present_is_met_by_no_sa_and_a_software_policy_is_still_drift_for_packet(
        veth_pair, tmp_path):
    # An idle host (no SA now) meets {if_present: ...}: the strict form above
    # would drift forever.  A policy for the rail that runs in software is
    # still drift for packet offload, which needs the policy offloaded too.
    must(veth_pair, "ip", "addr", "add", "198.18.0.1/24", "dev", "ntv0")
    for mode in ("crypto", "packet"):
        report = verify(veth_pair, tmp_path, {"if_present": mode})
        assert report["exit_code"] == 0, report
        (change,) = report["changes"]
        assert (change["status"], change["after"]) == ("ok", f"{mode} if present"), change
        assert change["note"].startswith("expected; no IPsec SA uses ntv0 now"), change
    must(veth_pair, "ip", "xfrm", "policy", "add", "src", "198.18.0.1/32", "dst", "198.18.0.2/32",
         "dir", "out", "tmpl", "src", "198.18.0.1", "dst", "198.18.0.2", "proto", "esp",
         "reqid", "9", "mode", "transport")
    report = verify(veth_pair, tmp_path, {"if_present": "packet"})
    assert report["exit_code"] == 2, report
    (change,) = report["changes"]
    assert change["status"] == "drift", change
    assert "policy 198.18.0.1/32 > 198.18.0.2/32 dir out: in software" in change["note"], change
    report = verify(veth_pair, tmp_path, {"if_present": "crypto"})
    assert report["exit_code"] == 0, report  # crypto offload needs no policy offloaded
    report = verify(veth_pair, tmp_path, {"if_present": "none"})
    assert report["exit_code"] != 0 and "if_present" in str(report), report
