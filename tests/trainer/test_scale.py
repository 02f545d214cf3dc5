"""Scale, on a real Ray job whose data is on gs:// (fake-gcs-server: a parquet of rows whose images are
separate objects beside it): over 2 workers, 5 epochs (global batch 8 = the 8 training rows) and a restart
(a worker killed mid-run), every image is downloaded once on the node, the dataset prefix brings only its data
file, and the restart reads the run's scan back instead of scanning again. Every count is the server's own
request log. The job is conftest's gcs_restart_run, shared with test_ray_job's resume drill (one run, not two)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.trainer.conftest import GCS_RUN_ROWS, GCS_RUN_STEPS

pytestmark = pytest.mark.slow

N_ROWS = GCS_RUN_ROWS  # 8 trained on, 2 held out
SCAN_FILE = "data_scan.json"
SCAN_PARTS = "data_scan_parts/"


@pytest.fixture(scope="module")
def job(gcs_restart_run) -> dict[str, Any]:
    return gcs_restart_run


def test_the_job_restarted_and_finished(job) -> None:
    summary = job["summary"]
    assert summary["resumed_from_step"] == 2  # the kill did happen, and the group restarted
    assert summary["global_step"] == summary["max_steps"] == GCS_RUN_STEPS
    assert summary["train_rows"] == 8


def test_each_image_is_downloaded_once_on_the_node(job) -> None:
    images = {k: v for k, v in job["downloads"].items() if k.startswith(f"{job['data']}/images/")}
    assert sorted(images) == [f"{job['data']}/images/{i:04d}.png" for i in range(N_ROWS)]
    assert set(images.values()) == {1}, images  # 2 workers, the scan, 5 epochs, a restart: one download
    assert job["downloads"][f"{job['data']}/train.parquet"] == 1  # the driver's check and both workers


def test_the_restart_reuses_the_scan(job) -> None:
    uploads = [name for name in job["uploads"] if name.startswith(job["root"] + "/")]
    scans = [n for n in uploads if n.endswith(SCAN_FILE)]
    parts = [n for n in uploads if SCAN_PARTS in n and n.endswith(".json")]  # not the folder markers
    assert len(scans) == 1, uploads  # written once, by the first attempt
    assert len(parts) == 2, parts  # one share per worker of the first attempt; none after the restart
    assert job["summary"]["scan_reused"] is True  # the attempt that finished read the scan back
