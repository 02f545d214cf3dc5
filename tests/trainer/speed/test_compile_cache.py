"""Triton's compile cache on the storage (trainer/compile_cache.py): restored before the first compile, stored
after the first step when it grew, never trusted beyond plain files under the cache directory."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.job.storage import storage_at
from trainer.speed import compile_cache


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compile_cache.CACHE_ENV, raising=False)


def kernel(root: Path, name: str, data: bytes) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "k.cubin").write_bytes(data)


def test_a_second_job_starts_with_the_first_jobs_kernels(tmp_path: Path) -> None:
    store = storage_at(str(tmp_path / "store"))
    first = compile_cache.restore(store, tmp_path / "node1", "k1")
    assert first["restored_files"] == 0 and compile_cache.os.environ[compile_cache.CACHE_ENV] == first["dir"]
    kernel(Path(first["dir"]), "abc", b"cubin-1")  # what Triton compiled during the first step
    saved = compile_cache.save(store, Path(first["dir"]), "k1", 0)
    assert saved["stored"] is True and saved["files"] == 1 and saved["bytes"] > len(b"cubin-1")
    compile_cache.os.environ.pop(compile_cache.CACHE_ENV)
    second = compile_cache.restore(store, tmp_path / "node2", "k1")  # another pod: empty local disk
    assert second["restored_files"] == 1
    assert (Path(second["dir"]) / "abc" / "k.cubin").read_bytes() == b"cubin-1"
    assert compile_cache.save(store, Path(second["dir"]), "k1", 1) == {"stored": False, "files": 1}
    compile_cache.os.environ.pop(compile_cache.CACHE_ENV)
    assert compile_cache.restore(store, tmp_path / "node3", "other-versions")["restored_files"] == 0


def test_an_environment_cache_dir_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path / "mine"))
    report = compile_cache.restore(storage_at(str(tmp_path / "store")), tmp_path / "node", "k")
    assert report["dir"] == str(tmp_path / "mine") and "set by the environment" in report["note"]


def test_only_plain_files_under_the_cache_dir_are_unpacked(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("ok/k.json", b"{}"), ("../escape.txt", b"x"), ("/abs.txt", b"y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("ok/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    store = storage_at(str(tmp_path / "store"))
    store.write_bytes("compile-cache/k.tar", buf.getvalue())
    report = compile_cache.restore(store, tmp_path / "node", "k")
    local = Path(report["dir"])
    assert report["restored_files"] == 1 and (local / "ok" / "k.json").exists() and not (local / "ok" / "link").exists()
    assert not (tmp_path / "node" / "escape.txt").exists() and not Path("/abs.txt").exists()


def test_rank_0_stores_after_the_first_step(tmp_path: Path) -> None:
    callbacks = []
    trainer = SimpleNamespace(add_callback=callbacks.append)
    args = SimpleNamespace(storage_path=str(tmp_path / "store"), gcs_bucket=None, output_dir="o",
                           cache_dir=str(tmp_path / "node"))
    report = compile_cache.keep_on_storage(args, trainer)
    kernel(Path(report["dir"]), "new", b"cubin")
    step = SimpleNamespace(global_step=1)
    callbacks[0].on_step_end(SimpleNamespace(process_index=1), step, None)  # other ranks store nothing
    assert "saved" not in report
    callbacks[0].on_step_end(SimpleNamespace(process_index=0), step, None)
    assert report["saved"]["stored"] is True
    assert storage_at(str(tmp_path / "store")).exists(f"compile-cache/{compile_cache.cache_key()}.tar")
