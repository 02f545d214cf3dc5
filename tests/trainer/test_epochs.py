"""Each epoch trains each row at most once, in whole global batches (#21): 45 training rows, global batch
8 on 2 workers (micro-batch 2 x 2 accumulation) through the trainer's own sampler and the data loader
accelerate builds for each of the two ranks (the path Ray Train's workers take). Before #21 the Trainer's
RandomSampler and accelerate's even batches padded the epoch to 48 samples, 3 rows trained twice."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from accelerate.data_loader import prepare_data_loader
from flags import UsageError, parse_args
from model import build_trainer

from demo.sample_data import build_sample_dataset

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
    from epochs import check_rows

    with pytest.raises(UsageError, match=r"^global_batch_size=64 is more than the 5 training rows \(of 6, 1 held "
                                         r"out for eval\): lower --global_batch_size to at most 5, or add rows$"):
        check_rows(5, 64, "of 6, 1 held out for eval")
    assert check_rows(64, 64, "") == {"rows_per_epoch": 64, "rows_left_out_per_epoch": 0, "steps_per_epoch": 1}


