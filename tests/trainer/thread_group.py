"""Test-only: ranks as threads, with a real barrier and a broadcast from rank 0 (as Ray Train's collectives)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class ThreadGroup:
    """`world` ranks run as threads; `timeout` (s) breaks the barrier when a rank is left waiting."""

    def __init__(self, world: int, timeout: float | None = None) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=timeout)
        self._slot: dict[str, Any] = {}

    def broadcast(self, rank: int, value: Any) -> Any:
        """Rank 0's value, on every rank."""
        self.barrier.wait()
        if rank == 0:
            self._slot["v"] = value
        self.barrier.wait()
        got = self._slot["v"]
        self.barrier.wait()
        return got

    def run(self, target: Callable[[int], None], join_timeout: float | None = None) -> None:
        """`target(rank)` on every rank; returns when all have ended (or `join_timeout` passed for each)."""
        threads = [threading.Thread(target=target, args=(rank,)) for rank in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=join_timeout)
