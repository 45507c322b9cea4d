"""The host being tuned, as the knobs see it: sockets, file root, facts.

The agent always runs inside the network namespace it tunes (`ip netns exec`
for local namespaces, sshd for remote hosts), so netlink, /proc/sys and
/sys all show the right devices without any setns juggling here.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Optional

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

    def matches(self, selectors: dict) -> bool:
        """All given selectors must match; a list means any of its items."""
        for field, wanted in selectors.items():
            options = wanted if isinstance(wanted, list) else [wanted]
            have = getattr(self, field)
            if have is None:
                return False
            if field in ("name", "phys_port_name"):
                ok = any(fnmatch.fnmatchcase(have, pat) for pat in options)
            elif field in ("mac", "pci_id", "phys_switch_id"):  # hex: any case
                ok = have.lower() in {o.lower() for o in options}
            else:
                ok = have in options
            if not ok:
                return False
        return True


def _skipped(name) -> str:
    shown = shown_name(name)
    escaped = " (escaped)" if shown != f"'{name}'" else ""
    return (f"skipped interface {shown}{escaped}: a name nictune does not handle "
            f"(it takes {WORDS[IFNAME]})")


class Host:
    """Lazily opened kernel handles, shared by all knob families of one run."""

    def __init__(self, root: str = "/"):
        self.root = root
        # The network namespace the agent was started in by `ip netns exec`,
        # as the request names it (None: not one): its /etc/netns/NAME files.
        self.netns: Optional[str] = None
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

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def rtnl(self):
        if self._rtnl is None:
            from nictune.host.netlink.rtnl import Rtnl

            self._rtnl = Rtnl()
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

                from nictune.host.netlink.errors import NetlinkError
                from nictune.host.netlink.ethtool import Ethtool

                try:
                    self._ethtool = Ethtool()
                    return self._ethtool
                except NetlinkError as e:
                    if e.errno != errno.ENOENT:
                        raise
            from nictune.host.netlink.ethtool_ioctl import EthtoolIoctl

            self._ethtool = EthtoolIoctl()
        return self._ethtool

    def devlink(self):
        """The devlink generic netlink socket (NetlinkError ENOENT: the
        kernel has no devlink)."""
        if self._devlink is None:
            from nictune.host.netlink.devlink import Devlink

            self._devlink = Devlink()
        return self._devlink

    def dcb(self):
        if self._dcb is None:
            from nictune.host.netlink.dcb import Dcb
            from nictune.host.netlink.socket import NETLINK_ROUTE, NetlinkSocket

            self._dcb_sock = NetlinkSocket(NETLINK_ROUTE)
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
            flavours = self._port_flavours()
            for link in self.links():
                if link.name == "lo":
                    continue
                if not matches(IFNAME, link.name):
                    skipped.append(_skipped(link.name))
                    continue
                info = self._drvinfo(link.name)
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
                        flavour=flavours.get(link.name),
                    )
                )
            self._interfaces, self.skipped_interfaces = found, skipped
        return self._interfaces

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
        from nictune.host.netlink.drvinfo import drvinfo
        from nictune.host.netlink.ioctl import inet_socket

        if self._ioctl_sock is None:  # one socket for every interface
            self._ioctl_sock = inet_socket()
        return drvinfo(ifname, sock=self._ioctl_sock)

    def _sysfs_text(self, ifname: str, name: str) -> Optional[str]:
        # The kernel answers EOPNOTSUPP on read when the driver has no
        # ndo_get_phys_port_name / switch id: not a switch port.
        try:
            with open(self.path("sys/class/net", ifname, name)) as f:
                return f.read().strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def _port_flavours(self) -> dict:
        """netdev name -> devlink port flavour; {} without devlink."""
        from nictune.host.netlink.errors import NetlinkError

        try:
            return {p.netdev: p.flavour for p in self.devlink().ports() if p.netdev}
        except (NetlinkError, OSError):
            return {}

    def _pci_id(self, ifname: str) -> Optional[str]:
        base = self.path("sys/class/net", ifname, "device")
        try:
            with open(os.path.join(base, "vendor")) as v, open(os.path.join(base, "device")) as d:
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
