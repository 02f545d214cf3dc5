"""Sample generations: base model vs fine-tuned adapter on fixed eval rows, greedy, batched, in a time budget.

Runs on rank 0 after training (torch is imported inside the functions: the Ray driver imports this module
too). The base output comes from the same PEFT model with its adapter disabled: no second model load.
Each record carries a small JPEG thumbnail as a data URI, so the report can be rebuilt from
``samples.jsonl`` alone.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.job.run_report import token_f1

THUMBNAIL_PX = 160
THUMBNAIL_JPEG_QUALITY = 80


@dataclass
class SampleSettings:
    """How many eval rows, how long each answer may get, how many per batch, and the time budget."""

    rows: int
    max_new_tokens: int
    batch_size: int
    budget_s: float


def settings_of(args: Any) -> SampleSettings:
    """The sample_* flags of the job's arguments."""
    return SampleSettings(rows=args.sample_rows, max_new_tokens=args.sample_max_new_tokens,
                          batch_size=args.sample_batch_size, budget_s=args.sample_time_budget_s)


def pick_rows(n_available: int, n: int) -> list[int]:
    """`n` indices spread evenly over `n_available` eval rows (deterministic: the eval split is seeded)."""
    n = max(0, min(n, n_available))
    return [i * n_available // n for i in range(n)] if n else []


def thumbnail(image: Any, px: int = THUMBNAIL_PX) -> str:
    """A PIL image as a small JPEG data URI (longest side `px`)."""
    im = image.convert("RGB").copy()
    im.thumbnail((px, px))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=THUMBNAIL_JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _stop_ids(encoder) -> list[int]:
    ids = [encoder.tokenizer.eos_token_id, encoder.end_of_turn_id]
    return sorted({i for i in ids if i is not None})


def generate(model, encoder, rows: Sequence[dict[str, Any]], images: Sequence[Any],
             max_new_tokens: int) -> list[tuple[str, int]]:
    """(text, number of generated tokens before the stop token) per row: the training prompt, greedy.

    The prompt is exactly the training prompt (``encoder.texts``/``prompt_ids``: one ``<bos>``, image
    soft tokens expanded), left-padded so every row's answer starts at the same position.
    """
    import torch
    from transformers import GenerationConfig

    prompts = [encoder.prompt_ids(encoder.texts(r)[0]) for r in rows]
    width = max(len(p) for p in prompts)
    pad = encoder.tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    device = next(model.parameters()).device
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    pixel_values = encoder.processor.image_processor(images=list(images), return_tensors="pt")["pixel_values"]
    stop = _stop_ids(encoder)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, use_cache=True,
                              pad_token_id=pad, eos_token_id=stop)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            pixel_values=pixel_values.to(device=device, dtype=dtype),
            token_type_ids=(input_ids == encoder.soft_token_id).long().to(device),
            generation_config=config,
        )
    results = []
    for seq in out[:, width:].tolist():
        n = next((i for i, t in enumerate(seq) if t in stop), len(seq))
        results.append((encoder.tokenizer.decode(seq[:n], skip_special_tokens=True).strip(), n))
    return results


def collect_samples(model, encoder, rows: Sequence[dict[str, Any]], images: Sequence[Any], row_ids: Sequence[int],
                    settings: SampleSettings, answer_field: str = "answer",
                    log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Base and fine-tuned outputs for `rows`, batch by batch, until done or the budget is spent.

    A batch is started only while its expected duration (the slowest batch so far) fits the budget; the
    rows left out are counted in the log line. `model` is the PEFT model; it is back in its mode on return.
    """
    started = time.monotonic()
    deadline = started + settings.budget_s
    has_base = hasattr(model, "disable_adapter")
    log(f"[samples] {len(rows)} eval rows: fine-tuned{' and base' if has_base else ''} outputs, greedy, "
        f"up to {settings.max_new_tokens} new tokens, batches of {settings.batch_size}, "
        f"time budget {settings.budget_s:.0f} s")
    was_training = model.training
    model.eval()
    records: list[dict[str, Any]] = []
    slowest = 0.0
    try:
        for start in range(0, len(rows), settings.batch_size):
            if time.monotonic() + slowest > deadline:
                break
            t = time.monotonic()
            batch = slice(start, start + settings.batch_size)
            tuned = generate(model, encoder, rows[batch], images[batch], settings.max_new_tokens)
            if has_base:
                with model.disable_adapter():
                    base = generate(model, encoder, rows[batch], images[batch], settings.max_new_tokens)
            else:
                base = [(None, 0)] * len(tuned)
            for i, row, image, (b_text, b_n), (f_text, f_n) in zip(
                row_ids[batch], rows[batch], images[batch], base, tuned, strict=True
            ):
                records.append(sample_record(encoder, i, row, image, answer_field, b_text, b_n, f_text, f_n))
            slowest = max(slowest, time.monotonic() - t)
    finally:
        model.train(was_training)
    took = time.monotonic() - started
    left = len(rows) - len(records)
    log(f"[samples] {len(records)}/{len(rows)} rows in {took:.1f} s (budget {settings.budget_s:.0f} s)"
        + (f"; {left} left out: the next batch would not fit the budget" if left else ""))
    return records


def sample_record(encoder, row_id: int, row: dict[str, Any], image: Any, answer_field: str,
                  base: str | None, base_tokens: int, tuned: str, tuned_tokens: int) -> dict[str, Any]:
    """One line of samples.jsonl."""
    reference = str(row[answer_field])
    prompt = encoder.texts(row)[0]
    return {
        "row_id": row_id,
        "product": row.get("product"),
        "category": row.get("category"),
        "prompt_fields": {f: row.get(f) for f in encoder.fields},
        "reference": reference,
        "base_output": base,
        "finetuned_output": tuned,
        "tokens": {
            "prompt": len(encoder.prompt_ids(prompt)),
            "reference": len(encoder.tokenizer(reference, add_special_tokens=False)["input_ids"]),
            "base_output": base_tokens if base is not None else None,
            "finetuned_output": tuned_tokens,
        },
        "base_f1": token_f1(base, reference) if base is not None else None,
        "finetuned_f1": token_f1(tuned, reference),
        "thumbnail": thumbnail(image),
    }


def to_jsonl(records: Sequence[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def eval_samples(trainer, settings: SampleSettings, load_image: Callable[[dict[str, Any]], Any],
                 answer_field: str = "answer", log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """`collect_samples` on the fixed eval rows of an SFTTrainer (its eval split and collator's encoder)."""
    evaluation = trainer.eval_dataset
    if evaluation is None or settings.rows <= 0:
        return []
    ids = pick_rows(len(evaluation), settings.rows)
    rows = [evaluation[i] for i in ids]
    images = [load_image(r) for r in rows]
    return collect_samples(trainer.model, trainer.data_collator.encoder, rows, images, ids, settings,
                           answer_field, log)
