"""The end of the demo: the trainer's summary.json / metrics.jsonl as a short report and a loss curve."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from demo.errors import DemoError
from demo.job_runner import read_metrics

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
METRICS_FILE = "metrics.jsonl"
RUNS_DIR = "runs"
PNG_DPI = 120
PNG_SIZE_IN = (7.0, 4.2)


def find_run(storage_dir: Path, run_name: str | None) -> Path | None:
    """The run's directory under ``<storage>/runs/``: the named one, else the newest (the trainer named it)."""
    runs = storage_dir / RUNS_DIR
    if run_name:
        return runs / run_name if (runs / run_name).is_dir() else None
    found = [p for p in runs.glob("*") if p.is_dir()] if runs.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def load_run(storage_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, metrics records) of a finished run whose directory is ``storage_dir`` on disk."""
    summary_path = storage_dir / SUMMARY_FILE
    if not summary_path.is_file():
        raise DemoError(f"the job finished but wrote no {summary_path}: see the job log above")
    summary = json.loads(summary_path.read_text())
    return summary, read_metrics(storage_dir / METRICS_FILE)


def copy_report(summary: dict[str, Any], run_storage: Path, run_dir: Path) -> Path | None:
    """The trainer's report.html (in the run's storage), copied to the demo's run directory; None when the
    trainer writes none (summary.json names no `report`)."""
    if not summary.get("report"):
        return None
    src = run_storage / REPORT_FILE
    if not src.is_file():
        raise DemoError(f"summary.json names {summary['report']} but there is no {src}: see the job log "
                        f"({run_dir / 'job.log'})")
    dest = run_dir / REPORT_FILE
    shutil.copyfile(src, dest)
    return dest


def loss_series(records: list[dict[str, Any]]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    train = [(int(r["step"]), float(r["loss"])) for r in records if r.get("kind") == "train" and "loss" in r]
    evals = [(int(r["step"]), float(r["eval_loss"])) for r in records if "eval_loss" in r]
    return train, evals


def plot_losses(records: list[dict[str, Any]], png: Path, title: str) -> Path:
    """Train and eval loss against the optimizer step, as a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = loss_series(records)
    if not train and not evals:
        raise DemoError("metrics.jsonl has no loss records to plot")
    fig, ax = plt.subplots(figsize=PNG_SIZE_IN)
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", color="tab:blue", linewidth=1.2)
    if evals:
        ax.plot(*zip(*evals, strict=True), label="eval loss", color="tab:orange", marker="o", linewidth=1.6)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean answer-token loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=PNG_DPI)
    plt.close(fig)
    return png


# summary.json `startup` keys (trainer/startup_timing.py ROWS), shortened for one line.
STARTUP_PARTS = (("runtime_env_s", "runtime env"), ("workers_s", "workers"), ("model_load_s", "model"),
                 ("data_s", "data"), ("setup_other_s", "set-up"), ("first_step_s", "first step"))


def _num(v: Any, fmt: str = ".4f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else str(v)


def summary_lines(summary: dict[str, Any], to_local: Callable[[str], Path], png: Path,
                  job_wall_s: float | None, total_s: float | None, total_label: str) -> list[str]:
    """The demo's closing report."""
    first_eval, final_eval = summary.get("first_eval_loss"), summary.get("final_eval_loss")
    drop = ""
    if isinstance(first_eval, (int, float)) and isinstance(final_eval, (int, float)) and first_eval:
        drop = f"  ({(1 - final_eval / first_eval) * 100:.0f}% lower)"

    def where(key: str) -> str:
        uri = summary.get(key)
        if not uri:
            return "-"
        local = to_local(str(uri))
        return f"{uri}\n{'':<22}on disk: {local}" if str(uri) != str(local) else str(uri)

    lines = [
        "=" * 72,
        "make demo: summary",
        f"  {'steps':<20}{summary.get('global_step')} (epochs {_num(summary.get('epochs'), '.2f')},"
        f" {summary.get('num_workers')} workers, global batch {summary.get('global_batch_size')})",
        f"  {'train loss':<20}{_num(summary.get('first_train_loss'))} -> {_num(summary.get('final_train_loss'))}",
        f"  {'eval loss':<20}{_num(first_eval)} -> {_num(final_eval)}{drop}",
        f"  {'samples/s':<20}{_num(summary.get('samples_per_second'), '.2f')}",
        f"  {'newest checkpoint':<20}{where('newest_checkpoint')}",
        f"  {'final adapter':<20}{where('final_adapter')}",
        f"  {'run report':<20}{where('report')}",
        f"  {'loss curve':<20}{png}",
        f"  {'job wall time':<20}{_num(job_wall_s, '.1f')} s",
    ]
    start = summary.get("startup") or {}
    if start.get("total_s") is not None:  # trainer/startup_timing.py; the job log has the full block
        parts = [f"{label} {start[key]:.1f}" for key, label in STARTUP_PARTS if start.get(key) is not None]
        lines.append(f"  {'job start':<20}{start['total_s']:.1f} s from {start.get('from')} to step 1"
                     f" ({', '.join(parts)} s)")
    stream = summary.get("streaming") or {}
    if stream:  # trainer/data/streaming.py: the rows of each epoch and the wait of each step for them
        wait = stream.get("data_wait_s") or {}
        epochs = "; ".join(f"epoch {e['epoch']}: {e['rows_trained']} rows, {e['rows_trained_twice']} twice"
                           for e in stream.get("epochs") or [])
        lines.append(f"  {'streamed':<20}{stream.get('shards')} shards; {epochs or 'no epoch recorded'}")
        lines.append(f"  {'data wait':<20}first step {_num(wait.get('first_step'), '.2f')} s, then mean "
                     f"{_num(wait.get('steady_mean'), '.4f')} s, max {_num(wait.get('steady_max'), '.4f')} s per step")
    if total_s is not None:
        lines.append(f"  {total_label:<20}{total_s:.1f} s")
    lines.append("=" * 72)
    return lines
