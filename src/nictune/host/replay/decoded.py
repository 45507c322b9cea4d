"""Netlink messages decoded once, shared read-only by the replays of many hosts.

The controller replays a verify on each host's probe answers
(probe_reads.ProbedHost), and most of what the hosts of one fleet answer is
byte for byte the same: the ethtool string set of feature names, the
generic netlink family lookups, the feature dump of identical rails.
Decoding it again for every host is a good share of the replay's CPU
(bench/bench_controller.py).  So the replay's netlink sockets carry a
DecodedCache (socket.py NetlinkSocket asks its raw socket for one; a
kernel socket has none, so the agent on a host never caches), and what
hosts answer alike is decoded once for all of them.

What makes sharing safe:
- the key is the message class and the message's exact bytes, but for its
  sequence number and port id, which are the socket's, not the answer's:
  each host's message gets its own header, read from its own bytes;
- what is shared is read-only: attribute lists become tuples, nested
  attributes a class whose every mutating method raises, their bytes
  `bytes`.  A family that tried to change a shared record would fail
  (SharedRecordError), never hand one host's change to another;
- only _nlmsg.py's classes are shared (pyroute2's are decoded as ever).

A message is kept from the second time its bytes are met: what only one
host answers (its own link dump) is decoded as ever and never kept.  The
cache is bounded (MAX_BYTES of messages, least recently used dropped
first) and thread-safe: fleet.run_jobs replays hosts in threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from nictune.host.transports.netlink import _nlmsg

# Of messages kept, as bytes: decoded, a message weighs some ten times its
# bytes (measured on the lab's link and feature dumps), so about 20 MB at
# most of the controller's 200 MB budget; the lab's verify is 11 messages
# of 8.5 KB in all.
MAX_BYTES = 2 << 20
MAX_SEEN = 50_000  # hashes of messages met once (some 3 MB), forgotten all at once past it
_HEADER_NAMES = tuple(name for name, _ in _nlmsg._HEADER)


class SharedRecordError(TypeError):
    """A change to a decoded message that replays of other hosts share."""


def _refuse(self, *args, **kwargs):
    raise SharedRecordError(f"a decoded {type(self).__name__} is shared between hosts' replays: "
                            "it cannot be changed")


_MUTATORS = ("__setitem__", "__delitem__", "__ior__", "clear", "pop", "popitem", "setdefault", "update")
_frozen_classes: dict = {}
_frozen_lock = threading.Lock()


def _frozen_class(cls: type) -> type:
    """cls with every dict mutator refused (same layout: instances switch to it)."""
    with _frozen_lock:
        frozen = _frozen_classes.get(cls)
        if frozen is None:
            frozen = type(f"Shared{cls.__name__}", (cls,), dict({name: _refuse for name in _MUTATORS},
                                                                shared=True))
            _frozen_classes[cls] = frozen
    return frozen


def _plain(cls: type, raw: bytes):
    message = cls(raw)
    message.decode()
    return message


def _freeze(message: _nlmsg._Base, data: bytes) -> None:
    """message and its nested attributes read-only, their bytes immutable."""
    attrs = []
    for name, value in message["attrs"]:
        if isinstance(value, _nlmsg._Base):
            _freeze(value, data)
        attrs.append((name, value))
    dict.__setitem__(message, "attrs", tuple(attrs))
    message.data = data
    message.__class__ = _frozen_class(type(message))


class DecodedCache:
    """Decoded netlink messages by class and bytes (header's seq and pid aside)."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()
        self._size = 0
        self._seen: set = set()  # hashes of messages met once
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def decoded(self, cls: type, raw: bytes):
        """The message raw decoded as cls (raw: one whole message)."""
        if not issubclass(cls, _nlmsg.nlmsg):
            return _plain(cls, raw)  # pyroute2's: decoded as ever, never shared
        key = (cls, raw[4:8], raw[16:])  # type and flags, then the body
        with self._lock:
            shared = self._items.get(key)
            if shared is not None:
                self._items.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
                seen_before = self._seen_before(hash(key))
        if shared is not None:
            return self._own(cls, shared, raw)
        if not seen_before:
            return _plain(cls, raw)
        return self._own(cls, self._keep(cls, raw, key), raw)

    def _seen_before(self, digest: int) -> bool:
        """Whether a message of this hash was met before (under the lock).
        Only what a second host answers alike is kept: a host's own link
        dump, met once per audit, would only crowd the cache."""
        if digest in self._seen:
            return True
        if len(self._seen) >= MAX_SEEN:
            self._seen.clear()
        self._seen.add(digest)
        return False

    def _keep(self, cls: type, raw: bytes, key: tuple):
        shared = _plain(cls, raw)
        _freeze(shared, raw)
        with self._lock:
            if key not in self._items:
                self._items[key] = shared
                self._size += len(raw)
            while self._size > self.max_bytes and self._items:
                _, old = self._items.popitem(last=False)
                self._size -= len(old.data)
        return shared

    @staticmethod
    def _own(cls: type, shared, raw: bytes):
        """This host's message: its own dict and header over the shared,
        read-only attributes."""
        m = cls.__new__(cls)
        dict.update(m, shared)
        dict.__setitem__(m, "header", dict(zip(_HEADER_NAMES, _nlmsg._HEADER_FMT.unpack_from(raw, 0))))
        m.data = bytearray(raw)
        return m


# The controller's, for every probe replay in the process (probe_reads._ReplaySocket).
SHARED = DecodedCache()
