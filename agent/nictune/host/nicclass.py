"""What each NIC class's driver can take, read from the drivers' sources.

Knob families consult these tables before asking the kernel, so a profile
key the driver has no operation for is reported per key, in plan, as
"not supported by <driver>", instead of surfacing as an errno mid-apply.
Anything not listed here is left to the kernel to answer (unknown drivers
are probed, never assumed).

Sources (torvalds/linux, paths under drivers/):
  mlx5: net/ethernet/mellanox/mlx5/core/en_dcbnl.c (mlx5e_dcbnl_ops:
        ieee_{get,set}ets -- EINVAL unless the ETS TCs' bandwidth sums to 0
        or 100 and every prio_tc < 8 (mlx5e_dbcnl_validate_ets);
        ieee_{get,set}pfc, ieee_{get,set}maxrate, ieee_{set,del}app for the
        DSCP selector only (the first DSCP entry switches trust to dscp, the
        last one deleted switches it back to pcp), dcbnl_{get,set}buffer,
        {get,set}dcbx), net/ethernet/mellanox/mlx5/core/en_ethtool.c
        (combined channels only, rings up to 8192).  ECN/DCQCN: upstream only
        in debugfs (infiniband/hw/mlx5/cong.c); the per-priority enables
        and CNP knobs under /sys/class/net/X/ecn/ are MLNX_OFED/DOCA-OFED.
  mana: net/ethernet/microsoft/mana/mana_en.c (no dcbnl_ops, max_mtu from
        the adapter, 9000 on Azure), net/ethernet/microsoft/mana/
        mana_ethtool.c (combined channels only; rings rx 128..8192, tx
        128..16384, rounded up to a power of two; no set_pauseparam),
        infiniband/hw/mana (mana_ib: RoCE v2 on port 1 only, GIDs from the
        hv_netvsc master netdev, no congestion-control knobs).
Inline crypto (`crypto`, knobs/crypto.py): mlx5 sets NETIF_F_HW_TLS_TX/RX in
  en_accel/ktls.c (mlx5e_ktls_build_netdev), NETIF_F_HW_ESP and
  NETIF_F_HW_ESP_TX_CSUM in en_accel/ipsec.c (mlx5e_ipsec_build_netdev:
  crypto and packet offload), NETIF_F_HW_MACSEC in en_accel/macsec.c, each
  when the device's firmware reports the capability (ConnectX-6 Dx and later;
  MACsec on ConnectX-7).  mana sets none of them and has no tlsdev_ops,
  xfrmdev_ops or macsec_ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class NicClass:
    driver: str
    dcb: frozenset            # DCB objects the driver's dcbnl ops cover; empty: no dcbnl_ops
    roce_ports: Optional[tuple]  # ports that carry RoCE v2; None: every port the device has
    channels: tuple           # ethtool -L kinds the driver takes
    rings: dict = field(default_factory=dict)  # name -> (min, max)
    rings_round_up_pow2: bool = False
    max_mtu: Optional[int] = None
    why_not: dict = field(default_factory=dict)  # capability -> reason, for messages
    title: str = ""           # what the class is, for docs
    crypto: Optional[dict] = None  # crypto: name -> note; a name absent: the driver lacks it


# NVIDIA ConnectX (mlx5)
MLX5 = NicClass(
    driver="mlx5_core",
    title="NVIDIA ConnectX-7 (mlx5_core)",
    dcb=frozenset({"trust", "dscp_map", "pfc", "ets", "maxrate", "buffer", "dcbx"}),
    roce_ports=None,
    channels=("combined",),
    rings={"rx": (1, 8192), "tx": (1, 8192)},
    max_mtu=9978,
    crypto={
        "tls_tx": "mlx5e_ktls (ConnectX-6 Dx and later, with the firmware capability)",
        "tls_rx": "mlx5e_ktls (ConnectX-6 Dx and later, with the firmware capability)",
        "esp": "mlx5e_ipsec: crypto and packet offload (ConnectX-6 Dx and later)",
        "esp_tx_csum": "mlx5e_ipsec (ConnectX-6 Dx and later)",
        "macsec": "mlx5e_macsec_ops (ConnectX-7, with the firmware capability)",
    },
    why_not={
        "ecn": "the upstream mlx5 driver has no /sys/class/net/<if>/ecn (ECN/DCQCN per-priority "
               "enables and CNP settings are MLNX_OFED/DOCA-OFED sysfs; upstream keeps DCQCN "
               "parameters in debugfs, which nictune does not write)",
    },
)

# Microsoft Azure Network Adapter (MANA)
MANA = NicClass(
    driver="mana",
    title="Azure Maia-class hosts (mana)",
    dcb=frozenset(),
    roce_ports=(1,),
    channels=("combined",),
    rings={"rx": (128, 8192), "tx": (128, 16384)},
    rings_round_up_pow2=True,
    max_mtu=9000,
    crypto={},
    why_not={
        "crypto": "the driver offers no inline crypto (no tlsdev_ops, xfrmdev_ops or "
                  "macsec_ops): kTLS, IPsec and MACsec run in software",
        "dcb": "the driver has no DCB (dcbnl) operations: no trust, DSCP map, PFC or ETS",
        "ecn": "mana_ib exposes no ECN/DCQCN settings",
        "ovs_offload": "no eswitch, switchdev mode or TC flower offload in the driver: OVS "
                       "flows stay in software (Azure Accelerated Networking is the VF path)",
        "macsec_offload": "the driver has no macsec_ops (MACsec runs in software)",
    },
)

CLASSES = {c.driver: c for c in (MLX5, MANA)}


def for_driver(driver: Optional[str]) -> Optional[NicClass]:
    return CLASSES.get(driver or "")


def dcb_unsupported(driver: Optional[str], name: str) -> Optional[str]:
    """Why a DCB key cannot be set on this driver, or None (known to work,
    or an unknown driver: then the kernel is asked)."""
    nic = for_driver(driver)
    # A DCB key needs the capability it is named after: ets.tc_bw needs ets.
    if nic is None or name.split(".")[0] in nic.dcb:
        return None
    return f"not supported by {driver}: " + nic.why_not.get("dcb", f"no DCB {name} in the driver")


def ecn_unsupported(driver: Optional[str]) -> Optional[str]:
    """Why ECN settings are absent, given that /sys/class/net/X/ecn is."""
    nic = for_driver(driver)
    if nic is None:
        return f"not supported by {driver or 'this driver'}: no /sys/class/net/<if>/ecn"
    return f"not supported by {driver}: " + nic.why_not["ecn"]


def crypto_unsupported(driver: Optional[str], name: str) -> Optional[str]:
    """Why this driver cannot turn on crypto offload `name` (knobs/crypto.py),
    or None (it can, or an unknown driver: then the device is asked)."""
    nic = for_driver(driver)
    if nic is None or nic.crypto is None or name in nic.crypto:
        return None
    return f"not supported by {driver}: " + nic.why_not.get("crypto", f"no {name} offload")


def crypto_note(driver: Optional[str], name: str) -> Optional[str]:
    nic = for_driver(driver)
    return (nic.crypto or {}).get(name) if nic else None


def roce_port_unsupported(driver: Optional[str], port: int) -> Optional[str]:
    nic = for_driver(driver)
    if nic is None or nic.roce_ports is None or port in nic.roce_ports:
        return None
    ports = ", ".join(str(p) for p in nic.roce_ports)
    return f"not supported by {driver}: RoCE v2 runs on port {ports} only, not {port}"


def rings_effective(driver: Optional[str], name: str, value: int) -> int:
    """What the driver will read back after being asked for `value` rings."""
    nic = for_driver(driver)
    if nic is None or not nic.rings_round_up_pow2:
        return value
    least = nic.rings.get(name, (0, 0))[0]
    value = max(value, least)
    return 1 << (value - 1).bit_length()
