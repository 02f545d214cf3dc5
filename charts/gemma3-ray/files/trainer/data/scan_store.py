"""The data scan kept with the run: which rows can be trained on and why the others cannot, computed once
per run (each worker scans its share of the rows) and read back by every restart or resize of the run."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

SCAN_FILE = "data_scan.json"
PARTS_DIR = "data_scan_parts"
FORMAT = 1


class RunFiles(Protocol):
    """The run directory: files by path relative to it (the trainer's Storage)."""

    def read_bytes(self, rel: str) -> bytes | None: ...

    def write_bytes(self, rel: str, data: bytes) -> None: ...


@dataclass
class ScanResult:
    """The outcome of scanning `rows` rows: the skipped ones, by row index, with their reason."""

    key: str
    rows: int
    skipped: dict[int, str] = field(default_factory=dict)
    reused: bool = False  # read back from the run, not scanned by this attempt

    def keep(self) -> list[int]:
        return [i for i in range(self.rows) if i not in self.skipped]

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.skipped.values()))

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, "key": self.key, "rows": self.rows,
                           "skipped": {str(i): r for i, r in sorted(self.skipped.items())}}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None, key: str) -> ScanResult | None:
        """The stored scan if it is intact and for the same data and rules (`key`), else None."""
        if not raw:
            return None
        try:
            obj = json.loads(raw)
            if obj.get("format") != FORMAT or obj.get("key") != key:
                return None
            return cls(key=key, rows=int(obj["rows"]), skipped={int(i): str(r) for i, r in obj["skipped"].items()},
                       reused=True)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # a torn or foreign file: scan again


def scan_key(**inputs: Any) -> str:
    """A digest of everything a row's verdict depends on (data files, column mapping, prompt, limits)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:32]


def share(rows: int, rank: int, world_size: int) -> range:
    """The contiguous block of rows that `rank` scans."""
    per, extra = divmod(rows, world_size)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (1 if rank < extra else 0))


@dataclass
class ScanGroup:
    """Who scans: the run's files and this worker's place in the group, with the group's collectives
    (`barrier`, and `broadcast` of rank 0's value). One worker alone by default."""

    files: RunFiles | None  # None: not kept (a scan outside a run, e.g. a test)
    rank: int = 0
    world_size: int = 1
    barrier: Callable[[], None] = lambda: None
    broadcast: Callable[[Any], Any] = lambda value: value
    # The data's identity (run_definition: its files' content or generations), part of the scan's key: a
    # changed dataset is scanned again.
    data_identity: str = ""

    @classmethod
    def of_ray_worker(cls, files: RunFiles, data_identity: str = "") -> ScanGroup:
        """This Ray Train worker's group (call inside train_loop_per_worker)."""
        import ray.train
        from ray.train.collective import barrier, broadcast_from_rank_zero

        ctx = ray.train.get_context()
        return cls(files, ctx.get_world_rank(), ctx.get_world_size(), barrier, broadcast_from_rank_zero,
                   data_identity)


def shared_scan(group: ScanGroup, key: str, rows: int, scan: Callable[[range], dict[int, str]],
                keep_bad: bool = True) -> ScanResult:
    """The run's scan: read back when the run has one for `key`; else every rank scans its share
    (`scan(block) -> {row: reason}` for the bad rows of the block), rank 0 merges and stores it; with
    `keep_bad` False (bad_rows=fail) a scan that found bad rows is not stored: the next attempt checks again.

    Every rank of the group calls this.
    """
    files, rank, world_size, barrier, broadcast = (group.files, group.rank, group.world_size, group.barrier,
                                                   group.broadcast)
    if files is None:
        return ScanResult(key=key, rows=rows, skipped=scan(range(rows)))
    stored = ScanResult.from_json(files.read_bytes(SCAN_FILE), key) if rank == 0 else None
    if broadcast(stored is not None):
        return broadcast(stored)
    block = share(rows, rank, world_size)
    part = ScanResult(key=key, rows=rows, skipped=scan(block))
    files.write_bytes(f"{PARTS_DIR}/{rank:05d}-of-{world_size:05d}.json", part.to_json())
    barrier()
    merged = None
    if rank == 0:
        skipped: dict[int, str] = {}
        for r in range(world_size):
            got = ScanResult.from_json(files.read_bytes(f"{PARTS_DIR}/{r:05d}-of-{world_size:05d}.json"), key)
            if got is None:
                raise RuntimeError(f"scan part of rank {r} is missing or unreadable")
            skipped.update(got.skipped)
        merged = ScanResult(key=key, rows=rows, skipped=skipped)
        if keep_bad or not skipped:
            files.write_bytes(SCAN_FILE, merged.to_json())
    return broadcast(merged)
