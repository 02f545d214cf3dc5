"""One Ray Train worker: resume point, callbacks, SFTTrainer, and the end of the run.

Runs on the GPU nodes; the driver never imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.data.dataset import count_by_reason, skipped_line, some_row_ids
from trainer.data.scan_store import ScanGroup
from trainer.job import startup_timing, stored
from trainer.job.elastic import BatchShape, describe, split_batch, worker_counts
from trainer.job.epochs import check_rows, epoch_line
from trainer.job.flags import TrainArguments, UsageError
from trainer.job.runs import FINAL_DIR, MERGED_DIR, TENSORBOARD_DIR, USAGE_ERROR_FILE
from trainer.job.storage import Storage
from trainer.job.usage_stop import stop_all_ranks
from trainer.worker import report_hook
from trainer.worker.metrics import RunReporter, build_summary, first_step_callback, write_summary
from trainer.worker.model import build_trainer
from trainer.worker.model_files import fetch_model
from trainer.worker.resume import choose_checkpoint, current_flags_callback
from trainer.worker.scratch import scratch_dir

# Varying sequence lengths fragment PyTorch's CUDA cache; expandable segments avoid the stalls.
CUDA_ALLOC_CONF = "expandable_segments:True"
SKIPPED_IN_TRAINING_LOG = "skipped_in_training.jsonl"  # one JSON line per row the collator skipped
BATCH_SHAPES_FILE = "batch_shapes.json"  # the run's batch shape per segment (elastic: per worker-group start)
SEGMENTS = stored.each(stored.fields({k: stored.COUNT for k in ("from_step", "workers", "global_batch", "micro_batch",
                                                                "accumulation")}))


@dataclass
class WorkerContext:
    """What a callback factory gets on each worker."""

    args: TrainArguments
    storage: Storage  # the run's directory
    rank: int
    world_size: int
    local_dir: Path  # this worker's scratch (the SFTTrainer's output_dir)


# Builds one transformers TrainerCallback per worker (or None for none); passed to vision_train.main by
# tests and add-ons, pickled to the workers with the train config.
CallbackFactory = Callable[[WorkerContext], Any]


def build_callbacks(ctx: WorkerContext, reporter: RunReporter, factories: list[CallbackFactory]) -> list[Any]:
    """Every callback of the SFTTrainer, in order: the run's reporter first, then the factories' ones."""
    callbacks: list[Any] = [reporter]
    for factory in factories:
        callback = factory(ctx)
        if callback is not None:
            callbacks.append(callback)
    return callbacks


def train(config: dict[str, Any]) -> None:
    """The body of Ray Train's train_loop_per_worker."""
    import ray.train
    import ray.train.torch
    import torch

    startup_timing.begin(config.get("startup"))  # the job start split: this worker is running
    args = TrainArguments(**config["args"])
    storage = Storage(**config["storage"])
    if storage.exists(USAGE_ERROR_FILE):  # a rank of an earlier attempt refused the inputs: no retry trains
        return
    if args.use_gpu:  # before the first CUDA allocation of this worker process
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)
    train_ctx = ray.train.get_context()
    rank, world_size = train_ctx.get_world_rank(), train_ctx.get_world_size()
    if not args.use_gpu:
        torch.set_flush_denormal(True)  # CPU: denormals make small models ~8x slower
    device = ray.train.torch.get_device()
    with startup_timing.phase(startup_timing.MODEL):
        model_dir = fetch_model(args, storage.emulator_host)
    with scratch_dir(rank) as local_dir:  # removed on every way out (trainer/worker/scratch.py)
        _train(config, args, storage, rank, world_size, device, model_dir, local_dir)


def _train(config: dict[str, Any], args: TrainArguments, storage: Storage, rank: int, world_size: int, device,
           model_dir: Path, local_dir: Path) -> None:
    """train() in this worker's scratch directory `local_dir`."""
    import ray.train

    tb_dir = local_dir / TENSORBOARD_DIR
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(tb_dir)
    ctx = WorkerContext(args, storage, rank, world_size, local_dir)
    skip_log = local_dir / SKIPPED_IN_TRAINING_LOG

    with contextlib.ExitStack() as stack:
        try:  # the same on every worker (bad_rows=fail, no usable rows, no loadable checkpoint): no retry
            resume = choose_checkpoint(config, storage, stack, rank, local_dir)
            # From the live world size: exactly the global batch on however many workers run (elastic too).
            batch = split_batch(args.global_batch_size, args.per_device_train_batch_size, world_size)
            reporter = RunReporter(storage, rank, batch.global_batch, tb_dir, local_dir, resume.step)
            refresh = report_hook.refresh_callback(ctx, reporter, config["run_name"])
            callbacks = build_callbacks(ctx, reporter, config.get("callback_factories") or [])
            callbacks.append(first_step_callback(rank))  # prints the split at step 1 (rank 0)
            callbacks.append(refresh)
            callbacks.append(current_flags_callback())  # the flags of this job win over the checkpoint's
            stream = stream_setup(config, storage, resume, rank, world_size) if config.get("stream") else None
            trainer, processor, stats = build_trainer(
                args, model_dir, local_dir, device, storage.emulator_host, batch, callbacks, skip_log,
                None if stream else ScanGroup.of_ray_worker(storage, data_identity(config)), stream=stream)
            refresh.trainer, refresh.stats = trainer, stats
            segments = record_segment(storage, resume.step or 0, world_size, batch) if rank == 0 else []
            check_rows(stats["train_rows"], batch.global_batch, f"of {stats['rows']} rows, "
                       f"{sum(stats['skipped_rows'].values())} skipped, {stats['eval_rows']} held out for eval",
                       worker_counts(args.num_workers, args.min_workers))
        except UsageError as e:
            storage.write_bytes(USAGE_ERROR_FILE, str(e).encode())  # any rank: the driver prints it
            if world_size > 1:  # the other ranks may already wait for this one in a collective: end them all
                stop_all_ranks(str(e))  # no retry, no traceback (usage_stop.py)
            return
        if rank == 0:
            print(describe(batch, world_size, args.per_device_train_batch_size), flush=True)
            print(f"[data] {json.dumps(stats)}", flush=True)
            print(epoch_line(stats, batch.global_batch), flush=True)
            line = skipped_line(stats["skipped_rows"], stats["skipped_row_ids"], "in the scan")
            if line:
                print(line, flush=True)
            trainer.model.print_trainable_parameters()
        try:
            result = trainer.train(resume_from_checkpoint=resume.directory)
        except Exception as e:  # the stream met what no retry fixes: one sentence, no retry, no traceback
            from trainer.data.stream_rows import stream_stop

            sentence = stream_stop(e, args.streaming_decoders, config.get("stream"))
            if sentence is None:
                raise
            storage.write_bytes(USAGE_ERROR_FILE, sentence.encode())
            if world_size > 1:
                stop_all_ranks(sentence)
            return
    # The same decision on every rank (evaluation is collective): from the trainer state, not rank 0's records.
    evaluated_last = any(
        "eval_loss" in h and h.get("step") == trainer.state.global_step for h in trainer.state.log_history
    )
    final_eval = trainer.evaluate() if trainer.eval_dataset is not None and not evaluated_last else {}

    skipped = skipped_in_training(skip_log, world_size)
    if trainer.stream is not None:
        trainer.stream[0].close()  # every rank: the record of an epoch max_steps cut short
    summary: dict[str, Any] = {}
    if rank == 0:
        extra = {"run_name": config["run_name"], "resumed_from_step": resume.step,
                 "micro_batch_size": batch.micro_batch, "gradient_accumulation_steps": batch.accumulation,
                 "resumed_from": resume.uri,
                 "broken_checkpoints": [*(config.get("broken_checkpoints") or []), *resume.broken],
                 "skipped_in_training": count_by_reason(skipped), "skipped_in_training_row_ids": some_row_ids(skipped),
                 "startup": startup_timing.split(), "definition": config.get("definition"),
                 "batch_shapes": segments}
        if trainer.stream is not None:  # the figures as trained, not as planned (the plan's: streaming.planned)
            streamed = stream_summary(trainer, storage, stats, args)
            from trainer.data.streaming import observed_epoch

            stats.update(observed_epoch(streamed))
            extra["streaming"], extra["epochs"] = streamed, streamed["epochs_trained"]
        line = skipped_line(extra["skipped_in_training"], extra["skipped_in_training_row_ids"], "in training")
        if line:
            print(line, flush=True)
        summary = finish(ctx, trainer, processor, stats, reporter, result, final_eval, extra)
    ray.train.report({"step": trainer.state.global_step, "done": True, **{k: v for k, v in summary.items()
                                                                          if isinstance(v, int | float)}})


def stream_setup(config: dict[str, Any], storage: Storage, resume, rank: int, world_size: int):
    """The streaming path of this worker (trainer.data.streaming): the driver's checked shards, the group's
    collectives, and where the newest checkpoint's stream state says to go on."""
    from ray.train.collective import broadcast_from_rank_zero

    from trainer.data.stream_plan import STATE_FILE, resume_state
    from trainer.data.streaming import StreamSetup
    from trainer.worker.metrics import gather

    args = TrainArguments(**config["args"])
    state = None
    if resume.directory:  # a missing or torn state is one sentence on every rank, never a restart at epoch 0
        path = Path(resume.directory) / STATE_FILE
        state = resume_state(path.read_bytes() if path.is_file() else None, resume.uri or str(resume.directory))
    import ray

    from trainer.data.stream_rows import node_cpus, placement_problem

    here = ray.get_runtime_context()
    placed = gather((here.get_node_id(), float(here.get_assigned_resources().get("CPU", 0))))
    node_ids = [node for node, _ in placed]  # the CPU stage's nodes
    held: dict[str, float] = {}
    for node, cpus in placed:
        held[node] = held.get(node, 0.0) + cpus
    problem = placement_problem(args.streaming_decoders, node_cpus(node_ids), held)  # the same on every rank
    if problem:
        raise UsageError(problem)
    return StreamSetup(shards=config["stream"], storage=storage, rank=rank, world_size=world_size,
                       broadcast=broadcast_from_rank_zero, gather=gather, state=state, start_step=resume.step or 0,
                       decoders=args.streaming_decoders,
                       object_store_bytes=int(args.streaming_object_store_gib * 2**30) or None, node_ids=node_ids)


def stream_summary(trainer, storage: Storage, stats: dict[str, Any], args: TrainArguments) -> dict[str, Any]:
    """Rank 0 at the end of a streamed run: the rows its CPU stages skipped (counted by reason, with row ids, as the
    scan counts them) into the stats, and the stream's section of summary.json, also logged."""
    from trainer.data import streaming
    from trainer.data.stream_rows import skipped_rows

    batches, plan = trainer.stream
    skipped = skipped_rows(storage)
    for row, reason in (stats.pop("eval_skipped", None) or {}).items():
        skipped.setdefault(reason, []).append(row)
    stats["skipped_rows"], stats["skipped_row_ids"] = count_by_reason(skipped), some_row_ids(skipped)
    line = skipped_line(stats["skipped_rows"], stats["skipped_row_ids"], "as they streamed")
    if line:
        print(line, flush=True)
    section = streaming.summary_section(plan, batches, args, stats["eval_rows"])
    print(f"[stream] {json.dumps(section)}", flush=True)
    return section


def record_segment(storage: Storage, start: int, world_size: int, batch: BatchShape) -> list[dict[str, int]]:
    """The run's batch shape per segment (from each worker-group start's step), this one appended; the
    segments a restart recomputes (those from this start's step on) are dropped. Rank 0."""
    earlier, problem = stored.read(storage, BATCH_SHAPES_FILE, SEGMENTS)
    if problem:
        print(f"[batch] {BATCH_SHAPES_FILE} is unusable ({problem}): started again from this segment", flush=True)
    segments = [s for s in earlier or [] if s["from_step"] < start]
    segments.append({"from_step": start, "workers": world_size, "global_batch": batch.global_batch,
                     "micro_batch": batch.micro_batch, "accumulation": batch.accumulation})
    storage.write_bytes(BATCH_SHAPES_FILE, json.dumps(segments).encode())
    return segments


def data_identity(config: dict[str, Any]) -> str:
    """The data's identity the driver recorded in the run's definition ('' without one)."""
    return ((config.get("definition") or {}).get("data") or {}).get("identity", "")


def skipped_in_training(skip_log: Path, world_size: int) -> dict[str, list[int]]:
    """{reason: row ids} of the rows every worker's collator had to skip (collective: call on every rank)."""
    mine = [json.loads(line) for line in skip_log.read_text().splitlines()] if skip_log.is_file() else []
    everyone = [mine]
    if world_size > 1:
        import torch.distributed as dist

        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
    skipped: dict[str, list[int]] = {}
    for records in everyone:
        for rec in records or []:
            skipped.setdefault(rec["reason"], []).append(rec["row"])
    return skipped


def finish(ctx: WorkerContext, trainer, processor, stats: dict[str, Any], reporter: RunReporter, result,
           final_eval: dict[str, float], extra: dict[str, Any]) -> dict[str, Any]:
    """Rank 0, at the end of the run: final/ (and merged/, the hub), TensorBoard, summary.json."""
    args, storage = ctx.args, ctx.storage
    out = Path(trainer.args.output_dir) / FINAL_DIR
    trainer.model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    storage.upload_dir(out, FINAL_DIR)
    hub_repo = (args.hub_model_id or Path(args.output_dir).name) if args.push_to_hub else None
    if hub_repo:  # the adapter: before the merge, which unloads its layers from trainer.model
        trainer.model.push_to_hub(hub_repo, token=os.environ["HF_TOKEN"], private=True)
        processor.push_to_hub(hub_repo, token=os.environ["HF_TOKEN"], private=True)
    if reporter.tb_dir.is_dir():
        storage.upload_dir(reporter.tb_dir, TENSORBOARD_DIR)
    sampled = report_hook.end_of_run_samples(trainer, args, storage)  # base and adapter: before the merge too
    merged_uri = None
    if args.merge_adapter:  # last: merge_and_unload folds the adapter into the base and removes its layers
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(str(out.parent / MERGED_DIR))
        processor.save_pretrained(str(out.parent / MERGED_DIR))
        storage.upload_dir(out.parent / MERGED_DIR, MERGED_DIR)
        merged_uri = storage.uri(MERGED_DIR)
    summary = build_summary(trainer, storage, stats, reporter, result, final_eval, {
        **extra, "final_adapter": storage.uri(FINAL_DIR), "merged_model": merged_uri, "hub_model_id": hub_repo,
        **sampled})
    write_summary(storage, summary)
    report_hook.write_report(ctx, summary, reporter.records)
    return summary
