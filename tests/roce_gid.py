"""Pick one GID out of nictune.host.facts.rdma's tables (test helper, shared by
tests/unit and the VM tests in tests/vm/guest).

The agent chooses its GIDs in nictune.host.knobs.nccl; tests look a single
one up to compare against what the kernel shows.
"""

from __future__ import annotations

from typing import Optional

from nictune.host.facts import rdma


def roce_v2_ipv4(host, device: str, port: int, ndev: Optional[str] = None) -> Optional[rdma.Gid]:
    """The lowest-index RoCE v2 GID with an IPv4 address (of ndev, if given)."""
    for g in rdma.gids(host, device, port):
        if g.type == rdma.ROCE_V2 and g.ipv4 and (ndev is None or g.ndev == ndev):
            return g
    return None
