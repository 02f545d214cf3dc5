"""`bench.py run --profile`: one optimizer step under torch.profiler, summarised to steer the next lever.

The capture starts at `on_step_begin` and ends at `on_step_end` of one optimizer step after the timed ones
(a Trainer callback), with `torch.cuda.synchronize()` at both ends. Written beside the row's result:

- GPU kernel time by category (a regex on the kernel's name: the fused LoRA kernels are their own
  category), the 40 kernels with the most GPU time, the op table sorted by GPU time;
- the gap: the row's mean unprofiled step wall time minus the captured step's GPU kernel time (time the
  GPU spends idle, waiting for the CPU, if kernels never overlap), and the captured step's own wall time
  (the profiler's CPU overhead inflates it; kernel times are not affected that way);
- where copies come from: `aten::copy_`/`clone`/`contiguous`/`add` grouped by the Python stack that
  called them, with their GPU time;
- where the GPU waits: every idle interval between kernels, attributed to the op (and its Python
  callers) that launched the kernel ending it, summed by caller.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

CATEGORIES = (  # first match wins
    ("lora", r"^(lora_fwd|lora_bwd|dropout_lora|keep_mask)"),
    ("attention", r"attention|fmha|flash|sdpa|cudnn_generated|_attn_"),
    ("gemm", r"gemm|nvjet|cutlass|sm90_xmma|ampere_|_mma_|implicit_convolve|cublas|matmul"),
    ("triton", r"^(_|triton_)"),
    ("copy/cast", r"copy|Memcpy|convert|cast|CUDAFunctor_add<c10::BFloat16> >\(at::TensorIteratorBase"),
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("elementwise", r"elementwise|reduce_kernel|vectorized"),
)


def category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return cat
    return "other"


def kernel_events(prof) -> list[tuple[str, float]]:
    """(name, µs) of every GPU kernel/memcpy/memset the capture saw."""
    out = []
    for ev in prof.events():
        dev = getattr(ev, "device_type", None)
        if dev is not None and "CUDA" in str(dev):
            out.append((ev.name, float(ev.time_range.elapsed_us())))
    return out


def summarise(kernels: list[tuple[str, float]], step_wall_s: float | None, captured_wall_s: float) -> dict[str, Any]:
    by_cat: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for name, us in kernels:
        by_cat[category(name)] = by_cat.get(category(name), 0.0) + us
        agg = by_name.setdefault(name, [0.0, 0])
        agg[0] += us
        agg[1] += 1
    gpu_ms = sum(by_cat.values()) / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:40]
    return {
        "gpu_ms": round(gpu_ms, 1),
        "captured_step_wall_ms": round(captured_wall_s * 1e3, 1),
        "step_wall_ms": round(step_wall_s * 1e3, 1) if step_wall_s else None,
        "gap_ms": round(step_wall_s * 1e3 - gpu_ms, 1) if step_wall_s else None,
        "kernels": len(kernels),
        "by_category_ms": {k: round(v / 1e3, 1) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:160], "ms": round(v[0] / 1e3, 2), "calls": v[1], "category": category(n)}
                        for n, v in top],
    }


PYTHON_FRAME = re.compile(r"\.py\(\d+\): |^<built-in ")


SKIP_FRAME = re.compile(r"torch/(nn/modules|autograd|utils|_ops|_tensor|overrides|profiler)|<built-in|threading.py|"
                        r"accelerate/|transformers/trainer\.py|trainer_callback")


def _caller(op, depth: int = 3) -> str:
    """An op and who called it: its aten parents (3), then the nearest Python frames outside torch (`depth`)."""
    if op is None:
        return "(launch not found)"
    atens, frames = [], list(getattr(op, "stack", None) or [])
    parent = getattr(op, "cpu_parent", None)
    while parent is not None and (len(atens) < 3 or len(frames) < depth + 4):
        if PYTHON_FRAME.search(parent.name):
            frames.append(parent.name)
        elif len(atens) < 3 and not frames:
            atens.append(parent.name)
        parent = getattr(parent, "cpu_parent", None)
    frames = [re.sub(r"^.*site-packages/", "", f) for f in frames if not SKIP_FRAME.search(f)][:depth]
    return " <- ".join([op.name, *atens, *frames])


def launches(events) -> dict[int, Any]:
    """id(kernel event) -> the CPU op that launched it: each op's kernels (by name) matched in launch order."""
    from collections import defaultdict, deque

    ops = sorted((e for e in events if "CPU" in str(e.device_type) and getattr(e, "kernels", None)),
                 key=lambda e: e.time_range.start)
    queues: dict[str, deque] = defaultdict(deque)
    for op in ops:
        for k in op.kernels:
            queues[k.name].append(op)
    out = {}
    for k in sorted((e for e in events if "CUDA" in str(e.device_type)), key=lambda e: e.time_range.start):
        if queues[k.name]:
            out[id(k)] = queues[k.name].popleft()
    return out


def idle_by_caller(prof) -> tuple[float, list[tuple[str, float, int]]]:
    """(total idle µs between the first and last kernel, [(caller, idle µs, intervals)] largest first)."""
    events = prof.events()
    launched = launches(events)
    kernels = sorted((e for e in events if "CUDA" in str(e.device_type)), key=lambda e: e.time_range.start)
    busy_end, total, by = None, 0.0, {}
    for k in kernels:
        start, end = k.time_range.start, k.time_range.end
        if busy_end is not None and start > busy_end:
            idle = start - busy_end
            total += idle
            agg = by.setdefault(_caller(launched.get(id(k))), [0.0, 0])
            agg[0] += idle
            agg[1] += 1
        busy_end = end if busy_end is None else max(busy_end, end)
    return total, sorted(((k, v[0], v[1]) for k, v in by.items()), key=lambda t: -t[1])


def copies_by_caller(prof) -> list[tuple[str, float, int]]:
    """GPU time of copy and add kernels by the op and Python frames that launched them, largest first."""
    by: dict[str, list] = {}
    for e in prof.events():
        if "CPU" in str(e.device_type) and e.name in ("aten::copy_", "aten::add", "aten::add_") and e.kernels:
            agg = by.setdefault(_caller(e), [0.0, 0])
            agg[0] += sum(k.duration for k in e.kernels)
            agg[1] += 1
    return sorted(((k, v[0], v[1]) for k, v in by.items()), key=lambda t: -t[1])


def report(summary: dict[str, Any], prof) -> str:
    lines = [f"GPU kernel time {summary['gpu_ms']} ms in {summary['kernels']} kernels; captured step wall "
             f"{summary['captured_step_wall_ms']} ms; unprofiled step wall {summary['step_wall_ms']} ms; "
             f"gap (unprofiled wall - GPU) {summary['gap_ms']} ms", "", "KERNEL TIME BY CATEGORY (ms, one step)"]
    total = summary["gpu_ms"] or 1.0
    for cat, ms in summary["by_category_ms"].items():
        lines.append(f"  {cat:<12} {ms:>9.1f} ms  {100 * ms / total:5.1f}%")
    lines += ["", "TOP 40 KERNELS (ms, calls, category)"]
    for k in summary["top_kernels"]:
        lines.append(f"  {k['ms']:>9.2f} ms {k['calls']:>6}  {k['category']:<12} {k['name']}")
    from torch.autograd.profiler_util import EventList

    ops = EventList([e for e in prof.key_averages() if not PYTHON_FRAME.search(e.key)])
    for key in ("device_time_total", "cuda_time_total", "self_cpu_time_total"):
        try:
            table = ops.table(sort_by=key, row_limit=45, max_name_column_width=90)
            break
        except (AttributeError, KeyError, ValueError):
            table = "(no op table)"
    lines += ["", "OPS BY GPU TIME", table]
    try:  # copies and adds by the op and Python frames that launched them
        lines += ["", "COPIES AND ADDS BY CALLER (top 30 by GPU time)"]
        lines += [f"  {us / 1e3:>8.2f} ms {n:>6}x {key}" for key, us, n in copies_by_caller(prof)[:30]]
    except Exception as exc:  # a bonus; the summary above stands without it
        lines.append(f"(copies by caller unavailable: {type(exc).__name__}: {exc})")
    try:
        total, callers = idle_by_caller(prof)
        summary["idle_ms_under_profiler"] = round(total / 1e3, 1)
        lines += ["", f"GPU IDLE BETWEEN KERNELS under the profiler: {total / 1e3:.1f} ms (the profiler's CPU overhead "
                  "inflates it), by the caller that launched the next kernel (top 40)"]
        lines += [f"  {us / 1e3:>8.2f} ms {n:>6}x {key}" for key, us, n in callers[:40]]
    except Exception as exc:
        lines.append(f"(idle attribution unavailable: {type(exc).__name__}: {exc})")
    return "\n".join(lines) + "\n"


class ProfileStep:
    """Trainer callback that captures optimizer step `at` (global_step before the step) under torch.profiler."""

    def __init__(self, at: int, out: Path, step_wall_s=lambda: None) -> None:
        self.at, self.out, self.step_wall_s = at, out, step_wall_s
        self.summary: dict[str, Any] | None = None
        self._prof = None
        self._t0 = 0.0

    def get_callback(self):
        import torch
        from transformers import TrainerCallback

        outer = self

        def _sync() -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()

        class _Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                if state.global_step == outer.at and outer._prof is None:
                    _sync()
                    acts = [torch.profiler.ProfilerActivity.CPU]
                    if torch.cuda.is_available():
                        acts.append(torch.profiler.ProfilerActivity.CUDA)
                    outer._prof = torch.profiler.profile(activities=acts, with_stack=False, record_shapes=False)
                    outer._prof.__enter__()
                    outer._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                if outer._prof is not None and outer.summary is None:
                    _sync()
                    wall = time.perf_counter() - outer._t0
                    outer._prof.__exit__(None, None, None)
                    outer.summary = summarise(kernel_events(outer._prof), outer.step_wall_s(), wall)
                    outer.out.write_text(report(outer.summary, outer._prof))
                    print(f"[bench] profile of step {outer.at + 1}: {outer.out}", flush=True)

        return _Cb()
