"""ethtool over the legacy SIOCETHTOOL ioctl: the fallback for kernels
without the ethtool generic-netlink family (before 5.6, e.g. Ubuntu 20.04's
5.4, or CONFIG_ETHTOOL_NETLINK=n).

`EthtoolIoctl` has the public API of `nictune.host.transports.netlink.ethtool.Ethtool`: the
same methods, the same dict keys (ethtool CLI names), the same `Features`,
and failures as `NetlinkError` carrying the ioctl's errno, so callers need
not know which backend they hold.

Differences that the ioctl imposes:
- "Dumps": the ioctl addresses one device by name, so each dump lists the
  namespace's devices (if_nameindex) and queries them one by one.  A device
  whose driver lacks the operation (EOPNOTSUPP) or that vanished meanwhile
  (ENODEV) is left out, as the netlink dump leaves it out.  lo is kept
  where the GET succeeds (features), as in the netlink dump.
- Parameters the ioctl structs do not carry are never reported, and asking
  to set one is EOPNOTSUPP: rings rx-buf-len/cqe-size/tx-push/rx-push and
  coalesce cqe-mode-rx/cqe-mode-tx.
- Coalesce reports all 22 struct fields; the netlink reply leaves out a
  zero-valued parameter the driver does not declare supported, which the
  ioctl cannot tell.
- A SET ioctl writes the whole struct, so every set is read-modify-write:
  GET, change only the given keys, SET.  A driver without the op, or a
  missing device, fails at that GET: EOPNOTSUPP, or ENODEV.

Tunables (`Tunables`, ETHTOOL_GTUNABLE / ETHTOOL_STUNABLE) exist only as
ioctls -- ethtool netlink has no tunable message -- so they are spoken here
whichever backend Host.ethtool() chose, as `ethtool --set-tunable` does.

Struct layouts are those of include/uapi/linux/ethtool.h (torvalds/linux);
the struct is named at each layout below.  The kernel side is
net/ethtool/ioctl.c (net/core/ethtool.c before 5.5).
"""

from __future__ import annotations

import array
import errno
import socket
import struct
from typing import Dict, List, Optional, Tuple

from nictune.host.transports.netlink.errors import NetlinkError
from nictune.host.transports.netlink.ethtool import ETH_SS_FEATURES, Features
from nictune.host.transports.netlink.ioctl import inet_socket, siocethtool, string_set
from nictune.host.transports.netlink.names import param_value, validate_features
from nictune.host.transports.netlink.uapi import (ETHTOOL_PFC_PREVENTION_TOUT,  # noqa: F401 (re-exported)
                                       PFC_STORM_PREVENTION_AUTO, PFC_STORM_PREVENTION_DISABLE)

ETHTOOL_GCOALESCE, ETHTOOL_SCOALESCE = 0x0E, 0x0F
ETHTOOL_GRINGPARAM, ETHTOOL_SRINGPARAM = 0x10, 0x11
ETHTOOL_GPAUSEPARAM, ETHTOOL_SPAUSEPARAM = 0x12, 0x13
ETHTOOL_GFEATURES, ETHTOOL_SFEATURES = 0x3A, 0x3B
ETHTOOL_GCHANNELS, ETHTOOL_SCHANNELS = 0x3C, 0x3D
ETHTOOL_GTUNABLE, ETHTOOL_STUNABLE = 0x48, 0x49

# enum tunable_id and enum tunable_type_id.  net/ethtool/ioctl.c
# ethtool_tunable_valid() insists on the type and length of each id
# (PFC_PREVENTION_TOUT: ETHTOOL_TUNABLE_U16, 2 bytes), else EINVAL.
ETHTOOL_TUNABLE_U16 = 2
_TUNABLE_TYPES = {ETHTOOL_PFC_PREVENTION_TOUT: (ETHTOOL_TUNABLE_U16, struct.Struct("=H"))}
# struct ethtool_tunable { u32 cmd; u32 id; u32 type_id; u32 len; void *data[]; }
_TUNABLE = struct.Struct("=4I")

# enum ethtool_sfeatures_retval_bits: SFEATURES returns these as a
# non-negative ioctl result.
ETHTOOL_F_UNSUPPORTED = 1 << 0  # some .valid bits are not in hw_features: ignored
ETHTOOL_F_WISH = 1 << 1  # recorded, but the active state differs from .requested
ETHTOOL_F_COMPAT = 1 << 2  # done through legacy driver hooks (2.6.39-era kernels)

# struct ethtool_gfeatures { u32 cmd; u32 size; struct ethtool_get_features_block features[]; }
# struct ethtool_sfeatures { u32 cmd; u32 size; struct ethtool_set_features_block features[]; }
_FEATURES_HDR = struct.Struct("=II")
# struct ethtool_get_features_block { u32 available, requested, active, never_changed; }
_GET_BLOCK = struct.Struct("=IIII")
# struct ethtool_set_features_block { u32 valid, requested; }
_SET_BLOCK = struct.Struct("=II")

# Parameter structs, all u32 words with cmd first.  A field row is
# CLI name -> (word index, is_bool, settable, gate): the value is reported
# only when word `gate` is non-zero (None = always), as the netlink reply
# leaves out a ring / channel kind whose maximum is 0.
_Fields = Dict[str, Tuple[int, bool, bool, Optional[int]]]


class _Params:
    def __init__(self, name: str, get_cmd: int, set_cmd: int, words: int,
                 fields: _Fields, netlink_only: Dict[str, bool]):
        self.name = name
        self.get_cmd, self.set_cmd = get_cmd, set_cmd
        self.layout = struct.Struct(f"={words}I")
        self.fields = fields
        # Keys Ethtool accepts that this struct has no field for (-> is_bool).
        self.netlink_only = netlink_only


# struct ethtool_ringparam { u32 cmd; rx_max_pending; rx_mini_max_pending;
#   rx_jumbo_max_pending; tx_max_pending; rx_pending; rx_mini_pending;
#   rx_jumbo_pending; tx_pending; }
_RINGS = _Params("rings", ETHTOOL_GRINGPARAM, ETHTOOL_SRINGPARAM, 9, {
    "rx-max": (1, False, False, 1),
    "rx-mini-max": (2, False, False, 2),
    "rx-jumbo-max": (3, False, False, 3),
    "tx-max": (4, False, False, 4),
    "rx": (5, False, True, 1),
    "rx-mini": (6, False, True, 2),
    "rx-jumbo": (7, False, True, 3),
    "tx": (8, False, True, 4),
}, {"rx-buf-len": False, "cqe-size": False, "tx-push": True, "rx-push": True})

# struct ethtool_channels { u32 cmd; max_rx; max_tx; max_other; max_combined;
#   rx_count; tx_count; other_count; combined_count; }
_CHANNELS = _Params("channels", ETHTOOL_GCHANNELS, ETHTOOL_SCHANNELS, 9, {
    "rx-max": (1, False, False, 1),
    "tx-max": (2, False, False, 2),
    "other-max": (3, False, False, 3),
    "combined-max": (4, False, False, 4),
    "rx": (5, False, True, 1),
    "tx": (6, False, True, 2),
    "other": (7, False, True, 3),
    "combined": (8, False, True, 4),
}, {})

# struct ethtool_coalesce { u32 cmd; then 22 u32, in this order:
#   rx_coalesce_usecs, rx_max_coalesced_frames, rx_coalesce_usecs_irq,
#   rx_max_coalesced_frames_irq, tx_coalesce_usecs, tx_max_coalesced_frames,
#   tx_coalesce_usecs_irq, tx_max_coalesced_frames_irq,
#   stats_block_coalesce_usecs, use_adaptive_rx_coalesce,
#   use_adaptive_tx_coalesce, pkt_rate_low, rx_coalesce_usecs_low,
#   rx_max_coalesced_frames_low, tx_coalesce_usecs_low,
#   tx_max_coalesced_frames_low, pkt_rate_high, rx_coalesce_usecs_high,
#   rx_max_coalesced_frames_high, tx_coalesce_usecs_high,
#   tx_max_coalesced_frames_high, rate_sample_interval; }
_COALESCE_KEYS = (
    "rx-usecs", "rx-frames", "rx-usecs-irq", "rx-frames-irq",
    "tx-usecs", "tx-frames", "tx-usecs-irq", "tx-frames-irq",
    "stats-block-usecs", "adaptive-rx", "adaptive-tx",
    "pkt-rate-low", "rx-usecs-low", "rx-frames-low", "tx-usecs-low", "tx-frames-low",
    "pkt-rate-high", "rx-usecs-high", "rx-frames-high", "tx-usecs-high", "tx-frames-high",
    "sample-interval",
)
_COALESCE = _Params("coalesce", ETHTOOL_GCOALESCE, ETHTOOL_SCOALESCE, 23, {
    cli: (i, cli in ("adaptive-rx", "adaptive-tx"), True, None)
    for i, cli in enumerate(_COALESCE_KEYS, start=1)
}, {"cqe-mode-rx": True, "cqe-mode-tx": True})

# struct ethtool_pauseparam { u32 cmd; autoneg; rx_pause; tx_pause; }
_PAUSE = _Params("pause", ETHTOOL_GPAUSEPARAM, ETHTOOL_SPAUSEPARAM, 4, {
    "autoneg": (1, True, True, None),
    "rx": (2, True, True, None),
    "tx": (3, True, True, None),
}, {})


def _words_to_int(blocks: List[tuple], field: int) -> int:
    """One field of the per-32-feature blocks as a single bit mask."""
    return sum(block[field] << (32 * i) for i, block in enumerate(blocks))


class EthtoolIoctl:
    def __init__(self, sock=None):
        # The ioctl looks device names up in the socket's namespace.
        # sock: the host's port's (Host.io.inet_socket).
        self._sock = sock or inet_socket()
        self._feature_names: List[str] | None = None

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "EthtoolIoctl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing --

    def _ioctl(self, ifname: str, buf: array.array) -> int:
        """SIOCETHTOOL on `ifname` with ifr_data -> `buf` (which the kernel
        reads and writes in place); returns the non-negative ioctl result."""
        try:
            return siocethtool(self._sock, ifname, buf)
        except OSError as e:
            raise NetlinkError(e.errno) from None

    def _ifnames(self) -> List[str]:
        # if_nameindex() lists the calling thread's namespace, not the
        # socket's: the same one, as the agent never switches namespace.
        return [name for _index, name in socket.if_nameindex()]

    def _each_device(self, get):
        """(name, get(name)) for every device whose GET succeeds."""
        for ifname in self._ifnames():
            try:
                result = get(ifname)
            except NetlinkError as e:
                # No such op: the netlink dump skips the device too.  ENODEV:
                # it went away (or is not present) since we listed it.
                if e.errno in (errno.EOPNOTSUPP, errno.ENODEV):
                    continue
                raise
            yield ifname, result

    # -- features --

    def feature_names(self) -> List[str]:
        """The kernel's feature bit names by index ('' for unused bits)."""
        if self._feature_names is None:
            # ETH_SS_FEATURES is global (the kernel's netdev_features_strings)
            # but the ioctl still needs a device: lo is in every namespace
            # (the others are only tried should it be missing).
            def candidates():
                yield "lo"
                yield from (n for n in self._ifnames() if n != "lo")

            last = NetlinkError(errno.ENODEV, "no network device to ask")
            for ifname in candidates():
                try:
                    self._feature_names = self._read_feature_names(ifname)
                    break
                except NetlinkError as e:
                    if e.errno != errno.ENODEV:
                        raise
                    last = e
            else:
                raise last
        return self._feature_names

    def _read_feature_names(self, ifname: str) -> List[str]:
        # The set is ARRAY_SIZE(netdev_features_strings), a constant of the
        # running kernel: GSSET_INFO's count is room enough.
        try:
            return string_set(self._sock, ifname, ETH_SS_FEATURES)
        except OSError as e:
            raise NetlinkError(e.errno) from None

    def _feature_words(self) -> int:
        # ETHTOOL_DEV_FEATURE_WORDS = DIV_ROUND_UP(NETDEV_FEATURE_COUNT, 32),
        # and the feature string set has NETDEV_FEATURE_COUNT names.
        # SFEATURES insists on exactly this size (EINVAL otherwise).
        return (len(self.feature_names()) + 31) // 32

    def _get_features(self, ifname: str) -> Tuple[int, int, int]:
        """(available, active, never_changed) masks of `ifname`."""
        words = self._feature_words()
        buf = array.array("B", _FEATURES_HDR.pack(ETHTOOL_GFEATURES, words))
        buf.extend(bytes(words * _GET_BLOCK.size))
        self._ioctl(ifname, buf)
        raw = buf.tobytes()
        # The kernel sets size to the words it has, and copies at most ours.
        n = min(_FEATURES_HDR.unpack_from(raw)[1], words)
        blocks = [_GET_BLOCK.unpack_from(raw, _FEATURES_HDR.size + i * _GET_BLOCK.size) for i in range(n)]
        return _words_to_int(blocks, 0), _words_to_int(blocks, 2), _words_to_int(blocks, 3)

    def features(self) -> Dict[str, Features]:
        """Every device's features: one GFEATURES per device."""
        names = self.feature_names()
        out = {}
        for ifname, (available, active, never) in self._each_device(self._get_features):
            changeable = available & ~never
            out[ifname] = Features(
                active={n: bool(active >> i & 1) for i, n in enumerate(names) if n},
                changeable={n for i, n in enumerate(names) if n and changeable >> i & 1},
            )
        return out

    def set_features(self, ifname: str, wanted: Dict[str, bool]) -> Dict[str, bool]:
        """Request feature bits; return {name: requested value} for those not applied.

        SFEATURES changes the bits in .valid to .requested and returns flags
        (net/ethtool/ioctl.c ethtool_set_features): ETHTOOL_F_UNSUPPORTED when
        some were not in hw_features (ignored), ETHTOOL_F_WISH when the
        resulting active state differs from the request.  It does not say
        which bits, so on any flag we read the active set back and report the
        requested bits that differ from it: what the netlink reply's masked
        WANTED lists too.  Never-changeable bits fail with EINVAL, as over
        netlink.
        """
        validate_features(wanted)
        if not wanted:
            return {}
        names = self.feature_names()
        index = {n: i for i, n in enumerate(names) if n}
        unknown = sorted(n for n in wanted if n not in index)
        if unknown:
            # What ethtool netlink answers for a name it does not know.
            raise NetlinkError(errno.EOPNOTSUPP, "bit name not found: " + ", ".join(unknown))
        valid = requested = 0
        for name, value in wanted.items():
            valid |= 1 << index[name]
            if value:
                requested |= 1 << index[name]
        words = self._feature_words()
        buf = array.array("B", _FEATURES_HDR.pack(ETHTOOL_SFEATURES, words))
        for w in range(words):
            buf.extend(_SET_BLOCK.pack(valid >> (32 * w) & 0xFFFFFFFF, requested >> (32 * w) & 0xFFFFFFFF))
        flags = self._ioctl(ifname, buf)
        if not flags:
            return {}  # every requested bit now has its requested value
        _available, active, _never = self._get_features(ifname)
        return {n: v for n, v in wanted.items() if bool(active >> index[n] & 1) != v}

    # -- rings, channels, coalesce, pause --

    def _get_words(self, p: _Params, ifname: str) -> list:
        buf = array.array("B", p.layout.pack(p.get_cmd, *([0] * (p.layout.size // 4 - 1))))
        self._ioctl(ifname, buf)
        return list(p.layout.unpack(buf.tobytes()))

    def _get_all(self, p: _Params) -> Dict[str, dict]:
        out = {}
        for ifname, words in self._each_device(lambda name: self._get_words(p, name)):
            out[ifname] = {
                cli: bool(words[i]) if is_bool else words[i]
                for cli, (i, is_bool, _settable, gate) in p.fields.items()
                if gate is None or words[gate]
            }
        return out

    def _set_values(self, p: _Params, ifname: str, values: dict) -> None:
        changes, missing = {}, []
        for cli, value in values.items():
            if cli in p.fields and p.fields[cli][2]:
                is_bool = p.fields[cli][1]
            elif cli in p.netlink_only:
                is_bool = p.netlink_only[cli]
                missing.append(cli)
            else:
                raise ValueError(f"not a settable parameter: {cli!r}")
            changes[cli] = param_value(cli, value, is_bool)
        if not changes:
            return
        if missing:
            raise NetlinkError(errno.EOPNOTSUPP, f"{p.name} {', '.join(missing)} cannot be set "
                               "through the legacy ethtool ioctl (needs ethtool netlink)")
        # The SET ioctl takes the whole struct: start from the current one.
        words = self._get_words(p, ifname)
        words[0] = p.set_cmd
        for cli, value in changes.items():
            words[p.fields[cli][0]] = value
        self._ioctl(ifname, array.array("B", p.layout.pack(*words)))

    def rings(self) -> Dict[str, dict]:
        return self._get_all(_RINGS)

    def set_rings(self, ifname: str, values: dict) -> None:
        self._set_values(_RINGS, ifname, values)

    def channels(self) -> Dict[str, dict]:
        return self._get_all(_CHANNELS)

    def set_channels(self, ifname: str, values: dict) -> None:
        self._set_values(_CHANNELS, ifname, values)

    def coalesce(self) -> Dict[str, dict]:
        return self._get_all(_COALESCE)

    def set_coalesce(self, ifname: str, values: dict) -> None:
        self._set_values(_COALESCE, ifname, values)

    def pause(self) -> Dict[str, dict]:
        return self._get_all(_PAUSE)

    def set_pause(self, ifname: str, values: dict) -> None:
        self._set_values(_PAUSE, ifname, values)


# -- tunables ------------------------------------------------------------------


def tunable_request(cmd: int, tunable_id: int, value: int = 0) -> bytes:
    """struct ethtool_tunable plus its data, as `ethtool --set-tunable` /
    `--get-tunable` fill it (a GET carries a zeroed value)."""
    if cmd not in (ETHTOOL_GTUNABLE, ETHTOOL_STUNABLE) or tunable_id not in _TUNABLE_TYPES:
        raise ValueError(f"not a tunable request nictune makes: cmd {cmd!r}, id {tunable_id!r}")
    type_id, layout = _TUNABLE_TYPES[tunable_id]
    limit = 1 << (8 * layout.size)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise ValueError(f"tunable {tunable_id} takes an integer 0-{limit - 1}, got {value!r}")
    return _TUNABLE.pack(cmd, tunable_id, type_id, layout.size) + layout.pack(value)


class Tunables:
    """ETHTOOL_GTUNABLE / STUNABLE on devices of this network namespace;
    failures are NetlinkError with the ioctl's errno (EOPNOTSUPP: the
    driver has no get/set_tunable; EINVAL: it refused the value)."""

    def __init__(self, sock=None):
        self._sock = sock or inet_socket()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "Tunables":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ioctl(self, ifname: str, request: bytes) -> bytes:
        buf = array.array("B", request)
        try:
            siocethtool(self._sock, ifname, buf)
        except OSError as e:
            raise NetlinkError(e.errno) from None
        return buf.tobytes()

    def get(self, ifname: str, tunable_id: int) -> int:
        raw = self._ioctl(ifname, tunable_request(ETHTOOL_GTUNABLE, tunable_id))
        return _TUNABLE_TYPES[tunable_id][1].unpack_from(raw, _TUNABLE.size)[0]

    def set(self, ifname: str, tunable_id: int, value: int) -> None:
        self._ioctl(ifname, tunable_request(ETHTOOL_STUNABLE, tunable_id, value))
