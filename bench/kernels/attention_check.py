"""Kernel candidates for issue #33 on the GPU: SigLIP attention (cuDNN vs FlashAttention 4) and the frozen
LayerNorm, each checked against a float32 reference on fresh random inputs, then timed (median of do_bench).

    python3 -m bench.kernels.attention_check --out results.jsonl      # one JSON line per check, kind "kernel_check"

SigLIP's attention in the bench workload: 16 images x 16 heads x 4,096 patches x head dim 72, bf16, no mask;
x 27 layers x 4 micro-batches per optimizer step. The LayerNorm: [65,536, 1,152] bf16, frozen weight and bias.
Every candidate that cannot run here (no FA4 installed, an error) is a row saying so, never a crash.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=50, rep=300, return_mode="median"))


def siglip_attention(emit, batch: int, heads: int, seq: int, dim: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from trainer.speed import capability

    cap = capability.device_capability()
    flops_fwd = 4 * batch * heads * seq * seq * dim
    scale = dim ** -0.5

    def inputs(b: int, dtype=torch.bfloat16):
        g = [torch.randn(b, heads, seq, dim, device="cuda", dtype=dtype) for _ in range(3)]
        return [t.requires_grad_() for t in g]

    # reference: float32 math on one image
    q, k, v = inputs(1, torch.float32)
    dout = torch.randn(1, heads, seq, dim, device="cuda")
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q, k, v, scale=scale)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)

    def check(name: str, run) -> dict[str, Any]:
        qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
        out = run(qb, kb, vb)
        grads = torch.autograd.grad(out, (qb, kb, vb), dout.bfloat16())
        return {"out": rel(out, ref), "dq": rel(grads[0], ref_grads[0]), "dk": rel(grads[1], ref_grads[1]),
                "dv": rel(grads[2], ref_grads[2])}

    def cudnn(qb, kb, vb):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qb, kb, vb, scale=scale)

    candidates = [("cudnn", cudnn)]
    try:
        from trainer.speed import fa4_attention

        for pad in (None, 80, 96):
            candidates.append((f"fa4_pad{pad}" if pad else "fa4",
                               lambda qb, kb, vb, pad=pad: fa4_attention.attention_bhsd(qb, kb, vb, scale, pad)))
    except Exception as e:  # FA4 not installed here: a row that says so
        emit({"check": "siglip_attention", "kernel": "fa4", "ok": False,
              "error": f"{type(e).__name__}: {str(e)[:300]}"})
    def measure(name: str, run) -> dict[str, Any]:
        row: dict[str, Any] = {"check": "siglip_attention", "kernel": name, "arch": capability.arch(cap),
                               "shape": [batch, heads, seq, dim]}
        try:
            t0 = time.time()
            row["error_vs_fp32"] = check(name, run)
            row["first_call_s"] = round(time.time() - t0, 2)
            bad = [k for k, v in row["error_vs_fp32"].items() if not v < 2e-2]
            qb, kb, vb = inputs(batch)
            go = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
            row["fwd_ms"] = bench_ms(lambda: run(qb, kb, vb))

            def fwd_bwd():
                out = run(qb, kb, vb)
                torch.autograd.grad(out, (qb, kb, vb), go)

            row["fwd_bwd_ms"] = bench_ms(fwd_bwd)
            row["fwd_tflops"] = flops_fwd / row["fwd_ms"] / 1e9
            row["fwd_bwd_tflops"] = 3.5 * flops_fwd / row["fwd_bwd_ms"] / 1e9
            row["step_ms_27x4"] = row["fwd_bwd_ms"] * 27 * 4
            if bad:  # timed anyway (what a fix would be worth), but not a candidate
                raise AssertionError(f"error above 2e-2 in {bad}")
            row["ok"] = True
        except Exception as e:
            traceback.print_exc()
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
        return row

    for name, run in candidates:
        emit(measure(name, run))

def frozen_layer_norm(emit, rows: int, dim: int) -> None:
    """SigLIP's LayerNorm with frozen weight and bias: PyTorch's kernel (what `frozen_norm` installs) against
    Liger's (what `use_liger_kernel` installs), both against float64."""
    import torch
    import torch.nn.functional as F

    from trainer.speed import frozen_norm

    w = torch.randn(dim, device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    b = torch.randn(dim, device="cuda", dtype=torch.bfloat16) * 0.1
    candidates = [("torch", lambda x: frozen_norm.frozen_layer_norm(x, w, b, 1e-6))]
    try:
        from liger_kernel.transformers.layer_norm import LigerLayerNorm

        ln = LigerLayerNorm(dim, eps=1e-6).cuda().bfloat16()
        with torch.no_grad():
            ln.weight.copy_(w)
            ln.bias.copy_(b)
        ln.weight.requires_grad_(False)
        ln.bias.requires_grad_(False)
        candidates.append(("liger", ln))
    except ImportError:
        emit({"check": "frozen_layer_norm", "kernel": "liger", "ok": False, "error": "liger-kernel not installed"})
    for name, fn in candidates:
        row: dict[str, Any] = {"check": "frozen_layer_norm", "kernel": name, "shape": [rows, dim]}
        try:
            x = (torch.randn(4096, dim, device="cuda") * 3 + 0.5).bfloat16().requires_grad_()
            dy = torch.randn(4096, dim, device="cuda", dtype=torch.bfloat16)
            y = fn(x)
            (dx,) = torch.autograd.grad(y, (x,), dy)
            xd = x.detach().double().cpu().requires_grad_()
            yd = F.layer_norm(xd, (dim,), w.double().cpu(), b.double().cpu(), 1e-6)
            (dxd,) = torch.autograd.grad(yd, (xd,), dy.double().cpu())
            row["error_vs_fp64"] = {"y": rel(y.cpu(), yd), "dx": rel(dx.cpu(), dxd)}
            if not all(v < 1e-2 for v in row["error_vs_fp64"].values()):
                raise AssertionError(f"error {row['error_vs_fp64']}")
            xb = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
            gb = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16)
            yb = fn(xb)
            row["fwd_ms"] = bench_ms(lambda: fn(xb))  # noqa: B023 - timed here, inside the iteration
            row["bwd_ms"] = bench_ms(lambda: torch.autograd.grad(yb, (xb,), gb, retain_graph=True))  # noqa: B023
            row["step_ms_fwd220_bwd216"] = 220 * row["fwd_ms"] + 216 * row["bwd_ms"]
            row["ok"] = True
        except Exception as e:
            traceback.print_exc()
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
        emit(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=16)
    a = parser.parse_args()

    import torch

    from trainer.speed import capability

    def emit(row: dict[str, Any]) -> None:
        row = {"kind": "kernel_check", **row}
        print("RESULT " + json.dumps(row), flush=True)
        with open(a.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    cap = capability.device_capability()
    emit({"check": "device", "gpu": torch.cuda.get_device_name(0), "arch": capability.arch(cap),
          "torch": torch.__version__, "plan": {p: c.kernel for p, c in capability.plan().items()}})
    siglip_attention(emit, a.batch, 16, 4096, 72)
    frozen_layer_norm(emit, 65536, 1152)


if __name__ == "__main__":
    main()
