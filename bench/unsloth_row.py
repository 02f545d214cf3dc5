"""Unsloth as a row of the bench (issue #33, target 0): the same rows, LoRA set and global batch as the
trainer's rows, through Unsloth's own path, so every ratio in RESULTS.md's headline comes from one call.

    python3 -m bench.unsloth_row --out results.jsonl [--micro_batch 16] [--global_batch 64]

What runs is Unsloth's documented vision fine-tune: `FastVisionModel.from_pretrained` (bf16, no 4-bit, no
gradient checkpointing), `FastVisionModel.get_peft_model` (LoRA r16 / alpha 16 / dropout 0.05 on the attention
and MLP layers of both towers: the trainer's `all-linear`), `UnslothVisionDataCollator`, TRL's `SFTTrainer`
(fused AdamW, lr 2e-4 constant, clipping 0.3, bf16). Inputs are the bench's: the random 4B weights
(`bench.py data`) and its synthetic product rows as chat messages with the trainer's prompt and system message.
Timing is the trainer rows' own: synchronised wall time of each optimizer step after the warm-up steps.
Must run in its own process, importing Unsloth before transformers and TRL (Unsloth patches them).
"""

from __future__ import annotations

import argparse
import io
import os
import time
import traceback
from pathlib import Path
from typing import Any

from bench.bench import emit

ROOT = Path(__file__).resolve().parents[1]


def rows_as_messages(parquet: Path, n: int) -> list[dict[str, Any]]:
    """The bench's rows as Unsloth's collator takes them: system, user (prompt text + image), assistant."""
    import pyarrow.parquet as pq
    from PIL import Image

    from trainer.job.flags import DEFAULT_PROMPT_TEMPLATE, DEFAULT_SYSTEM_MESSAGE

    table = pq.read_table(parquet).slice(0, n).to_pylist()
    out = []
    for row in table:
        image = Image.open(io.BytesIO(row["image"]["bytes"])).convert("RGB")
        fields = {"product": row["Product Name"], "category": row["Category"]}
        messages = []
        if DEFAULT_SYSTEM_MESSAGE:
            messages.append({"role": "system", "content": [{"type": "text", "text": DEFAULT_SYSTEM_MESSAGE}]})
        messages.append({"role": "user", "content": [
            {"type": "text", "text": DEFAULT_PROMPT_TEMPLATE.format(**fields)}, {"type": "image", "image": image}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": row["description"]}]})
        out.append({"messages": messages})
    return out


def run(model_dir: Path, parquet: Path, out: Path | None, micro: int, global_batch: int, warmup: int,
        steps: int, name: str) -> dict[str, Any]:
    res: dict[str, Any] = {"name": name, "recipe": "unsloth", "kind": "row", "ok": False}
    t0 = time.time()
    try:
        import torch
        import unsloth  # noqa: F401 - first: it patches transformers, TRL and PEFT
        from transformers import TrainerCallback
        from trl import SFTConfig, SFTTrainer
        from unsloth import FastVisionModel
        from unsloth.trainer import UnslothVisionDataCollator

        accumulation = global_batch // micro
        total = warmup + steps
        model, processor = FastVisionModel.from_pretrained(
            str(model_dir), load_in_4bit=False, use_gradient_checkpointing=False, dtype=torch.bfloat16,
            max_seq_length=1024)
        model = FastVisionModel.get_peft_model(
            model, finetune_vision_layers=True, finetune_language_layers=True, finetune_attention_modules=True,
            finetune_mlp_modules=True, r=16, lora_alpha=16, lora_dropout=0.05, bias="none", random_state=42,
            use_gradient_checkpointing=False)
        FastVisionModel.for_training(model)
        data = rows_as_messages(parquet, global_batch * total)

        times: list[float] = []

        class Timer(TrainerCallback):
            start = 0.0

            def on_step_begin(self, args, state, control, **kw):
                torch.cuda.synchronize()
                Timer.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                torch.cuda.synchronize()
                if state.global_step > warmup:
                    times.append(time.perf_counter() - Timer.start)

        trainer = SFTTrainer(
            model=model, processing_class=processor, data_collator=UnslothVisionDataCollator(model, processor),
            train_dataset=data,
            args=SFTConfig(
                per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation, max_steps=total,
                learning_rate=2e-4, lr_scheduler_type="constant", max_grad_norm=0.3, optim="adamw_torch_fused",
                bf16=True, logging_steps=1, report_to="none", output_dir=str(Path("/tmp") / "unsloth-row"),
                save_strategy="no", remove_unused_columns=False, dataset_text_field="",
                dataset_kwargs={"skip_prepare_dataset": True}, max_length=1024, seed=42,
                dataloader_num_workers=0))
        trainer.add_callback(Timer())
        torch.cuda.reset_peak_memory_stats()
        trainer.train()
        sps = global_batch * len(times) / sum(times)
        res.update(
            ok=True, timed_steps=len(times), step_s=[round(t, 3) for t in times],
            step_s_mean=sum(times) / len(times), step_s_min=min(times), step_s_max=max(times),
            samples_per_step=global_batch, samples_per_s=sps,
            flags={"per_device_train_batch_size": micro, "global_batch_size": global_batch,
                   "gradient_accumulation_steps": accumulation, "lora_r": 16, "lora_alpha": 16, "lora_dropout": 0.05},
            trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
            loss_log=[h.get("loss") for h in trainer.state.log_history if "loss" in h],
            peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
            peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30)
    except Exception as e:  # a failed row is a result too (out of memory, an import)
        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {str(e)[:800]}"
    res["wall_s"] = round(time.time() - t0, 1)
    from importlib.metadata import PackageNotFoundError, version

    res["versions"] = {}
    for pkg in ("unsloth", "unsloth_zoo", "torch", "transformers", "trl", "peft"):
        try:
            res["versions"][pkg] = version(pkg)
        except PackageNotFoundError:
            res["versions"][pkg] = "-"
    return emit(res, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("BENCH_WORK", "/tmp/gemma3-bench")))
    parser.add_argument("--rows", type=int, default=0, help="rows file of the bench (default: the largest there)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--name", default="unsloth")
    parser.add_argument("--micro_batch", type=int, default=16)
    parser.add_argument("--global_batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    a = parser.parse_args()
    model_dir = a.work / "gemma3-4b-random"
    files = sorted(a.work.glob("products-*.parquet"), key=lambda p: int(p.stem.split("-")[1]))
    need = a.global_batch * (a.warmup + a.steps)
    parquet = a.work / f"products-{a.rows}.parquet" if a.rows else next(
        (p for p in files if int(p.stem.split("-")[1]) >= need), files[-1] if files else None)
    if not model_dir.exists() or parquet is None:
        raise SystemExit(f"no bench weights or rows under {a.work}: run `python3 -m bench.bench data --rows {need}` first")
    res = run(model_dir, parquet, a.out, a.micro_batch, a.global_batch, a.warmup, a.steps, a.name)
    raise SystemExit(0 if res.get("ok") else 1)


if __name__ == "__main__":
    main()
