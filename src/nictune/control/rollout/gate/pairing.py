"""Who measures with whom: rings of a batch, peers, and rounds in which no
host is client twice or server twice (see the package docstring)."""

from __future__ import annotations

from typing import List, Sequence, Tuple


def pair_up(batch: Sequence[str], peers: Sequence[str], kept: Sequence[str]) -> List[Tuple[str, str]]:
    """(client, server) pairs for a batch (see the module's docstring)."""
    batch = list(dict.fromkeys(batch))
    others = [p for p in dict.fromkeys(peers)]
    pairs: List[Tuple[str, str]] = []
    if others:
        turn = 0
        for host in batch:
            choices = [p for p in others if p != host]
            if not choices:
                continue
            peer = choices[turn % len(choices)]
            turn += 1
            pairs += [(host, peer), (peer, host)]
    elif len(batch) >= 2:
        pairs = [(host, batch[(i + 1) % len(batch)]) for i, host in enumerate(batch)]
    elif batch and [k for k in kept if k != batch[0]]:
        peer = [k for k in kept if k != batch[0]][-1]
        pairs = [(batch[0], peer), (peer, batch[0])]
    return pairs


def rounds(pairs: Sequence[Tuple[str, str]]) -> List[List[Tuple[str, str]]]:
    """Pairs in rounds where no host is a client twice or a server twice."""
    out: List[List[Tuple[str, str]]] = []
    for client, server in pairs:
        for r in out:
            if all(c != client and s != server for c, s in r):
                r.append((client, server))
                break
        else:
            out.append([(client, server)])
    return out
