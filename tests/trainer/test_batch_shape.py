"""Shape-independent training (issue #13): a global batch (default the tutorial's 64 = 16 workers x 1 x 4),
a micro-batch from the recipe, accumulation derived from the live world size; the same values on 1 and
2 workers take the same optimizer steps per epoch with the same learning rates."""

from __future__ import annotations

import dataclasses

import pytest
import vision_train
from flags import RECIPES, BatchShape, UsageError, batch_shape, describe_batch, parse_args
from model import sft_config

from demo.sample_data import build_sample_dataset
from tests.trainer.test_ray_job import N_ROWS, job_flags, records

CPU = ["--use_gpu=false", "--quantization=none"]


@pytest.mark.parametrize(
    ("world", "cap", "shape"),
    [(16, 12, (4, 1)), (8, 12, (8, 1)), (1, 12, (8, 8)), (8, 6, (4, 2)), (16, 1, (1, 4)), (2, 5, (4, 8))],
)
def test_micro_batch_is_the_largest_divisor_of_the_share_up_to_the_cap(world: int, cap: int,
                                                                       shape: tuple[int, int]) -> None:
    assert batch_shape(64, world, cap) == BatchShape(64, *shape)


def test_a_global_batch_that_does_not_split_is_rounded_down_and_said() -> None:
    """64 on 12 workers: 5 each (60), said in the worker's log line; never below one sample per worker."""
    shape = batch_shape(64, 12, 12)
    assert shape == BatchShape(60, 5, 1)
    assert describe_batch(shape, 12, 64) == ("[batch] global batch 60 = 12 workers x micro-batch 5 x 1 accumulation "
                                             "(global_batch_size=64 rounded down to a multiple of 12 workers)")
    assert batch_shape(8, 16, 4) == BatchShape(16, 1, 1)
    assert parse_args([*CPU, "--num_workers=12"]).global_batch_size == 64  # the flag itself is kept


def test_accumulation_is_no_flag_any_more() -> None:
    with pytest.raises(UsageError, match="--gradient_accumulation_steps: accumulation is derived: set --global_batch_size"):
        parse_args([*CPU, "--gradient_accumulation_steps=4"])


def test_the_recipes_differ_only_in_speed_levers(tmp_path) -> None:
    """fast and tutorial share the tutorial's optimization: global batch, learning rate, schedule, clipping."""
    fast, tutorial = parse_args([]), parse_args(["--recipe=tutorial"])
    differing = {f.name for f in dataclasses.fields(fast) if getattr(fast, f.name) != getattr(tutorial, f.name)}
    assert differing == {"recipe"} | {name for name, (a, b, _) in RECIPES.items() if a != b}
    assert fast.global_batch_size == tutorial.global_batch_size == 64
    configs = [sft_config(a, tmp_path, False, batch_shape(a.global_batch_size, 16, a.per_device_train_batch_size))
               for a in (parse_args(CPU), parse_args([*CPU, "--recipe=tutorial", "--quantization=none"]))]
    for key in ("learning_rate", "lr_scheduler_type", "max_grad_norm", "num_train_epochs", "weight_decay",
                "warmup_steps"):
        assert getattr(configs[0], key) == getattr(configs[1], key), key


@pytest.mark.slow
def test_one_and_two_workers_take_the_same_steps(ray_cluster, tiny_model, cache_dir, tmp_path) -> None:
    """8 training rows, global batch 4, micro-batch cap 2, one epoch: 2 optimizer steps on 1 worker (2 x 2
    accumulation) and on 2 workers (2 x 1), with the same learning rate at each step."""
    data = build_sample_dataset(tmp_path / "data", n_rows=N_ROWS, seed=0)
    runs = {}
    for workers in (1, 2):
        flags = [*job_flags(tiny_model, data, cache_dir, str(tmp_path / "storage"), -1, run_name=f"w{workers}"),
                 f"--num_workers={workers}", "--global_batch_size=4", "--num_train_epochs=1", "--save_strategy=no"]
        summary = vision_train.main(flags)
        metrics = records((tmp_path / "storage" / "runs" / f"w{workers}" / "metrics.jsonl").read_text())
        runs[workers] = (summary, [(r["step"], r["learning_rate"]) for r in metrics if r["kind"] == "train"])
    (one, lr_one), (two, lr_two) = runs[1], runs[2]
    assert one["train_rows"] == two["train_rows"] == 8
    assert one["global_step"] == two["global_step"] == one["max_steps"] == two["max_steps"] == 2
    assert lr_one == lr_two and len(lr_one) == 2
    assert (one["global_batch_size"], one["micro_batch_size"], one["gradient_accumulation_steps"]) == (4, 2, 2)
    assert (two["global_batch_size"], two["micro_batch_size"], two["gradient_accumulation_steps"]) == (4, 2, 1)
