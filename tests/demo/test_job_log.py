"""The demo's terminal shows the trainer's lines and every warning/error, not Ray's own logging.

The lines are taken from a real `make demo` job log (Ray 2.60, Ray Train V2, 2 CPU workers)."""

from __future__ import annotations

import io

import pytest

from demo.job_log import LineSplitter, is_ray_own
from demo.job_runner import _Out

W = "\x1b[36m(RayTrainWorker pid=20285)\x1b[0m "
C = "\x1b[36m(TrainController pid=19514)\x1b[0m "
LEFT_OUT = [
    "2026-12-01 09:41:02,123\tINFO worker.py:1851 -- Connecting to existing Ray cluster at address: 127.0.0.1:6379...",
    "Running entrypoint for job raysubmit_yq2viNyGJbjTiDFN: python ./vision_train.py --num_workers=2",
    C + "Requesting resources: {'CPU': 1} * 2",
    C + "Failed to send resource request for train-33da. If this only happens transiently during network "
        "partition or CPU being overloaded, it's safe to ignore this error.",
    C + "Traceback (most recent call last):",
    C + "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
    C + "Attempting to start training worker group of size 2 with the following resources: [{'CPU': 1}] * 2",
    C + "- (ip=127.0.0.1, pid=20285) world_rank=0, local_rank=0, node_rank=0",
    W + "Setting up process group for: env:// [rank=0, world_size=2]",
    W,
    W + "2026-12-01 09:41:09,001\tINFO config.py:357 -- something Ray logs",
    W + "Checkpoint successfully created at: Checkpoint(filesystem=gcs, path=b/local/runs/r/checkpoints/c-6)",
    W + "Reporting training result 1: TrainingReport(checkpoint=Checkpoint(filesystem=gcs, path=x), metrics={})",
    W + "{'loss': '12.35', 'grad_norm': '4.122', 'learning_rate': '0.005', 'epoch': '0.05556'}",
    W + "{'eval_loss': '10.99', 'eval_runtime': '3.413'}",
    W + "{'train_runtime': '71.8', 'train_samples_per_second': '0.334'}",
    "(autoscaler +3s) Tip: use `ray status` to view detailed cluster status.",
]
SHOWN = [
    "fresh run run-20261201-100029 (no --run_name given: named from the UTC time)",
    W + '[data] {"rows": 80, "train_rows": 72, "eval_rows": 8, "skipped_rows": {}}',
    W + "trainable params: 16,804,864 || all params: 33,688,064 || trainable%: 49.8837",
    W + "[samples] 8/8 rows in 3.1 s (budget 600 s)",
    W + "[transformers] The tokenizer has new PAD/BOS/EOS tokens that differ from the model config",
    W + "UserWarning: something the user should see",
    W + "Traceback (most recent call last):",
    "2026-12-01 09:41:02,123\tWARNING worker.py:12 -- a Ray warning",
    "Traceback (most recent call last):",
    "  gemma3-ray training summary",
]


@pytest.mark.parametrize("line", LEFT_OUT)
def test_ray_own_lines_are_left_out(line: str) -> None:
    assert is_ray_own(line)


@pytest.mark.parametrize("line", SHOWN)
def test_trainer_lines_warnings_and_errors_are_shown(line: str) -> None:
    assert not is_ray_own(line)


def test_lines_split_across_chunks_are_judged_whole() -> None:
    s = LineSplitter()
    assert s.feed("(TrainController pid=1) Start") == []
    assert s.feed("ed training\nfresh ") == ["(TrainController pid=1) Started training"]
    assert s.flush() == ["fresh "] and s.flush() == []


def test_terminal_gets_the_shown_lines_and_the_log_everything() -> None:
    log, term = io.StringIO(), io.StringIO()
    out = _Out(log, term)
    text = "\n".join(LEFT_OUT + SHOWN) + "\n"
    out.job(text[:50])
    out.job(text[50:])
    out.close()
    assert log.getvalue() == text
    no_colour = [line.replace("\x1b[36m", "").replace("\x1b[0m", "") for line in SHOWN]
    assert term.getvalue().splitlines() == [f"  job | {line}" for line in no_colour]  # not a TTY: no colours
    assert out.hidden == len(LEFT_OUT)
