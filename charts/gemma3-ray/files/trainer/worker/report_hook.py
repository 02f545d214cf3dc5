"""Rank 0's part of the run report: report.html refreshed at each evaluation, samples.jsonl at the end.

Worker-only (it needs transformers and torch through samples.py). The driver writes the final
report.html once summary.json is complete (run_report.write with final_status).
"""

from __future__ import annotations

from typing import Any

from trainer.data.dataset import decode_image, image_bytes
from trainer.job import run_report
from trainer.job.flags import ANSWER_FIELD, IMAGE_FIELD
from trainer.worker import samples


def image_loader(collator):
    """A row's decoded image, read as the collator reads it (local path, inline bytes, or gs:// through the
    node cache: an image the scan fetched is not downloaded again)."""

    def load(row: dict[str, Any]):
        data = image_bytes(row[IMAGE_FIELD], collator.image_base, collator.emulator_host, collator.cache)
        if data is None:
            raise RuntimeError(f"image vanished after the scan: {str(row[IMAGE_FIELD])[:80]}")
        return decode_image(data)

    return load


def generate_samples(trainer, args) -> list[dict[str, Any]]:
    """The fixed eval rows' base and fine-tuned outputs (sample_* flags); [] without an eval split."""
    return samples.eval_samples(trainer, samples.settings_of(args), image_loader(trainer.data_collator),
                                ANSWER_FIELD)


def write_samples(storage, records: list[dict[str, Any]]) -> str:
    storage.write_bytes(run_report.SAMPLES_FILE, samples.to_jsonl(records))
    return storage.uri(run_report.SAMPLES_FILE)


def end_of_run_samples(trainer, args, storage) -> dict[str, Any]:
    """Rank 0 after the last step: samples.jsonl; summary.json's keys about it.

    A failure here (the adapter is saved already) is reported in the log, the summary and the report,
    and never retrains the run: the job goes on to write its summary.
    """
    want = min(args.sample_rows, len(trainer.eval_dataset)) if trainer.eval_dataset is not None else 0
    out: dict[str, Any] = {"samples": None, "samples_rows": 0, "samples_left_out": 0, "samples_error": None,
                           "report": storage.uri(run_report.REPORT_FILE)}
    if want == 0:
        return out
    try:
        records = generate_samples(trainer, args)
    except Exception as e:  # noqa: BLE001 - reported, see the docstring
        print(f"[samples] FAILED after training (the adapter is saved): {type(e).__name__}: {e}", flush=True)
        return {**out, "samples_error": f"{type(e).__name__}: {e}"}
    return {**out, "samples": write_samples(storage, records), "samples_rows": len(records),
            "samples_left_out": want - len(records)}


def write_report(ctx, summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """Rank 0 at the end: report.html from the summary (the driver rewrites it with the newest checkpoint)."""
    return run_report.write(ctx.storage, run_name=summary.get("run_name") or "", config=vars(ctx.args),
                            status=run_report.final_status(summary), summary=summary, records=records)


def partial_summary(state, reporter, stats: dict[str, Any], world_size: int) -> dict[str, Any]:
    """What is known mid-run, in summary.json's keys."""
    train = [r["loss"] for r in reporter.records if r.get("kind") == "train" and "loss" in r]
    evals = [r["eval_loss"] for r in reporter.records if "eval_loss" in r]
    return {"global_step": state.global_step, "max_steps": state.max_steps, "epochs": state.epoch, **stats,
            "num_workers": world_size, "global_batch_size": reporter.global_batch,
            "first_train_loss": train[0] if train else None, "final_train_loss": train[-1] if train else None,
            "first_eval_loss": evals[0] if evals else None, "final_eval_loss": evals[-1] if evals else None}


def refresh_callback(ctx, reporter, run_name: str):
    """A TrainerCallback that rewrites report.html on rank 0 after each evaluation (with fresh samples
    when --sample_at_eval). Set `.trainer` and `.stats` once the trainer is built."""
    from transformers import TrainerCallback

    class ReportRefresh(TrainerCallback):
        trainer: Any = None
        stats: dict[str, Any] = {}
        records: list[dict[str, Any]] | None = None

        def on_evaluate(self, args, state, control, **kwargs):
            if ctx.rank != 0:
                return
            if ctx.args.sample_at_eval and self.trainer is not None:
                self.records = generate_samples(self.trainer, ctx.args)
                write_samples(ctx.storage, self.records)
            run_report.write(ctx.storage, run_name=run_name, status=run_report.eval_status(state.global_step,
                             state.max_steps), config=vars(ctx.args),
                             summary=partial_summary(state, reporter, self.stats, ctx.world_size),
                             records=reporter.records, samples=self.records or [])

    return ReportRefresh()
