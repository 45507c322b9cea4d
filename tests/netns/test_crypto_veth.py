"""crypto: on a veth in a namespace, on this host's real kernel.

veth reports every inline-crypto bit off [fixed] (ethtool -k): asking for
off is met, asking for on is unsupported with the reason, in plan, and an
apply writes nothing.  netdevsim, whose esp and macsec bits are fixed on,
is in the VM tier (tests/vm/guest/test_crypto.py).
"""

from __future__ import annotations

import pytest

from nictune.control.remote.targets import NetnsTarget

pytestmark = pytest.mark.netns

ALL = {"tls_tx": "tls-hw-tx-offload", "tls_rx": "tls-hw-rx-offload", "esp": "esp-hw-offload",
       "esp_tx_csum": "esp-tx-csum-hw-offload", "macsec": "macsec-hw-offload"}


def run(veth_pair, tmp_path, command: str, crypto: dict) -> dict:
    doc = {"nictune": 1, "interfaces": {"rail": {"match": {"name": "ntv0"}, "crypto": crypto}}}
    req = {"nictune_request": 1, "command": command,
           "profile": {"path": "p.yaml", "doc": doc, "sources": {}}}
    return NetnsTarget(veth_pair.ns_a, str(tmp_path)).run(req)


def ethtool_k(veth_pair) -> dict:
    out = veth_pair.run(veth_pair.ns_a, ["ethtool", "-k", "ntv0"]).stdout
    return {line.split(":")[0]: line.split(":", 1)[1].strip()
            for line in out.splitlines()[1:] if ":" in line}


def test_fixed_off_bits_read_off_and_cannot_be_turned_on(veth_pair, tmp_path):
    shown = ethtool_k(veth_pair)
    assert {shown[bit] for bit in ALL.values()} == {"off [fixed]"}, shown
    report = run(veth_pair, tmp_path, "plan", {name: False for name in ALL})
    assert report["exit_code"] == 0, report
    assert {c["key"]["name"]: (c["status"], c["before"]) for c in report["changes"]} == {
        name: ("ok", False) for name in ALL}

    report = run(veth_pair, tmp_path, "apply", {"tls_tx": True, "esp": False})
    got = {c["key"]["name"]: c for c in report["changes"]}
    assert got["esp"]["status"] == "ok"
    assert got["tls_tx"]["status"] == "unsupported"
    assert got["tls_tx"]["note"].startswith("ntv0: tls-hw-tx-offload is fixed off"), got
    assert report["exit_code"] != 0 and ethtool_k(veth_pair) == shown  # nothing written


def test_show_leaves_fixed_bits_out(veth_pair, tmp_path):
    report = NetnsTarget(veth_pair.ns_a, str(tmp_path)).run({"nictune_request": 1, "command": "show"})
    (entry,) = [e for e in report["profile"]["interfaces"].values() if e["match"]["name"] == "ntv0"]
    assert "crypto" not in entry
    assert not set(ALL.values()) & set(entry.get("features", {}))
