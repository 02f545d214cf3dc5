"""The node cache on fake-gcs-server: an object is downloaded once per node however many processes of the
node ask for it, and a dataset prefix brings its data files only, never the images beside them. The
downloads are counted in the server's own request log."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.trainer.conftest import GCS_BUCKET
from trainer.job import node_cache
from trainer.job.storage import Storage, filesystem

PROCESSES_PER_NODE = 4
LOG_SETTLE_S = 0.5  # the server's log reaches the fixture's reader thread asynchronously


@pytest.fixture
def downloads(fake_gcs_downloads):
    def under(prefix: str) -> dict[str, int]:
        time.sleep(LOG_SETTLE_S)
        return {k: v for k, v in fake_gcs_downloads().items() if k.startswith(prefix)}

    return under


@pytest.fixture
def prefix(fake_gcs, request) -> str:
    root = f"gs://{GCS_BUCKET}/node-cache/{request.node.name}"
    storage = Storage(root=root, emulator_host=fake_gcs)
    storage.write_bytes("data/train.parquet", b"PAR1-not-really")
    storage.write_bytes("data/part/more.jsonl", b"{}\n")
    for i in range(3):
        storage.write_bytes(f"data/images/{i}.png", b"\x89PNG" + bytes([i]))
    return root


def fs_for(fake_gcs: str):
    return lambda uri: filesystem(uri, fake_gcs)


def test_an_object_is_downloaded_once_per_node(prefix, fake_gcs, downloads, tmp_path: Path) -> None:
    uri = f"{prefix}/data/images/1.png"
    nodes = [tmp_path / "node-a", tmp_path / "node-b"]
    with ThreadPoolExecutor(PROCESSES_PER_NODE * len(nodes)) as pool:
        got = list(pool.map(lambda cache: node_cache.read_object(uri, cache, fs_for(fake_gcs)),
                            nodes * PROCESSES_PER_NODE))
    assert got == [b"\x89PNG\x01"] * (PROCESSES_PER_NODE * len(nodes))
    again = [node_cache.read_object(uri, cache, fs_for(fake_gcs)) for cache in nodes for _ in range(3)]  # "epochs"
    assert again == [b"\x89PNG\x01"] * 6
    assert downloads(prefix) == {uri: len(nodes)}
    assert node_cache.read_object(f"{prefix}/data/images/missing.png", nodes[0], fs_for(fake_gcs)) is None


def test_a_dataset_prefix_brings_data_files_only(prefix, fake_gcs, downloads, tmp_path: Path) -> None:
    local = node_cache.copy_data_files(f"{prefix}/data", tmp_path, fs_for(fake_gcs), {".parquet", ".jsonl"})
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert files == ["part/more.jsonl", "train.parquet"]
    assert (local / "train.parquet").read_bytes() == b"PAR1-not-really"
    # Only the two data files came down; again on the same node: nothing.
    node_cache.copy_data_files(f"{prefix}/data", tmp_path, fs_for(fake_gcs), {".parquet", ".jsonl"})
    assert downloads(prefix) == {f"{prefix}/data/train.parquet": 1, f"{prefix}/data/part/more.jsonl": 1}
    one = node_cache.copy_data_files(f"{prefix}/data/train.parquet", tmp_path, fs_for(fake_gcs), {".parquet"})
    assert one.name == "train.parquet" and one.read_bytes() == b"PAR1-not-really"
    with pytest.raises(FileNotFoundError):
        node_cache.copy_data_files(f"{prefix}/nothing-here", tmp_path, fs_for(fake_gcs), {".parquet"})

