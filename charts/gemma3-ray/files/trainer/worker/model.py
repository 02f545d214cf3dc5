"""The model side of a worker: Gemma 3, LoRA, the SFT config and TRL's SFTTrainer.

bf16 or 4-bit (QLoRA) loading, the LoRA targets, and an eval loss that is the exact token mean.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.data.dataset import prepare_data
from trainer.data.sampler import whole_batches
from trainer.job import startup_timing
from trainer.job.elastic import BatchShape, split_batch
from trainer.job.flags import TrainArguments, UsageError
from trainer.job.storage import cache_root
from trainer.worker.processor_cache import load_processor

# The tutorial's fixed hyperparameters (QLoRA paper): not flags.
MAX_GRAD_NORM = 0.3
LR_SCHEDULER = "constant"
LANGUAGE_MODEL_LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def load_model(args: TrainArguments, model_dir: Path, device):
    import torch
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig

    kwargs: dict[str, Any] = {
        "dtype": torch.bfloat16 if args.use_gpu else torch.float32,
        "attn_implementation": args.attn_implementation,
    }
    if args.quantization == "4bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_quant_storage=torch.bfloat16,
        )
        kwargs["device_map"] = {"": device}
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), **kwargs)
    model.config.use_cache = False
    if args.freeze_vision:
        tower = model.model.vision_tower
        tower.requires_grad_(False)
        tower.forward = torch.no_grad()(tower.forward)
    return model


def _load_model_on(args: TrainArguments, model_dir: Path, device, cuda_index: int | None):
    """load_model in another thread, whose current CUDA device is the calling thread's (`cuda_index`)."""
    if cuda_index is not None:
        import torch

        torch.cuda.set_device(cuda_index)
    return load_model(args, model_dir, device)


def _current_cuda_index(device) -> int | None:
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    return device.index if device.index is not None else torch.cuda.current_device()


def lora_config(args: TrainArguments):
    from peft import LoraConfig

    extra: dict[str, Any] = {}
    if args.train_embeddings:
        # One trainable copy shared by the tied embedding and LM head (the tutorial untied them).
        extra = {"modules_to_save": ["lm_head", "embed_tokens"], "ensure_weight_tying": True}
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules="all-linear" if args.lora_target == "all-linear" else LANGUAGE_MODEL_LORA_TARGETS,
        **extra,
    )


def sft_config(args: TrainArguments, local_dir: Path, has_eval: bool, batch: BatchShape, max_steps: int | None = None):
    from trl import SFTConfig

    eval_kwargs: dict[str, Any] = {"eval_strategy": "no"}
    if has_eval:
        if args.eval_steps:
            eval_kwargs = {"eval_strategy": "steps", "eval_steps": args.eval_steps}
        elif args.save_strategy == "steps":
            eval_kwargs = {"eval_strategy": "steps", "eval_steps": args.save_steps}
        else:
            eval_kwargs = {"eval_strategy": "epoch"}
    return SFTConfig(
        output_dir=str(local_dir),
        num_train_epochs=args.num_train_epochs,
        max_steps=args.max_steps if max_steps is None else max_steps,
        ignore_data_skip=max_steps is not None,  # the streaming path starts where its stream state says
        per_device_train_batch_size=batch.micro_batch,
        per_device_eval_batch_size=batch.micro_batch,
        gradient_accumulation_steps=batch.accumulation,
        learning_rate=args.learning_rate,
        lr_scheduler_type=LR_SCHEDULER,
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch_fused" if args.use_gpu else "adamw_torch",
        bf16=args.use_gpu,
        use_cpu=not args.use_gpu,
        logging_steps=args.logging_steps,
        save_strategy=args.save_strategy,
        save_steps=args.save_steps,
        save_total_limit=1,  # local scratch; storage keeps `save_total_limit` through Ray
        seed=args.seed,
        data_seed=args.seed,
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if args.gradient_checkpointing else None,
        dataloader_num_workers=args.dataloader_num_workers,
        dataloader_persistent_workers=args.dataloader_num_workers > 0,
        dataloader_pin_memory=args.use_gpu,
        use_liger_kernel=bool(args.use_liger_kernel),
        # Only the layer kernels: TRL's fused LM head already scores just the labelled positions.
        liger_kernel_config={"rope": True, "rms_norm": True, "geglu": True,
                             # compiled vision layers fuse their LayerNorms themselves
                             "layer_norm": not args.compile_vision,
                             "cross_entropy": False, "fused_linear_cross_entropy": False}
        if args.use_liger_kernel else None,
        report_to=["tensorboard"],
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=None,  # length is enforced per row (rows over max_seq_length are skipped, never cut)
        # Every row has an image, so every parameter gets a gradient in every step.
        ddp_find_unused_parameters=False,
        average_tokens_across_devices=True,
        disable_tqdm=True,
        push_to_hub=False,
        **eval_kwargs,
    )


def token_mean_eval(trainer_cls):
    """`trainer_cls` whose eval loss is the mean over every labelled eval token on all workers.

    Trainer's own `eval_loss` averages per-batch token means (weighted by rows), which over-weights
    short answers. TRL's fused LM head returns per-token log-probabilities and the label mask; a forward
    hook sums them per row during evaluation, `gather_for_metrics` collects the rows of every worker
    (dropping the rows the sampler repeats to even out the last batch), and the loss is recomputed from
    the token totals.
    """
    import torch

    class TokenMeanEval(trainer_cls):
        def evaluation_loop(self, *args, **kwargs):
            prefix = kwargs.get("metric_key_prefix", "eval")
            rows: list[tuple[Any, Any]] = []

            def keep(_module, _inputs, output) -> None:
                log_probs = getattr(output, "log_probs", None)
                mask = getattr(output, "label_mask", None)
                if log_probs is None or mask is None:
                    return  # not the fused forward (e.g. a logits-only pass)
                nll = -log_probs.detach().float().sum(dim=1)
                rows.append(self.accelerator.gather_for_metrics((nll, mask.sum(dim=1).float())))

            handle = self.model.register_forward_hook(keep)
            try:
                output = super().evaluation_loop(*args, **kwargs)
            finally:
                handle.remove()
            if rows:
                nll = torch.cat([r[0] for r in rows]).sum()
                tokens = torch.cat([r[1] for r in rows]).sum()
                output.metrics[f"{prefix}_loss"] = float(nll / tokens.clamp(min=1))
            return output

    TokenMeanEval.__name__ = TokenMeanEval.__qualname__ = f"TokenMeanEval{trainer_cls.__name__}"
    return TokenMeanEval


def build_trainer(args: TrainArguments, model_dir: Path, local_dir: Path, device, emulator_host: str | None,
                  batch: BatchShape | None = None, callbacks: list | None = None, skip_log: Path | None = None,
                  scan_group=None, stream=None):
    """The TRL SFTTrainer of one worker, plus the data stats. Usable without Ray (tests, bench): `batch`
    defaults to the global batch split over num_workers; `scan_group`: the run's workers (data.prepare_data)."""
    batch = batch or split_batch(args.global_batch_size, args.per_device_train_batch_size, args.num_workers)
    from trl import SFTTrainer

    with startup_timing.phase(startup_timing.MODEL):  # from the node's copy after its first worker (processor_cache)
        processor = load_processor(model_dir, cache_root(args))
    # The weights load (disk -> memory) while the rows are fetched and scanned (CPU): the model phase of the
    # job start split is then only the wait for the load after the data is ready.
    with ThreadPoolExecutor(1, thread_name_prefix="load_model") as pool:
        loading = pool.submit(_load_model_on, args, model_dir, device, _current_cuda_index(device))
        with startup_timing.phase(startup_timing.DATA):
            if stream is not None:  # the streaming path (trainer.data.streaming): no copy, no scan
                from trainer.data import stream_plan, streaming

                batches, evaluation, collator, stats, stream_callback, plan = streaming.prepare_stream(
                    args, processor, stream, batch.micro_batch, batch.accumulation)
                callbacks = [stream_callback, *(callbacks or [])]  # before the reporter: data_wait_s, stream state
            else:
                train, evaluation, collator, stats = prepare_data(args, processor, emulator_host, scan_group, skip_log)
        with startup_timing.phase(startup_timing.MODEL):
            model = loading.result()
    model_image_token = getattr(model.config, "image_token_id", None)
    if model_image_token is not None and model_image_token != collator.encoder.soft_token_id:
        raise UsageError(
            f"{args.model_id}: the processor's image token id {collator.encoder.soft_token_id} differs from the "
            f"model's image_token_id {model_image_token}; use the processor saved with the model"
        )
    peft_config = lora_config(args)
    if args.adapter_dtype == "bf16" and args.quantization == "none":
        # PEFT upcasts LoRA weights to fp32 by default; on a bf16 base that costs a cast per LoRA layer per
        # step (bench/RESULTS.md). QLoRA adapters are bf16 already (TRL casts them).
        from peft import get_peft_model

        model = get_peft_model(model, peft_config, autocast_adapter_dtype=False)
        peft_config = None
    if stream is not None:
        import datasets

        trainer_cls = streaming.streaming_trainer(SFTTrainer, batches)  # each row once per epoch, streamed
        train = datasets.Dataset.from_list([{k: None for k in evaluation.column_names}] if evaluation is not None
                                           else [{"image": None}])  # TRL's vision check only: never trained
        steps = stream_plan.max_steps(args, plan)
    else:
        trainer_cls, steps = whole_batches(SFTTrainer, batch.global_batch), None  # each row once per epoch
    trainer = token_mean_eval(trainer_cls)(
        model=model,
        args=sft_config(args, local_dir, evaluation is not None, batch, steps),
        data_collator=collator,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    # TRL scores only the labelled positions and divides the summed token loss by `num_items_in_batch`:
    # the labelled tokens of all micro-batches of the optimizer step on all workers, then multiplies by
    # the world size because DDP averages gradients. Trainer computes `num_items_in_batch` only when it
    # believes the model takes loss kwargs; say so explicitly rather than rely on the signature of
    # Gemma3ForConditionalGeneration.forward. (Position 0 is `<bos>`, never labelled, so counting over
    # `labels` or `labels[:, 1:]` is the same.)
    trainer.model_accepts_loss_kwargs = True
    trainer.stream = (batches, plan) if stream is not None else None
    from trainer.speed import speed_levers

    trainer.speed_levers = speed_levers.apply(args, trainer.model, trainer)
    if args.compile_vision:
        # The vision tower sees one image size, so its layers compile once (and share the compiled code);
        # the fused elementwise LoRA work (dropout, scaling, adds, casts) is most of the gain.
        for module in trainer.model.modules():
            if type(module).__name__ == "SiglipEncoderLayer":
                module.compile()
    return trainer, processor, stats


