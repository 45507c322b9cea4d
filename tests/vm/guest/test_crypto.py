"""crypto: against netdevsim on the VM kernel.

netdevsim reports esp-hw-offload and macsec-hw-offload on [fixed] (it
implements xfrmdev_ops and macsec_ops) and tls-hw-* off [fixed]: nictune
reads each as ethtool -k shows it, and asking to change a fixed bit is
unsupported, in plan, with nothing written.  The CLI runs in-process.
"""

from __future__ import annotations

from nictune_cli import nictune
from rxe import sh

BITS = {"tls_tx": "tls-hw-tx-offload", "tls_rx": "tls-hw-rx-offload", "esp": "esp-hw-offload",
        "esp_tx_csum": "esp-tx-csum-hw-offload", "macsec": "macsec-hw-offload"}


def ethtool_k(ifname: str) -> dict:
    out = sh("ethtool", "-k", ifname).stdout
    return {line.split(":")[0]: line.split(":", 1)[1].strip()
            for line in out.splitlines()[1:] if ":" in line}


def profile(tmp_path, ifname: str, crypto: str) -> str:
    path = tmp_path / "crypto.yaml"
    path.write_text(f"nictune: 1\ninterfaces:\n  rail:\n    match: {{name: {ifname}}}\n"
                    f"    crypto: {crypto}\n")
    return str(path)


def changes(report: dict) -> dict:
    (host,) = report["hosts"]
    return {c["key"]["name"]: c for c in host["changes"]}


def test_netdevsim_bits_read_as_ethtool_shows_them(nsim, tmp_path):
    port = nsim.ifnames[0]
    shown = ethtool_k(port)
    assert (shown["esp-hw-offload"], shown["macsec-hw-offload"]) == ("on [fixed]", "on [fixed]"), shown
    assert shown["tls-hw-tx-offload"] == shown["tls-hw-rx-offload"] == "off [fixed]", shown
    code, report, _ = nictune("verify", profile(
        tmp_path, port, "{esp: true, macsec: true, tls_tx: false, tls_rx: false}"),
        "--state-dir", str(tmp_path / "state"))
    assert code == 0, report
    got = changes(report)
    assert {k: (c["status"], c["before"]) for k, c in got.items()} == {
        "esp": ("ok", True), "macsec": ("ok", True), "tls_tx": ("ok", False),
        "tls_rx": ("ok", False)}, got
    for name, c in got.items():
        assert shown[BITS[name]].startswith("on" if c["before"] else "off")


def test_turning_a_fixed_bit_off_is_unsupported_and_writes_nothing(nsim, tmp_path):
    port = nsim.ifnames[0]
    shown = ethtool_k(port)
    code, report, _ = nictune("apply", profile(tmp_path, port, "{esp: false, tls_tx: true}"),
                           "--state-dir", str(tmp_path / "state"))
    got = changes(report)
    assert got["esp"]["status"] == "unsupported", got
    assert got["esp"]["note"].startswith(f"{port}: esp-hw-offload is fixed on ("), got
    assert got["tls_tx"]["status"] == "unsupported"
    assert "fixed off" in got["tls_tx"]["note"], got
    assert code != 0 and ethtool_k(port) == shown
