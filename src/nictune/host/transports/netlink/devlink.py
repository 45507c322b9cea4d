"""devlink over generic netlink: eswitch mode, ports, `dev info`, params.

Message classes are written here on _nlmsg.py's genlmsg/nla with explicit
attribute ids from include/uapi/linux/devlink.h (pyroute2.netlink.devlink
has the same constants but imports its asyncio socket, and has no SET
helpers).  Encodings follow iproute2's `devlink` (devlink/devlink.c,
cmd_dev_eswitch_set): BUS_NAME and DEV_NAME first, then ESWITCH_MODE (u16),
ESWITCH_INLINE_MODE (u8), ESWITCH_ENCAP_MODE (u8), only those asked for;
tests/recorded/test_devlink_encoder.py checks the bytes.

What the kernel answers (net/devlink/dev.c, devlink_nl_eswitch_set_doit):
each attribute goes to its own driver op (eswitch_mode_set,
eswitch_inline_mode_set, eswitch_encap_mode_set) in that order, and the
first refusal ends the request: a SET that carries a mode and an inline
mode may leave the mode changed when the inline mode is refused.  Callers
that care send one attribute per request (set_eswitch does).  A device
whose driver lacks the op answers EOPNOTSUPP; ESWITCH_GET on a device
without eswitch_mode_get fails whole (EOPNOTSUPP), so a driver that only
has a mode reports inline/encap as absent, not as 0.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Dict, List, Optional, Tuple

from nictune.host.transports.netlink._nlmsg import genlmsg, nla
from nictune.host.transports.netlink.genl import GenlFamily
from nictune.host.transports.netlink.socket import NLM_F_ACK, NLM_F_REQUEST
from nictune.host.transports.netlink.uapi import ENCAP_MODES, ESWITCH_MODES, INLINE_MODES
from nictune.host.validate import InvalidInput

# The genl header's version byte: include/uapi/linux/devlink.h says 1, but
# iproute2's devlink (6.1, recorded in tests/recorded/devlink) sends 0, and
# the kernel's devlink family never looks at it (genl_family_rcv_msg does
# not compare versions).  We send what the tool sends.
DEVLINK_GENL_VERSION = 0

DEVLINK_CMD_GET = 1
DEVLINK_CMD_PORT_GET = 5
DEVLINK_CMD_ESWITCH_GET = 29
DEVLINK_CMD_ESWITCH_SET = 30
DEVLINK_CMD_INFO_GET = 51
DEVLINK_CMD_PARAM_GET = 38
DEVLINK_CMD_PARAM_SET = 39

# enum devlink_param_cmode; a param lists one value per cmode it has.
CMODES = {"runtime": 0, "driverinit": 1, "permanent": 2}
# DEVLINK_ATTR_PARAM_TYPE carries the NLA_* type of the value (devlink.h
# enum devlink_param_type: u8 1, u16 2, u32 3, string 5, bool 6).
PARAM_TYPES = {1: "u8", 2: "u16", 3: "u32", 5: "string", 6: "bool"}
_PARAM_FORMATS = {"u8": "B", "u16": "H", "u32": "I"}

# enum devlink_eswitch_mode / _inline_mode / _encap_mode
MODES = ESWITCH_MODES
# enum devlink_port_flavour
FLAVOURS = {0: "physical", 1: "cpu", 2: "dsa", 3: "pcipf", 4: "pcivf", 5: "virtual",
            6: "unused", 7: "pcisf"}

# A devlink handle as `devlink dev` prints it: bus/device.
_HANDLE = re.compile(r"^([a-z0-9_]{1,32})/([A-Za-z0-9_.:-]{1,64})$")


def split_handle(handle: object) -> Tuple[str, str]:
    """"pci/0000:03:00.0" -> ("pci", "0000:03:00.0"); InvalidInput otherwise."""
    m = _HANDLE.match(handle) if isinstance(handle, str) else None
    if m is None:
        raise InvalidInput(f"not a devlink device: {handle!r} (expected bus/device, "
                           "such as pci/0000:03:00.0 or netdevsim/netdevsim1)")
    return m.group(1), m.group(2)


class devlinkmsg(genlmsg):
    """The attributes nictune sends or reads, with their uapi ids."""

    nla_map = (
        (1, "DEVLINK_ATTR_BUS_NAME", "asciiz"),
        (2, "DEVLINK_ATTR_DEV_NAME", "asciiz"),
        (3, "DEVLINK_ATTR_PORT_INDEX", "uint32"),
        (6, "DEVLINK_ATTR_PORT_NETDEV_IFINDEX", "uint32"),
        (7, "DEVLINK_ATTR_PORT_NETDEV_NAME", "asciiz"),
        (25, "DEVLINK_ATTR_ESWITCH_MODE", "uint16"),
        (26, "DEVLINK_ATTR_ESWITCH_INLINE_MODE", "uint8"),
        (62, "DEVLINK_ATTR_ESWITCH_ENCAP_MODE", "uint8"),
        (77, "DEVLINK_ATTR_PORT_FLAVOUR", "uint16"),
        (78, "DEVLINK_ATTR_PORT_NUMBER", "uint32"),
        (98, "DEVLINK_ATTR_INFO_DRIVER_NAME", "asciiz"),
        (99, "DEVLINK_ATTR_INFO_SERIAL_NUMBER", "asciiz"),
        (100, "DEVLINK_ATTR_INFO_VERSION_FIXED", "version"),
        (101, "DEVLINK_ATTR_INFO_VERSION_RUNNING", "version"),
        (102, "DEVLINK_ATTR_INFO_VERSION_STORED", "version"),
        (80, "DEVLINK_ATTR_PARAM", "param"),
        (81, "DEVLINK_ATTR_PARAM_NAME", "asciiz"),
        (83, "DEVLINK_ATTR_PARAM_TYPE", "uint8"),
        (86, "DEVLINK_ATTR_PARAM_VALUE_DATA", "cdata"),
        (87, "DEVLINK_ATTR_PARAM_VALUE_CMODE", "uint8"),
        (127, "DEVLINK_ATTR_PORT_PCI_PF_NUMBER", "uint16"),
        (128, "DEVLINK_ATTR_PORT_PCI_VF_NUMBER", "uint16"),
    )

    class version(nla):
        # Not flagged NLA_F_NESTED by the kernel (devlink_info_version_put
        # uses nla_nest_start_noflag); we only ever decode it.
        nla_map = (
            (103, "DEVLINK_ATTR_INFO_VERSION_NAME", "asciiz"),
            (104, "DEVLINK_ATTR_INFO_VERSION_VALUE", "asciiz"),
        )


    class param(nla):
        # DEVLINK_ATTR_PARAM: name, type, and a list of (cmode, data) values
        # (net/devlink/param.c, devlink_nl_param_fill).
        nla_flags = 1 << 15
        nla_map = (
            (81, "DEVLINK_ATTR_PARAM_NAME", "asciiz"),
            (82, "DEVLINK_ATTR_PARAM_GENERIC", "flag"),
            (83, "DEVLINK_ATTR_PARAM_TYPE", "uint8"),
            (84, "DEVLINK_ATTR_PARAM_VALUES_LIST", "values"),
        )

        class values(nla):
            nla_flags = 1 << 15
            nla_map = ((85, "DEVLINK_ATTR_PARAM_VALUE", "value"),)

            class value(nla):
                nla_flags = 1 << 15
                nla_map = (
                    (86, "DEVLINK_ATTR_PARAM_VALUE_DATA", "cdata"),
                    (87, "DEVLINK_ATTR_PARAM_VALUE_CMODE", "uint8"),
                )


@dataclass
class Param:
    """One devlink param of a device: its type and its value per cmode."""

    handle: str
    name: str
    type: str
    values: Dict[str, object] = field(default_factory=dict)  # cmode -> value


@dataclass
class Eswitch:
    mode: Optional[str] = None
    inline_mode: Optional[str] = None
    encap: Optional[str] = None


@dataclass
class Port:
    handle: str  # devlink device, "pci/0000:03:00.0"
    index: int
    flavour: Optional[str]
    netdev: Optional[str]
    number: Optional[int]  # DEVLINK_ATTR_PORT_NUMBER (physical ports)
    pf: Optional[int]
    vf: Optional[int]


@dataclass
class DevInfo:
    driver: Optional[str]
    serial: Optional[str]
    fixed: Dict[str, str] = field(default_factory=dict)
    running: Dict[str, str] = field(default_factory=dict)
    stored: Dict[str, str] = field(default_factory=dict)

    def pending_firmware(self) -> List[str]:
        """Components whose stored (flashed) version differs from the running
        one: a firmware update that waits for a reset."""
        return sorted(k for k, v in self.stored.items()
                      if k in self.running and self.running[k] != v)


def _name(mapping: dict, value: Optional[int]) -> Optional[str]:
    if value is None:
        return None
    return next((k for k, v in mapping.items() if v == value), str(value))


def _versions(msg, attr: str) -> Dict[str, str]:
    out = {}
    for nest in msg.get_attrs(attr):
        name = nest.get_attr("DEVLINK_ATTR_INFO_VERSION_NAME")
        if name is not None:
            out[name] = nest.get_attr("DEVLINK_ATTR_INFO_VERSION_VALUE")
    return out


def _param_value(kind: str, data) -> object:
    """A param value from its DEVLINK_ATTR_PARAM_VALUE_DATA bytes: a bool is
    a flag (present: true), a string NUL-terminated, a number native-order."""
    if kind == "bool":
        return data is not None
    if data is None:
        raise ValueError(f"devlink param value of type {kind} without data")
    if kind == "string":
        return bytes(data).split(b"\0", 1)[0].decode("utf-8", "replace")
    fmt = _PARAM_FORMATS.get(kind)
    if fmt is None or len(data) < struct.calcsize(fmt):
        raise ValueError(f"devlink param value of type {kind}: {len(data)} bytes")
    return struct.unpack_from(fmt, data)[0]


def decode_param(msg) -> Param:
    nest = msg.get_attr("DEVLINK_ATTR_PARAM")
    if nest is None:
        raise ValueError("devlink param reply without DEVLINK_ATTR_PARAM")
    kind = PARAM_TYPES.get(nest.get_attr("DEVLINK_ATTR_PARAM_TYPE"), "unknown")
    values: dict = {}
    lists = nest.get_attr("DEVLINK_ATTR_PARAM_VALUES_LIST")
    for value in (lists.get_attrs("DEVLINK_ATTR_PARAM_VALUE") if lists is not None else ()):
        cmode = _name(CMODES, value.get_attr("DEVLINK_ATTR_PARAM_VALUE_CMODE"))
        if kind != "unknown":
            values[cmode] = _param_value(kind, value.get_attr("DEVLINK_ATTR_PARAM_VALUE_DATA"))
    return Param(_handle_of(msg), nest.get_attr("DEVLINK_ATTR_PARAM_NAME") or "", kind, values)


def param_set_message(handle: str, name: str, kind: str, cmode: str, value) -> devlinkmsg:
    """DEVLINK_CMD_PARAM_SET as iproute2's `devlink dev param set` lays it
    out (cmd_dev_param_set): bus, device, name, type, data (a bool false is
    no data attribute at all), cmode."""
    bus, dev = split_handle(handle)
    if kind not in PARAM_TYPES.values() or cmode not in CMODES:
        raise InvalidInput(f"devlink param {name}: type {kind!r} or cmode {cmode!r} unknown")
    type_id = next(k for k, v in PARAM_TYPES.items() if v == kind)
    attrs: list = [("DEVLINK_ATTR_BUS_NAME", bus), ("DEVLINK_ATTR_DEV_NAME", dev),
                   ("DEVLINK_ATTR_PARAM_NAME", name), ("DEVLINK_ATTR_PARAM_TYPE", type_id)]
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidInput(f"devlink param {name} takes true or false, got {value!r}")
        if value:
            attrs.append(("DEVLINK_ATTR_PARAM_VALUE_DATA", b""))
    elif kind == "string":
        attrs.append(("DEVLINK_ATTR_PARAM_VALUE_DATA", str(value).encode() + b"\0"))
    else:
        fmt = _PARAM_FORMATS[kind]
        top = (1 << (8 * struct.calcsize(fmt))) - 1
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise InvalidInput(f"devlink param {name} takes a {kind} (0..{top}), got {value!r}")
        attrs.append(("DEVLINK_ATTR_PARAM_VALUE_DATA", struct.pack(fmt, value)))
    attrs.append(("DEVLINK_ATTR_PARAM_VALUE_CMODE", CMODES[cmode]))
    msg = devlinkmsg()
    msg["cmd"] = DEVLINK_CMD_PARAM_SET
    msg["version"] = DEVLINK_GENL_VERSION
    msg["attrs"] = attrs
    return msg


def eswitch_set_message(handle: str, mode: Optional[str] = None,
                        inline_mode: Optional[str] = None,
                        encap: Optional[str] = None) -> devlinkmsg:
    """DEVLINK_CMD_ESWITCH_SET, laid out as `devlink dev eswitch set` does."""
    bus, dev = split_handle(handle)
    attrs: list = [("DEVLINK_ATTR_BUS_NAME", bus), ("DEVLINK_ATTR_DEV_NAME", dev)]
    for value, table, attr, what in (
        (mode, MODES, "DEVLINK_ATTR_ESWITCH_MODE", "eswitch mode"),
        (inline_mode, INLINE_MODES, "DEVLINK_ATTR_ESWITCH_INLINE_MODE", "eswitch inline_mode"),
        (encap, ENCAP_MODES, "DEVLINK_ATTR_ESWITCH_ENCAP_MODE", "eswitch encap"),
    ):
        if value is None:
            continue
        if value not in table:
            raise InvalidInput(f"{what} must be one of {', '.join(table)}, got {value!r}")
        attrs.append((attr, table[value]))
    msg = devlinkmsg()
    msg["cmd"] = DEVLINK_CMD_ESWITCH_SET
    msg["version"] = DEVLINK_GENL_VERSION
    msg["attrs"] = attrs
    return msg


def handle_message(cmd: int, handle: Optional[str] = None) -> devlinkmsg:
    msg = devlinkmsg()
    msg["cmd"] = cmd
    msg["version"] = DEVLINK_GENL_VERSION
    attrs = []
    if handle is not None:
        bus, dev = split_handle(handle)
        attrs = [("DEVLINK_ATTR_BUS_NAME", bus), ("DEVLINK_ATTR_DEV_NAME", dev)]
    msg["attrs"] = attrs
    return msg


def _handle_of(msg) -> str:
    return f"{msg.get_attr('DEVLINK_ATTR_BUS_NAME')}/{msg.get_attr('DEVLINK_ATTR_DEV_NAME')}"


def decode_eswitch(msg) -> Eswitch:
    return Eswitch(
        mode=_name(MODES, msg.get_attr("DEVLINK_ATTR_ESWITCH_MODE")),
        inline_mode=_name(INLINE_MODES, msg.get_attr("DEVLINK_ATTR_ESWITCH_INLINE_MODE")),
        encap=_name(ENCAP_MODES, msg.get_attr("DEVLINK_ATTR_ESWITCH_ENCAP_MODE")),
    )


def decode_port(msg) -> Port:
    get = msg.get_attr
    flavour = get("DEVLINK_ATTR_PORT_FLAVOUR")
    return Port(
        handle=_handle_of(msg),
        index=get("DEVLINK_ATTR_PORT_INDEX"),
        flavour=FLAVOURS.get(flavour, str(flavour)) if flavour is not None else None,
        netdev=get("DEVLINK_ATTR_PORT_NETDEV_NAME"),
        number=get("DEVLINK_ATTR_PORT_NUMBER"),
        pf=get("DEVLINK_ATTR_PORT_PCI_PF_NUMBER"),
        vf=get("DEVLINK_ATTR_PORT_PCI_VF_NUMBER"),
    )


def decode_info(msg) -> DevInfo:
    return DevInfo(
        driver=msg.get_attr("DEVLINK_ATTR_INFO_DRIVER_NAME"),
        serial=msg.get_attr("DEVLINK_ATTR_INFO_SERIAL_NUMBER"),
        fixed=_versions(msg, "DEVLINK_ATTR_INFO_VERSION_FIXED"),
        running=_versions(msg, "DEVLINK_ATTR_INFO_VERSION_RUNNING"),
        stored=_versions(msg, "DEVLINK_ATTR_INFO_VERSION_STORED"),
    )


class Devlink(GenlFamily):
    """One generic netlink socket bound to the devlink family.

    Resolving the family fails with ENOENT (a NetlinkError) on a kernel
    without CONFIG_NET_DEVLINK: callers turn that into Unsupported."""

    FAMILY = "devlink"

    def _map(self) -> dict:
        return {self._family: devlinkmsg}

    def devices(self) -> List[str]:
        """Every devlink device of the namespace, as bus/device."""
        replies = self._nl.dump(handle_message(DEVLINK_CMD_GET), self._family, self._map())
        return [_handle_of(m) for m in replies]

    def eswitch(self, handle: str) -> Eswitch:
        reply = self._nl.request(handle_message(DEVLINK_CMD_ESWITCH_GET, handle),
                                 self._family, NLM_F_REQUEST, self._map())
        return decode_eswitch(reply[0])

    def set_eswitch(self, handle: str, mode: Optional[str] = None,
                    inline_mode: Optional[str] = None, encap: Optional[str] = None) -> None:
        """One request per attribute, mode first (what the kernel would do
        in one request, but a refusal then names the one setting refused)."""
        for kw in ({"mode": mode}, {"inline_mode": inline_mode}, {"encap": encap}):
            if next(iter(kw.values())) is None:
                continue
            msg = eswitch_set_message(handle, **kw)
            self._nl.request(msg, self._family, NLM_F_REQUEST | NLM_F_ACK, self._map())

    def ports(self) -> List[Port]:
        replies = self._nl.dump(handle_message(DEVLINK_CMD_PORT_GET), self._family, self._map())
        return [decode_port(m) for m in replies]

    def info(self, handle: str) -> DevInfo:
        reply = self._nl.request(handle_message(DEVLINK_CMD_INFO_GET, handle),
                                 self._family, NLM_F_REQUEST, self._map())
        return decode_info(reply[0])

    def params(self, handle: str) -> List[Param]:
        """Every devlink param of `handle` (a dump filtered by device)."""
        replies = self._nl.dump(handle_message(DEVLINK_CMD_PARAM_GET), self._family, self._map())
        return [p for p in map(decode_param, replies) if p.handle == handle]

    def set_param(self, handle: str, name: str, kind: str, cmode: str, value) -> None:
        msg = param_set_message(handle, name, kind, cmode, value)
        self._nl.request(msg, self._family, NLM_F_REQUEST | NLM_F_ACK, self._map())
