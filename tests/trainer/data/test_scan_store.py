"""The scan kept with the run: a restart reads it back instead of scanning again (the scanned rows are
counted), the workers split the scan between them and agree on the result, and a scan for other data or
rules, or a torn file, is not reused."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.thread_group import ThreadGroup
from trainer.data import scan_store
from trainer.job.storage import Storage

ROWS = 23
BAD = {3: "corrupt_image", 11: "too_long", 22: "empty_answer"}


class Counting:
    """A scan function that records every row it looks at."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, block: range) -> dict[int, str]:
        with self.lock:
            self.rows += list(block)
        return {i: BAD[i] for i in block if i in BAD}


def alone(files, key: str, scan) -> scan_store.ScanResult:
    return scan_store.shared_scan(scan_store.ScanGroup(files), key, ROWS, scan)


def in_group(files, key: str, scan, world: int) -> list[scan_store.ScanResult]:
    """`world` ranks in threads, with a real barrier and a broadcast from rank 0 (as Ray Train's collectives)."""
    ranks = ThreadGroup(world)
    results: list[Any] = [None] * world

    def rank_main(rank: int) -> None:
        group = scan_store.ScanGroup(files, rank, world, ranks.barrier.wait, partial(ranks.broadcast, rank))
        results[rank] = scan_store.shared_scan(group, key, ROWS, scan)

    ranks.run(rank_main, join_timeout=30)
    return results


@pytest.fixture
def files(tmp_path: Path) -> Storage:
    return Storage(root=str(tmp_path / "runs" / "r1"))


def test_a_restart_reuses_the_scan(files) -> None:
    key = scan_store.scan_key(data=["train.parquet", 123], max_seq_length=512)
    first, scan = alone(files, key, Counting()), None
    assert first.skipped == BAD and not first.reused
    assert first.keep() == [i for i in range(ROWS) if i not in BAD]
    assert first.counts() == {"corrupt_image": 1, "too_long": 1, "empty_answer": 1}
    scan = Counting()
    again = alone(files, key, scan)  # the restart
    assert scan.rows == []  # not one row scanned
    assert again.reused and again.skipped == BAD


def test_the_workers_split_the_scan_and_agree(files) -> None:
    key = scan_store.scan_key(data="x")
    scan = Counting()
    results = in_group(files, key, scan, world=3)
    assert sorted(scan.rows) == list(range(ROWS))  # each row scanned once, by one rank
    assert all(r.skipped == BAD for r in results)
    scan = Counting()
    resized = in_group(files, key, scan, world=2)  # a resize restarts the group: the scan is read back
    assert scan.rows == [] and all(r.reused and r.skipped == BAD for r in resized)


def test_other_data_or_a_torn_file_scans_again(files) -> None:
    alone(files, scan_store.scan_key(data="a"), Counting())
    scan = Counting()
    alone(files, scan_store.scan_key(data="b"), scan)
    assert sorted(scan.rows) == list(range(ROWS))
    raw = files.read_bytes(scan_store.SCAN_FILE)
    files.write_bytes(scan_store.SCAN_FILE, raw[: len(raw) // 2])
    scan = Counting()
    assert alone(files, scan_store.scan_key(data="b"), scan).skipped == BAD
    assert sorted(scan.rows) == list(range(ROWS))


def test_shares_cover_the_rows_once() -> None:
    for rows in (0, 1, 7, 23):
        for world in (1, 2, 3, 16):
            blocks = [scan_store.share(rows, r, world) for r in range(world)]
            assert [i for b in blocks for i in b] == list(range(rows))
