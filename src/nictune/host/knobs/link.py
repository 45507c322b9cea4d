"""Link basics over rtnetlink: MTU, transmit queue length, admin state.

An MTU change on mlx5, MANA and hv_netvsc rebuilds queues or the device
(nicclass.DISRUPTS): plans mark it disruptive."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs every agent run (test_agent_imports.py)
    from typing import Optional

from nictune.host.facts import nicclass
from nictune.host.knobs.base import Family, group_by_target
from nictune.host.model import Desired, Key, Unsupported, Want

_ATTR = {"mtu": "mtu", "txqueuelen": "txqlen"}


class LinkFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    mtu: 9000               # or {min: 9000}
    txqueuelen: 10000
    state: up
"""
    name = "link"
    position = 100
    position_note = ("last: an MTU change reopens the queues on both drivers and, on mlx5, "
                     "resizes the receive buffers that PFC headroom was computed for; a link "
                     "brought up comes up with everything else in place")
    sections = ("mtu", "txqueuelen", "state")
    settings = sections

    @classmethod
    def schema(cls, s):
        return {"entry": {
            "mtu": s.wanted(68, 65535, "MTU in bytes."),
            "txqueuelen": s.wanted(0, s.U32, "Transmit queue length in packets."),
            "state": {"enum": ["up", "down"], "description": "Administrative link state."},
        }}

    @classmethod
    def nic_support(cls, driver, setting):
        nic = nicclass.for_driver(driver)
        if setting == "mtu" and nic is not None and nic.max_mtu:
            return f"up to {nic.max_mtu}"
        return None

    def __init__(self, host):
        super().__init__(host)
        self._links: dict = {}

    def expand(self, target, sections, source):
        return [Desired(Key(self.name, target, name), Want.parse(raw), source(name))
                for name, raw in sections.items()]

    def _dump(self) -> dict:
        self._links = {link.name: link for link in self.host.links()}
        return self._links

    def read(self, keys):
        links = self._dump()
        out = {}
        for key in keys:
            link = links.get(key.target)
            if link is None:
                out[key] = Unsupported("no such interface")
            elif key.name == "state":
                out[key] = "up" if link.up else "down"
            else:
                out[key] = getattr(link, _ATTR[key.name])
        return out

    def check(self, key, want) -> Optional[str]:
        link = self._links.get(key.target)
        if key.name != "mtu" or link is None:
            return None
        lo, hi = link.min_mtu, link.max_mtu  # 0 or None: the device sets no bound
        value = want.value
        if hi and value > hi:
            return f"MTU {value} is above the device maximum {hi}"
        if lo and value < lo:
            return f"MTU {value} is below the device minimum {lo}"
        return None

    def disruptive(self, key, before, after) -> str:
        """An MTU change on an up interface of a driver that rebuilds its
        queues or detaches the port for it (nicclass.DISRUPTS); taking the
        link down."""
        link = self._links.get(key.target)
        if link is None or not link.up:
            return ""
        if key.name == "state":
            wanted = getattr(after, "value", after)  # a Want or its value
            return "the link goes down" if wanted == "down" else ""
        if key.name == "mtu":
            return nicclass.disruption(self.driver_of(key.target), "mtu")
        return ""

    def apply(self, items):
        """Stacked devices (VLAN, macvlan on a rail) refuse an MTU above their
        lower device's, and a lower device refuses to go below an upper's on
        some drivers: rather than model the topology, retry what the kernel
        refused after the others went through, until nothing more succeeds."""
        try:
            self._converge(list(group_by_target(items).items()))
        finally:
            self.host.forget()  # the shared link dump is stale now

    def _converge(self, pending: list) -> None:
        while pending:
            refused = []
            for target, values in pending:
                try:
                    self._set(target, values)
                except OSError as e:
                    refused.append((target, values, e))
            if len(refused) == len(pending):
                raise refused[0][2]
            pending = [(target, values) for target, values, _ in refused]

    def _set(self, target: str, values: dict) -> None:
        links = self._links or self._dump()
        state = values.get("state")
        self.host.rtnl().set_link(
            links[target].index,
            mtu=values.get("mtu"),
            txqlen=values.get("txqueuelen"),
            up=None if state is None else state == "up",
        )

    def show(self, target):
        link = (self._links or self._dump()).get(target)
        if link is None:
            return {}
        return {"mtu": link.mtu, "txqueuelen": link.txqlen,
                "state": "up" if link.up else "down"}
