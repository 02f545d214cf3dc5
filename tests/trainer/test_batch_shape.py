"""Shape-independent training (issue #13): a global batch (default the tutorial's 64 = 16 workers x 1 x 4),
a micro-batch from the recipe, accumulation derived from the live world size; the same values on 1 and
2 workers take the same optimizer steps per epoch with the same learning rates. The global batch is exact
on every worker count the run may take, or refused at the start with the nearest valid values (#21)."""

from __future__ import annotations

import dataclasses

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer.test_ray_job import N_ROWS, job_flags, records
from trainer import vision_train
from trainer.job.arguments import parse_args
from trainer.job.elastic import BatchShape, BatchSplitError, describe, run_shapes, split_batch
from trainer.job.flags import RECIPES, UsageError
from trainer.worker.model import sft_config

CPU = ["--use_gpu=false", "--quantization=none"]


@pytest.mark.parametrize(
    ("world", "cap", "shape"),
    [(16, 12, (4, 1)), (8, 12, (8, 1)), (1, 12, (8, 8)), (8, 6, (4, 2)), (16, 1, (1, 4)), (2, 5, (4, 8))],
)
def test_micro_batch_is_the_largest_divisor_of_the_share_up_to_the_cap(world: int, cap: int,
                                                                       shape: tuple[int, int]) -> None:
    assert split_batch(64, cap, world) == BatchShape(64, *shape)
    assert run_shapes(64, cap, world, None) == {world: BatchShape(64, *shape)}


@pytest.mark.parametrize(("global_batch", "workers", "message"), [
    (64, 3, "global_batch_size=64 does not split exactly over 3 workers (micro-batch x accumulation x workers must "
            "equal it): use --global_batch_size=63 or --global_batch_size=66, or --num_workers=2 or 4"),
    (2, 4, "global_batch_size=2 does not split exactly over 4 workers (micro-batch x accumulation x workers must "
           "equal it): use --global_batch_size=4, or --num_workers=2"),
    (64, 12, "global_batch_size=64 does not split exactly over 12 workers (micro-batch x accumulation x workers "
             "must equal it): use --global_batch_size=60 or --global_batch_size=72, or --num_workers=8 or 16"),
])
def test_a_global_batch_the_workers_do_not_divide_is_refused_with_the_nearest_values(
        global_batch: int, workers: int, message: str) -> None:
    """Before #21 64 on 3 workers trained 63, 2 on 4 trained 4 ("rounded down"), 64 on 12 trained 60."""
    with pytest.raises(BatchSplitError) as err:
        run_shapes(global_batch, 16, workers, None)
    assert str(err.value) == message
    with pytest.raises(BatchSplitError):
        split_batch(global_batch, 16, workers)  # what each worker runs at its start: the same check


def test_every_elastic_shape_is_checked_at_the_start() -> None:
    """min_workers=2, num_workers=4: 64 splits on 2 and 4 workers but not on 3 (a 3 <-> 2 resize changed the
    batch before #21); 48 splits on all three, each shape exact."""
    with pytest.raises(BatchSplitError, match=r"^global_batch_size=64 does not split exactly over 3 of the worker "
                                              r"counts 2\.\.4 \(min_workers\.\.num_workers\).*use "
                                              r"--global_batch_size=60 or --global_batch_size=72$"):
        run_shapes(64, 16, 4, 2)
    shapes = run_shapes(48, 16, 4, 2)
    assert shapes == {2: BatchShape(48, 12, 2), 3: BatchShape(48, 16, 1), 4: BatchShape(48, 12, 1)}
    for workers, shape in shapes.items():
        assert shape.micro_batch * shape.accumulation * workers == 48


def test_a_micro_batch_below_its_cap_is_exact_and_said() -> None:
    """68 on 4 workers with cap 16: 17 per worker is prime, so 1 x 17 is the only exact split; it runs, and
    the line says why and what would run micro-batches of 16 (before #21: 1 x 17 without a word)."""
    shape = run_shapes(68, 16, 4, None)[4]
    assert shape == BatchShape(68, 1, 17)
    assert describe(shape, 4, 16) == (
        "[batch] global batch 68 = 4 workers x micro-batch 1 x 17 accumulation (micro-batch 1, not 16: 17 samples "
        "per worker have no divisor between 2 and 16; global_batch_size=64 or 128 would run micro-batches of 16)")
    assert describe(split_batch(64, 16, 4), 4, 16) == "[batch] global batch 64 = 4 workers x micro-batch 16 x 1 accumulation"


def test_the_driver_refuses_before_anything_starts(capsys) -> None:
    """No Ray, no data: the driver stops at the flags with the one sentence (exit 2)."""
    with pytest.raises(SystemExit) as stop:
        vision_train.main([*CPU, "--num_workers=3", "--global_batch_size=64", "--dataset_name=/nonexistent"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: global_batch_size=64 does not split exactly over 3 workers (micro-batch x accumulation x workers "
        "must equal it): use --global_batch_size=63 or --global_batch_size=66, or --num_workers=2 or 4")


def test_accumulation_is_no_flag_any_more() -> None:
    with pytest.raises(UsageError, match="--gradient_accumulation_steps: accumulation is derived: set --global_batch_size"):
        parse_args([*CPU, "--gradient_accumulation_steps=4"])


def test_the_recipes_differ_only_in_speed_levers(tmp_path) -> None:
    """fast and tutorial share the tutorial's optimization: global batch, learning rate, schedule, clipping."""
    fast, tutorial = parse_args([]), parse_args(["--recipe=tutorial"])
    differing = {f.name for f in dataclasses.fields(fast) if getattr(fast, f.name) != getattr(tutorial, f.name)}
    assert differing == {"recipe"} | {name for name, (a, b, *_) in RECIPES.items() if a != b}
    assert fast.global_batch_size == tutorial.global_batch_size == 64
    configs = [sft_config(a, tmp_path, False, split_batch(a.global_batch_size, a.per_device_train_batch_size, 16))
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


def test_each_segment_keeps_its_batch_shape(tmp_path) -> None:
    """summary.json's batch_shapes: one entry per worker-group start (elastic: per size), the segments a
    restart recomputes (from its checkpoint's step on) dropped."""
    from trainer.job.storage import Storage
    from trainer.worker.worker import record_segment

    run = Storage(str(tmp_path / "run"))
    assert record_segment(run, 0, 2, split_batch(8, 2, 2)) == [
        {"from_step": 0, "workers": 2, "global_batch": 8, "micro_batch": 2, "accumulation": 2}]
    record_segment(run, 4, 1, split_batch(8, 2, 1))  # lost a node after step 4's checkpoint
    again = record_segment(run, 4, 2, split_batch(8, 2, 2))  # that segment was cut short and redone on 2
    assert [(s["from_step"], s["workers"], s["accumulation"]) for s in again] == [(0, 2, 2), (4, 2, 2)]
    shrunk = record_segment(run, 6, 1, split_batch(8, 2, 1))
    assert [(s["from_step"], s["workers"], s["accumulation"]) for s in shrunk] == [(0, 2, 2), (4, 2, 2), (6, 1, 4)]
