#!/usr/bin/env python3
"""Fine-tune Gemma 3 on image-text pairs with Ray Train, TRL's SFTTrainer and PEFT LoRA/QLoRA: the driver.

The tutorial's job (google/gemma-3-4b-it on philschmid/amazon-product-descriptions-vlm), made correct,
configurable and resumable:

- the loss covers the assistant's answer and its end-of-turn marker only, with exactly one ``<bos>``
  and image token ids taken from the processor; ``token_type_ids`` marks the image soft tokens;
- the logged loss is the true mean token loss over the accumulation steps and the workers;
- rows are decoded lazily; bad rows are counted and skipped (or fail the job); a held-out eval split;
- the model and dataset are fetched once per node; everything works offline from local paths;
- each run lives in ``<storage_path>/runs/<run_name>``: checkpoints go to its ``checkpoints/`` through
  Ray Train, a restart of the run resumes from the newest one; the adapter lands in its ``final/``;
  ``metrics.jsonl``, ``summary.json`` and TensorBoard events sit next to it. A finished run is never
  trained again; ``--resume_from`` continues an earlier run explicitly.

This module and what it imports (``trainer.job``) use only the standard library and Ray: the head node
needs nothing else to parse, validate, plan and run the job (Ray Train's DataParallelTrainer with
job.torch_backend, not TorchTrainer, whose package imports torch). The workers' code is ``trainer.worker``
(the torch side) with ``trainer.data`` and ``trainer.speed``, imported only inside train_loop_per_worker,
which runs on the workers. tests/trainer/test_layering.py holds the package to that.

Usage (run from the directory that holds the ``trainer`` package; flags are ``--name=value``; booleans
``true|false``; maps as JSON; see trainer/README.md)::

    python -m trainer.vision_train --model_id=google/gemma-3-4b-it --num_workers=16 --storage_path=gs://b/runs
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainer.job import run_definition, run_report, shard_manifest, startup_timing, stored
from trainer.job.arguments import parse_args
from trainer.job.dataset_check import check_dataset_before_download
from trainer.job.elastic import describe, ray_num_workers, run_shapes
from trainer.job.epochs import check_known_rows
from trainer.job.flag_values import extra_pip
from trainer.job.flags import UsageError
from trainer.job.runs import CHECKPOINTS_DIR, SUMMARY, SUMMARY_FILE, USAGE_ERROR_FILE, plan_run, set_aside
from trainer.job.storage import storage_for
from trainer.job.torch_backend import TorchBackendConfig
from trainer.job.worker_runtime_env import worker_runtime_env

# The directory that holds the `trainer` package: the job's working directory on a cluster.
CODE_DIR = str(Path(__file__).resolve().parents[1])
SUMMARY_KEYS = ["run_name", "global_step", "epochs", "train_rows", "eval_rows", "skipped_rows", "skipped_in_training",
                "rows_per_epoch", "rows_left_out_per_epoch",
                "global_batch_size", "micro_batch_size", "gradient_accumulation_steps", "first_train_loss",
                "final_train_loss", "first_eval_loss", "final_eval_loss", "final_answer_token_accuracy",
                "samples_per_second", "tokens_per_second", "resumed_from_step", "resumed_from", "broken_checkpoints",
                "newest_checkpoint", "final_adapter",
                "merged_model", "metrics", "tensorboard", "samples", "report"]


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's worker entry: make the trainer package importable on this node, then train.

    Defined here (stdlib only) so that it unpickles on a worker before any trainer module is imported;
    the package comes from the job's working directory (the chart's working_dir), or from the same path
    as on the driver. The only place the driver's module reaches into trainer.worker: this runs on the
    workers.
    """
    if isinstance(config.get("startup"), dict):
        config["startup"]["loop_start"] = time.time()  # the job start split: before the trainer's imports
    if os.path.isdir(config["code_dir"]) and config["code_dir"] not in sys.path:
        sys.path.insert(0, config["code_dir"])
    from trainer.worker import quiet_logs, unused_libraries

    quiet_logs.install()  # before transformers, datasets and bitsandbytes are imported
    unused_libraries.leave_out(config["args"]["quantization"])  # before peft would import bitsandbytes
    from trainer.worker import worker

    worker.train(config)


def print_summary(summary: dict[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    print("=" * 72)
    print("gemma3-ray training summary")
    for k in SUMMARY_KEYS:
        if summary.get(k) is not None:
            print(f"  {k:<28} {fmt(summary[k])}")
    print("=" * 72, flush=True)


def main(argv: list[str] | None = None, callbacks: list | None = None) -> dict[str, Any]:
    """Run the job; return its summary. `callbacks`: worker.CallbackFactory functions (tests, add-ons)."""
    try:
        args = parse_args(argv)
        cap = args.per_device_train_batch_size
        shapes = run_shapes(args.global_batch_size, cap, args.num_workers, args.min_workers)  # every count, now
        plan = plan_run(args, storage_for(args))
        print(plan.log_line, flush=True)
        for workers, shape in shapes.items():  # the full shape; other elastic sizes when below their cap
            line = describe(shape, workers, cap)
            if workers == args.num_workers or "(" in line:
                print(line, flush=True)
        if plan.finished is not None:
            return plan.finished
        storage = plan.storage
        stream = None
        if args.streaming:  # the shards' manifest, their columns and every shard, before any worker starts
            stream = shard_manifest.check_for_run(args)
            rows = stream.rows
        else:
            rows = check_dataset_before_download(args, storage.emulator_host, plan.definition["data"]["identity"])
        check_known_rows(rows, args)  # too few rows: refused before any worker, model load or scan
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e

    import ray.train

    from trainer.job.usage_stop import (
        UsageStopTrainer,  # DataParallelTrainer (no torch), no retry of a usage error
    )

    fs, base = storage.fs()
    fs.create_dir(base, recursive=True)
    run_definition.write(storage, plan.definition)  # what defines the run, compared at every restart
    set_aside(storage, plan)  # Ray Train restores only intact checkpoints (or none), retrains into fresh ones
    if storage.exists(USAGE_ERROR_FILE):  # from an earlier attempt of this run; the inputs may be fixed now
        fs.delete_file(f"{base}/{USAGE_ERROR_FILE}")
    trainer = UsageStopTrainer(
        train_loop_per_worker,
        backend_config=TorchBackendConfig(),
        train_loop_config={
            "args": asdict(args),
            "stream": shard_manifest.to_config(stream) if stream is not None else None,
            "storage": asdict(storage),
            "run_name": plan.name,
            "resume_checkpoint": plan.resume_checkpoint,
            "definition": plan.definition,
            "broken_checkpoints": plan.broken,  # passed over (and moved aside) by the driver
            "code_dir": CODE_DIR,
            "callback_factories": list(callbacks or []),
            "startup": startup_timing.driver_marks(),  # submission time and driver start, for the split
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=ray_num_workers(args.num_workers, args.min_workers),
            use_gpu=args.use_gpu,
            accelerator_type=args.accelerator_type,
            resources_per_worker=None if args.use_gpu else {"CPU": 1},
        ),
        run_config=ray.train.RunConfig(
            name=CHECKPOINTS_DIR,
            storage_path=base,
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=args.save_total_limit),
            failure_config=ray.train.FailureConfig(max_failures=args.max_failures),
            worker_runtime_env=worker_runtime_env(args.installer, extra_pip(args)),
        ),
    )
    try:
        result = trainer.fit()
    except Exception:  # a rank stopped the group on a usage error (usage_stop.StopAllRanks): say it, no traceback
        if not storage.exists(USAGE_ERROR_FILE):
            raise
        result = None
    problem = storage.read_bytes(USAGE_ERROR_FILE)
    if problem:
        print(f"error: {problem.decode()}", file=sys.stderr)
        raise SystemExit(2)
    summary, problem = stored.read(storage, SUMMARY_FILE, SUMMARY)
    if summary is None:  # the workers ended without writing it: never reported as a success
        print(f"error: run {plan.name} ended without a usable {SUMMARY_FILE} ({problem or 'none was written'})",
              file=sys.stderr)
        raise SystemExit(1)
    if result.checkpoint is not None:
        newest = result.checkpoint.path
        if storage.root.startswith("gs://"):
            newest = "gs://" + newest.removeprefix("gs://")
        summary["newest_checkpoint"] = newest
        storage.write_bytes(SUMMARY_FILE, json.dumps(summary, indent=2).encode())
    if summary.get("report"):  # the final page, with what only the driver knows (the newest checkpoint)
        run_report.write(storage, run_name=plan.name, status=run_report.final_status(summary), config=asdict(args),
                         summary=summary)
    print_summary(summary)
    return summary


if __name__ == "__main__":
    main()
