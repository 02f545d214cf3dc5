"""Each epoch trains each row at most once, in whole global batches (#21): 45 training rows, global batch
8 on 2 workers (micro-batch 2 x 2 accumulation) through the trainer's own sampler and the data loader
accelerate builds for each of the two ranks (the path Ray Train's workers take). Before #21 the Trainer's
RandomSampler and accelerate's even batches padded the epoch to 48 samples, 3 rows trained twice."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from accelerate.data_loader import prepare_data_loader

from localkit.sample_data import build_sample_dataset
from trainer.job.arguments import parse_args
from trainer.job.flags import UsageError
from trainer.worker.model import build_trainer

ROWS, GLOBAL_BATCH, WORKERS, MICRO_CAP = 45, 8, 2, 2
EPOCHS = 2


@pytest.fixture(scope="module")
def trainer(tiny_model, cache_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("epochs")
    data = build_sample_dataset(tmp / "data", n_rows=ROWS, seed=3)
    args = parse_args([f"--model_id={tiny_model}", f"--dataset_name={data}", f"--cache_dir={cache_dir}",
                       "--use_gpu=false", "--quantization=none", f"--num_workers={WORKERS}", "--eval_fraction=0",
                       f"--global_batch_size={GLOBAL_BATCH}", f"--per_device_train_batch_size={MICRO_CAP}",
                       "--save_strategy=no", "--seed=5"])
    built, _, stats = build_trainer(args, tiny_model, tmp / "out", torch.device("cpu"), None)  # split for num_workers
    return built, stats


def rank_epochs(trainer, rank: int) -> list[list[list[int]]]:
    """[epoch][micro-batch] -> row indices, as rank `rank` of WORKERS iterates them."""
    dataset = trainer.train_dataset
    loader = torch.utils.data.DataLoader(range(len(dataset)), batch_size=trainer.args.per_device_train_batch_size,
                                         sampler=trainer._get_train_sampler(dataset), collate_fn=list)
    shard = prepare_data_loader(loader, num_processes=WORKERS, process_index=rank, put_on_device=False)
    epochs = []
    for epoch in range(EPOCHS):
        shard.set_epoch(epoch)  # as Trainer._run_epoch does
        epochs.append([list(b) for b in shard])
    return epochs


def test_each_epoch_trains_each_row_at_most_once_in_whole_global_batches(trainer) -> None:
    built, stats = trainer
    micro, accumulation = built.args.per_device_train_batch_size, built.args.gradient_accumulation_steps
    assert (stats["train_rows"], micro, accumulation) == (ROWS, 2, 2)
    ranks = [rank_epochs(built, r) for r in range(WORKERS)]
    orders = []
    for epoch in range(EPOCHS):
        per_rank = [ranks[r][epoch] for r in range(WORKERS)]
        # Every micro-batch full, every rank the same number of them, a whole number of optimizer steps.
        assert {len(b) for r in per_rank for b in r} == {micro}
        assert len(per_rank[0]) == len(per_rank[1]) == 5 * accumulation
        rows = Counter(i for r in per_rank for b in r for i in b)
        assert sum(rows.values()) == 40 and max(rows.values()) == 1, rows.most_common(3)  # none repeated
        orders.append(set(rows))
    assert orders[0] != orders[1]  # another 5 rows left out in the second epoch
    assert (stats["rows_per_epoch"], stats["rows_left_out_per_epoch"], stats["steps_per_epoch"]) == (40, 5, 5)


def test_a_global_batch_larger_than_the_rows_is_refused() -> None:
    """5 rows, global batch 64: before #21 every step trained 8 samples while the log said 64."""
    from trainer.job.epochs import check_rows

    with pytest.raises(UsageError, match=r"^global_batch_size=64 is more than the 5 training rows \(of 6, 1 held "
                                         r"out for eval\): use --global_batch_size=5 \(the most that 5 rows fill and "
                                         r"1 worker split exactly\), or add rows$"):
        check_rows(5, 64, "of 6, 1 held out for eval", [1])
    assert check_rows(64, 64, "", [1]) == {"rows_per_epoch": 64, "rows_left_out_per_epoch": 0, "steps_per_epoch": 1}


@pytest.mark.parametrize(("rows", "counts", "advice"), [
    (5, [2], "use --global_batch_size=4 (the most that 5 rows fill and 2 workers split exactly), or add rows"),
    (13, [2, 3, 4], "use --global_batch_size=12 (the most that 13 rows fill and every worker count 2..4 split "
                    "exactly), or add rows"),
    (10, [2, 3, 4], "add rows (every worker count 2..4 splits only a global batch of 12 or more), or use fewer workers"),
])
def test_the_advice_is_a_global_batch_that_is_itself_accepted(rows: int, counts: list[int], advice: str) -> None:
    """#27.14: 5 rows on 2 workers advised `at most 5`, which the workers' split refuses (4 is valid)."""
    from trainer.job.elastic import run_shapes
    from trainer.job.epochs import check_rows

    with pytest.raises(UsageError) as err:
        check_rows(rows, 16, f"of {rows} rows", counts)
    assert str(err.value).endswith(f": {advice}")
    if advice.startswith("use"):
        advised = int(advice.split("=")[1].split()[0])
        run_shapes(advised, 2, counts[-1], counts[0] if len(counts) > 1 else None)  # accepted: no BatchSplitError
        assert check_rows(rows, advised, "", counts)["steps_per_epoch"] == 1
