"""The run's one-page report.html: facts, loss curves (inline SVG), eval metrics and the sample gallery.

Standard library only (the Ray driver imports it). The page is self-contained: no scripts, styles
inline, images as data URIs, and a Content-Security-Policy that forbids any request a browser could make.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

REPORT_FILE = "report.html"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
CHART_W, CHART_H = 720, 300
CHART_MARGIN = {"left": 56, "right": 16, "top": 16, "bottom": 40}
CHART_TICKS = 5
TRAIN_COLOR, EVAL_COLOR = "#1f77b4", "#ff7f0e"
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.status{color:#555} table{border-collapse:collapse} td,th{padding:3px 10px;text-align:left;vertical-align:top}
table.facts th{color:#555;font-weight:600;white-space:nowrap} table.metrics td,table.metrics th{border:1px solid #ddd}
table.metrics td{text-align:right;font-variant-numeric:tabular-nums}
.gallery{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:14px}
figure.sample{margin:0;border:1px solid #ddd;border-radius:6px;padding:10px;background:#fafafa}
figure.sample img{width:96px;height:96px;object-fit:contain;float:right;margin:0 0 6px 8px;background:#fff;
border:1px solid #eee;image-rendering:pixelated} figcaption{font-weight:600;margin-bottom:6px}
.text{clear:none;margin:4px 0;padding:4px 6px;border-left:3px solid #ccc;background:#fff;white-space:pre-wrap}
.text b{display:block;font-size:12px;color:#555} .reference{border-color:#888} .base{border-color:#c66}
.finetuned{border-color:#4a4} .f1{float:right;font-size:12px;font-weight:600} .better{color:#2a7a2a}
.worse{color:#b33} .verdict{font-size:15px;margin:6px 0 12px} .muted{color:#777}
"""


# ----------------------------------------------------------------------------------------------
# Agreement with the reference
# ----------------------------------------------------------------------------------------------
def words(text: str | None) -> list[str]:
    """Lower-cased word tokens (letters/digits), punctuation dropped."""
    return re.findall(r"\w+", (text or "").lower())


def token_f1(output: str | None, reference: str | None) -> float:
    """SQuAD-style token-overlap F1 of `output` against `reference` (bag of words), in [0, 1]."""
    out, ref = words(output), words(reference)
    if not out or not ref:
        return float(out == ref)
    common = sum((Counter(out) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(out), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if isinstance(v, int | float)]
    return sum(vals) / len(vals) if vals else None


# ----------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else str(value)
    return str(value)


def _seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.1f} s" if value < 120 else f"{value:.0f} s ({value / 60:.1f} min)"


def _nice_ticks(lo: float, hi: float, n: int = CHART_TICKS) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------
def loss_series(records: Sequence[dict[str, Any]]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(train, eval) loss points by optimizer step, from metrics.jsonl records."""
    train = [(int(r["step"]), float(r["loss"])) for r in records if r.get("kind") == "train" and "loss" in r]
    evals = [(int(r["step"]), float(r["eval_loss"])) for r in records if "eval_loss" in r]
    return train, evals


def loss_chart(records: Sequence[dict[str, Any]]) -> str:
    """Train (line) and eval (line with dots) loss against the step, as inline SVG."""
    train, evals = loss_series(records)
    points = train + evals
    if not points:
        return '<p class="muted" id="loss-chart">No loss records yet.</p>'
    m = CHART_MARGIN
    x_hi = max(max(s for s, _ in points), 1)
    y_lo, y_hi = min(v for _, v in points), max(v for _, v in points)
    y_ticks = _nice_ticks(min(0.0, y_lo), y_hi)
    y_lo, y_hi = y_ticks[0], max(y_ticks[-1], y_hi)
    x_ticks = [t for t in _nice_ticks(0, x_hi) if t <= x_hi]
    pw, ph = CHART_W - m["left"] - m["right"], CHART_H - m["top"] - m["bottom"]

    def x(step: float) -> float:
        return m["left"] + pw * step / x_hi

    def y(v: float) -> float:
        return m["top"] + ph * (1 - (v - y_lo) / ((y_hi - y_lo) or 1.0))

    parts = [f'<svg id="loss-chart" role="img" aria-label="train and eval loss by step" '
             f'width="{CHART_W}" height="{CHART_H}" '
             f'viewBox="0 0 {CHART_W} {CHART_H}" font-size="11" font-family="sans-serif">']
    for t in y_ticks:
        parts.append(f'<line x1="{m["left"]}" x2="{m["left"] + pw}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#eee"/>'
                     f'<text x="{m["left"] - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in x_ticks:
        parts.append(f'<text x="{x(t):.1f}" y="{m["top"] + ph + 16}" text-anchor="middle">{t:g}</text>')
    parts.append(f'<rect x="{m["left"]}" y="{m["top"]}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    parts.append(f'<text x="{m["left"] + pw / 2}" y="{CHART_H - 6}" text-anchor="middle">optimizer step</text>')
    parts.append(f'<text transform="translate(14 {m["top"] + ph / 2}) rotate(-90)" text-anchor="middle">'
                 "answer-token loss</text>")
    for name, series, color in (("train", train, TRAIN_COLOR), ("eval", evals, EVAL_COLOR)):
        if not series:
            continue
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in series)
        parts.append(f'<polyline class="{name}-loss" points="{path}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        if name == "eval":
            parts.extend(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3.5" fill="{color}"><title>step {s}: '
                         f'eval loss {v:.4g}</title></circle>' for s, v in series)
    for i, (label, color, n) in enumerate((("train loss", TRAIN_COLOR, len(train)), ("eval loss", EVAL_COLOR, len(evals)))):
        lx, ly = m["left"] + pw - 110, m["top"] + 16 + 16 * i
        parts.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="2"/>'
                     f'<text x="{lx + 24}" y="{ly}">{label} ({n})</text>')
    parts.append("</svg>")
    return "".join(parts)


def eval_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per evaluation: the step and every eval_* metric."""
    rows = [r for r in records if "eval_loss" in r]
    if not rows:
        return '<p class="muted">No evaluation yet.</p>'
    keys = sorted({k for r in rows for k in r if k.startswith("eval_")}, key=lambda k: (k != "eval_loss", k))
    head = "".join(f"<th>{_e(k.removeprefix('eval_'))}</th>" for k in keys)
    body = "".join("<tr><td>" + _e(r.get("step")) + "</td>" + "".join(f"<td>{_e(_fmt(r.get(k)))}</td>" for k in keys)
                   + "</tr>" for r in rows)
    return f'<table class="metrics" id="eval-metrics"><tr><th>step</th>{head}</tr>{body}</table>'


def facts_table(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """The run's facts: model, data, recipe, batch, workers and GPUs, steps, time, throughput, job start."""
    per_device = summary.get("micro_batch_size", config.get("per_device_train_batch_size"))
    accum = summary.get("gradient_accumulation_steps", config.get("gradient_accumulation_steps"))
    workers = summary.get("num_workers") or config.get("num_workers")
    gpus = (f"{workers} GPU{'s' if workers != 1 else ''}" + (f" ({config['accelerator_type']})"
            if config.get("accelerator_type") else "")) if config.get("use_gpu") else "CPU only"
    skipped = summary.get("skipped_rows") or {}
    rows: list[tuple[str, str]] = [
        ("model", _fmt(config.get("model_id"))),
        ("data", f"{_fmt(config.get('dataset_name'))}: {_fmt(summary.get('train_rows'))} train / "
                 f"{_fmt(summary.get('eval_rows'))} eval rows"
                 + (f", skipped {sum(skipped.values())} ({', '.join(f'{k} {v}' for k, v in skipped.items())})"
                    if skipped else "")),
        ("recipe", f"{_fmt(config.get('recipe'))}: quantization {_fmt(config.get('quantization'))}, attention "
                   f"{_fmt(config.get('attn_implementation'))}, LoRA r {_fmt(config.get('lora_r'))} / alpha "
                   f"{_fmt(config.get('lora_alpha'))} on {_fmt(config.get('lora_target'))}, learning rate "
                   f"{_fmt(config.get('learning_rate'))}"),
        ("global batch", f"{_fmt(summary.get('global_batch_size'))} = {_fmt(per_device)} per worker x "
                         f"{_fmt(accum)} accumulation x {_fmt(workers)} workers"),
        ("workers and GPUs", f"{_fmt(workers)} Ray Train workers, {gpus}"),
        ("steps", f"{_fmt(summary.get('global_step'))} of {_fmt(summary.get('max_steps'))} (epochs "
                  f"{_fmt(summary.get('epochs'), 3)})"
                  + (f", resumed from step {summary['resumed_from_step']}"
                     if summary.get("resumed_from_step") is not None else "")),
        ("training time", _seconds(summary.get("train_runtime_s"))),
        ("throughput", f"{_fmt(summary.get('samples_per_second'))} samples/s, "
                       f"{_fmt(summary.get('tokens_per_second'))} tokens/s"),
        ("loss", f"train {_fmt(summary.get('first_train_loss'))} -> {_fmt(summary.get('final_train_loss'))}, "
                 f"eval {_fmt(summary.get('first_eval_loss'))} -> {_fmt(summary.get('final_eval_loss'))}"),
    ]
    startup = summary.get("startup")  # the job-start split (startup_timing.py): `<phase>_s` seconds, `from`
    if isinstance(startup, dict) and startup:
        phases = [f"{k.removesuffix('_s').replace('_', ' ')} {_seconds(v)}" for k, v in startup.items()
                  if k.endswith("_s") and isinstance(v, int | float)]
        origin = f" (from {startup['from']})" if startup.get("from") else ""
        rows.append(("job start", ", ".join(phases) + origin if phases else "-"))
    for key, label in (("final_adapter", "adapter"), ("newest_checkpoint", "newest checkpoint")):
        if summary.get(key):
            rows.append((label, str(summary[key])))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts" id="facts">{body}</table>'


def _text_block(kind: str, label: str, text: str | None, f1: float | None, other: float | None) -> str:
    score = ""
    if f1 is not None:
        cls = "" if other is None or f1 == other else (" better" if f1 > other else " worse")
        score = f'<span class="f1{cls}" title="token-overlap F1 with the reference">F1 {f1:.2f}</span>'
    shown = _e(text) if text else '<span class="muted">(empty)</span>' if text is not None else "-"
    return f'<div class="text {kind}">{score}<b>{_e(label)}</b>{shown}</div>'


def gallery(samples: Sequence[dict[str, Any]]) -> str:
    """One figure per sample: thumbnail, reference, base and fine-tuned outputs with their F1."""
    if not samples:
        return '<p class="muted">No sample generations (sample_rows=0, no eval split, or not written yet).</p>'
    base_f1 = _mean([s.get("base_f1") for s in samples])
    tuned_f1 = _mean([s.get("finetuned_f1") for s in samples])
    closer = sum(1 for s in samples if isinstance(s.get("base_f1"), int | float)
                 and (s.get("finetuned_f1") or 0) > s["base_f1"])
    verdict = (f"Mean token-overlap F1 with the reference: base {_fmt(base_f1, 3)} -> fine-tuned "
               f"{_fmt(tuned_f1, 3)}; the fine-tuned output is closer on {closer} of {len(samples)} rows.")
    figures = []
    for s in samples:
        title = " · ".join(str(s[k]) for k in ("product", "category") if s.get(k)) or f"eval row {s.get('row_id')}"
        tokens = s.get("tokens") or {}
        img = (f'<img src="{_e(s["thumbnail"])}" alt="image of eval row {_e(s.get("row_id"))}">'
               if str(s.get("thumbnail", "")).startswith("data:image/") else "")
        figures.append(
            f'<figure class="sample" data-row="{_e(s.get("row_id"))}">{img}<figcaption>{_e(title)}</figcaption>'
            + _text_block("reference", "reference", s.get("reference"), None, None)
            + _text_block("base", f"base model ({_fmt(tokens.get('base_output'))} tokens)", s.get("base_output"),
                          s.get("base_f1"), s.get("finetuned_f1"))
            + _text_block("finetuned", f"fine-tuned ({_fmt(tokens.get('finetuned_output'))} tokens)",
                          s.get("finetuned_output"), s.get("finetuned_f1"), s.get("base_f1"))
            + f'<div class="muted">eval row {_e(s.get("row_id"))}, prompt {_fmt(tokens.get("prompt"))} tokens</div>'
            "</figure>"
        )
    return f'<p class="verdict" id="verdict">{_e(verdict)}</p><div class="gallery">{"".join(figures)}</div>'


def build_html(*, run_name: str, status: str, config: dict[str, Any], summary: dict[str, Any] | None,
               records: Sequence[dict[str, Any]], samples: Sequence[dict[str, Any]]) -> str:
    """The whole page. `summary` may be partial (a refresh at an evaluation, before summary.json)."""
    summary = summary or {}
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>gemma3-ray run {_e(run_name)}</title><style>{STYLE}</style></head><body>"
        f"<h1>gemma3-ray run {_e(run_name)}</h1><p class=\"status\" id=\"status\">{_e(status)}</p>"
        f"<h2>Run</h2>{facts_table(config, summary)}"
        f"<h2>Loss</h2>{loss_chart(records)}"
        f"<h2>Evaluation</h2>{eval_table(records)}"
        f"<h2>Samples</h2>{gallery(samples)}"
        "</body></html>\n"
    )


# ----------------------------------------------------------------------------------------------
# Writing it to the run's directory
# ----------------------------------------------------------------------------------------------
def read_jsonl(data: bytes | None) -> list[dict[str, Any]]:
    """Records of a .jsonl file's bytes (a partly written last line is ignored)."""
    out = []
    for line in (data or b"").decode(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def final_status(summary: dict[str, Any]) -> str:
    resumed = summary.get("resumed_from_step")
    return (f"finished at step {summary.get('global_step')}" + (f" (resumed from step {resumed})" if resumed else "")
            + (f"; {summary['samples_left_out']} sample rows did not fit the time budget"
               if summary.get("samples_left_out") else "")
            + (f"; sample generation failed: {summary['samples_error']}" if summary.get("samples_error") else ""))


def eval_status(step: int, max_steps: int) -> str:
    return f"training: step {step} of {max_steps} (this page is refreshed at each evaluation and at the end)"


def write(storage: Any, *, run_name: str, status: str, config: dict[str, Any], summary: dict[str, Any] | None,
          records: Sequence[dict[str, Any]] | None = None, samples: Sequence[dict[str, Any]] | None = None) -> str:
    """Render and store report.html in the run's directory (`storage`: write_bytes/read_bytes/uri); its URI.

    Records and samples left as None are read from the run's metrics.jsonl and samples.jsonl.
    """
    if records is None:
        records = read_jsonl(storage.read_bytes(METRICS_FILE))
    if samples is None:
        samples = read_jsonl(storage.read_bytes(SAMPLES_FILE))
    page = build_html(run_name=run_name, status=status, config=config, summary=summary, records=records,
                      samples=samples)
    storage.write_bytes(REPORT_FILE, page.encode())
    return storage.uri(REPORT_FILE)
