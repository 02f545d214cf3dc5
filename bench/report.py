"""The comparison table of one bench call (bench/call.py's results file), its check against the expectations
of bench/scenarios.toml, and bench/RESULTS.md from it.

    python3 -m bench.report bench/results/CALL.jsonl            # the table and the check (exit 1: out of range)
    python3 -m bench.report bench/results/CALL.jsonl --write bench/RESULTS.md

`--write` replaces only the speed section (between the `speed:begin`/`speed:end` markers; at the top
when the file has none) and keeps every other section of the file as it is.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench import scenario_table

BEGIN, END = "<!-- speed:begin (bench/report.py writes this section) -->", "<!-- speed:end -->"
TUTORIAL, PLAIN, UNSLOTH = "tutorial", "plain_trl", "unsloth"
DEFAULT, FREEZE = "default", "freeze_vision_3ep"


def load(path: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("kind", "row") != "row":
                continue  # kernel checks, summaries, metrics: checked or cited, not tabled
            rows[r.get("scenario") or r["name"]] = r
    return rows


def sps(r: dict[str, Any] | None) -> float | None:
    if not r or not r.get("ok"):
        return None
    return r.get("samples_per_s")


def fmt(v: float | None, nd: int = 2) -> str:
    return "—" if v is None else f"{v:,.{nd}f}"


def table(rows: dict[str, dict[str, Any]]) -> str:
    tut, plain, uns = sps(rows.get(TUTORIAL)), sps(rows.get(PLAIN)), sps(rows.get(UNSLOTH))
    out = ["| row | micro-batch × accumulation | samples/s | × tutorial | × plain TRL | × Unsloth | MFU "
           "| peak GiB (reserved) | step s (min–max) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        if r.get("run") in ("data", "job_start", "kernels"):
            continue
        f = r.get("flags", {})
        micro = f.get("per_device_train_batch_size", "?")
        # results recorded before --global_batch_size name the accumulation; newer ones the global batch
        accum = f.get("gradient_accumulation_steps") or (
            int(f["global_batch_size"]) // int(micro) if "global_batch_size" in f and micro != "?" else "?")
        mb = f"{micro} × {accum}"
        if not r.get("ok"):
            out.append(f"| `{name}` | {mb} | failed: {r.get('error', '?')[:120]} | | | | | "
                       f"{fmt(r.get('peak_alloc_gib'), 1)} | |")
            continue
        s = r.get("samples_per_s")
        if r.get("workload"):
            s = r["workload"].get("samples_per_s", s)
        if s is None:
            continue
        xt = s / tut if tut else None
        xp = s / plain if plain else None
        xu = s / uns if uns and not r.get("workload") else None
        mfu = r.get("mfu")
        out.append(
            f"| `{name}` | {mb} | {fmt(s)} | {fmt(xt, 1)} | {fmt(xp, 2)} | {fmt(xu, 2)} | "
            f"{fmt(mfu * 100 if mfu else None, 1)}% | "
            f"{fmt(r.get('peak_reserved_gib'), 1)} | {fmt(r.get('step_s_mean'))} "
            f"({fmt(r.get('step_s_min'))}–{fmt(r.get('step_s_max'))}) |")
    return "\n".join(out)


def e2e_steady(path: Path | None) -> dict[str, Any] | None:
    """The Ray Train job's samples/s per log interval, and the mean over all but the first (steady state)."""
    if not path or not path.exists():
        return None
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    train = [r for r in recs if r.get("kind") == "train" and r.get("samples_per_second")]
    if not train:
        return None
    steady = train[1:] or train
    return {"intervals": [(r["step"], round(r["samples_per_second"], 2)) for r in train],
            "steady_samples_per_s": sum(r["samples_per_second"] for r in steady) / len(steady),
            "peak_gpu_mem_gib": max(r.get("peak_gpu_mem_gib") or 0 for r in train)}


PEAK_TFLOPS = 989
ROW_TEXT = {
    TUTORIAL: "the tutorial's recipe: 4-bit NF4, eager, checkpointing, 1 × 4, embeddings trained",
    PLAIN: "plain TRL + PEFT as a careful user writes it: bf16, sdpa, no Liger, fp32 adapters, no loader workers",
    "round1": "the fast recipe as round 1 left it (Liger, bf16 adapters, loader workers; PEFT's LoRA layer)",
    DEFAULT: "**default** (`--recipe=fast`): fused LoRA layers at micro-batch 16, cuDNN LM attention, the lean step, "
             "SigLIP attention by the device (FA4 where installed)",
    UNSLOTH: "Unsloth's own path (`FastVisionModel`, its collator) on the same rows, LoRA set and global batch",
    FREEZE: "**`freeze_vision`**, LoRA on the language model, image features reused: the tutorial's 3 epochs",
}


def losses(rows: dict[str, dict[str, Any]], names: list[str]) -> str:
    out = ["| step | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    cols = [rows[n].get("loss_log") or [] for n in names]
    for i in range(max(len(c) for c in cols)):
        out.append(f"| {i + 1} | " + " | ".join(f"{c[i]:.4f}" if i < len(c) else "" for c in cols) + " |")
    return "\n".join(out)


def phases(rows: dict[str, dict[str, Any]], names: list[str]) -> str:
    keys = [("vision_tower", "vision tower forward (SigLIP)"), ("language_model", "language model forward"),
            ("projector", "projector"), ("backward_and_loss", "backward, fused LM head and loss"),
            ("optimizer", "optimizer (fused AdamW)"), ("step", "optimizer step (64 samples)")]
    out = ["| phase (s per optimizer step) | " + " | ".join(f"`{n}`" for n in names) + " |",
           "|---" * (len(names) + 1) + "|"]
    for k, label in keys:
        out.append(f"| {label} | " + " | ".join(fmt(rows[n].get("phase_s_per_step", {}).get(k), 3)
                                                for n in names) + " |")
    return "\n".join(out)


def ratio(a: float | None, b: float | None, nd: int = 2) -> str:
    return f"{a / b:.{nd}f}×" if a and b else "—"


def headline(rows: dict[str, dict[str, Any]], source: str, others: dict[str, dict[str, Any]] | None = None,
             others_source: str = "", earlier: dict[str, dict[str, Any]] | None = None,
             earlier_source: str = "") -> list[str]:
    """RESULTS.md's first lines: the default's ratios from one call, then freeze_vision and the job start. A row the
    call lacks (the tutorial's, when the call's time went to the others) may come from an `earlier` call of the same
    speed path, named beside its ratio."""
    tut, plain, uns, dflt = (sps(rows.get(n)) for n in (TUTORIAL, PLAIN, UNSLOTH, DEFAULT))
    tut_from = ""
    if tut is None and earlier and sps(earlier.get(TUTORIAL)) is not None:
        tut, tut_from = sps(earlier[TUTORIAL]), f" (its row from `{earlier_source}`)"
    uv = (rows.get(UNSLOTH) or {}).get("versions", {}).get("unsloth", "?")
    lines = [f"default: {fmt(dflt)} samples/s, {ratio(dflt, tut, 1)} the tutorial recipe{tut_from}, {ratio(dflt, plain)} "
             f"plain TRL, {ratio(dflt, uns)} Unsloth {uv} ({fmt(uns)}), one call: `{source}`"]
    both = {**(others or {}), **rows}
    fv = (both.get(FREEZE) or {}).get("workload") or {}
    where = others_source if others and FREEZE in others else source
    if fv:
        lines.append(f"freeze_vision: the tutorial's 3 epochs in {fv.get('train_wall_s', float('nan')):.1f} s "
                     f"(`{where}`)")
    js = both.get("job_start") or {}
    if js.get("ok"):
        lines.append(f"job start: {js['job_start_s']:.1f} s from submission to the end of the first optimizer step "
                     f"(`{others_source if others and 'job_start' in others else source}`)")
    return lines


def section(rows: dict[str, dict[str, Any]], source: str, e2e: dict[str, Any] | None,
            others: dict[str, dict[str, Any]] | None = None, others_source: str = "",
            earlier: dict[str, dict[str, Any]] | None = None, earlier_source: str = "") -> str:
    fv = ((others or {}).get(FREEZE) or rows.get(FREEZE) or {}).get("workload") or {}
    v = next((r["versions"] for r in rows.values() if r.get("versions", {}).get("torch")), {})
    calls = sorted({r.get("call") for r in rows.values() if r.get("call")})
    head = [
        *headline(rows, source, others, others_source, earlier, earlier_source),
        "",
        "# Training speed: the trainer's own path on one H200 (Gemma 3 4B, random weights)",
        "",
        f"Generated by `bench/report.py` from `{source}` (one `run` call, `python3 -m bench.call`, "
        f"{', '.join(calls) or 'call not recorded'}, "
        f"{v.get('gpu', '?')}; torch {v.get('torch')}, transformers {v.get('transformers')}, peft {v.get('peft')}, "
        f"trl {v.get('trl')}, liger-kernel {v.get('liger-kernel')}, bitsandbytes {v.get('bitsandbytes')}). "
        "`bench/bench.py` drives the trainer's own path (flags, recipes, parquet rows decoded by its collator, "
        "`load_model`, LoRA set-up, its TRL `SFTTrainer` step); only the weights (google/gemma-3-4b-it's "
        "architecture, random bf16) and the rows (896×896 JPEGs, ~409 tokens per sample, 49 labelled) are "
        "synthetic. Every row trains at the tutorial's global batch 64 (micro-batch × accumulation on one GPU) "
        "with LoRA r16 / α16 / dropout 0.05 on all linear layers, except the tutorial row (its own 1 × 4) and "
        "`freeze_vision` (LoRA on the language model). Timing: synchronised wall time of each optimizer step "
        "after the warm-up steps (the scenario's options in bench/scenarios.toml; a profiled step after them is "
        "excluded); the `freeze_vision` row is `trainer.train()`'s wall time over 3 epochs of 1,345 rows.",
        "",
        table(rows),
        "",
        "| row | what it is |", "|---|---|",
        *[f"| `{n}` | {ROW_TEXT[n]} |" for n in rows if n in ROW_TEXT],
        "",
        f"**MFU** = model FLOPs per sample × samples/s ÷ {PEAK_TFLOPS} TFLOP/s (H100/H200 dense bf16 peak). "
        "Model FLOPs as `../shared/reference-bench`: frozen linear layers under LoRA 4·N·T, attention 3× its "
        "forward, the 262k-vocabulary head at every token (for every recipe), SigLIP 4·N·P with a backward "
        "pass or 2·N·P frozen: "
        f"{rows[DEFAULT]['tflop_per_sample']:.1f} TFLOP per sample with LoRA on all linear layers, "
        f"{rows[FREEZE]['tflop_per_sample']:.1f} with `freeze_vision` (its MFU uses its own, smaller count)."
        if DEFAULT in rows and FREEZE in rows else "",
        "",
        "**Peak memory** (PyTorch's reserved peak, GiB) is in the table"
        + (f": the default at micro-batch 16 reserved {rows[DEFAULT]['peak_reserved_gib']:.1f} GiB in this call. "
           if rows.get(DEFAULT, {}).get("peak_reserved_gib") else ". ")
        + "On an 80 GB H100 set `per_device_train_batch_size=8`.",
        "",
        *(["## Where the time goes (per optimizer step of 64 samples, from the phase-hook step)", "",
           phases(rows, timed), ""] if (timed := [n for n in (PLAIN, "round1", DEFAULT)
                                                   if n in rows and rows[n].get("phase_s_per_step")]) else []),
        "## Loss on the same batches (same seed and data order; dropout masks differ)",
        "",
        "The fused layer keeps PEFT's semantics; per-step training loss over the same 64-sample batches:",
        "",
        losses(rows, [n for n in (PLAIN, "round1", DEFAULT) if n in rows]),
        "",
    ]
    if fv:
        frow = (others or {}).get(FREEZE) or rows[FREEZE]
        cache = frow.get("levers", {}).get("image_feature_cache", {})
        st = frow.get("step_s", [])
        per_epoch = fv["optimizer_steps"] // 3
        e1, rest = st[:per_epoch - 2], st[per_epoch:-1]
        head += [
            "## `freeze_vision`: the tutorial's 3-epoch workload",
            "",
            f"{fv['rows']} rows × 3 epochs = {fv['samples']:.0f} samples in {fv['train_wall_s']:.1f} s of "
            f"`trainer.train()` ({fv['samples_per_s']:.1f} samples/s averaged, {fv['optimizer_steps']} optimizer "
            f"steps of 32 × 2). Image features: {cache.get('misses')} computed, {cache.get('hits')} reused "
            f"({cache.get('gib')} GiB on the GPU). Full steps of epoch 1 took "
            f"{sum(e1) / max(1, len(e1)):.2f} s (vision tower forward included), of epochs 2–3 "
            f"{sum(rest) / max(1, len(rest)):.2f} s (features reused): "
            f"{64 * len(e1) / max(1e-9, sum(e1)):.1f} vs {64 * len(rest) / max(1e-9, sum(rest)):.1f} samples/s.",
            "",
        ]
    if e2e:
        head += ["## Ray Train job, steady state", "",
                 f"{e2e['steady_samples_per_s']:.2f} samples/s (log intervals {e2e['intervals']}).", ""]
    return "\n".join(head)


HEADLINE_PREFIXES = ("default: ", "freeze_vision: ", "job start: ", "Default: ")


def write(path: Path, text: str) -> None:
    """The headline as the file's first lines, the rest of the section between the markers; everything
    else in the file (other engineers' sections) stays as it is."""
    headline, body = text.split("\n\n", 1)
    old = path.read_text() if path.exists() else ""
    lines = old.splitlines(keepends=True)
    while lines and (lines[0].startswith(HEADLINE_PREFIXES) or not lines[0].strip()):
        lines.pop(0)
    old = "".join(lines)
    if BEGIN in old and END in old:
        before, rest = old.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        new = before + BEGIN + "\n" + body + END + after
    else:
        new = BEGIN + "\n" + body + END + "\n\n" + old
    path.write_text(headline + "\n\n" + new)


def metric_value(r: dict[str, Any], metric: str) -> float | None:
    if metric == "train_wall_s":
        return (r.get("workload") or {}).get("train_wall_s")
    v = r.get(metric)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def check(path: Path, scenarios: list | None = None) -> list[dict[str, Any]]:
    """Each scenario the results file holds, judged against its row of bench/scenarios.toml: its value, the
    expected range and where it came from, `in range` / `below` / `above` / `failed`, and the issue's target."""
    if scenarios is None:
        scenarios = scenario_table.load()
    by_name = {s.name: s for s in scenarios}
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    out = []
    for name in dict.fromkeys(r.get("scenario") for r in lines if r.get("scenario")):
        s = by_name.get(name)
        mine = [r for r in lines if r.get("scenario") == name]
        verdict: dict[str, Any] = {"scenario": name, "value": None, "status": "", "expect": None, "source": "",
                                   "target": "", "target_status": ""}
        if s is None:
            verdict["status"] = "not in bench/scenarios.toml"
            out.append(verdict)
            continue
        verdict.update(expect=s.expect, source=s.source, target=s.target)
        failed = [r for r in mine if not r.get("ok")]
        if s.run == "kernels":
            verdict["status"] = "failed: " + "; ".join(
                f"{r.get('check', '?')}/{r.get('kernel', '')}: {str(r.get('error', ''))[:80]}" for r in failed
            ) if failed else "ok"
            out.append(verdict)
            continue
        r = mine[-1]
        if not r.get("ok"):
            verdict["status"] = f"failed: {str(r.get('error', '?'))[:160]}"
            out.append(verdict)
            continue
        value = metric_value(r, s.metric) if s.metric else None
        verdict["value"] = value
        if s.expect is None or value is None:
            verdict["status"] = "ok" if value is None else "ok (no expected range)"
        elif value < s.expect[0]:
            verdict["status"] = "below the expected range"
        elif value > s.expect[1]:
            verdict["status"] = "above the expected range"
        else:
            verdict["status"] = "in range"
        parts = s.target_parts()
        if parts and value is not None:
            op, bar = parts
            met = value >= bar if op == ">=" else value <= bar
            verdict["target_status"] = ("met" if met else
                                        f"missed by {abs(value - bar):.2f} ({abs(value - bar) / bar:.0%})") + f" ({s.issue})"
        out.append(verdict)
    return out


def print_check(path: Path, scenarios: list | None = None) -> bool:
    """The table and the check; True when every scenario ran and landed in its expected range."""
    rows = load(path)
    if any(r.get("run") not in ("data", "job_start", "kernels") for r in rows.values()):
        print(table(rows))
    ok = True
    for v in check(path, scenarios):
        value = "—" if v["value"] is None else f"{v['value']:.3g}"
        rng = f" expected {v['expect'][0]:g}–{v['expect'][1]:g}" if v["expect"] else ""
        tgt = f"; target {v['target']}: {v['target_status']}" if v["target"] else ""
        print(f"[check] {v['scenario']}: {value}{rng}: {v['status']}{tgt}")
        ok &= v["status"] in ("in range", "ok", "ok (no expected range)")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--with", dest="others", type=Path, default=None,
                        help="a second call's results (freeze_vision, the job start) for the headline")
    parser.add_argument("--earlier", type=Path, default=None,
                        help="an earlier call of the same speed path whose rows fill what the first lacks (the tutorial's)")
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--e2e", type=Path, default=None, help="the Ray job's metrics.jsonl")
    parser.add_argument("--notes", type=Path, default=None, help="text appended to the section (levers, targets)")
    a = parser.parse_args()
    rows = load(a.results)
    ok = print_check(a.results)
    others = load(a.others) if a.others else None
    if others is not None:
        ok &= print_check(a.others)
    e2e = e2e_steady(a.e2e)
    if a.write:
        if a.earlier and load(a.earlier).get(DEFAULT, {}).get("speed_path") != rows.get(DEFAULT, {}).get("speed_path"):
            raise SystemExit(f"bench.report: {a.earlier} measured another speed path than {a.results}")
        write(a.write, section(rows, str(a.results), e2e, others, str(a.others or ""),
                               load(a.earlier) if a.earlier else None, str(a.earlier or "")) + "\n"
              + (a.notes.read_text() if a.notes else ""))
    if e2e:
        bench = sps(rows.get(DEFAULT))
        ratio = f" ({e2e['steady_samples_per_s'] / bench:.0%} of the bench's default)" if bench else ""
        print(f"Ray Train job steady state: {e2e['steady_samples_per_s']:.2f} samples/s{ratio}; "
              f"intervals {e2e['intervals']}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
