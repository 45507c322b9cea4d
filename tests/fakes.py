"""Fake kernel for recorded NIC state (mlx5, MANA): stands in for hardware no kernel here has; real-kernel behaviour is tested in tests/netns.

A recorded state (tests/golden/states/*.json, or a golden case's
observed.json) says what the host's kernel shows:

    links      list of nictune.host.transports.netlink.rtnl.Link fields (RTM_GETLINK);
               "master": the upper device's name, which the fake links in
               sysfs as the kernel does (X/lower_<name>, <name>/upper_X)
    page_size  the kernel's PAGE_SIZE (Host.page_size), 4096 if left out
    drvinfo    {ifname: DrvInfo fields}                  (ethtool -i)
    features   {ifname: {"active": {bit: bool}, "changeable": [bit, ...]}}
    rings, channels, coalesce, pause
               {ifname: {ethtool CLI name: value, "<name>-max": limit}};
               a device missing from a map has no such driver operation,
               exactly as the kernel leaves it out of the netlink dump
    files      {path relative to /: text}, written under Host.root
               (/proc/sys/..., /sys/class/net/X/device/{vendor,device},
               /etc/nccl.conf); "dirs" lists directories to create
    tree       name of a directory under tests/fixtures/ (a sysfs tree shaped
               like a real host's: class/net/X -> devices/..., infiniband GID
               tables, OFED ecn files, rdma_cm configfs) copied under
               Host.root first, symlinks kept
    dcb        {ifname: {"ets": {...}, "pfc": {...}, "apps": [[sel, prio, proto]],
                "buffer": {...}, "dcbx": bits}}
               per device with dcbnl ops; fields left out take mlx5's
               initial state (ETS vendor TSA, prio_tc 0->1 1->0 i->i, PFC
               off, cable length 7 m, no APP entries, DCBX not host); a
               device missing from the map answers EOPNOTSUPP, as veth and
               MANA do; "buffer_owner": "software" for buffers a buffer write
               already took from the firmware (the default: "firmware")
    tunables   {ifname: {"pfc-prevention-tout": ms}}: ethtool tunables of
               devices whose driver has them (FakeTunables, mlx5's ranges);
               a device missing from the map answers EOPNOTSUPP
    ethtool_stats
               {ifname: {statistic: value | [value, ...]}}  (ethtool -S,
               ETHTOOL_GSTATS), served by FakeCounters; a list holds the
               value at each instant of the fake clock: its n-th item after
               the n-th wait (the last one stays)
    eswitch    {"pci/0000:17:00.0": {"mode": "legacy", "inline_mode": "none",
                "encap": "basic", "ports": ["enp23s0f0np0"], "totalvfs": 8}}:
               devlink devices with an eswitch (FakeDevlink); each port is a
               physical devlink port (the uplink), whose sysfs the fake makes
               (device -> the function, its subsystem, sriov_numvfs and
               sriov_totalvfs); VFs made by writing sriov_numvfs get VF
               settings (FakeVfs: rtnetlink's, as a new VF reads)
    tc_flows   {ifname: n}: offloaded tc filters on a port (OVS's flows)
    quirks     {ifname: {...}} driver behaviour that matters to nictune:
               rings_round_up_pow2 / rings_min (MANA, mlx5), mtu_propagates_to
               (hv_netvsc sets its MANA VF's MTU first), raw_qp (a mana_ib
               RAW QP, DPDK, holds the MANA port's vPort)
    facts      {ifname: {fact: value}}: facts the driver rules
               (nicclass.RULES) ask of a port beyond those the fake derives
    addresses, rules, routes
               lists of dicts as host/transports/netlink/inet.py's
               addresses(), rules() and routes() give them (addresses may
               name only dev, local and prefixlen: IPv4 is the default),
               served and changed by FakeInet; empty when left out, never
               this machine's own

An observed.json may start from a recorded state and change parts of it:
{"base": "cx7-host", ...overlay...}; mappings merge, null deletes, and
"links" entries merge by name.

The fakes behave like the kernel where nictune depends on it: an MTU
outside [min_mtu, max_mtu] is EINVAL, rings or channels above the maximum
are EINVAL, an operation the driver lacks is EOPNOTSUPP, FEATURES_SET
acknowledges fixed bits and reports them back as not applied, MANA rounds
ring sizes up to a power of two, an MTU change resets the interface's
net.ipv6.conf.<if>.mtu as addrconf does, and the fake dcbnl answers like
mlx5's ops (FakeDcb).  What a driver refuses or does by itself in one
eswitch mode is decided by the driver rules nictune's plan consults
(nictune.host.facts.nicclass, "mlx5 in switchdev"), never by a copy: VF
vlan/qos/trust/spoofchk writes on mlx5 in switchdev are EOPNOTSUPP (VLAN 0
is taken and dropped), netdevsim refuses rates there, an mlx5 eswitch
entering switchdev turns hw-tc-offload on on its ports, and an mlx5 uplink
in switchdev with offloaded tc filters keeps hw-tc-offload on when asked
to turn it off (FEATURES_SET reports it unchanged: the kernel answers a
failed ndo_set_features in the reply's diff, not by an errno).  Every
write meets the rules of nicclass.RULES that refuse, each by its decision
(DriverRule.holds with FakeKernel.facts: FakeKernel._refuse_by_rules,
OP_KEYS; set_features per bit): the same objects plan consults.
Tests inject further refusals with FakeKernel.fail().
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
from dataclasses import asdict, fields, replace
from typing import Callable, Optional

from nictune.host.facts import nicclass
from nictune.host.transports.io import LiveIO
from nictune.host.machine import Host
from nictune.host.transports.netlink.dcb import App, Buffer, DcbState, Ets, Pfc
from nictune.host.transports.netlink.devlink import Eswitch, Param, Port
from nictune.host.transports.netlink.drvinfo import DrvInfo
from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.ethtool import Features
from nictune.host.transports.netlink.rtnl import Link
from nictune.host.transports.netlink.vf import VfConfig

HERE = os.path.dirname(os.path.abspath(__file__))
STATES = os.path.join(HERE, "golden", "states")
FIXTURES = os.path.join(HERE, "fixtures")
OPS = ("rings", "channels", "coalesce", "pause")
_LINK_FIELDS = {f.name for f in fields(Link)}
_IPV6_MIN_MTU = 1280


# -- recorded state -----------------------------------------------------------

def load_state(name_or_path: str) -> dict:
    """A recorded state by name (tests/golden/states/NAME.json) or path,
    with its "base" resolved."""
    path = name_or_path
    if not path.endswith(".json"):
        path = os.path.join(STATES, f"{name_or_path}.json")
    with open(path) as f:
        state = json.load(f)
    return resolve(state)


def resolve(state: dict) -> dict:
    state = copy.deepcopy(state)
    base = state.pop("base", None)
    if base is None:
        return state
    return overlay(load_state(base), state)


def overlay(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if key == "comment":
            out[key] = value
        elif key == "links":
            by_name = {link["name"]: link for link in out.get("links", [])}
            for link in value:
                if link.get("delete"):
                    by_name.pop(link["name"], None)
                elif link["name"] in by_name:
                    by_name[link["name"]].update(link)
                else:
                    by_name[link["name"]] = dict(link)
            out["links"] = sorted(by_name.values(), key=lambda l: l["index"])
        elif value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = overlay(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# -- the fake kernel ------------------------------------------------------------

class Fault:
    """A refusal the fake kernel returns for matching writes."""

    def __init__(self, op: str, ifname: Optional[str], error: BaseException,
                 when: Optional[Callable[[dict], bool]] = None, times: Optional[int] = None):
        self.op, self.ifname, self.error, self.when, self.times = op, ifname, error, when, times

    def hit(self, op: str, ifname: str, values: dict) -> bool:
        if op != self.op or (self.ifname is not None and ifname != self.ifname):
            return False
        if self.times is not None and self.times <= 0:
            return False
        if self.when is not None and not self.when(values):
            return False
        if self.times is not None:
            self.times -= 1
        return True


class FakeKernel:
    """The mutable recorded state, shared by FakeRtnl and FakeEthtool."""

    def __init__(self, state: dict, root: str):
        if os.path.isdir(root) and os.listdir(root):
            raise ValueError(f"{root} is not empty: each fake host needs a root of its own")
        self.state = resolve(state)
        self.root = root
        self.links = {}
        for raw in self.state.get("links", []):
            link = Link(**{k: v for k, v in raw.items() if k in _LINK_FIELDS})
            self.links[link.name] = link
        self.drvinfo = {name: DrvInfo(**info) for name, info in self.state.get("drvinfo", {}).items()}
        self.features = {name: {"active": dict(dev["active"]), "changeable": set(dev["changeable"])}
                         for name, dev in self.state.get("features", {}).items()}
        self.ops = {op: copy.deepcopy(self.state.get(op, {})) for op in OPS}
        self.quirks = self.state.get("quirks", {})
        self.dcb = {name: _dcb_state(dev) for name, dev in self.state.get("dcb", {}).items()}
        # Who owns each port's buffers, and the cable length software last
        # sized the lossless headroom for (None: the firmware's sizing):
        # FakeDcb, by nicclass's buffer rules.  No dcbnl message reports either.
        self.buffers = {name: {"owner": dev.get("buffer_owner", "firmware"), "headroom_for_m": None}
                        for name, dev in self.state.get("dcb", {}).items()}
        self.tunables = copy.deepcopy(self.state.get("tunables", {}))
        self.addresses = [full_address(a) for a in self.state.get("addresses", [])]
        self.rules = copy.deepcopy(self.state.get("rules", []))
        self.routes = [full_route(r) for r in self.state.get("routes", [])]
        self.faults: list = []
        self.writes: list = []  # (op, ifname, values) of every write that reached the kernel
        self.on_write: list = []  # callables(op, ifname, values), run before each write
        if self.state.get("tree"):
            shutil.copytree(os.path.join(FIXTURES, self.state["tree"]), root, symlinks=True,
                            dirs_exist_ok=True)
        for d in self.state.get("dirs", []):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        for rel, text in self.state.get("files", {}).items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        for raw in self.state.get("links", []):
            if raw.get("master"):  # net/core/dev.c netdev_adjacent_sysfs_add
                self._adjacent(raw["master"], raw["name"])
        self.eswitch = copy.deepcopy(self.state.get("eswitch", {}))
        self.tc_flows = dict(self.state.get("tc_flows", {}))
        self.vfs: dict = {}  # pf -> {vf number: VfConfig}, as sriov_numvfs made them
        for handle, dev in self.eswitch.items():
            self._eswitch_sysfs(handle, dev)

    def _eswitch_sysfs(self, handle: str, dev: dict) -> None:
        """What devlink_handle() and the sriov family read of an eswitch's
        ports: device -> the function, its subsystem, the SR-IOV files."""
        bus, addr = handle.split("/", 1)
        function = os.path.join(self.root, "sys/devices/fake", addr)
        # In a recorded sysfs tree (a state's "tree") the ports' device links
        # are there already: the function is where they point.
        linked = [os.path.join(self.root, "sys/class/net", port, "device") for port in dev.get("ports", [])]
        if linked and os.path.islink(linked[0]):
            function = os.path.realpath(linked[0])
        os.makedirs(function, exist_ok=True)
        subsystem = os.path.join(self.root, "sys/bus", bus)
        os.makedirs(subsystem, exist_ok=True)
        os.symlink(os.path.relpath(subsystem, function), os.path.join(function, "subsystem"))
        for name, text in (("sriov_numvfs", "0"), ("sriov_totalvfs", str(dev.get("totalvfs", 8)))):
            with open(os.path.join(function, name), "w") as f:
                f.write(text + "\n")
        for port in dev.get("ports", []):
            net = os.path.join(self.root, "sys/class/net", port)
            os.makedirs(net, exist_ok=True)
            device = os.path.join(net, "device")
            if os.path.islink(device):
                continue  # the recorded tree's, to the function above
            if os.path.isdir(device):
                # The recorded files of the device (vendor, device) move to the function.
                shutil.copytree(device, function, dirs_exist_ok=True)
                shutil.rmtree(device)
            os.symlink(os.path.relpath(function, net), device)

    # -- the eswitch (FakeDevlink, FakeVfs, FakeEthtool consult it) --
    def eswitch_of(self, ifname: str):
        """(handle, eswitch state) of the device whose port ifname is, or (None, None)."""
        return next(((h, d) for h, d in self.eswitch.items() if ifname in d.get("ports", [])),
                    (None, None))

    def mode_of(self, ifname: str) -> Optional[str]:
        return (self.eswitch_of(ifname)[1] or {}).get("mode")

    def driver_of(self, ifname: str) -> Optional[str]:
        info = self.drvinfo.get(ifname)
        return info.driver if info else None

    def entered_switchdev(self, handle: str) -> None:
        """What the driver does by itself when its eswitch enters switchdev
        (nicclass.MLX5_HW_TC_SWITCHDEV_ON: hw-tc-offload on on the uplink)."""
        for port in self.eswitch[handle].get("ports", []):
            dev = self.features.get(port)
            if dev is not None and nicclass.hw_tc_kept(self.driver_of(port), None, nicclass.SWITCHDEV):
                dev["active"]["hw-tc-offload"] = True

    def vfs_of(self, pf: str) -> dict:
        """pf's VFs as its sriov_numvfs now says: new ones read as a new VF
        does (no VLAN, trust and spoofchk off, no rates, link auto)."""
        count = int(self.read_file(f"sys/class/net/{pf}/device/sriov_numvfs") or 0)
        vfs = self.vfs.setdefault(pf, {})
        for n in list(vfs):
            if n >= count:
                del vfs[n]
        for n in range(count):
            vfs.setdefault(n, VfConfig(mac="00:00:00:00:00:00", vlan=0, qos=0, spoofchk=False,
                                       trust=False, link_state="auto", min_tx_rate=0, max_tx_rate=0))
        return vfs

    def _adjacent(self, upper: str, lower: str) -> None:
        net = os.path.join(self.root, "sys/class/net")
        for a, b, kind in ((upper, lower, "lower"), (lower, upper, "upper")):
            os.makedirs(os.path.join(net, a), exist_ok=True)
            os.symlink(os.path.join("..", b), os.path.join(net, a, f"{kind}_{b}"))

    # -- test controls --
    def fail(self, op: str, ifname: Optional[str] = None, code: int = errno.EINVAL,
             extack: Optional[str] = None, when=None, times=None, error=None) -> Fault:
        """Make writes of `op` (set_link, set_features, set_rings, ...) fail."""
        fault = Fault(op, ifname, error or NetlinkError(code, extack), when, times)
        self.faults.append(fault)
        return fault

    def _write(self, op: str, ifname: str, values: dict, by_rules: bool = True) -> None:
        """Record a write, after the test's hooks and faults and (unless the
        handle meets them itself, in the driver's order: by_rules=False)
        the driver rules."""
        for hook in self.on_write:
            hook(op, ifname, values)
        for fault in self.faults:
            if fault.hit(op, ifname, values):
                raise fault.error
        if by_rules:
            self._refuse_by_rules(op, ifname, values)
        self.writes.append((op, ifname, copy.deepcopy(values)))

    def facts(self, ifname: str) -> dict:
        """What the driver rules (nicclass.RULES) ask of a port, from this
        fake's state: the same facts plan reads where it can.  A state's
        "facts": {ifname: {...}} adds or overrides (an eswitch mode, ...)."""
        link = self.links.get(ifname)
        out = {"port_up": bool(link is not None and link.up),
               "buffers": self.buffers.get(ifname, {}).get("owner"),
               "raw_qp": bool(self.quirks.get(ifname, {}).get("raw_qp")),
               "offloaded_flows": self.tc_flows.get(ifname, 0)}
        if self.mode_of(ifname) is not None:
            out["eswitch"] = self.mode_of(ifname)
        out.update(self.state.get("facts", {}).get(ifname, {}))
        return out

    def rule_refusing(self, key: str, ifname: str, value) -> Optional[nicclass.DriverRule]:
        """The rule by which the port's driver refuses writing profile key
        `key` = `value` on it, given this fake's facts, or None."""
        return nicclass.refusal(self.driver_of(ifname), key, dict(self.facts(ifname), value=value))

    def _refuse_by_rules(self, op: str, ifname: str, values: dict) -> None:
        """Refuse a write as the driver does, by the same rule objects plan
        consults: any rule of the port's driver with effect "refused" that
        covers a profile key this write sets and holds for the port's facts."""
        for key in OP_KEYS.get(op, lambda v: [])(values):
            value = values.get(key.rsplit(".", 1)[-1]) if isinstance(values, dict) else None
            found = self.rule_refusing(key, ifname, value)
            if found is not None:
                raise NetlinkError(_rule_errno(found), f"{found.why} ({found.source})")

    def snapshot(self) -> dict:
        """Everything a profile could change, for before/after comparisons."""
        files = {}
        for top, _dirs, names in os.walk(self.root):
            for name in names:
                path = os.path.join(top, name)
                if os.path.islink(path):
                    continue
                rel = os.path.relpath(path, self.root)
                with open(path) as f:
                    text = f.read()
                # The kernel formats what /proc/sys and /sys read back; a plain file
                # keeps what was written ("1500" vs "1500\n").
                files[rel] = " ".join(text.split()) if rel.startswith(("proc/sys/", "sys/")) else text
        return {
            "links": {n: asdict(l) for n, l in self.links.items()},
            "features": {n: dict(d["active"]) for n, d in self.features.items()},
            "ops": copy.deepcopy(self.ops),
            "dcb": {n: asdict(d) for n, d in self.dcb.items()},
            "buffers": copy.deepcopy(self.buffers),
            "tunables": copy.deepcopy(self.tunables),
            "files": files,
        }

    def read_file(self, rel: str) -> Optional[str]:
        try:
            with open(os.path.join(self.root, rel)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _link(self, name: str) -> Link:
        link = self.links.get(name)
        if link is None:
            raise NetlinkError(errno.ENODEV)
        return link


class FakeRtnl:
    def __init__(self, kernel: FakeKernel):
        self.k = kernel

    def links(self) -> list:
        return [copy.copy(l) for l in sorted(self.k.links.values(), key=lambda l: l.index)]

    def set_link(self, index, *, mtu=None, txqlen=None, up=None) -> None:
        if not isinstance(index, int) or isinstance(index, bool) or index <= 0:
            raise ValueError(f"invalid interface index: {index!r}")
        link = next((l for l in self.k.links.values() if l.index == index), None)
        if link is None:
            raise NetlinkError(errno.ENODEV)
        values = {k: v for k, v in (("mtu", mtu), ("txqlen", txqlen), ("up", up)) if v is not None}
        if not values:
            return
        self.k._write("set_link", link.name, values)
        if mtu is not None and mtu != link.mtu:
            # hv_netvsc changes its VF's MTU first and fails if the VF refuses.
            lowers = [self.k._link(n) for n in self.k.quirks.get(link.name, {}).get("mtu_propagates_to", [])]
            for dev in lowers + [link]:
                _check_mtu(dev, mtu)
            for dev in lowers + [link]:
                self._set_mtu(dev, mtu)
        if txqlen is not None:
            link.txqlen = txqlen
        if up is not None:
            link.up = bool(up)
            link.operstate = "UP" if up else "DOWN"

    def _set_mtu(self, link: Link, mtu: int) -> None:
        link.mtu = mtu
        # addrconf (NETDEV_CHANGEMTU) resets the interface's IPv6 MTU.
        rel = os.path.join("proc/sys/net/ipv6/conf", link.name, "mtu")
        if mtu >= _IPV6_MIN_MTU and self.k.read_file(rel) is not None:
            with open(os.path.join(self.k.root, rel), "w") as f:
                f.write(f"{mtu}\n")

    def close(self) -> None:
        pass


def _check_mtu(link: Link, mtu: int) -> None:
    if link.min_mtu and mtu < link.min_mtu:
        raise NetlinkError(errno.EINVAL, "mtu less than device minimum")
    if link.max_mtu and mtu > link.max_mtu:
        raise NetlinkError(errno.EINVAL, "mtu greater than device maximum")


class FakeEthtool:
    def __init__(self, kernel: FakeKernel):
        self.k = kernel

    def close(self) -> None:
        pass

    # -- features --
    def features(self) -> dict:
        return {name: Features(active=dict(d["active"]), changeable=set(d["changeable"]))
                for name, d in self.k.features.items() if name in self.k.links}

    def set_features(self, ifname: str, wanted: dict) -> dict:
        self.k._link(ifname)
        dev = self.k.features.get(ifname)
        if dev is None:
            raise NetlinkError(errno.EOPNOTSUPP)
        for name, value in wanted.items():
            if not isinstance(value, bool):
                raise ValueError(f"feature {name} wants a bool, got {value!r}")
            if name not in dev["active"]:
                raise NetlinkError(errno.EINVAL, "bit name not found")
        # A driver rule refusing a bit fails ndo_set_features: FEATURES_SET
        # leaves the bit and says so in its reply (no errno), so the rules are
        # met here, per bit, rather than by _write.
        self.k._write("set_features", ifname, wanted, by_rules=False)
        refused = {}
        for name, value in wanted.items():
            if dev["active"][name] != value and self.k.rule_refusing(f"features.{name}", ifname, value):
                refused[name] = value  # ndo_set_features failed: the bit stays, the reply says so
            elif name in dev["changeable"]:
                dev["active"][name] = value
            elif dev["active"][name] != value:
                refused[name] = value  # ACKed, and listed in the reply's WANTED diff
        return refused

    # -- rings, channels, coalesce, pause --
    def _get(self, op: str) -> dict:
        return {n: dict(v) for n, v in self.k.ops[op].items() if n in self.k.links}

    def _set(self, op: str, ifname: str, values: dict) -> None:
        self.k._link(ifname)
        dev = self.k.ops[op].get(ifname)
        if dev is None:
            raise NetlinkError(errno.EOPNOTSUPP)
        new = {}
        for name, value in values.items():
            if name.endswith("-max"):
                raise ValueError(f"not a settable parameter: {name!r}")
            if name not in dev:
                if op in ("rings", "channels"):  # the device's maximum for it is 0
                    raise NetlinkError(errno.EINVAL, f"requested {_WHAT[op]} exceeds maximum")
                raise NetlinkError(errno.EOPNOTSUPP, "unsupported parameter")
            # As Ethtool._set_values: bools for flags, u32 for the rest.
            if isinstance(dev[name], bool) != isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}: bad value {value!r}")
            limit = dev.get(f"{name}-max")
            if limit is not None and value > limit:
                raise NetlinkError(errno.EINVAL, f"requested {_WHAT[op]} exceeds maximum")
            new[name] = value
        quirks = self.k.quirks.get(ifname, {})
        if op == "rings":
            for name, value in new.items():
                least = quirks.get("rings_min", {}).get(name, 0)
                if value < least:  # mana_set_ringparam
                    raise NetlinkError(errno.EINVAL, f"{name}:{value} less than the min:{least}")
        self.k._write(f"set_{op}", ifname, values)
        if op == "rings":
            for name, value in new.items():
                if quirks.get("rings_round_up_pow2"):
                    value = 1 << (value - 1).bit_length()
                new[name] = value
        dev.update(new)

    def rings(self):
        return self._get("rings")

    def set_rings(self, ifname, values):
        self._set("rings", ifname, values)

    def channels(self):
        return self._get("channels")

    def set_channels(self, ifname, values):
        self._set("channels", ifname, values)

    def coalesce(self):
        return self._get("coalesce")

    def set_coalesce(self, ifname, values):
        self._set("coalesce", ifname, values)

    def pause(self):
        return self._get("pause")

    def set_pause(self, ifname, values):
        self._set("pause", ifname, values)


_WHAT = {"rings": "ring size", "channels": "channel count"}

# The profile keys each fake write sets (FakeKernel._refuse_by_rules): a
# fake handle that writes something new adds its op here, and every rule
# declared in nicclass.RULES for those keys then applies to it.  Feature
# bits are met per bit in FakeEthtool.set_features (FEATURES_SET answers
# in its reply, not by an errno).
OP_KEYS = {
    "set_rings": lambda values: [f"rings.{k}" for k in values],
    "set_channels": lambda values: [f"channels.{k}" for k in values],
    "set_coalesce": lambda values: [f"coalesce.{k}" for k in values],
    "set_pause": lambda values: [f"pause.{k}" for k in values],
    "set_link": lambda values: [k for k in values if k in ("mtu", "txqlen")],
    "set_pfc": lambda values: ["roce.pfc", "roce.pfc_cable_length"],
    "set_ets": lambda values: ["roce.ets.prio_tc", "roce.ets.tc_bw", "roce.ets.tc_tsa"],
    "set_buffer": lambda values: ["roce.buffer.prio2buffer", "roce.buffer.size"],
    "add_apps": lambda values: ["roce.dscp_map"],
    "del_apps": lambda values: ["roce.dscp_map"],
    "set_dcbx": lambda values: ["roce.dcbx"],
    "set_tunable": lambda values: ["roce.pfc_prevention_timeout"],
    "set_eswitch": lambda values: [f"eswitch.{k}" for k in values],
    "set_vf": lambda values: [f"sriov.vfs.{values['vf']}.{k}" for k in values if k != "vf"],
}


def _rule_errno(found) -> int:
    """The errno a rule's driver answers, as its `why` names it (EBUSY,
    EINVAL, ...); EOPNOTSUPP when it names none."""
    for name in ("EBUSY", "EINVAL", "EPERM", "EOPNOTSUPP"):
        if name in found.why:
            return getattr(errno, name)
    return errno.EOPNOTSUPP


def _dcb_state(recorded: dict) -> DcbState:
    """mlx5's initial DCB state (en_dcbnl.c mlx5e_ets_init: vendor TSA,
    prio_tc 0->1, 1->0, the rest i->i; PFC off; mlx5e_dcbnl_initialize:
    cable length MLX5E_DEFAULT_CABLE_LEN 7, DCBX caps CEE | IEEE without
    HOST, as when the firmware runs DCBX) with the recorded fields on top.
    The default buffers are a ConnectX's as mlnx_qos showed them in a
    published reading (every priority in buffer 1 of 262016 bytes; the
    total was not shown)."""
    ets = Ets(tc_tx_bw=[100] * 8, tc_rx_bw=[0] * 8, tc_tsa=[255] * 8,
              prio_tc=[1, 0, 2, 3, 4, 5, 6, 7], tc_reco_bw=[0] * 8, tc_reco_tsa=[0] * 8,
              reco_prio_tc=[0] * 8, ets_cap=8)
    pfc = Pfc(pfc_cap=8, pfc_en=0, delay=7, requests=[0] * 8, indications=[0] * 8)
    buffer = Buffer(prio2buffer=[1] * 8, buffer_size=[0, 262016, 0, 0, 0, 0, 0, 0], total_size=0)
    ets = replace(ets, **recorded.get("ets", {}))
    pfc = replace(pfc, **recorded.get("pfc", {}))
    buffer = replace(buffer, **recorded.get("buffer", {}))
    apps = [App(*a) for a in recorded.get("apps", [])]
    return DcbState(ets=ets, pfc=pfc, apps=apps, maxrate=[0] * 8, trust=None,
                    dcbx=recorded.get("dcbx", 0x4 | 0x8), buffer=buffer)


class FakeDcb:
    """dcbnl as mlx5 answers it (drivers/net/ethernet/mellanox/mlx5/core/
    en_dcbnl.c): ETS with prio_tc >= 8 or ETS-class bandwidth other than 0
    or 100 is EINVAL; APP entries other than DSCP are EINVAL; a new DSCP
    entry replaces the old one for that DSCP; deleting an absent entry is
    ENOENT; a PFC delay (cable length) of 0 or >= 1000 is silently kept as
    it was (mlx5e_dcbnl_ieee_setpfc); buffer sizes are kept in 128-byte
    cells, rounding down, and a zero size for a buffer that a PFC priority
    maps to is EINVAL (en/port_buffer.c); the port buffers are the
    firmware's until a buffer write hands them to software for good, and
    the cable length re-sizes the headroom only then (nicclass's
    MLX5_CABLE_LENGTH_NO_EFFECT and MLX5_BUFFER_WRITE_ONE_WAY: FakeKernel.
    buffers); SDCBX takes a mode with HOST, or
    0 for firmware control, and refuses LLD_MANAGED (mlx5e_dcbnl_setdcbx).
    Devices without dcbnl ops answer EOPNOTSUPP."""

    def __init__(self, kernel: FakeKernel):
        self.k = kernel

    def close(self) -> None:
        pass

    def _dev(self, ifname: str) -> DcbState:
        self.k._link(ifname)
        dev = self.k.dcb.get(ifname)
        if dev is None:
            raise NetlinkError(errno.EOPNOTSUPP)
        return dev

    def get(self, ifname: str) -> DcbState:
        return copy.deepcopy(self._dev(ifname))

    def set_ets(self, ifname: str, ets: Ets) -> None:
        dev = self._dev(ifname)
        if any(tc >= 8 for tc in ets.prio_tc):
            raise NetlinkError(errno.EINVAL)
        if sum(bw for bw, tsa in zip(ets.tc_tx_bw, ets.tc_tsa) if tsa == 2) not in (0, 100):
            raise NetlinkError(errno.EINVAL)
        self.k._write("set_ets", ifname, asdict(ets))
        dev.ets = copy.deepcopy(ets)
        # mlx5e_build_tc_tx_bw: strict and vendor classes get 100% in the
        # port register, and getets reports that.
        dev.ets.tc_tx_bw = [bw if tsa == 2 else 100 for bw, tsa in zip(ets.tc_tx_bw, ets.tc_tsa)]

    def set_pfc(self, ifname: str, pfc: Pfc) -> None:
        dev = self._dev(ifname)
        self.k._write("set_pfc", ifname, asdict(pfc))
        delay = pfc.delay if 0 < pfc.delay < 1000 else dev.pfc.delay
        dev.pfc = replace(copy.deepcopy(pfc), delay=delay)
        buffers = self.k.buffers[ifname]
        # Stored and read back either way; the headroom follows it only
        # while software owns the buffers (nicclass.MLX5_CABLE_LENGTH_NO_EFFECT).
        if not nicclass.MLX5_CABLE_LENGTH_NO_EFFECT.applies({"buffers": buffers["owner"]}):
            buffers["headroom_for_m"] = delay

    def set_buffer(self, ifname: str, buffer: Buffer) -> None:
        dev = self._dev(ifname)
        lossless = {buffer.prio2buffer[p] for p in range(8) if dev.pfc.pfc_en >> p & 1}
        if any(buffer.buffer_size[b] == 0 for b in lossless):
            raise NetlinkError(errno.EINVAL)
        cells = [size // 128 * 128 for size in buffer.buffer_size]
        if list(buffer.prio2buffer) == dev.buffer.prio2buffer and cells == dev.buffer.buffer_size:
            return  # mlx5e_dcbnl_setbuffer: nothing changed, nothing written
        self.k._write("set_buffer", ifname, asdict(buffer))
        dev.buffer = Buffer(list(buffer.prio2buffer), cells, dev.buffer.total_size)
        # nicclass.MLX5_BUFFER_WRITE_ONE_WAY: software owns them from now on,
        # the headroom sized for the cable length; nothing hands them back.
        self.k.buffers[ifname] = {"owner": "software", "headroom_for_m": dev.pfc.delay}

    def set_dcbx(self, ifname: str, mode: int) -> None:
        dev = self._dev(ifname)
        if mode & 0x2 or (mode and not mode & 0x1):
            raise NetlinkError(errno.EINVAL, "the driver refused the DCBX mode")
        self.k._write("set_dcbx", ifname, {"mode": mode})
        dev.dcbx = (dev.dcbx & ~0x1) if mode == 0 else mode

    def add_apps(self, ifname: str, apps: list) -> None:
        dev = self._dev(ifname)
        if any(a.selector != 5 for a in apps):
            raise NetlinkError(errno.EINVAL)
        self.k._write("add_apps", ifname, [asdict(a) for a in apps])
        for app in apps:
            dev.apps = [a for a in dev.apps if (a.selector, a.protocol) != (5, app.protocol)]
            dev.apps.append(app)

    def del_apps(self, ifname: str, apps: list) -> None:
        dev = self._dev(ifname)
        if any(a not in dev.apps for a in apps):
            raise NetlinkError(errno.ENOENT)
        self.k._write("del_apps", ifname, [asdict(a) for a in apps])
        dev.apps = [a for a in dev.apps if a not in apps]


class FakeTunables:
    """ethtool tunables as mlx5 answers them (en_ethtool.c
    mlx5e_set_pfc_prevention_tout): pfc-prevention-tout 0 (off), 80-8000
    ms, or 0xffff (auto), which reads back as 100; anything else EINVAL.
    Devices without tunables answer EOPNOTSUPP."""

    def __init__(self, kernel: FakeKernel):
        self.k = kernel

    def __enter__(self) -> "FakeTunables":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass

    def _dev(self, ifname: str) -> dict:
        self.k._link(ifname)
        dev = self.k.tunables.get(ifname)
        if dev is None:
            raise NetlinkError(errno.EOPNOTSUPP)
        return dev

    def get(self, ifname: str, tunable_id: int) -> int:
        return self._dev(ifname)["pfc-prevention-tout"]

    def set(self, ifname: str, tunable_id: int, value: int) -> None:
        dev = self._dev(ifname)
        ms = 100 if value == 0xFFFF else value
        if ms != 0 and not 80 <= ms <= 8000:
            raise NetlinkError(errno.EINVAL)
        self.k._write("set_tunable", ifname, {"pfc-prevention-tout": value})
        dev["pfc-prevention-tout"] = ms


class FakeDevlink:
    """devlink over the recorded eswitches (FakeKernel.eswitch): modes,
    each device's physical ports; no device info (EOPNOTSUPP)."""

    def __init__(self, kernel: FakeKernel):
        self.k = kernel

    def close(self) -> None:
        pass

    def devices(self) -> list:
        return sorted(self.k.eswitch)

    def _dev(self, handle: str) -> dict:
        dev = self.k.eswitch.get(handle)
        if dev is None:
            raise NetlinkError(errno.ENODEV)
        return dev

    def eswitch(self, handle: str) -> Eswitch:
        dev = self._dev(handle)
        return Eswitch(dev.get("mode"), dev.get("inline_mode"), dev.get("encap"))

    def set_eswitch(self, handle: str, mode=None, inline_mode=None, encap=None) -> None:
        dev = self._dev(handle)
        values = {k: v for k, v in (("mode", mode), ("inline_mode", inline_mode), ("encap", encap))
                  if v is not None}
        self.k._write("set_eswitch", handle, values)
        entering = mode == nicclass.SWITCHDEV and dev.get("mode") != mode
        dev.update(values)
        if entering:
            self.k.entered_switchdev(handle)

    def ports(self) -> list:
        return [Port(handle, n, "physical", port, n, None, None)
                for handle, dev in sorted(self.k.eswitch.items())
                for n, port in enumerate(dev.get("ports", []))]

    def info(self, handle: str):
        raise NetlinkError(errno.EOPNOTSUPP)

    # mlx5's permanent params (lib/nv_param.c mlx5_nv_param_devlink_params):
    # their values are the stored (next boot) ones; sriov_totalvfs in sysfs
    # keeps what runs until the fake is "rebooted" by its test.
    NV_PARAMS = (("enable_sriov", "bool"), ("total_vfs", "u32"), ("cqe_compress_type", "string"))

    def _nv(self, handle: str) -> dict:
        dev = self._dev(handle)
        if not handle.startswith("pci/"):
            return {}
        return dev.setdefault("nv_params", {"enable_sriov": True, "total_vfs": dev.get("totalvfs", 8),
                                            "cqe_compress_type": "balanced"})

    def params(self, handle: str) -> list:
        nv = self._nv(handle)
        return [Param(handle, name, kind, {"permanent": nv[name]})
                for name, kind in self.NV_PARAMS if name in nv]

    def set_param(self, handle: str, name: str, kind: str, cmode: str, value) -> None:
        nv = self._nv(handle)
        if name not in nv or cmode != "permanent":
            raise NetlinkError(errno.EOPNOTSUPP)
        # mlx5_devlink_total_vfs_validate: "Max allowed by device is %u"
        if name == "total_vfs" and value > self._dev(handle).get("max_vfs_per_pf", 127):
            raise NetlinkError(errno.EINVAL)
        self.k._write("set_param", handle, {name: value})
        nv[name] = value


# rtnetlink's do_setvfinfo order: a refusal stops the request there, with
# what came before it written.
_VF_WRITE_ORDER = ("mac", "vlan", "rate", "spoofchk", "link_state", "trust")


class FakeVfs:
    """VF settings (netlink/vf.py Vfs) of the recorded eswitches' PFs, as
    sriov_numvfs made them; refusals by the PF's driver rules in its
    eswitch mode (FakeKernel._refuse_by_rules, one attribute group at a
    time in rtnetlink's order)."""

    def __init__(self, kernel: FakeKernel):
        self.k = kernel

    def close(self) -> None:
        pass

    def all(self) -> dict:
        out = {}
        for dev in self.k.eswitch.values():
            for pf in dev.get("ports", []):
                vfs = self.k.vfs_of(pf)
                if vfs:
                    out[pf] = {n: copy.copy(cfg) for n, cfg in vfs.items()}
        return out

    def set(self, index: int, vf: int, cfg: VfConfig) -> None:
        link = next((l for l in self.k.links.values() if l.index == index), None)
        if link is None:
            raise NetlinkError(errno.ENODEV)
        now = self.k.vfs_of(link.name).get(vf)
        if now is None:
            raise NetlinkError(errno.EINVAL)
        driver, mode = self.k.driver_of(link.name), self.k.mode_of(link.name)
        self.k._write("set_vf", link.name, {"vf": vf, **asdict(cfg)}, by_rules=False)
        for what in _VF_WRITE_ORDER:
            attrs = {"vlan": ("vlan", "qos"), "rate": ("min_tx_rate", "max_tx_rate")}.get(what, (what,))
            values = {a: getattr(cfg, a) for a in attrs}
            if all(v is None for v in values.values()):
                continue
            if what == "vlan" and nicclass.vf_vlan_ignored(driver, cfg.vlan, mode):
                continue  # mlx5 takes VLAN 0 (any qos) in switchdev and does nothing with it
            self.k._refuse_by_rules("set_vf", link.name, {"vf": vf, **values})
            for attr, value in values.items():
                setattr(now, attr, value or 0 if attr in ("vlan", "qos", "min_tx_rate",
                                                          "max_tx_rate") else value)


class FixtureHost(Host):
    """A real Host over a file tree (a /sys fixture) whose interface list
    the test gives: for code that reads files, not netlink."""

    def __init__(self, root: str, interfaces: list):
        super().__init__(root)
        self._interfaces = interfaces

    def interfaces(self):
        return self._interfaces


class FakeIO(LiveIO):
    """The fake host's port (host/transports/io.py): files are the real ones under the
    test's root; the page size is the fake kernel's; the clock is a clock of
    its own, which a wait moves at once.  Sockets are the running kernel's,
    as they always were: the fake kernel's handles (rtnl, ethtool, dcb,
    tunables) stand in for the families that have one, and the others (the
    MACsec and XFRM handles, devlink) see this machine's namespace.  """

    def __init__(self, kernel: FakeKernel):
        self.k = kernel
        self.clock = 1000.0
        self.waits: list = []  # seconds of each wait asked for

    def page_size(self) -> int:
        return self.k.state.get("page_size", 4096)

    def now(self) -> float:
        return self.clock

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock += seconds


class FakeCounters:
    """The recorded ethtool statistics, and the fake port's clock (health.
    CounterSource's methods): waiting moves the clock and the counters to
    their next instant at once, so a test sees a counter rise between two
    reads without sleeping."""

    def __init__(self, kernel: FakeKernel, io: FakeIO):
        self.k, self.io = kernel, io

    @property
    def waits(self) -> list:
        return self.io.waits

    def ethtool_stats(self, ifname: str) -> dict:
        instant = len(self.waits)
        return {name: (value[min(instant, len(value) - 1)] if isinstance(value, list) else value)
                for name, value in self.k.state.get("ethtool_stats", {}).get(ifname, {}).items()}

    def now(self) -> float:
        return self.io.now()

    def sleep(self, seconds: float) -> None:
        self.io.sleep(seconds)


def full_address(a: dict) -> dict:
    """An address as netlink/inet.py's addresses() gives it, from what a
    state names (dev, local, prefixlen): IPv4, permanent, no extras."""
    return {"family": 4, "peer": None, "broadcast": None, "label": None, "scope": 0,
            "flags": 0x80, "metric": None, "proto": None, "preferred": None, "valid": None, **a}


def full_route(r: dict) -> dict:
    """A route as netlink/inet.py's routes() gives it, from the fields a
    state or a write names: single path, no extras."""
    return {"family": 4, "dst": None, "dst_len": 0, "src": None, "src_len": 0, "tos": 0,
            "table": 254, "proto": 4, "scope": 0, "type": 1, "onlink": False, "dev": None,
            "gateway": None, "via": None, "metric": None, "prefsrc": None, "metrics": None,
            "flow": None, "pref": None, "expires": None, "nexthops": None, "nh_id": None,
            "encap": False, **r}


class FakeInet:
    """Addresses, rules and routes (netlink/inet.py's Inet) of a FakeKernel:
    an exact duplicate is EEXIST and a delete of what is not there ENOENT,
    as rtnetlink answers."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass

    def links(self):
        return [{"index": link.index, "name": link.name, "mtu": link.mtu, "up": link.up,
                 "kind": link.kind, "lower": None, "master": None}
                for link in self.kernel.links.values()]

    def addresses(self, names):
        return copy.deepcopy(self.kernel.addresses)

    def rules(self):
        return copy.deepcopy(self.kernel.rules)

    def routes(self, names):
        return copy.deepcopy(self.kernel.routes)

    def add_address(self, a: dict, index, lifetime=None) -> None:
        self._add(self.kernel.addresses, full_address(
            {"dev": self._name(index), "local": a["local"], "prefixlen": a["prefixlen"]}))

    def delete_address(self, a: dict, index) -> None:
        self._delete(self.kernel.addresses, full_address(
            {"dev": self._name(index), "local": a["local"], "prefixlen": a["prefixlen"]}))

    def _name(self, index) -> str:
        return next(link.name for link in self.kernel.links.values() if link.index == index)

    def add_rule(self, r: dict) -> None:
        self._add(self.kernel.rules, dict(r))

    def delete_rule(self, r: dict) -> None:
        self._delete(self.kernel.rules, r)

    def add_route(self, r: dict, index, expires=None) -> None:
        self._add(self.kernel.routes, full_route(r))

    def delete_route(self, r: dict, index) -> None:
        self._delete(self.kernel.routes, full_route(r))

    def _add(self, table: list, item: dict) -> None:
        if item in table:
            raise OSError(errno.EEXIST, "File exists")
        self.kernel.writes.append(("inet", item.get("dev"), item))
        table.append(item)

    def _delete(self, table: list, item: dict) -> None:
        if item not in table:
            raise OSError(errno.ENOENT, "No such file or directory")
        self.kernel.writes.append(("inet-delete", item.get("dev"), item))
        table.remove(item)


class FakeHost(Host):
    """nictune's Host over a FakeKernel; files live under `root`."""

    def __init__(self, state, root: str):
        super().__init__(str(root))
        if isinstance(state, str):
            state = load_state(state)
        self.kernel = FakeKernel(state, str(root))
        self.io = FakeIO(self.kernel)
        self._rtnl = FakeRtnl(self.kernel)
        self._ethtool = FakeEthtool(self.kernel)
        self._dcb = FakeDcb(self.kernel)
        self._fake_devlink = FakeDevlink(self.kernel)
        self.counter_source = FakeCounters(self.kernel, self.io)  # health.counter_source()

    def dcb(self):
        return self._dcb

    def tunables(self):
        return FakeTunables(self.kernel)

    def rtnl(self):
        return self._rtnl

    def inet(self):
        return FakeInet(self.kernel)

    def ethtool(self):
        return self._ethtool

    # A recorded state without eswitches leaves devlink and VF settings to
    # this machine's kernel, as the other sockets (FakeIO).
    def devlink(self):
        return self._fake_devlink if self.kernel.eswitch else super().devlink()

    def vfs(self):
        return FakeVfs(self.kernel) if self.kernel.eswitch else super().vfs()

    def _drvinfo(self, ifname: str):
        return self.kernel.drvinfo.get(ifname)

    def close(self) -> None:  # the fakes stay usable after a run
        pass


def cx7_rails_state(**extra) -> dict:
    """cx7-host with both ConnectX-7 rails up, its sysfs tree (GID tables,
    rdma_cm configfs, OFED ecn files) and dcbnl in mlx5's initial state;
    `extra` replaces top-level parts of the state."""
    ports = ("enp23s0f0np0", "enp23s0f1np1")
    state = load_state("cx7-host")
    state.update({"tree": "mlx5-host", "dcb": {p: {} for p in ports}})
    state["links"] = [dict(link, up=True) if link["name"] in ports else link for link in state["links"]]
    state.update(extra)
    return state


def cx7_eswitch_state(mode: str = "legacy", **extra) -> dict:
    """cx7-host with each ConnectX-7 port the uplink of a devlink eswitch in
    `mode` (pci/0000:17:00.0 and .1, as the ports' bus addresses): the host
    the ASAP2 profile plans on; `extra` replaces top-level parts."""
    state = load_state("cx7-host")
    state["eswitch"] = {f"pci/0000:17:00.{n}": {"mode": mode, "inline_mode": "none", "encap": "basic",
                                                "ports": [port]}
                        for n, port in enumerate(("enp23s0f0np0", "enp23s0f1np1"))}
    state.update(extra)
    return state
# -- MACsec (drivers/net/macsec.c, with the NIC classes' driver rules) ---------


class FakeMacsec:
    """The MACsec handle of a FakeHost (host/transports/netlink/macsec.Macsec's
    methods), as strict as the kernel where nictune relies on it: offload
    asked of a parent whose driver's rule refuses it is EOPNOTSUPP with that
    rule's text (nicclass.macsec_offload_refused: the rule plan and lint
    ask); an SA on an XPN link needs SSCI and salt and takes a 64-bit PN, a
    non-XPN one a 32-bit PN (macsec_add_txsa: EINVAL).  The kernel never
    returns keys: neither does this (it keeps KEYIDs only)."""

    def __init__(self, host: "FakeHost"):
        self.host = host
        self.k = host.kernel
        if not hasattr(self.k, "macsec"):
            self.k.macsec = {}  # ifindex -> {"link": MacsecLink, "secy": SecY}
        self.sent: list = []  # (command, ifindex, an, pn, xpn given) of every SA written

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def close(self) -> None:
        pass

    def _refuse_offload(self, parent: int, mode: Optional[str]) -> None:
        from nictune.host.facts.nicclass import macsec_offload_refused

        driver = next((i.driver for i in self.host.interfaces() if i.index == parent), None)
        found = macsec_offload_refused(driver, mode)
        if found is not None:
            raise NetlinkError(errno.EOPNOTSUPP, f"{found.why} ({found.source})")

    def links(self) -> list:
        return [copy.deepcopy(e["link"]) for e in self.k.macsec.values()]

    def secys(self) -> dict:
        return {i: copy.deepcopy(e["secy"]) for i, e in self.k.macsec.items()}

    def add_link(self, parent: int, name: str, *, sci=None, encrypt=None, offload=None,
                 cipher=None, icv_len=None, port=None) -> None:
        from nictune.host.transports.netlink.macsec import MacsecLink, SecY, sci_text

        self._refuse_offload(parent, offload)
        if any(e["link"].name == name for e in self.k.macsec.values()):
            raise NetlinkError(errno.EEXIST, "File exists")
        index = 1000 + len(self.k.macsec)
        cipher = cipher or "gcm-aes-128"
        link = MacsecLink(index=index, name=name, link=parent, up=False, mtu=None,
                          sci=sci_text(sci) if sci else None,
                          port=int.from_bytes(sci[6:8], "big") if sci else port,
                          cipher=cipher, icv_len=icv_len or 16,
                          encrypt=bool(encrypt), offload=offload or "off")
        secy = SecY(ifindex=index, sci=link.sci, cipher=cipher, icv_len=link.icv_len,
                    encrypt=link.encrypt, validate="strict", encoding_sa=0, offload=link.offload)
        self.k.macsec[index] = {"link": link, "secy": secy}

    def del_link(self, index: int) -> None:
        self.k.macsec.pop(index)

    def set_up(self, index: int) -> None:
        self.k.macsec[index]["link"].up = True

    def set_offload(self, index: int, mode: str) -> None:
        entry = self.k.macsec[index]
        self._refuse_offload(entry["link"].link, mode)
        if entry["link"].up and entry["link"].offload != mode:  # macsec_update_offload
            raise NetlinkError(errno.EBUSY, "Device or resource busy")
        entry["link"].offload = entry["secy"].offload = mode

    def add_rxsc(self, index: int, sci: bytes) -> None:
        from nictune.host.transports.netlink.macsec import RxSc

        self.k.macsec[index]["secy"].rx_scs.append(RxSc(sci=sci.hex(), active=True))

    def add_sa(self, index: int, an: int, pn: int, keyid: bytes, key: bytearray,
               rx_sci: Optional[bytes] = None, xpn: Optional[tuple] = None) -> None:
        from nictune.host.transports.netlink.macsec import KEY_LENGTHS, XPN, Sa, key_id

        secy = self.k.macsec[index]["secy"]
        is_xpn = secy.cipher in XPN
        if len(key) != KEY_LENGTHS[secy.cipher] or (xpn is not None) != is_xpn or not (
                1 <= pn <= (2 ** 64 - 1 if is_xpn else 2 ** 32 - 1)):
            raise NetlinkError(errno.EINVAL, "Invalid argument")
        self.sent.append(("rx" if rx_sci else "tx", index, an, pn, xpn is not None))
        sa = Sa(an=an, active=True, pn=pn, keyid=key_id(keyid).hex(),
                ssci=xpn[0] if xpn else None)
        if rx_sci is None:
            secy.tx_sas.append(sa)
        else:
            sc = next(c for c in secy.rx_scs if c.sci == rx_sci.hex())
            sc.sas.append(sa)

    def send_traffic(self, index: int, packets: int) -> None:
        """What traffic does to the SAs: every active SA's next PN moves on."""
        secy = self.k.macsec[index]["secy"]
        for sa in secy.tx_sas + [s for sc in secy.rx_scs for s in sc.sas]:
            sa.pn += packets


def _fake_host_macsec(self) -> FakeMacsec:
    # One handle per host, so that a test sees what the family wrote.
    if not hasattr(self, "_macsec"):
        self._macsec = FakeMacsec(self)
    return self._macsec


FakeHost.macsec = _fake_host_macsec
