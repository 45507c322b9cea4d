"""Which IPsec SAs and policies concern an interface, and where each runs.

Read-only, over NETLINK_XFRM (netlink/xfrm.py: algorithm names and key
lengths only, never keys).  An SA concerns interface X when

- its XFRMA_OFFLOAD_DEV names X (offloaded there: "crypto", or "packet"
  with XFRM_OFFLOAD_PACKET), or
- it is not offloaded to X and its local address is one of X's addresses:
  the source of an outbound SA, the destination of an inbound one, either
  when the SA does not say its direction (no XFRMA_SA_DIR before 6.10, no
  offload flags).  Such an SA runs in software on X ("none"), or on the
  other device it is offloaded to, which X's expectation does not count.

A policy concerns X when its offload names X or one of its templates'
local address is X's (src for dir out, dst for in/fwd).  Policies only
matter to packet offload, where the policy is offloaded too.

What each NIC class offers (sources under torvalds/linux drivers/):
  mlx5_core  net/ethernet/mellanox/mlx5/core/en_accel/ipsec.c
             (mlx5e_xfrmdev_ops: xdo_dev_state_add for crypto offload and,
             with XFRM_DEV_OFFLOAD_PACKET, packet offload, plus
             xdo_dev_policy_add; ConnectX-6 Dx and later, ConnectX-7)
  mana       net/ethernet/microsoft/mana: no xfrmdev_ops, no IPsec offload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # the controller imports this for nic_support alone: no pyroute2
    from nictune.host.transports.netlink.xfrm import Policy, Sa

MODES = ("none", "crypto", "packet")
# driver -> the offload modes its xfrmdev_ops implement (see above).
OFFLOAD_MODES = {"mlx5_core": ("crypto", "packet"), "mana": ()}
SOFTWARE_POLICY = "software-policy"  # token: a policy packet offload needs is not offloaded


def support_note(driver: Optional[str]) -> Optional[str]:
    """What the NIC class with `driver` offers for IPsec offload."""
    if driver not in OFFLOAD_MODES:
        return None
    modes = OFFLOAD_MODES[driver]
    if not modes:
        return (f"not supported by {driver}: no xfrmdev_ops, every SA runs in software "
                "(only `ipsec_offload: none` can be met)")
    return " and ".join(modes) + " offload (xfrmdev_ops)"


@dataclass
class Finding:
    """One SA (or policy) as it concerns an interface."""

    what: str            # Sa.label() / Policy.label()
    mode: str            # none / crypto / packet (policies: none / packet)
    why: str = ""        # for mode none: "in software (...)" / "offloaded to eth1"
    policy: bool = False


@dataclass
class Usage:
    """The SAs and policies that concern one interface."""

    sas: List[Finding] = field(default_factory=list)
    policies: List[Finding] = field(default_factory=list)

    def counts(self) -> Dict[str, int]:
        """Health facts: SAs offloaded to this interface / in software."""
        return {"ipsec_sa_offloaded": sum(f.mode != "none" for f in self.sas),
                "ipsec_sa_software": sum(f.mode == "none" for f in self.sas)}

    def current(self, want: Optional[str]) -> Optional[str]:
        """The modes seen, sorted and joined with "+" ("crypto", "crypto+none"),
        None when no SA concerns the interface.  For a packet expectation a
        policy that is not packet-offloaded adds "software-policy"."""
        tokens = {f.mode for f in self.sas}
        if want == "packet" and any(f.mode != "packet" for f in self.policies):
            tokens.add(SOFTWARE_POLICY)
        order = MODES + (SOFTWARE_POLICY,)
        return "+".join(t for t in order if t in tokens) or None

    def problems(self, want: str, ifname: str) -> List[str]:
        """Why `want` is not met, naming each SA or policy at fault."""
        out = []
        if want != "none" and not self.sas:
            out.append(f"no IPsec SA uses {ifname}")
        for f in self.sas:
            if want == "none" and f.mode != "none":
                out.append(f"SA {f.what}: {f.mode} offload on {ifname}, the profile expects none")
            elif want == "crypto" and f.mode == "none":
                out.append(f"SA {f.what}: {f.why}")
            elif want == "packet" and f.mode != "packet":
                out.append(f"SA {f.what}: " + (f.why if f.mode == "none" else
                                               f"crypto offload on {ifname}, not packet offload"))
        if want == "packet":
            out += [f"{f.what}: {f.why}" for f in self.policies if f.mode != "packet"]
        return out


def met(want: str, current: Optional[str]) -> bool:
    tokens = set(current.split("+")) if current else set()
    modes = tokens - {SOFTWARE_POLICY}
    if want == "none":
        return modes <= {"none"}
    if want == "crypto":  # packet offload does the crypto in hardware too
        return bool(modes) and modes <= {"crypto", "packet"}
    return modes == {"packet"} and SOFTWARE_POLICY not in tokens


def _local(src: str, dst: str, direction: Optional[str], mine: set) -> bool:
    if direction == "out":
        return src in mine
    if direction in ("in", "fwd"):
        return dst in mine
    return src in mine or dst in mine


def usage(sas: List[Sa], policies: List[Policy], ifindex: int, ifname: str,
          addresses: set, names: Dict[int, str]) -> Usage:
    """What of `sas` and `policies` concerns interface (ifindex, ifname)
    whose addresses are `addresses`; names maps other ifindexes to names."""
    out = Usage()

    def elsewhere(index: int) -> str:
        return f"offloaded to {names.get(index, f'ifindex {index}')}, not {ifname}"

    for sa in sas:
        off = sa.offload
        if off is not None and off.ifindex == ifindex:
            out.sas.append(Finding(sa.label(), off.mode))
        elif _local(sa.src, sa.dst, sa.dir, addresses):
            why = ("in software (no XFRMA_OFFLOAD_DEV)" if off is None else elsewhere(off.ifindex))
            out.sas.append(Finding(sa.label(), "none", why))
    for pol in policies:
        off = pol.offload
        if off is not None and off.ifindex == ifindex:
            mode = "packet" if off.packet else "none"
            out.policies.append(Finding(pol.label(), mode, "offloaded without packet mode",
                                        policy=True))
        elif any(_local(t.src, t.dst, pol.dir, addresses) for t in pol.templates):
            why = ("in software (no XFRMA_OFFLOAD_DEV): packet offload needs the policy "
                   "offloaded too" if off is None else elsewhere(off.ifindex))
            out.policies.append(Finding(pol.label(), "none", why, policy=True))
    return out


class IpsecView:
    """One NETLINK_XFRM dump of SAs and policies, and the interfaces'
    addresses, kept for the instance's life (one command)."""

    def __init__(self, host):
        self._host = host
        self._data: Optional[Tuple[list, list, Dict[str, set], Dict[int, str]]] = None

    def _load(self):
        if self._data is None:
            with self._host.inet() as inet:
                names = {link["index"]: link["name"] for link in inet.links()}
                addresses: Dict[str, set] = {}
                for a in inet.addresses(names):
                    addresses.setdefault(a["dev"], set()).add(a["local"])
            with self._host.xfrm() as xfrm:
                self._data = (xfrm.sas(), xfrm.policies(), addresses, names)
        return self._data

    def of(self, ifname: str, ifindex: int) -> Usage:
        """Raises OSError (NetlinkError) when the dumps fail."""
        sas, policies, addresses, names = self._load()
        return usage(sas, policies, ifindex, ifname, addresses.get(ifname, set()), names)
