"""The `ipsec:` section's policies on this host's real kernel, in a
namespace with a veth: the host kernel has xfrm but no ESP, so it takes
policies and no SA (static SAs with offload are applied for real in the VM
tier, tests/vm/guest/test_ipsec_sas.py).  nictune adds two policies whose
templates carry its reqid block, leaves a policy added by hand (reqid 9,
as an IKE daemon would) alone, refuses one with the hand policy's selector,
and a rollback deletes exactly its own two -- each read back with `ip xfrm
policy`.
"""

from __future__ import annotations

import pytest

from nictune.control.remote.targets import NetnsTarget

pytestmark = pytest.mark.netns


def run(veth_pair, tmp_path, command: str, policies=None, state="state") -> dict:
    req = {"nictune_request": 1, "command": command, "state_dir": str(tmp_path / state)}
    if policies is not None:
        doc = {"nictune": 1, "interfaces": {"rail": {"match": {"name": "ntv0"},
                                                     "ipsec": {"policies": policies}}}}
        req["profile"] = {"path": "p.yaml", "doc": doc, "sources": {}}
    return NetnsTarget(veth_pair.ns_a, str(tmp_path)).run(req)


def must(veth_pair, *argv):
    r = veth_pair.run(veth_pair.ns_a, list(argv))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_policies_are_added_and_rolled_back_and_a_foreign_one_is_left(veth_pair, tmp_path):
    must(veth_pair, "ip", "xfrm", "policy", "add", "src", "198.18.0.3/32", "dst", "198.18.0.1/32",
         "dir", "in", "tmpl", "src", "198.18.0.3", "dst", "198.18.0.1", "proto", "esp",
         "reqid", "9", "mode", "transport")
    mine = [{"src": "198.18.0.1/32", "dst": "198.18.0.2", "dir": "out", "priority": 5,
             "tmpl": {"src": "198.18.0.1", "dst": "198.18.0.2", "reqid": 1}},
            {"src": "198.18.2.0/24", "dst": "198.18.0.1/32", "dir": "in",
             "tmpl": {"src": "198.18.0.2", "dst": "198.18.0.1", "reqid": 2, "mode": "tunnel"}}]
    report = run(veth_pair, tmp_path, "apply", mine)
    assert report["exit_code"] == 0, report
    by_name = {c["key"]["name"]: c for c in report["changes"]}
    out = by_name["policy 198.18.0.1/32 > 198.18.0.2/32 dir out"]
    assert (out["status"], out["before"]) == ("applied", None), out
    assert out["after"] == ("tmpl 198.18.0.1 > 198.18.0.2 esp transport reqid 1 priority 5 "
                            "offload none")
    shown = must(veth_pair, "ip", "xfrm", "policy", "list")
    assert "src 198.18.0.1/32 dst 198.18.0.2/32" in shown and "priority 5" in shown, shown
    assert "src 198.18.2.0/24 dst 198.18.0.1/32" in shown, shown
    assert "reqid 1853095937 mode transport" in shown, shown  # 0x6e740001
    assert "reqid 1853095938 mode tunnel" in shown, shown

    report = run(veth_pair, tmp_path, "verify", mine)
    assert report["exit_code"] == 0 and {c["status"] for c in report["changes"]} == {"ok"}

    # The hand policy's selector and direction: someone else's, not replaced.
    clash = [{"src": "198.18.0.3/32", "dst": "198.18.0.1/32", "dir": "in",
              "tmpl": {"src": "198.18.0.3", "dst": "198.18.0.1", "reqid": 3}}]
    report = run(veth_pair, tmp_path, "apply", clash, state="other")
    (change,) = report["changes"]
    assert change["status"] == "unsupported" and report["exit_code"] != 0, (change, report)
    assert "not installed by nictune" in str(change), change
    assert "reqid 9 mode transport" in must(veth_pair, "ip", "xfrm", "policy", "list")

    report = run(veth_pair, tmp_path, "rollback")
    assert report["exit_code"] == 0, report
    shown = must(veth_pair, "ip", "xfrm", "policy", "list")
    assert "1853095937" not in shown and "1853095938" not in shown, shown
    assert "src 198.18.0.3/32 dst 198.18.0.1/32" in shown and "reqid 9 " in shown, shown
