"""The release's grant covers what the job's storage layer really does: pyarrow's GCS file system
(Ray Train's) on fake-gcs-server, whose request log shows every object name and list prefix it
touched. With the directory object `prereqs` creates, every request stays under the release's
prefix (but one metadata probe of the bare prefix name, which the grant denies and pyarrow takes for
"not there") and none reads the bucket's metadata, so ``roles/storage.objectUser`` with the prefix
condition suffices and no bucket-level role is needed; without it, pyarrow walks up to the bucket
root (arrow's CreateDirMarkerRecursive, cpp/src/arrow/filesystem/gcsfs.cc) and writes outside."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.parse
from datetime import timedelta
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Overrides, resolve
from gemma3_ray.release.prereqs import Prereqs
from gemma3_ray.utils.plan import Plan

from tests.plugin.conftest import PROJECT, REGION, _fake_gcs_binary, _wait_http, free_port, storage_client

BUCKET = "scope-bucket"
_REQUEST_RE = re.compile(r'\\"(?P<method>[A-Z]+) (?P<path>/\S+) HTTP')


@pytest.fixture
def logged_gcs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """fake-gcs-server with its request log in a file (info level: one line per request)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "fake-gcs.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(_fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                 "-backend", "memory", "-location", REGION, "-external-url", url,
                                 "-log-level", "info"], stdout=sink, stderr=sink)
    try:
        _wait_http(f"{url}/storage/v1/b", proc)
        yield url, port, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _touched(log: Path, start: int) -> tuple[set[str], bool]:
    """(object names and list prefixes requested after byte ``start``, whether bucket metadata was read)."""
    names: set[str] = set()
    bucket_read = False
    for m in _REQUEST_RE.finditer(log.read_bytes()[start:].decode(errors="replace")):
        url = urllib.parse.urlsplit(m["path"])
        query = urllib.parse.parse_qs(url.query)
        path = urllib.parse.unquote(url.path)
        if path == f"/storage/v1/b/{BUCKET}":
            bucket_read = True
        elif path.startswith(f"/storage/v1/b/{BUCKET}/o/"):
            names.add(path.removeprefix(f"/storage/v1/b/{BUCKET}/o/"))
        names.update(query.get("name", []) + query.get("prefix", []))
    return names, bucket_read


def _job_io(port: int, run_dir: str, tmp_path: Path) -> None:
    """What Ray Train does with its storage path: make the run's directory, write a marker file, list
    it, upload a checkpoint directory, read a file back, delete an old checkpoint."""
    fs = pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=f"127.0.0.1:{port}",
                            retry_time_limit=timedelta(seconds=5))
    fs.create_dir(run_dir, recursive=True)
    with fs.open_output_stream(f"{run_dir}/.validate_storage_marker") as f:
        f.write(b"x")
    fs.get_file_info(pafs.FileSelector(run_dir, recursive=True))
    local = tmp_path / "checkpoint_000001"
    local.mkdir()
    (local / "model.pt").write_bytes(b"w")
    pafs.copy_files(str(local), f"{run_dir}/checkpoint_000001", destination_filesystem=fs)
    with fs.open_input_file(f"{run_dir}/checkpoint_000001/model.pt") as f:
        assert f.read() == b"w"
    fs.delete_dir_contents(f"{run_dir}/checkpoint_000001")


@pytest.mark.parametrize("with_folder", [True, False])
def test_the_jobs_storage_io_stays_inside_the_release_prefix(with_folder: bool, logged_gcs, tmp_path: Path) -> None:
    url, port, log = logged_gcs
    storage = storage_client(url)
    storage.create_bucket(BUCKET)
    dep = resolve(Overrides(project=PROJECT, region=REGION, namespace="team-a", bucket=BUCKET), None, None)
    if with_folder:  # the step of `prereqs` that makes the directory object
        p = Prereqs(dep, Clients(project=PROJECT, storage=storage))
        p.bucket = storage.get_bucket(BUCKET)
        plan = Plan()
        p._folder(plan)  # noqa: SLF001 - one step of the plan, on a server without bucket IAM
        for action in plan.actions:
            action.run()
        assert [b.name for b in storage.list_blobs(BUCKET)] == [f"{dep.prefix}/"]
    time.sleep(0.2)  # the server flushes its log line by line
    start = log.stat().st_size
    _job_io(port, f"{BUCKET}/{dep.prefix}/runs/r1-20261201T100000Z", tmp_path)
    time.sleep(0.2)
    names, bucket_read = _touched(log, start)
    outside = sorted(n for n in names if not n.startswith(f"{dep.prefix}/"))
    assert names, "the log shows the requests"
    if with_folder:
        # Only the probe of the bare prefix (a metadata GET the grant denies; pyarrow reads any error
        # there as "no such directory" and then finds PREFIX/) is outside; nothing is written outside.
        assert outside == [dep.prefix] and not bucket_read
    else:  # the failing case: what the grant alone could not cover
        assert "gemma3-ray/" in outside and bucket_read
