"""The host being tuned, as the knobs see it: sockets, file root, facts.

The agent always runs inside the network namespace it tunes (`ip netns exec`
for local namespaces, sshd for remote hosts), so netlink, /proc/sys and
/sys all show the right devices without any setns juggling here.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune.host.transports.io import LiveIO
from nictune.host.text import shown_name
from nictune.host.validate import IFNAME, WORDS, matches


@dataclass
class Interface:
    """Facts used by `match:` selectors and shown by `nictune show`."""

    name: str
    index: int
    driver: Optional[str]
    mac: Optional[str]
    pci_id: Optional[str]  # "vendor:device", e.g. "15b3:1021" for ConnectX-7
    bus_info: Optional[str]
    firmware: Optional[str]
    # Switch ports (representors, uplinks): /sys/class/net/X/phys_port_name
    # ("p0", "pf0vf3") and phys_switch_id (hex), and the devlink port
    # flavour of the port whose netdev this is (physical, pcipf, pcivf).
    phys_port_name: Optional[str] = None
    phys_switch_id: Optional[str] = None
    flavour: Optional[str] = None
    # For `match: {vf_of: ENTRY}` (vfs_of below).  The devlink port's
    # instance and PCI PF and VF numbers (a pcivf representor: pf, vf; a
    # pcipf one: pf); the PCI address of the netdev's device, and
    # for a VF netdev the PF's (device/physfn) and its VF index there (the
    # PF's device/virtfnN link that leads to it).
    port_handle: Optional[str] = None  # devlink instance, "pci/0000:03:00.0"
    port_pf: Optional[int] = None
    port_vf: Optional[int] = None
    pci_address: Optional[str] = None
    physfn: Optional[str] = None
    vf_index: Optional[int] = None
    # The drivers of the devices enslaved to this one (its lower devices:
    # /sys/class/net/X/lower_*), sorted; None when it has none.  An Azure
    # hv_netvsc NIC's is its Accelerated Networking VF's: mana, or mlx5_core
    # / mlx4_en on older hardware, whose fabric carries less (MTU 3900).
    lower_driver: Optional[tuple] = None

    def matches(self, selectors: dict) -> bool:
        """All given selectors must match; a list means any of its items.
        vf_of and vfs are not facts of one interface: vfs_of() does them."""
        for field, wanted in selectors.items():
            if field in VF_SELECTORS:
                continue
            options = wanted if isinstance(wanted, list) else [wanted]
            have = getattr(self, field)
            if have is None:
                return False
            if field in ("name", "phys_port_name"):
                ok = any(fnmatch.fnmatchcase(have, pat) for pat in options)
            elif field == "lower_driver":  # any lower device of a wanted driver
                ok = any(d in options for d in have)
            elif field in ("mac", "pci_id", "phys_switch_id"):  # hex: any case
                ok = have.lower() in {o.lower() for o in options}
            else:
                ok = have in options
            if not ok:
                return False
        return True


VF_SELECTORS = ("vf_of", "vfs")


def _eswitch_of(pf: Interface) -> Optional[tuple]:
    """What a representor of one of pf's VFs shares with pf: the devlink
    instance, the switch id and, for a pcipf port, the PF number.  An uplink
    (physical port) has no PF number in devlink, and its port number is not
    one (netdevsim: port p1, VFs pf0vfN); its instance is: one per PF on
    mlx5 (two PFs of a card share the switch id), one per device on
    netdevsim, whose VFs are the device's."""
    if pf.flavour not in ("physical", "pcipf") or not pf.port_handle or not pf.phys_switch_id:
        return None
    return (pf.port_handle, pf.phys_switch_id.lower(), pf.port_pf if pf.flavour == "pcipf" else None)


def vfs_of(pfs: list, interfaces: list, vfs=None) -> list:
    """`match: {vf_of: ENTRY, vfs: [...]}`: the interfaces that stand for a
    VF of one of `pfs` (what ENTRY matched), in `interfaces` order:

    - VF representors: devlink port flavour pcivf on the devlink instance
      of one of pfs, with its switch id (phys_switch_id) and, when that PF
      is a pcipf port (an eswitch manager's view of a PF), its PF number;
    - VF netdevs: device/physfn is the PCI device of one of pfs.

    vfs (an int or a list of them) keeps only those VF numbers: the
    representor's devlink VF number (pfNvfM), the VF netdev's index in its
    PF's virtfnN links.  Interfaces are those of when the plan runs: VFs and
    representors that the same apply makes are not there yet, and apply
    writes only what its plan showed; the next plan matches them."""
    wanted = None if vfs is None else set(vfs if isinstance(vfs, list) else [vfs])
    switches = {_eswitch_of(p) for p in pfs} - {None}
    pcis = {p.pci_address for p in pfs if p.pci_address}
    found = []
    for i in interfaces:
        if i.flavour == "pcivf" and i.port_handle and i.phys_switch_id and (
                (i.port_handle, i.phys_switch_id.lower(), None) in switches
                or (i.port_handle, i.phys_switch_id.lower(), i.port_pf) in switches):
            number = i.port_vf
        elif i.physfn is not None and i.physfn in pcis:
            number = i.vf_index
        else:
            continue
        if wanted is None or number in wanted:
            found.append(i)
    return found


def _skipped(name) -> str:
    shown = shown_name(name)
    escaped = " (escaped)" if shown != f"'{name}'" else ""
    return (f"skipped interface {shown}{escaped}: a name nictune does not handle "
            f"(it takes {WORDS[IFNAME]})")


class Host:
    """Lazily opened kernel handles, shared by all knob families of one run."""

    def __init__(self, root: str = "/", io: Optional[LiveIO] = None):
        self.root = root
        # The one door to the kernel (host/transports/io.py): every file, socket, ioctl
        # and key file the families use goes through it.
        self.io = io or LiveIO()
        # The network namespace the agent was started in by `ip netns exec`,
        # as the request names it (None: not one): its /etc/netns/NAME files.
        self.netns: Optional[str] = None
        # The state directory of the command (the resident agent's LLDP
        # frames are there) and how long a verify may wait for an LLDP
        # frame on a silent rail (--lldp-wait; knobs/switch.py).
        self.state_dir: Optional[str] = None
        self.lldp_wait: float = 0
        self._rtnl = None
        self._ethtool = None
        self._dcb = None
        self._dcb_sock = None
        self._interfaces: Optional[list] = None
        # Why links left out of interfaces() were, for the command's warnings.
        self.skipped_interfaces: list = []
        self._links: Optional[list] = None
        self._ioctl_sock = None
        self._devlink = None
        # Where counters are read and how verify waits between samples
        # (health.CounterSource); tests/fakes.py FakeHost brings its own.
        self.counter_source = None

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def page_size(self) -> int:
        """The kernel's PAGE_SIZE: some drivers' ring limits are counted in
        pages (nicclass.rings_minimum)."""
        return self.io.page_size()

    def rtnl(self):
        if self._rtnl is None:
            from nictune.host.transports.netlink.rtnl import Rtnl

            self._rtnl = Rtnl(self.io.netlink)
        return self._rtnl

    def ethtool(self):
        if self._ethtool is None:
            # NICTUNE_ETHTOOL=ioctl forces the legacy SIOCETHTOOL backend:
            # for testing it, and for kernels whose ethtool genl family
            # misbehaves.  Otherwise it is the fallback when the kernel has
            # no ethtool genl family (< 5.6, or CONFIG_ETHTOOL_NETLINK=n):
            # resolving the family then fails with ENOENT.
            if os.environ.get("NICTUNE_ETHTOOL") != "ioctl":
                import errno

                from nictune.host.transports.netlink.errors import NetlinkError
                from nictune.host.transports.netlink.ethtool import Ethtool

                try:
                    self._ethtool = Ethtool(self.io.netlink)
                    return self._ethtool
                except NetlinkError as e:
                    if e.errno != errno.ENOENT:
                        raise
            from nictune.host.transports.netlink.ethtool_ioctl import EthtoolIoctl

            self._ethtool = EthtoolIoctl(self.io.inet_socket())
        return self._ethtool

    def tunables(self):
        """An ethtool tunables ioctl socket for one phase (a context manager:
        tunables exist only as ETHTOOL_GTUNABLE/STUNABLE ioctls)."""
        from nictune.host.transports.netlink.ethtool_ioctl import Tunables

        return Tunables(self.io.inet_socket())

    def macsec(self):
        """A MACsec handle (rtnetlink for the link, genl macsec for the SAs),
        for one phase; the caller closes it (a context manager)."""
        from nictune.host.transports.netlink.macsec import Macsec

        return Macsec(self.io.netlink)

    def xfrm(self):
        """A NETLINK_XFRM handle for one phase; the caller closes it."""
        from nictune.host.transports.netlink.xfrm import Xfrm

        return Xfrm(self.io.netlink)

    def vfs(self):
        """An rtnetlink handle for VF settings (netlink/vf.py); the caller closes it."""
        from nictune.host.transports.netlink.vf import Vfs

        return Vfs(self.io.netlink)

    def inet(self):
        """An rtnetlink handle for addresses and routes; the caller closes it."""
        from nictune.host.transports.netlink.inet import Inet

        return Inet(self.io.netlink)

    def devlink(self):
        """The devlink generic netlink socket (NetlinkError ENOENT: the
        kernel has no devlink)."""
        if self._devlink is None:
            from nictune.host.transports.netlink.devlink import Devlink

            self._devlink = Devlink(self.io.netlink)
        return self._devlink

    def dcb(self):
        if self._dcb is None:
            from nictune.host.transports.netlink.dcb import Dcb
            from nictune.host.transports.netlink.socket import NETLINK_ROUTE, NetlinkSocket

            self._dcb_sock = NetlinkSocket(NETLINK_ROUTE, opener=self.io.netlink)
            self._dcb = Dcb(self._dcb_sock)
        return self._dcb

    def interfaces(self) -> list:
        """Every link but loopback, with the facts selectors need (read once).

        A name the kernel accepts but nictune's checks refuse ('rt#1', one
        with an escape character, bytes that are not UTF-8) is left out and
        listed in skipped_interfaces: every write path checks names again,
        and one odd link must not stop the profile on every other."""
        if self._interfaces is None:
            found, skipped = [], []
            ports = self._ports()
            for link in self.links():
                if link.name == "lo":
                    continue
                if not matches(IFNAME, link.name):
                    skipped.append(_skipped(link.name))
                    continue
                info = self._drvinfo(link.name)
                port = ports.get(link.name)
                pci, physfn, vf_index = self._pci_place(link.name)
                found.append(
                    Interface(
                        name=link.name,
                        index=link.index,
                        driver=(info.driver if info else None) or link.kind,
                        mac=link.mac,
                        pci_id=self._pci_id(link.name),
                        bus_info=(info.bus_info if info else None) or None,
                        firmware=(info.fw_version if info else None) or None,
                        phys_port_name=self._sysfs_text(link.name, "phys_port_name"),
                        phys_switch_id=self._sysfs_text(link.name, "phys_switch_id"),
                        flavour=port.flavour if port else None,
                        port_pf=port.pf if port else None,
                        port_vf=port.vf if port else None,
                        port_handle=port.handle if port else None,
                        pci_address=pci,
                        physfn=physfn,
                        vf_index=vf_index,
                    )
                )
            self._set_lower_drivers(found)
            self._interfaces, self.skipped_interfaces = found, skipped
        return self._interfaces

    def _set_lower_drivers(self, found: list) -> None:
        """Interface.lower_driver: the kernel links each upper device to its
        lower ones in sysfs as lower_<ifname> (net/core/dev.c
        netdev_adjacent_sysfs_add, for masters such as hv_netvsc, bond,
        bridge, team); a lower device nictune skipped has no known driver."""
        drivers = {i.name: i.driver for i in found}
        for iface in found:
            try:
                entries = self.io.listdir(self.path("sys/class/net", iface.name))
            except OSError:
                continue
            lowers = {drivers.get(e[len("lower_"):]) for e in entries if e.startswith("lower_")}
            lowers.discard(None)
            iface.lower_driver = tuple(sorted(lowers)) or None

    def links(self) -> list:
        """The last link dump: facts and the first link read share it."""
        if self._links is None:
            self._links = self.rtnl().links()
        return self._links

    def forget(self, facts: bool = False) -> None:
        """Drop what was read: after a write (the next read must ask the
        kernel again) and, with the interface facts, before a command."""
        self._links = None
        if facts:
            self._interfaces = None
            self.skipped_interfaces = []

    def _drvinfo(self, ifname: str):
        """ethtool -i of one device (a seam: tests stand in recorded state)."""
        from nictune.host.transports.netlink.drvinfo import drvinfo

        if self._ioctl_sock is None:  # one socket for every interface
            self._ioctl_sock = self.io.inet_socket()
        return drvinfo(ifname, sock=self._ioctl_sock)

    def _sysfs_text(self, ifname: str, name: str) -> Optional[str]:
        # The kernel answers EOPNOTSUPP on read when the driver has no
        # ndo_get_phys_port_name / switch id: not a switch port.
        try:
            return self.io.read_text(self.path("sys/class/net", ifname, name)).strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def _ports(self) -> dict:
        """netdev name -> its devlink port; {} without devlink."""
        from nictune.host.transports.netlink.errors import NetlinkError

        try:
            return {p.netdev: p for p in self.devlink().ports() if p.netdev}
        except (NetlinkError, OSError):
            return {}

    def _pci_place(self, ifname: str) -> tuple:
        """(PCI address of the netdev's device, of its PF if it is a VF,
        its VF index there), each None where it does not apply.  Only PCI
        devices have physfn/virtfnN (netdevsim VFs have no netdev at all)."""
        device = self.path("sys/class/net", ifname, "device")
        io = self.io
        if not io.isdir(device):
            return None, None, None
        real = io.realpath(device)
        pci = os.path.basename(real) if io.exists(os.path.join(real, "vendor")) else None
        physfn = os.path.join(real, "physfn")
        if pci is None or not io.isdir(physfn):
            return pci, None, None
        pf = io.realpath(physfn)
        index = None
        try:
            for name in io.listdir(pf):
                if (name.startswith("virtfn") and name[6:].isdigit()
                        and io.realpath(os.path.join(pf, name)) == real):
                    index = int(name[6:])
                    break
        except OSError:
            pass
        return pci, os.path.basename(pf), index

    def _pci_id(self, ifname: str) -> Optional[str]:
        base = self.path("sys/class/net", ifname, "device")
        try:
            with self.io.open(os.path.join(base, "vendor")) as v, \
                    self.io.open(os.path.join(base, "device")) as d:
                return f"{v.read().strip()[2:]}:{d.read().strip()[2:]}"
        except OSError:
            return None

    def close(self) -> None:
        for handle in (self._rtnl, self._ethtool, self._ioctl_sock, self._dcb_sock, self._devlink):
            if handle is not None:
                handle.close()
        self._rtnl = self._ethtool = self._ioctl_sock = self._dcb = self._dcb_sock = None
        self._devlink = None

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
