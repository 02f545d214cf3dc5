"""What a run reports: metrics.jsonl, TensorBoard, checkpoints to Ray Train, summary.json.

metrics.jsonl is appended, one record per log/eval. Imported by the workers only (it needs transformers).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from trainer.job import checkpoint_manifest, startup_timing
from trainer.job.runs import CHECKPOINTS_DIR, METRICS_FILE, SUMMARY_FILE, TENSORBOARD_DIR
from trainer.job.storage import Storage

GIB = 2**30


class RunReporter(TrainerCallback):
    """Writes metrics.jsonl / TensorBoard to storage (rank 0) and reports checkpoints to Ray (all ranks).

    Throughput counts the time from the end of one optimizer step (or of an eval/save/log) to the end
    of the next: data loading and the step itself, not evaluation or checkpoint uploads.
    """

    def __init__(self, storage: Storage, rank: int, global_batch: int, tb_dir: Path, local_dir: Path,
                 resumed_from_step: int | None):
        self.storage, self.rank, self.global_batch, self.tb_dir = storage, rank, global_batch, tb_dir
        self.resumed_from_step = resumed_from_step
        self.metrics_copy = local_dir / METRICS_FILE  # rank 0 appends here, then to storage
        self.records: list[dict[str, Any]] = []
        self.mark = time.perf_counter()
        self.window = {"time": 0.0, "steps": 0}
        self.totals = {"time": 0.0, "steps": 0, "tokens": 0}
        self.last_num_tokens: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.rank == 0:
            # A restart of this run keeps the records up to its checkpoint's step (the steps after it are
            # trained again) and rewrites the file once; every later record is appended.
            old = self.storage.read_bytes(METRICS_FILE) or b""
            resumed = self.resumed_from_step or 0
            self.records = [r for r in _parse_lines(old.decode()) if r.get("step", 0) <= resumed]
            text = "".join(json.dumps(r) + "\n" for r in self.records)
            self.metrics_copy.write_text(text)
            if old:
                self.storage.write_bytes(METRICS_FILE, text.encode())
        self.mark = time.perf_counter()

    def _remark(self) -> None:
        self.mark = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.window["time"] += now - self.mark
        self.window["steps"] += 1
        self.mark = now

    def on_evaluate(self, args, state, control, **kwargs):
        self._remark()

    def on_log(self, args, state, control, logs=None, **kwargs):
        import torch

        logs = dict(logs or {})
        rec: dict[str, Any] = {"step": state.global_step, "epoch": state.epoch}
        if "loss" in logs:
            rec["kind"] = "train"
            if "mean_token_accuracy" in logs:
                logs["answer_token_accuracy"] = logs["mean_token_accuracy"]
            self._throughput(rec, logs.get("num_tokens"))
            if torch.cuda.is_available():
                rec["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated() / GIB
        elif any(k.startswith("eval_") for k in logs):
            rec["kind"] = "eval"
        else:
            rec["kind"] = "end"
        rec.update(logs)
        self._remark()
        if self.rank == 0:
            self.records.append(rec)
            line = json.dumps(rec) + "\n"
            with open(self.metrics_copy, "a") as fh:
                fh.write(line)
            self.storage.append(METRICS_FILE, line.encode(), self.metrics_copy)

    def _throughput(self, rec: dict[str, Any], num_tokens: float | None) -> None:
        if self.window["time"] > 0:
            rec["samples_per_second"] = self.window["steps"] * self.global_batch / self.window["time"]
            if num_tokens is not None and self.last_num_tokens is not None and num_tokens >= self.last_num_tokens:
                rec["tokens_per_second"] = (num_tokens - self.last_num_tokens) / self.window["time"]
                self.totals["tokens"] += num_tokens - self.last_num_tokens
            elif num_tokens is not None and self.last_num_tokens is None:
                rec["tokens_per_second"] = num_tokens / self.window["time"]
                self.totals["tokens"] += num_tokens
        self.totals["time"] += self.window["time"]
        self.totals["steps"] += self.window["steps"]
        self.window = {"time": 0.0, "steps": 0}
        self.last_num_tokens = num_tokens

    def _checkpoint_name(self, step: int) -> str:
        """checkpoint-<step>, or with a suffix when that directory exists (a broken one a restart passed
        over): a retrained step never writes into another checkpoint's directory."""
        name, n = f"checkpoint-{step:06d}", 1
        while self.storage.exists(f"{CHECKPOINTS_DIR}/{name}"):
            name, n = f"checkpoint-{step:06d}-{n}", n + 1
        return name

    def on_save(self, args, state, control, **kwargs):
        import ray.train

        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        metrics = {"step": state.global_step, "epoch": state.epoch}
        for rec in reversed(self.records):
            if "loss" in rec:
                metrics["loss"] = rec["loss"]
                break
        # Every rank reports: rank 0 holds the adapter, optimizer and trainer state, each rank its RNG
        # state; Ray merges them into one checkpoint directory. Its manifest (every rank's files with their
        # checksums) is written by rank 0 once every rank's upload is done: last.
        part = checkpoint_manifest.entries(ckpt) if ckpt.is_dir() else {}
        parts = gather({"name": self._checkpoint_name(state.global_step) if self.rank == 0 else None, "files": part})
        name = parts[0]["name"]
        checkpoint = ray.train.Checkpoint.from_directory(str(ckpt)) if ckpt.is_dir() else None
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)
        gather(None)  # a barrier: every rank's upload has returned
        if self.rank == 0:
            self.storage.write_bytes(f"{CHECKPOINTS_DIR}/{name}/{checkpoint_manifest.MANIFEST_FILE}",
                                     checkpoint_manifest.manifest([p["files"] for p in parts], state.global_step))
        if self.rank == 0 and self.tb_dir.is_dir():
            self.storage.upload_dir(self.tb_dir, TENSORBOARD_DIR)
        self._remark()


def gather(value: Any) -> list[Any]:
    """`value` of every rank, in rank order (all ranks call it; alone: [value])."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _parse_lines(text: str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a line cut short by a crash mid-write is dropped."""
    out = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def build_summary(trainer, storage: Storage, stats: dict[str, Any], reporter: RunReporter, result,
                  final_eval: dict[str, float], extra: dict[str, Any]) -> dict[str, Any]:
    """summary.json's content: the run's numbers and where its outputs are."""
    history = [r for r in reporter.records if r.get("kind") in ("train", "eval")]
    train_losses = [r["loss"] for r in history if "loss" in r]
    eval_losses = [r["eval_loss"] for r in history if "eval_loss" in r]
    if final_eval.get("eval_loss") is not None:
        eval_losses.append(final_eval["eval_loss"])
    t = reporter.totals
    return {
        "run_name": extra.pop("run_name"),
        "completed": True,
        "global_step": trainer.state.global_step,
        "epochs": trainer.state.epoch,
        "max_steps": trainer.state.max_steps,
        **stats,
        "num_workers": int(trainer.args.world_size),
        "global_batch_size": reporter.global_batch,
        "first_train_loss": train_losses[0] if train_losses else None,
        "final_train_loss": train_losses[-1] if train_losses else None,
        "first_eval_loss": eval_losses[0] if eval_losses else None,
        "final_eval_loss": eval_losses[-1] if eval_losses else None,
        "final_answer_token_accuracy": next(
            (r["answer_token_accuracy"] for r in reversed(history) if "answer_token_accuracy" in r), None
        ),
        "samples_per_second": t["steps"] * reporter.global_batch / t["time"] if t["time"] else None,
        "tokens_per_second": t["tokens"] / t["time"] if t["time"] else None,
        "train_runtime_s": result.metrics.get("train_runtime"),
        **extra,
        "metrics": storage.uri(METRICS_FILE),
        "tensorboard": storage.uri(TENSORBOARD_DIR),
        "newest_checkpoint": None,  # filled in by the driver from Ray's result
    }


def write_summary(storage: Storage, summary: dict[str, Any]) -> None:
    storage.write_bytes(SUMMARY_FILE, json.dumps(summary, indent=2).encode())


def first_step_callback(rank: int):
    """A transformers TrainerCallback marking the training start and the first optimizer step (job.startup_timing)."""

    class StartupTimingCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            startup_timing.CLOCK.mark("train_start")

        def on_step_end(self, args, state, control, **kwargs):
            startup_timing.first_step_done(rank)

    return StartupTimingCallback()
