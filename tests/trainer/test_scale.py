"""Scale, on a real Ray job whose data is on gs:// (fake-gcs-server: a parquet of rows whose images are
separate objects beside it): over 2 workers, 2 epochs and a restart (a worker killed mid-run), every image
is downloaded once on the node, the dataset prefix brings only its data file, and the restart reads the
run's scan back instead of scanning again. Every count is the server's own request log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import GCS_BUCKET
from tests.trainer.faults import KillWorkerAfterStep
from trainer import vision_train as vt
from trainer.job.storage import Storage

pytestmark = pytest.mark.slow

N_ROWS = 10  # 8 trained on, 2 held out
EPOCHS = 2
KILL_AFTER_STEP = 3  # after the step-2 checkpoint: the restart resumes mid-epoch 2
PREFIX = "scale"
SCAN_FILE = "data_scan.json"
SCAN_PARTS = "data_scan_parts/"


def upload_rows(storage: Storage, n_rows: int, work: Path) -> str:
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


@pytest.fixture(scope="module")
def job(ray_cluster, fake_gcs, fake_gcs_downloads, fake_gcs_uploads, tiny_model, tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("scale")
    bucket = Storage(root=f"gs://{GCS_BUCKET}/{PREFIX}", emulator_host=fake_gcs)
    data = upload_rows(bucket, N_ROWS, tmp / "rows")
    summary = vt.main([
        f"--model_id={tiny_model}", f"--dataset_name={data}", f"--cache_dir={tmp / 'node-cache'}",
        f"--storage_path={bucket.uri('storage')}", "--use_gpu=false", "--quantization=none", "--num_workers=2",
        "--per_device_train_batch_size=1", "--global_batch_size=4", f"--num_train_epochs={EPOCHS}",
        "--logging_steps=1", "--save_strategy=steps", "--save_steps=2", "--eval_fraction=0.2",
        "--learning_rate=5e-3", "--max_failures=2", "--seed=7",
    ], callbacks=[KillWorkerAfterStep(KILL_AFTER_STEP)])
    return {"summary": summary, "data": data, "downloads": fake_gcs_downloads(), "uploads": fake_gcs_uploads()}


def test_the_job_restarted_and_finished(job) -> None:
    summary = job["summary"]
    assert summary["resumed_from_step"] == 2  # the kill did happen, and the group restarted
    assert summary["global_step"] == summary["max_steps"] == EPOCHS * 8 // 4
    assert summary["train_rows"] == 8


def test_each_image_is_downloaded_once_on_the_node(job) -> None:
    images = {k: v for k, v in job["downloads"].items() if k.startswith(f"{job['data']}/images/")}
    assert sorted(images) == [f"{job['data']}/images/{i:04d}.png" for i in range(N_ROWS)]
    assert set(images.values()) == {1}, images  # 2 workers, the scan, 2 epochs, a restart: one download
    assert job["downloads"][f"{job['data']}/train.parquet"] == 1  # the driver's check and both workers


def test_the_restart_reuses_the_scan(job) -> None:
    uploads = [name for name in job["uploads"] if "/storage/runs/" in name]
    scans = [n for n in uploads if n.endswith(SCAN_FILE)]
    parts = [n for n in uploads if SCAN_PARTS in n and n.endswith(".json")]  # not the folder markers
    assert len(scans) == 1, uploads  # written once, by the first attempt
    assert len(parts) == 2, parts  # one share per worker of the first attempt; none after the restart
    assert job["summary"]["scan_reused"] is True  # the attempt that finished read the scan back
