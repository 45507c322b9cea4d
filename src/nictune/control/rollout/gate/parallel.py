"""Work on many hosts at once: the gate's SSH sessions, reads and runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


def parallel(work, items: list, workers: int = 32) -> list:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(work, items))
