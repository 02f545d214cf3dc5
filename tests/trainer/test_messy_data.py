"""Bad rows never kill a job (issue #13): under Ray, a dataset with a truncated JPEG, a decompression
bomb and an image marker in a product name trains to the end with the three rows counted, and an image
that vanishes after the scan is skipped in training, counted, not fatal. bad_rows=fail on the same rows
stops before training, naming the row, without Ray retrying it: tests/trainer/test_usage_error_job.py
(one run of the driver holds both that claim and the console's)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer.faults import RemoveFileOnTrainBegin
from tests.trainer.messy import BAD_REASONS, write_messy_jsonl
from tests.trainer.test_ray_job import job_flags, records
from trainer import vision_train

pytestmark = pytest.mark.slow

N_GOOD = 6
STEPS = 3
VANISHING_ROW = 2


@pytest.fixture(scope="module")
def messy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    sample = build_sample_dataset(tmp_path_factory.mktemp("sample"), n_rows=N_GOOD, seed=0)
    return write_messy_jsonl(sample, tmp_path_factory.mktemp("messy"), n_good=N_GOOD)


def test_messy_rows_train_to_the_end_counted(ray_cluster, tiny_model, cache_dir, messy, tmp_path, capsys) -> None:
    data, where = messy
    # Its own copy: the image removed mid-run must not be missing for the other tests of this module.
    data = Path(shutil.copytree(data.parent, tmp_path / "messy")) / data.name
    vanishing = data.parent / "images" / f"{VANISHING_ROW}.png"
    root = tmp_path / "storage"
    # 6 good rows: global batch 6, every row in each step (8 would not fit them: refused since #21)
    flags = [*job_flags(tiny_model, data, cache_dir, str(root), STEPS, run_name="messy"), "--eval_fraction=0",
             "--global_batch_size=6"]
    summary = vision_train.main(flags, callbacks=[RemoveFileOnTrainBegin(str(vanishing))])
    assert summary["completed"] is True and summary["global_step"] == STEPS
    assert summary["skipped_rows"] == BAD_REASONS
    assert summary["skipped_row_ids"] == {reason: [row] for reason, row in where.items()}
    assert summary["skipped_in_training"] == {"missing_image": 1}
    assert summary["skipped_in_training_row_ids"] == {"missing_image": [VANISHING_ROW]}
    losses = [r["loss"] for r in records((root / "runs" / "messy" / "metrics.jsonl").read_text()) if "loss" in r]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses)
    out = capsys.readouterr().out
    assert "skipped_rows" in out and "skipped_in_training" in out  # the driver's summary lists both

