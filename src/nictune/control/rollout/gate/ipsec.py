"""The gate's IPsec check (`ipsec_offload: crypto|packet`): "is it in use",
which an expectation on an idle host cannot ask (expect: {ipsec_offload:
{if_present: crypto}} holds with no SA at all).  On every host of the batch
and every rail, before the traffic: at least one SA is offloaded to the
rail in that mode, and no SA of the rail's addresses runs in software or
elsewhere; after the traffic: the packets those offloaded SAs counted rose,
so the gate's traffic went through them.

Read with `ip -s xfrm state list nokeys` (iproute2's own format,
ipxfrm.c xfrm_state_print: a block per SA starting "src A dst B", its
"crypto offload parameters: dev X dir D [mode M]" line -- the mode only
from iproute2 6.2, so a packet gate needs that -- and the packets of
"lifetime current:"), over the gate's SSH session: no agent process, no
write.  `nokeys` keeps the keys out of the output; nothing else of it is
kept but the addresses, SPI, offload and packet count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from nictune.control.rollout.gate.parallel import parallel
from nictune.control.rollout.gate.rows import fail, row
from nictune.host.errors import NictuneError

IPSEC_ARGV = ["ip", "-s", "xfrm", "state", "list", "nokeys"]
MAX_SAS = 20000
_BLOCK = re.compile(r"^src (\S{2,39}) dst (\S{2,39})\s*$")
_SPI = re.compile(r"^\s+proto (\S+) spi (0x[0-9a-f]{1,8})\b")
# iproute2 6.2 and later add " mode crypto|packet"; 6.1 (Debian 12) prints none.
_OFFLOAD = re.compile(r"^\s+crypto offload parameters: dev (\S{1,15}) dir (in|out)"
                      r"(?: mode (crypto|packet))?")
UNKNOWN = "offload of an unknown mode"
_CURRENT = re.compile(r"^\s+([0-9]{1,20})\(bytes\), ([0-9]{1,20})\(packets\)")


@dataclass
class GateSa:
    src: str
    dst: str
    spi: str = ""
    dev: Optional[str] = None   # the device it is offloaded to
    mode: str = "none"          # none, crypto, packet, UNKNOWN (iproute2 before 6.2)
    packets: Optional[int] = None

    def label(self) -> str:
        return f"{self.src} > {self.dst} spi {self.spi or '?'}"


def parse_sas(text: str) -> List[GateSa]:
    """The SAs of `ip -s xfrm state list nokeys`, as untrusted text."""
    out: List[GateSa] = []
    current_lifetime = False
    for line in text.splitlines()[:MAX_SAS * 16]:
        m = _BLOCK.match(line)
        if m:
            out.append(GateSa(m.group(1), m.group(2)))
            current_lifetime = False
            continue
        if not out:
            continue
        sa = out[-1]
        if (m := _SPI.match(line)) and not sa.spi:
            sa.spi = m.group(2)
        elif m := _OFFLOAD.match(line):
            sa.dev, sa.mode = m.group(1), m.group(3) or UNKNOWN
        elif line.strip() == "lifetime current:":
            current_lifetime = True
        elif current_lifetime and (m := _CURRENT.match(line)):
            sa.packets, current_lifetime = int(m.group(2)), False
    return out[:MAX_SAS]


def read_sas(sessions: Dict[str, Any]) -> Dict[str, Any]:
    """{host: [GateSa] or why not}."""
    def one(name: str):
        try:
            result = sessions[name].run(IPSEC_ARGV, 20)
        except NictuneError as e:
            return name, str(e)
        if not result.ok:
            return name, result.why()
        return name, parse_sas(result.stdout)

    return dict(parallel(one, list(sessions)))


def _on_rail(sas: List[GateSa], rail: str, addresses: set) -> Tuple[List[GateSa], List[GateSa]]:
    """(SAs offloaded to rail, SAs of the rail's addresses that are not)."""
    there = [sa for sa in sas if sa.dev == rail]
    other = [sa for sa in sas if sa.dev != rail and (sa.src in addresses or sa.dst in addresses)]
    return there, other


def ipsec_rows(mode: str, rails: List[str], before: Dict[str, Any], after: Dict[str, Any],
               addresses: Dict[Tuple[str, str], set]) -> List[dict]:
    """A row per host and rail: SAs offloaded in `mode` exist, none of the
    rail's runs otherwise, and the offloaded ones counted packets during
    the traffic."""
    out = []
    for name, then in before.items():
        for rail in rails:
            r = row(name, None, rail, "ipsec-offload")
            out.append(r)
            now = after.get(name)
            for source in (then, now):
                if not isinstance(source, list):
                    fail(r, f"cannot read its IPsec SAs: {source}")
            if r["passed"]:
                _judge(r, mode, rail, then, now, addresses.get((name, rail), set()))
    return out


def _judge(r: dict, mode: str, rail: str, then: List[GateSa], now: List[GateSa],
           addresses: set) -> None:
    there, other = _on_rail(then, rail, addresses)
    # Any offload does the crypto; only a printed "mode packet" proves packet offload.
    wanted = [sa for sa in there if sa.mode == mode or mode == "crypto"]
    r["figures"]["sas_offloaded"] = len(wanted)
    if not wanted:
        unknown = any(sa.mode == UNKNOWN for sa in there)
        fail(r, f"no IPsec SA is {mode}-offloaded to {rail}" + (
            " (this host's iproute2 does not print the offload mode: 6.2 and later do)" if unknown
            else f" ({len(there)} offloaded in another mode)" if there else ""))
    for sa in (other + [sa for sa in there if sa not in wanted])[:5]:
        where = "in software" if sa.dev is None else f"{sa.mode} offload on {sa.dev}"
        fail(r, f"SA {sa.label()} of {rail}'s addresses runs {where}, not {mode} offload on {rail}")
    if not wanted:
        return
    later = {(sa.src, sa.dst, sa.spi): sa.packets for sa in now}
    rise = 0
    for sa in wanted:
        after = later.get((sa.src, sa.dst, sa.spi))
        if sa.packets is not None and after is not None and after >= sa.packets:
            rise += after - sa.packets
    r["figures"]["sa_packets"] = rise
    if rise == 0:
        fail(r, f"the SAs offloaded to {rail} counted no packet during the traffic: it did "
                "not go through them (check the policies' selectors)")
