"""--resume_from continues a checkpoint only with the adapter's shape it was trained with (#27.12): another LoRA
rank, targets, trained embeddings, base model or quantization is refused by the driver in one sentence before
any worker starts (before, the driver printed `lora_r 16 → 8` and every worker failed on a state-dict size
mismatch, max_failures times); changes that keep the shape (alpha, dropout, learning rate) pass. No Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.job.test_checkpoint_check import write_checkpoint
from tests.trainer.job.test_run_definition import CPU, FIRST, crashed, plan  # noqa: F401 - crashed is a fixture
from trainer import vision_train
from trainer.job.flags import UsageError
from trainer.job.runs import RUNS_DIR

SHAPE_CHANGES = {
    "--lora_r=8": "lora_r 16 → 8",
    "--lora_target=language-model": 'lora_target "all-linear" → "language-model"',
    "--train_embeddings=true": "train_embeddings false → true",
    "--model_id=/models/another-gemma": 'model_id "google/gemma-3-4b-it" → "/models/another-gemma"',
    "--quantization=4bit": 'quantization "none" → "4bit"',
}
REST = ("a checkpoint continues only with the adapter shape it was trained with (model_id, quantization, lora_r, "
        "lora_target, train_embeddings): keep those flags, or drop --resume_from to train a new adapter")


def checkpoint(root: Path) -> Path:
    return root / RUNS_DIR / "r" / "checkpoints" / "checkpoint-000004"


@pytest.mark.parametrize("flag", SHAPE_CHANGES)
@pytest.mark.parametrize("how", ["run name", "checkpoint path"])
def test_another_adapter_shape_is_refused_up_front(crashed, flag: str, how: str) -> None:  # noqa: F811
    root, data = crashed
    source = "r" if how == "run name" else str(checkpoint(root))
    extra = ["--use_gpu=true"] if flag == "--quantization=4bit" else []  # 4-bit needs GPU workers
    with pytest.raises(UsageError) as err:
        plan(root, data, "--run_name=r2", f"--resume_from={source}", flag, *extra)
    assert str(err.value) == (f"resume_from={source}: its checkpoint {checkpoint(root)} was trained with another "
                              f"adapter shape ({SHAPE_CHANGES[flag]}); {REST}")


def test_changes_that_keep_the_shape_pass(crashed) -> None:  # noqa: F811
    root, data = crashed
    cont = plan(root, data, "--run_name=r2", "--resume_from=r", "--lora_alpha=32", "--lora_dropout=0.1",
                "--learning_rate=1e-3")
    assert cont.resume_checkpoint == str(checkpoint(root))
    assert cont.log_line.endswith("with new settings: learning_rate 0.005 → 0.001; lora_alpha 16 → 32; lora_dropout "
                                  "0.05 → 0.1)")


def test_a_checkpoint_without_its_run_definition_is_checked_by_its_adapter_config(tmp_path: Path) -> None:
    """A checkpoint copied out of its run: its adapter_config.json says the rank (r) and trained embeddings."""
    foreign = write_checkpoint(tmp_path / "elsewhere" / "checkpoint-000004", 4)  # adapter_config.json: r 16
    data = tmp_path / "data"
    from localkit.sample_data import build_sample_dataset

    data = build_sample_dataset(data, n_rows=12, seed=0)
    with pytest.raises(UsageError, match=rf"^resume_from={foreign}: its checkpoint {foreign} was trained with another "
                                         r"adapter shape \(lora_r 16 → 8\); a checkpoint continues only"):
        plan(tmp_path / "storage", data, f"--resume_from={foreign}", "--lora_r=8")
    assert plan(tmp_path / "storage", data, f"--resume_from={foreign}").resume_checkpoint == str(foreign)
    assert json.loads((foreign / "adapter_config.json").read_text()) == {"r": 16}


def test_the_driver_exits_2_with_the_sentence_before_ray(crashed, capsys) -> None:  # noqa: F811
    root, data = crashed
    with pytest.raises(SystemExit) as stop:
        vision_train.main([*CPU, f"--storage_path={root}", f"--dataset_name={data}", *FIRST, "--run_name=r2",
                           "--resume_from=r", "--lora_r=8"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: resume_from=r: its checkpoint {checkpoint(root)} was trained with " \
                                      f"another adapter shape (lora_r 16 → 8); {REST}\n"
