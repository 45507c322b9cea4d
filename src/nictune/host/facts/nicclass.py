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
        (combined channels only; rings: see MLX5 below).  ECN/DCQCN: upstream only
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
  MACsec full offload ConnectX-7 onwards, at the MAC only: see the MACsec
  rules at the end of this file).  mana sets none of them and has no tlsdev_ops,
  xfrmdev_ops or macsec_ops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Callable, List, Optional


@dataclass(frozen=True)
class NicClass:
    driver: str
    dcb: frozenset            # DCB objects the driver's dcbnl ops cover; empty: no dcbnl_ops
    roce_ports: Optional[tuple]  # ports that carry RoCE v2; None: every port the device has
    channels: tuple           # ethtool -L kinds the driver takes
    rings: dict = field(default_factory=dict)  # name -> (min, max); min with 4 KiB pages
    rings_round_up_pow2: bool = False
    # Ring minimums that grow with the kernel's PAGE_SIZE: name -> bytes of a
    # page per ring entry at the minimum (minimum = PAGE_SIZE // that).
    rings_page_bytes: dict = field(default_factory=dict)
    max_mtu: Optional[int] = None
    why_not: dict = field(default_factory=dict)  # capability -> reason, for messages
    title: str = ""           # what the class is, for docs
    crypto: Optional[dict] = None  # crypto: name -> note; a name absent: the driver lacks it


@dataclass(frozen=True)
class DriverRule:
    """One thing a driver refuses, rounds, resets or does by itself, read from
    its source.  Plan, lint and the test fakes (tests/fakes.py) consult the
    same rule, so a stand-in can never accept what the driver refuses; the
    profile reference lists every rule with its source function."""
    driver: str   # the netdev's driver, as sysfs names it ("mlx5_core", "mana")
    key: str      # the profile key it concerns ("sriov.vfs.<n>.trust")
    effect: str   # "refused", "automatic", "one-way", "no effect", "disruptive", "rounded"
    when: str     # the state in which it holds ("eswitch in switchdev mode")
    why: str      # what the driver does, in a user's words
    source: str   # file and function ("esw/legacy.c mlx5_eswitch_set_vport_trust")
    # The decision: holds(facts) -> bool, whether the rule applies to a port
    # whose facts are these (a dict: "port_up", "buffers", "raw_qp",
    # "eswitch", "role" (port_role), "offloaded_flows", an IPsec SA's
    # "offload" and "esn_offload", "value" (what the key is set to),
    # "planned" (profile key -> what the plan sets on the port, the eswitch
    # mode included); None where a fact cannot be read).
    # Plan passes what it can read, the test fakes pass their state: both ask
    # the same function (a section's own helper, such as vf_write_refused,
    # only passes the facts it knows to refusal()).  None: nothing decides
    # it, so refusal() and rules_holding() never apply it
    # (tests/unit/test_nicclass.py wants every declared rule decided).
    holds: Optional[Callable] = None

    def applies(self, facts: dict) -> bool:
        return self.holds is not None and bool(self.holds(facts))


RULES: List[DriverRule] = []


def rule(**fields) -> DriverRule:
    """Declare a driver rule (module level only): it joins RULES."""
    found = DriverRule(**fields)
    RULES.append(found)
    return found


def rules_for(driver: Optional[str], key_prefix: str = "") -> List[DriverRule]:
    return [r for r in RULES if r.driver == driver and r.key.startswith(key_prefix)]


def _key_covers(pattern: str, key: str) -> bool:
    """A rule's key covers a profile key: equal, a section of it
    ("channels" covers "channels.combined"), or with <placeholders>
    ("sriov.vfs.<n>.trust" covers "sriov.vfs.3.trust")."""
    want, got = pattern.split("."), key.split(".")
    if len(got) < len(want):
        return False
    return all(w == g or (w.startswith("<") and w.endswith(">")) for w, g in zip(want, got))


def rules_holding(driver: Optional[str], key: str, facts: dict, effect: str = "") -> List[DriverRule]:
    """The rules of `driver` that cover profile key `key` and hold for a
    port with these facts (of one effect, or any)."""
    return [r for r in RULES if r.driver == driver and _key_covers(r.key, key)
            and (not effect or r.effect == effect) and r.applies(facts)]


def refusal(driver: Optional[str], key: str, facts: dict) -> Optional[DriverRule]:
    """The rule by which `driver` refuses to write `key` on a port with
    these facts, or None."""
    found = rules_holding(driver, key, facts, "refused")
    return found[0] if found else None


# NVIDIA ConnectX (mlx5)
MLX5 = NicClass(
    driver="mlx5_core",
    title="NVIDIA ConnectX-7 (mlx5_core)",
    dcb=frozenset({"trust", "dscp_map", "pfc", "ets", "maxrate", "buffer", "dcbx",
                   "pfc_cable_length"}),
    roce_ports=None,
    channels=("combined",),
    # en_ethtool.c mlx5e_ethtool_set_ringparam: EINVAL below
    # 1 << MLX5E_PARAMS_MINIMUM_LOG_RQ_SIZE rx and 1 << MLX5E_PARAMS_MINIMUM_LOG_SQ_SIZE
    # (0x6: 64) tx, then order_base_2() of each: sizes round up to a power of two.
    # en.h: MINIMUM_LOG_RQ_SIZE = 1 + MLX5E_LOG_MAX_RX_WQE_BULK = 1 + ilog2(PAGE_SIZE /
    # roundup_pow_of_two(SKB_DATA_ALIGN(NET_SKB_PAD) + SKB_DATA_ALIGN(sizeof(struct
    # skb_shared_info)))) = 1 + ilog2(PAGE_SIZE / 512) with 64-byte cache lines: rx
    # at least 16 with 4 KiB pages, 256 with 64 KiB (arm64).  Maxima: 1 << 0xd, and
    # the device reports its own (rx-max, tx-max).  (Kernels before 4.19 had a fixed
    # MINIMUM_LOG_RQ_SIZE 0x7: 128.)
    rings={"rx": (16, 8192), "tx": (64, 8192)},
    rings_round_up_pow2=True,
    rings_page_bytes={"rx": 256},
    max_mtu=9978,
    crypto={
        "tls_tx": "mlx5e_ktls (ConnectX-6 Dx and later, with the firmware capability)",
        "tls_rx": "mlx5e_ktls (ConnectX-6 Dx and later, with the firmware capability)",
        "esp": "mlx5e_ipsec: crypto and packet offload (ConnectX-6 Dx and later)",
        "esp_tx_csum": "mlx5e_ipsec (ConnectX-6 Dx and later)",
        "macsec": "mlx5e_macsec_build_netdev (en_accel/macsec.c macsec_offload_ops): offload "
                  "mac only; ConnectX-7 onwards, with the firmware capability (not ConnectX-6 Dx)",
    },
    why_not={
        "ecn": "the upstream mlx5 driver has no /sys/class/net/<if>/ecn (ECN/DCQCN per-priority "
               "enables and CNP settings are MLNX_OFED/DOCA-OFED sysfs; upstream keeps DCQCN "
               "parameters in debugfs, which nictune does not write)",
        # en_dcbnl.c mlx5e_dcbnl_build_netdev: dcbnl_ops only when
        # MLX5_CAP_GEN(mdev, vport_group_manager) (a VF never is);
        # mlx5e_dcbnl_build_rep_netdev: only the uplink representor
        # (en_rep.c mlx5e_build_rep_netdev, rep->vport == MLX5_VPORT_UPLINK).
        "dcb_port": "mlx5 gives DCB (dcbnl) only to the vport group manager: the PF netdev and "
                    "the uplink representor (en_dcbnl.c mlx5e_dcbnl_build_netdev, "
                    "mlx5e_dcbnl_build_rep_netdev); set it on the PF",
        # MLNX_OFED en_sysfs.c set_kobj_mode(): the ecn files are 0644 when
        # mlx5_core_is_pf(mdev), else 0444.  A representor's mdev is its
        # PF's, so what it shows is the PF port's.
        "ecn_port": "MLNX_OFED makes the ecn files writable on the PF only (en_sysfs.c "
                    "set_kobj_mode: mlx5_core_is_pf); a representor shares its PF's device; "
                    "set ECN on the PF",
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


# Where on an eswitch a netdev sits (machine.Interface facts): a VF netdev
# has device/physfn; a representor has a devlink port flavour (pcivf,
# pcisf, pcipf) or, without devlink, mlx5's phys_port_name ([cN]pfNvfM,
# [cN]pfNsfM: en_rep.c mlx5e_rep_get_phys_port_name); an uplink (flavour
# physical, phys_port_name pN) and a plain PF netdev have neither.
ROLE_NAMES = {"vf": "a VF", "vf_rep": "a VF representor", "sf_rep": "an SF representor",
              "pf_rep": "a PF representor"}
_REP_FLAVOURS = {"pcivf": "vf_rep", "pcisf": "sf_rep", "pcipf": "pf_rep"}
_REP_PORT_NAMES = ((re.compile(r"(c\d+)?pf\d+vf\d+"), "vf_rep"), (re.compile(r"(c\d+)?pf\d+sf\d+"), "sf_rep"))


def port_role(iface) -> str:
    """"vf", "vf_rep", "sf_rep", "pf_rep", or "" (a PF netdev or an uplink)."""
    if iface is None:
        return ""
    if iface.physfn:
        return "vf"
    if iface.flavour in _REP_FLAVOURS:
        return _REP_FLAVOURS[iface.flavour]
    if iface.flavour is None and iface.phys_port_name:
        for pattern, role in _REP_PORT_NAMES:
            if pattern.fullmatch(iface.phys_port_name):
                return role
    return ""


def _port_unsupported(driver: Optional[str], iface, why: str) -> Optional[str]:
    nic = for_driver(driver)
    role = port_role(iface)
    if nic is None or not role or why not in nic.why_not:
        return None
    return f"not supported on {ROLE_NAMES[role]} ({iface.name}): " + nic.why_not[why]


def dcb_port_unsupported(driver: Optional[str], iface) -> Optional[str]:
    """Why this netdev has no DCB although its driver does (a VF, a
    representor), or None."""
    return _port_unsupported(driver, iface, "dcb_port")


def ecn_port_unsupported(driver: Optional[str], iface) -> Optional[str]:
    """Why this netdev's ECN files are not the ones to write, or None."""
    return _port_unsupported(driver, iface, "ecn_port")


def dcb_port_note(driver: Optional[str]) -> Optional[str]:
    """For the profile reference: the netdevs of the class that have DCB."""
    nic = for_driver(driver)
    return "PF and uplink representor only, not on VFs or VF representors" if (
        nic is not None and "dcb_port" in nic.why_not) else None


# roce.pfc_cable_length: en_dcbnl.c mlx5e_dcbnl_ieee_setpfc takes
# ieee_pfc.delay as the cable length in metres for the PFC headroom
# (port_buffer.c calculate_xoff) and silently keeps the old one for 0 or
# anything >= MLX5E_MAX_CABLE_LENGTH (1000); mlx5e_dcbnl_ieee_getpfc
# reports it only with MLX5_BUFFER_SUPPORTED.  The uapi (dcbnl.h struct
# ieee_pfc) defines delay in bit times, so for other drivers it is not a
# length at all.
PFC_CABLE_LENGTH = {"mlx5_core": (1, 999)}

# roce.pfc_prevention_timeout (ms): en_ethtool.c
# mlx5e_set_pfc_prevention_tout: 0 disables, PFC_STORM_PREVENTION_AUTO
# (0xffff) means MLX5E_PFC_PREVEN_AUTO_TOUT_MSEC (100, which a read then
# reports), else MLX5E_PFC_PREVEN_TOUT_MIN_MSEC..MAX_MSEC (80..8000) or EINVAL.
PFC_PREVENTION_TIMEOUT = {"mlx5_core": {"min": 80, "max": 8000, "auto": 100}}


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


def rings_minimum(driver: Optional[str], name: str, page_size: int = 4096) -> int:
    """The fewest `name` ring entries the driver takes (it refuses fewer
    with EINVAL); 0 where nictune knows of no minimum."""
    nic = for_driver(driver)
    if nic is None:
        return 0
    per_entry = nic.rings_page_bytes.get(name)
    if per_entry:
        return max(page_size // per_entry, 1)
    return nic.rings.get(name, (0, 0))[0]


# Changes that interrupt traffic while the interface is up: (driver, what) ->
# why, with the driver function that does it.  what: rings, channels, mtu.
# Drivers absent here are not known to (veth, bridge, ...).
DISRUPTS = {
    ("mlx5_core", "rings"): "mlx5 re-creates its channels (mlx5e_ethtool_set_ringparam -> "
                            "mlx5e_safe_switch_params): the queues are rebuilt",
    ("mlx5_core", "channels"): "mlx5 re-creates its channels (mlx5e_ethtool_set_channels -> "
                               "mlx5e_safe_switch_params): the queues are rebuilt",
    ("mlx5_core", "mtu"): "mlx5 re-creates its channels (mlx5e_change_mtu -> "
                          "mlx5e_safe_switch_params): the queues are rebuilt",
    ("mana", "rings"): "MANA detaches and re-attaches the port (mana_set_ringparam -> "
                       "mana_detach, mana_attach)",
    ("mana", "channels"): "MANA detaches and re-attaches the port (mana_set_channels -> "
                          "mana_detach, mana_attach)",
    ("mana", "mtu"): "MANA detaches and re-attaches the port (mana_change_mtu -> "
                     "mana_detach, mana_attach)",
    # drivers/net/hyperv/netvsc_drv.c netvsc_change_mtu: the VF's MTU first
    # (dev_set_mtu), then netvsc_detach + netvsc_attach of the synthetic device.
    ("hv_netvsc", "mtu"): "hv_netvsc changes its VF's MTU, then removes and re-adds the "
                          "synthetic device (netvsc_change_mtu -> netvsc_detach, netvsc_attach)",
}


def disruption(driver: Optional[str], what: str) -> str:
    """Why changing `what` (rings, channels, mtu) on an up interface of
    this driver interrupts traffic; "" when it is not known to."""
    return DISRUPTS.get((driver or "", what), "")


# -- mlx5 in switchdev: VF attributes, tc offload -------------------------------
# torvalds/linux drivers/net/ethernet/mellanox/mlx5/core/:
# - esw/legacy.c mlx5_eswitch_set_vport_vlan: with esw->mode !=
#   MLX5_ESWITCH_LEGACY, VLAN 0 is accepted and does nothing ("compatibility
#   with libvirt": a qos sent with it is dropped), any other VLAN is
#   -EOPNOTSUPP; mlx5_eswitch_set_vport_spoofchk and _trust are -EOPNOTSUPP
#   whatever the value; mlx5_eswitch_set_vport_rate has no mode check (rates
#   work in both modes; in switchdev `devlink port function rate` sets the
#   same vport QoS), nor have eswitch.c mlx5_eswitch_set_vport_mac and
#   _state.
# - en_rep.c mlx5e_uplink_rep_enable sets NETIF_F_HW_TC in the uplink's
#   wanted_features when the eswitch enters switchdev; mlx5e_build_rep_netdev
#   makes every representor with it on (features |= hw_features).
# - en_main.c set_feature_hw_tc (the uplink's ndo_set_features): turning it off
#   while the uplink has offloaded tc filters (MLX5_TC_FLAG(ESW_OFFLOAD) in
#   switchdev: OVS's flows) is -EINVAL, "Active offloaded tc filters, can't
#   turn hw_tc_offload off".
# netdevsim (drivers/net/netdevsim/netdev.c nsim_set_vf_rate) is the other
# way round: it takes VLAN, trust and spoofchk in either mode and refuses
# rates in switchdev.
SWITCHDEV = "switchdev"
# What a representor of an mlx5 eswitch reports as its driver (en_rep.c
# mlx5e_rep_get_drvinfo: "mlx5e_rep"); the uplink reports mlx5_core.
MLX5_PORT_DRIVERS = ("mlx5_core", "mlx5e_rep")


def eswitch_written_in(facts: dict) -> Optional[str]:
    """The eswitch mode a port's writes meet: the one the plan sets
    (facts["planned"]["eswitch.mode"]: eswitch sits before sriov and
    features), else the current one (facts["eswitch"])."""
    return (facts.get("planned") or {}).get("eswitch.mode", facts.get("eswitch"))


def in_switchdev(facts: dict) -> bool:
    return eswitch_written_in(facts) == SWITCHDEV


def _switchdev_and(test: Callable) -> Callable:
    """holds(facts): in switchdev, and `test` of the value written."""
    return lambda facts: in_switchdev(facts) and test(facts.get("value"))


_NON_ZERO = _switchdev_and(bool)        # VLAN 0 / qos 0 is what a new VF reads
_ANY_VALUE = _switchdev_and(lambda value: value is not None)
_VLAN_ELSEWHERE = ("in switchdev a VLAN belongs on the representor's OVS port (tag=) or in tc "
                   "vlan push/pop on the representor")

MLX5_VF_VLAN_SWITCHDEV = rule(
    driver="mlx5_core", key="sriov.vfs.<n>.vlan", effect="refused",
    when="eswitch in switchdev mode, VLAN other than 0",
    why="mlx5 answers EOPNOTSUPP: VF port VLANs are legacy-mode only; " + _VLAN_ELSEWHERE,
    source="esw/legacy.c mlx5_eswitch_set_vport_vlan",
    holds=_NON_ZERO)
MLX5_VF_QOS_SWITCHDEV = rule(
    driver="mlx5_core", key="sriov.vfs.<n>.qos", effect="refused",
    when="eswitch in switchdev mode, qos other than 0",
    why="mlx5 answers EOPNOTSUPP with a VLAN, and with VLAN 0 accepts the request and drops "
        "the priority; " + _VLAN_ELSEWHERE + " (skbedit priority)",
    source="esw/legacy.c mlx5_eswitch_set_vport_vlan",
    holds=_NON_ZERO)
MLX5_VF_TRUST_SWITCHDEV = rule(
    driver="mlx5_core", key="sriov.vfs.<n>.trust", effect="refused",
    when="eswitch in switchdev mode",
    why="mlx5 answers EOPNOTSUPP: VF trust is legacy-mode only; in switchdev what a VF may "
        "send and receive is decided by the flows on its representor",
    source="esw/legacy.c mlx5_eswitch_set_vport_trust",
    holds=_ANY_VALUE)
MLX5_VF_SPOOFCHK_SWITCHDEV = rule(
    driver="mlx5_core", key="sriov.vfs.<n>.spoofchk", effect="refused",
    when="eswitch in switchdev mode",
    why="mlx5 answers EOPNOTSUPP: spoof checking is legacy-mode only; in switchdev match the "
        "source MAC in the representor's flows (OVS, tc flower)",
    source="esw/legacy.c mlx5_eswitch_set_vport_spoofchk",
    holds=_ANY_VALUE)
NSIM_VF_RATE_SWITCHDEV = tuple(rule(
    driver="netdevsim", key=f"sriov.vfs.<n>.{attr}", effect="refused",
    when="eswitch in switchdev mode",
    why="netdevsim answers EOPNOTSUPP (\"Please use devlink API\"); mlx5 takes VF rates in "
        "both modes",
    source="drivers/net/netdevsim/netdev.c nsim_set_vf_rate",
    holds=_ANY_VALUE)
    for attr in ("max_tx_rate", "min_tx_rate"))
MLX5_HW_TC_SWITCHDEV_ON = rule(
    driver="mlx5_core", key="features.hw-tc-offload", effect="automatic",
    when="eswitch in switchdev mode: the uplink and every representor",
    why="mlx5 turns hw-tc-offload on by itself on the uplink when the eswitch enters switchdev "
        "and on every representor it creates: an expectation there, which a rollback leaves on",
    source="en_rep.c mlx5e_uplink_rep_enable, mlx5e_build_rep_netdev",
    # facts["role"]: port_role() of the netdev; a VF netdev is no switch port.
    holds=lambda facts: in_switchdev(facts) and facts.get("role") != "vf")
MLX5_HW_TC_OFF_REFUSED = rule(
    driver="mlx5_core", key="features.hw-tc-offload", effect="refused",
    when="off, on a switchdev uplink with offloaded tc filters (OVS's flows)",
    why="mlx5 answers EINVAL \"Active offloaded tc filters, can't turn hw_tc_offload off\" "
        "while the uplink has offloaded flows",
    source="en_main.c set_feature_hw_tc",
    # facts["offloaded_flows"]: the uplink's offloaded tc filters (plan cannot
    # count them, so plan never refuses by this rule: the rollback keeps the
    # bit instead, MLX5_HW_TC_SWITCHDEV_ON; the fakes count theirs).
    holds=lambda facts: facts.get("value") is False and in_switchdev(facts)
    and (facts.get("offloaded_flows") or 0) > 0)

SWITCHDEV_RULES = (MLX5_VF_VLAN_SWITCHDEV, MLX5_VF_QOS_SWITCHDEV, MLX5_VF_TRUST_SWITCHDEV,
                   MLX5_VF_SPOOFCHK_SWITCHDEV, *NSIM_VF_RATE_SWITCHDEV, MLX5_HW_TC_SWITCHDEV_ON,
                   MLX5_HW_TC_OFF_REFUSED)


def vf_write_refused(driver: Optional[str], attr: str, value, eswitch_mode: Optional[str]
                     ) -> Optional[DriverRule]:
    """The rule by which the PF's driver refuses writing VF attribute `attr`
    = `value` with its eswitch in `eswitch_mode`, or None.  Plan and lint
    refuse the key with it; the test fakes ask refusal() with their state."""
    return refusal(driver, f"sriov.vfs.<n>.{attr}", {"eswitch": eswitch_mode, "value": value})


def vf_vlan_ignored(driver: Optional[str], vlan, eswitch_mode: Optional[str]) -> bool:
    """mlx5 in switchdev takes VLAN 0 (with any qos) and does nothing with it."""
    return driver == "mlx5_core" and eswitch_mode == SWITCHDEV and not vlan


def refusal_text(found: DriverRule) -> str:
    """How plans word a refusal by rule `found`."""
    return f"not supported by {found.driver} ({found.when}): {found.why} [{found.source}]"


def hw_tc_kept(driver: Optional[str], iface, eswitch_mode: Optional[str]) -> Optional[DriverRule]:
    """MLX5_HW_TC_SWITCHDEV_ON when `iface` (machine.Interface; None: the
    uplink of `driver`) is an mlx5 uplink or representor whose eswitch is in
    switchdev: its hw-tc-offload is the driver's, not written off again."""
    if driver not in MLX5_PORT_DRIVERS:
        return None
    # A representor reports mlx5e_rep; the rules are its PF driver's.
    found = rules_holding("mlx5_core", "features.hw-tc-offload",
                          {"eswitch": eswitch_mode, "role": port_role(iface)}, "automatic")
    return found[0] if found else None


# -- PFC headroom and port-buffer ownership (mlx5) ------------------------------
# en_dcbnl.c mlx5e_dcbnl_ieee_setpfc stores the cable length (priv->dcbx.
# cable_len; newer kernels keep it in the firmware, mlx5e_port_set_cable_len)
# and calls mlx5e_port_manual_buffer_config, which re-sizes the lossless
# headroom (en/port_buffer.c mlx5e_calculate_buf_sz_and_thresholds: xoff
# from cable_len and the link speed), only when software owns the port
# buffers: before 2025 priv->dcbx.manual_buffer, false from
# mlx5e_dcbnl_initialize until the first dcbnl setbuffer; since "net/mlx5e:
# Query FW for buffer ownership" mlx5_query_port_buffer_ownership ==
# MLX5_BUF_OWNERSHIP_SW_OWNED.  mlx5e_dcbnl_setbuffer writes the buffers
# (PBMC) itself, which hands them to software; nothing in the driver hands
# them back (only its re-initialisation).  The cable length starts at
# MLX5E_DEFAULT_CABLE_LEN (7 m).  Neither dcbnl nor any sysfs file reports
# who owns the buffers: plan knows only what the profile writes.
MLX5_DEFAULT_CABLE_LENGTH = 7


def firmware_owns_buffers(facts: dict) -> bool:
    """facts["buffers"]: "software" once a buffer write made them so,
    "firmware" at driver load, None when unknown (plan on a live host)."""
    return facts.get("buffers") != "software"


MLX5_CABLE_LENGTH_NO_EFFECT = rule(
    driver="mlx5_core", key="roce.pfc_cable_length", effect="no effect",
    when="the firmware owns the port buffers (the default, until a roce.buffer write)",
    why="mlx5 stores the cable length and reads it back, but sizes the PFC headroom for it "
        "only while software owns the port buffers: with firmware-owned buffers it changes "
        "nothing",
    source="en_dcbnl.c mlx5e_dcbnl_ieee_setpfc (mlx5_query_port_buffer_ownership; before "
           "2025 priv->dcbx.manual_buffer), en/port_buffer.c mlx5e_port_manual_buffer_config",
    holds=firmware_owns_buffers)

MLX5_BUFFER_WRITE_ONE_WAY = rule(
    driver="mlx5_core", key="roce.buffer", effect="one-way",
    when="any write of roce.buffer.size or roce.buffer.prio2buffer",
    why="the write hands the port buffers from the firmware to software, which then sizes "
        f"the lossless headroom for the cable length ({MLX5_DEFAULT_CABLE_LENGTH} m, "
        "MLX5E_DEFAULT_CABLE_LEN, unless roce.pfc_cable_length says otherwise); a rollback "
        "restores the sizes and the priority mapping but not firmware ownership (only "
        "reloading the driver does)",
    source="en_dcbnl.c mlx5e_dcbnl_setbuffer, en/port_buffer.c mlx5e_port_manual_buffer_config",
    holds=lambda facts: True)  # every write


# -- MANA queue changes under RDMA ------------------------------------------------
# mana_en.c mana_cfg_vport: Ethernet (an up port, mana_alloc_queues) and a
# RAW QP (mana_ib, DPDK) exclude each other on the vPort (vport_use_count);
# RC QPs do not count ("This physical port limitation only applies to the
# RAW QP").  mana_ethtool.c mana_set_channels: EBUSY when !apc->port_is_up
# && apc->vport_use_count, the RAW QP user's EQs being sized to the
# current queue count.  mana_set_ringparam has no such check: on a down
# port it only records the sizes (mana_attach allocates no queues), on an
# up one Ethernet holds the vPort.  nictune cannot read whether a RAW QP
# holds the vPort (rdma netlink's QP dump would tell; nictune does not
# speak it): plan takes it as unknown, and so refuses on a down port with
# an RDMA device on it.


def raw_qp_may_hold_vport(facts: dict) -> bool:
    """facts["port_up"]: the netdev is up; facts["raw_qp"]: True, False,
    or None (unknown: counted as maybe)."""
    return not facts.get("port_up") and facts.get("raw_qp") is not False


MANA_CHANNELS_VPORT_BUSY = rule(
    driver="mana", key="channels", effect="refused",
    when="the port is down and a RAW QP (mana_ib: DPDK) holds the vPort",
    why="MANA answers EBUSY: the RAW QP user's EQs are sized to the current queue count; "
        "with the port up Ethernet holds the vPort and the change goes through (detaching "
        "and re-attaching the port)",
    source="mana_ethtool.c mana_set_channels; mana_en.c mana_cfg_vport",
    holds=raw_qp_may_hold_vport)
# -- IPsec static SAs (knobs/ipsec.py): what the xfrm offload paths refuse ---
# Facts of an SA: "offload" (none, crypto, packet), "value" (what its key is
# set to: esn's bool, lifetime's limits), "esn_offload" (whether the device's
# firmware offers ESN offload; None: unknown, left to the kernel).


def _soft_not_below_hard(lifetime) -> bool:
    lifetime = lifetime if isinstance(lifetime, dict) else {}
    return any(lifetime.get("soft_" + kind) is not None and lifetime.get("hard_" + kind) is not None
               and lifetime["soft_" + kind] >= lifetime["hard_" + kind] for kind in ("packets", "bytes"))


IPSEC_ESN_NO_ADVANCE = rule(
    driver="netdevsim", key="ipsec.sas.esn", effect="refused",
    when="crypto offload (offload: crypto) with esn: true (the default)",
    why="the xfrm core refuses to offload an ESN SA to a device whose xfrmdev_ops have no "
        "xdo_dev_state_advance_esn (\"Device doesn't support offload with ESN\"); netdevsim "
        "has none: set esn: false there",
    source="net/xfrm/xfrm_device.c xfrm_dev_state_add; drivers/net/netdevsim/ipsec.c "
           "nsim_xfrmdev_ops",
    holds=lambda facts: facts.get("offload") == "crypto" and bool(facts.get("value")))
IPSEC_ESN_MLX5_CAP = rule(
    driver="mlx5_core", key="ipsec.sas.esn", effect="refused",
    when="offloaded, on a device whose firmware lacks the ESN capability (MLX5_IPSEC_CAP_ESN)",
    why="mlx5 refuses to offload an ESN SA without the capability (\"Cannot offload ESN xfrm "
        "states\"), which the firmware reports (en_accel/ipsec_offload.c "
        "mlx5_ipsec_device_caps): left to the kernel to answer",
    source="drivers/net/ethernet/mellanox/mlx5/core/en_accel/ipsec.c mlx5e_xfrm_validate_state",
    holds=lambda facts: facts.get("offload") in ("crypto", "packet") and bool(facts.get("value"))
    and facts.get("esn_offload") is False)
IPSEC_MLX5_PACKET_LIMITS = rule(
    driver="mlx5_core", key="ipsec.sas.lifetime", effect="refused",
    when="packet offload (offload: packet)",
    why="a soft limit not below its hard limit, or a replay window other than 32, 64, 128 or "
        "256 packets on an inbound SA, is refused; nictune's schema allows only those for "
        "every SA",
    source="drivers/net/ethernet/mellanox/mlx5/core/en_accel/ipsec.c mlx5e_xfrm_validate_state",
    holds=lambda facts: facts.get("offload") == "packet" and _soft_not_below_hard(facts.get("value")))


def ipsec_sa_refused(driver: Optional[str], offload: str, esn: bool) -> Optional[DriverRule]:
    """The driver rule that refuses this SA's offload, None when none does
    (what the device's firmware offers is left to the kernel to answer)."""
    return refusal(driver, "ipsec.sas.esn", {"offload": offload, "value": esn})


# -- MACsec offload ------------------------------------------------------------
# drivers/net/macsec.c macsec_check_offload: offload phy needs
# real_dev->phydev->macsec_ops, offload mac needs NETIF_F_HW_MACSEC and
# real_dev->macsec_ops; anything else is EOPNOTSUPP (macsec_newlink,
# macsec_update_offload).  mlx5 drives its PHY in firmware (no phylib
# phydev) and sets only the netdev's macsec_ops
# (en_accel/macsec.c mlx5e_macsec_build_netdev: netdev->macsec_ops =
# &macsec_offload_ops), when mlx5e_is_macsec_device: ConnectX-7 onwards
# (NVIDIA's "MACsec Full Offload" document: GCM-AES and GCM-AES-XPN,
# 128 and 256 bits, ConnectX-7 onwards).
MLX5_MACSEC_PHY = rule(
    driver="mlx5_core", key="macsec.offload", effect="refused", when="offload: phy",
    why="mlx5 offloads MACsec at the MAC only (macsec_offload_ops on the netdev, ConnectX-7 "
        "onwards); it has no PHY MACsec operations, so the kernel answers EOPNOTSUPP to offload "
        "phy: use offload: mac",
    source="en_accel/macsec.c mlx5e_macsec_build_netdev; drivers/net/macsec.c "
           "macsec_check_offload",
    holds=lambda facts: facts.get("value") == "phy")


def macsec_offload_refused(driver: Optional[str], mode: Optional[str]) -> Optional[DriverRule]:
    """The rule by which this driver refuses MACsec offload `mode`, or None
    (plan, lint and tests/fakes.py's MACsec handle all ask this)."""
    return refusal(driver, "macsec.offload", {"value": mode})
