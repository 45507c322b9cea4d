"""Netlink message classes without pyroute2, for the agent's everyday reads.

pyroute2.netlink costs some 15 ms of CPU at every agent start, most of it
what it imports (logging, typing, threading, traceback): as much as the
rest of a verify.  The messages of a verify (rtnl.py's link dump, genl.py's
family lookup, devlink.py, ethtool.py) need only a small part of it, so
this module is that part, with the same API: a class declares `fields`
(struct formats, native byte order), `nla_map` (name, type) by position or
(id, name, type), nested attribute classes by name and `nla_flags`; a
message is a dict with "header", its fields and "attrs" [(name, value)];
encode() fills `data`, decode() reads it; get_attr/get_attrs read
attributes.  The bytes are pyroute2's, byte for byte: the recorded tests
(tests/recorded/test_devlink.py) compare them with iproute2's, and
tests/unit/test_nlmsg.py with pyroute2's own encoding and decoding.  The
other netlink modules (dcb, inet, vf, xfrm, macsec) keep pyroute2's
classes: they need its address and array types.

Types: uint8/16/32/64 and int32 (native order), asciiz (a NUL-terminated
string: str when it is UTF-8, else bytes, as pyroute2 gives it), cdata
(bytes), flag (True when present), none (skipped), and a nested class.
"""

from __future__ import annotations

import struct

NLA_F_NESTED = 1 << 15
NLA_F_NET_BYTEORDER = 1 << 14
_NLA_TYPE = 0xFFFF & ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER)
_NLA = struct.Struct("HH")
_HEADER = (("length", "I"), ("type", "H"), ("flags", "H"), ("sequence_number", "I"), ("pid", "I"))
_HEADER_FMT = struct.Struct("IHHII")
_SCALARS = {"uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q", "int32": "i"}
_ATOMS = frozenset(_SCALARS) | {"asciiz", "cdata", "flag", "none"}


def _align(n: int) -> int:
    return (n + 3) & ~3


class _Base(dict):
    fields: tuple = ()
    nla_map: tuple = ()
    nla_flags = 0
    shared = False  # True: read-only, shared by the controller's replays (host/replay/decoded.py)

    def __init__(self, data=None):
        dict.__init__(self)
        self.data = bytearray(data or b"")
        self["attrs"] = []

    @classmethod
    def _table(cls) -> tuple:
        """({id: (name, kind)}, {name: (id, kind)}), built once per class."""
        table = cls.__dict__.get("_compiled")
        if table is None:
            by_id, by_name = {}, {}
            positional = bool(cls.nla_map) and not isinstance(cls.nla_map[0][0], int)
            for n, entry in enumerate(cls.nla_map):
                key, name, kind = (n, *entry) if positional else entry
                if kind not in _ATOMS:
                    kind = getattr(cls, kind)  # a nested class, by its attribute name
                by_id[key] = (name, kind)
                by_name[name] = (key, kind)
            table = cls._compiled = (by_id, by_name)
        return table

    # -- reading -------------------------------------------------------------

    def get_attrs(self, attr: str) -> list:
        return [value for name, value in self["attrs"] if name == attr]

    def get_attr(self, attr: str, default=None):
        values = self.get_attrs(attr)
        return values[0] if values else default

    def _decode_fields(self, offset: int) -> int:
        for name, fmt in self.fields:
            value = struct.unpack_from(fmt, self.data, offset)
            self[name] = value[0] if len(value) == 1 else value
            offset += struct.calcsize(fmt)
        return _align(offset)

    def _decode_attrs(self, offset: int, end: int) -> None:
        by_id = self._table()[0]
        data = self.data
        attrs = self["attrs"] = []
        while offset <= end - 4:
            length, kind = _NLA.unpack_from(data, offset)
            length = min(max(length, 4), end - offset)
            known = by_id.get(kind & _NLA_TYPE)
            if known is not None:
                attrs.append((known[0], _value(known[1], data, offset, length)))
            offset += _align(length)

    # -- writing -------------------------------------------------------------

    def _encode_fields(self, out: bytearray) -> None:
        for name, fmt in self.fields:
            if fmt.endswith("x"):
                out += struct.pack(fmt)
            else:
                value = self.get(name)
                out += struct.pack(fmt, 0 if value is None else value)
        out += bytes(_align(len(out)) - len(out))

    def _encode_attrs(self, out: bytearray) -> None:
        by_name = self._table()[1]
        for cell in self["attrs"]:
            known = by_name.get(cell[0])
            if known is None:  # as pyroute2: a name the class does not map is left out
                continue
            key, kind = known
            if isinstance(kind, str):
                payload, flags = _atom(kind, cell[1]), 0
            else:
                nested = kind()
                nested.update(cell[1])
                payload, flags = nested._payload(), kind.nla_flags
            out += _NLA.pack(4 + len(payload), key | flags) + payload
            out += bytes(_align(len(payload)) - len(payload))


class nla(_Base):
    """A nested attribute: fields (rarely), then attributes."""

    def _payload(self) -> bytes:
        out = bytearray()
        self._encode_fields(out)
        self._encode_attrs(out)
        return bytes(out)


class nlmsg(_Base):
    """A netlink message: the 16-byte header, fields, attributes."""

    def __init__(self, data=None):
        super().__init__(data)
        self["header"] = {}

    def encode(self) -> None:
        out = bytearray(_HEADER_FMT.size)
        self._encode_fields(out)
        self._encode_attrs(out)
        header = self["header"]
        header["length"] = len(out)
        _HEADER_FMT.pack_into(out, 0, *(header.get(name, 0) for name, _ in _HEADER))
        self.data = out

    def decode(self) -> None:
        values = _HEADER_FMT.unpack_from(self.data, 0)
        self["header"] = dict(zip((name for name, _ in _HEADER), values))
        end = max(values[0], 4)
        self._decode_attrs(self._decode_fields(_HEADER_FMT.size), end)


class genlmsg(nlmsg):
    fields = (("cmd", "B"), ("version", "B"), ("reserved", "H"))


class ctrlmsg(genlmsg):
    """Generic netlink's controller: the two attributes a family lookup uses
    (include/uapi/linux/genetlink.h enum CTRL_ATTR_*)."""

    nla_map = (
        (1, "CTRL_ATTR_FAMILY_ID", "uint16"),
        (2, "CTRL_ATTR_FAMILY_NAME", "asciiz"),
    )


def _atom(kind: str, value) -> bytes:
    if kind in _SCALARS:
        return struct.pack(_SCALARS[kind], value)
    if kind == "asciiz":
        return (value.encode() if isinstance(value, str) else bytes(value)) + b"\0"
    if kind == "cdata":
        return bytes(value)
    if kind == "flag":
        return b""
    raise ValueError(f"cannot encode a netlink attribute of type {kind}")


def _value(kind, data: bytearray, offset: int, length: int):
    """The decoded value of the attribute at offset, as pyroute2 gives it."""
    payload = bytes(data[offset + 4:offset + length])
    if kind == "asciiz":
        text = payload.strip(b"\0")
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            return text
    if kind == "cdata":
        return payload
    if kind == "flag":
        return True
    if kind == "none":
        return None
    if isinstance(kind, str):
        fmt = _SCALARS[kind]
        if len(payload) < struct.calcsize(fmt):
            return bytes(data[offset:offset + length])  # pyroute2's answer to a short value
        return struct.unpack_from(fmt, payload)[0]
    nested = kind()
    nested.data = data
    nested._decode_attrs(nested._decode_fields(offset + 4), offset + length)
    return nested
