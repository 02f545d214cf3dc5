#!/usr/bin/env python3
"""GPU check of the speed levers' kernels: correctness against the PyTorch reference, then timings.

- fused LoRA (trainer/fast_lora.py): the Triton mask equals `keep_mask` bit for bit; forward and the
  gradients of x, A and B match the explicit formula (float32 reference on the same mask); PEFT's layer
  vs the fused one, forward + backward, at Gemma 3 4B's shapes (batch 16);
- SigLIP attention (trainer/vision_attention.py): SDPA's FlashAttention-2 vs cuDNN at [B, 16, 4096, 72],
  error of each against an fp32 reference, forward + backward time.

    python3 bench/kernel_check.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "trainer"))


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def bench_ms(fn, reps: int = 10) -> float:
    import torch
    from triton.testing import do_bench

    torch.cuda.synchronize()
    return float(do_bench(fn, warmup=25, rep=max(50, reps * 10), return_mode="median"))


def check_lora(res: dict) -> None:
    import fast_lora
    import torch
    from fast_lora_kernels import keep_mask_kernel
    from peft import LoraConfig, get_peft_model

    dev = "cuda"
    # mask: the kernel's against the reference, odd sizes
    for m, k in ((1000, 4304), (333, 1152)):
        seed, p = 987654321, 0.05
        out = torch.full((m, k), 7, dtype=torch.uint8, device=dev)
        kb = -(-k // 128)
        keep_mask_kernel[(-(-m // 64), kb)](out, m, k, kb, seed, fast_lora.threshold(p), BM=64)
        ref = fast_lora.keep_mask(seed, m, k, p, dev)
        res.setdefault("mask_equal", []).append({"m": m, "k": k, "equal": bool(torch.equal(out.bool(), ref)),
                                                 "drop_rate": float(1 - ref.float().mean())})
    # fused Function vs the explicit formula in fp32 on the same mask (bf16 inputs)
    torch.manual_seed(0)
    for m, k, n in ((4096 * 3 + 17, 1152, 4304), (2000, 2560, 2048)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(n, k, device=dev) / k**0.5).bfloat16()
        a = (torch.randn(16, k, device=dev) / k**0.5).bfloat16().requires_grad_()
        b = (torch.randn(n, 16, device=dev) / 4).bfloat16().requires_grad_()
        p, s = 0.05, 1.0
        torch.manual_seed(5)
        y = fast_lora.fused_lora_linear(x, w, None, a, b, s, p, training=True)
        torch.manual_seed(5)
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        keep = fast_lora.keep_mask(seed, m, k, p, dev)
        inv = 1 / (1 - fast_lora.threshold(p) / 65536)
        xf, wf, af, bf = (t.detach().float().requires_grad_() for t in (x, w, a, b))
        yr = xf @ wf.t() + s * ((xf * keep * inv) @ af.t()) @ bf.t()
        gy = torch.randn_like(yr)
        gx, ga, gb = torch.autograd.grad(y, (x, a, b), gy.bfloat16())
        gxr, gar, gbr = torch.autograd.grad(yr, (xf, af, bf), gy)
        res.setdefault("fused_vs_fp32", []).append({
            "m": m, "k": k, "n": n, "y": rel(y, yr), "gx": rel(gx, gxr), "gA": rel(ga, gar), "gB": rel(gb, gbr)})
    # timing: PEFT layer vs fused, forward + backward, the 4B model's LoRA shapes at batch 16
    shapes = {"siglip_qkvo": (16 * 4096, 1152, 1152), "siglip_fc1": (16 * 4096, 1152, 4304),
              "siglip_fc2": (16 * 4096, 4304, 1152), "lm_q": (16 * 410, 2560, 2048),
              "lm_up": (16 * 410, 2560, 10240), "lm_down": (16 * 410, 10240, 2560)}
    only = [s for s in os.environ.get("KC_SHAPES", "").split(",") if s]
    for name, (m, k, n) in shapes.items():
        if only and name not in only:
            continue
        row = {"m": m, "k": k, "n": n}
        for p in (0.05, 0.0):
            for fused in (False, True):
                torch.manual_seed(1)
                base = torch.nn.Sequential(torch.nn.Linear(k, n, bias=True)).to(dev, torch.bfloat16)
                model = get_peft_model(base, LoraConfig(r=16, lora_alpha=16, lora_dropout=p, target_modules=["0"]),
                                       autocast_adapter_dtype=False)
                if fused:
                    fast_lora.apply(model)
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
                gy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)

                def step(model=model, x=x, gy=gy):
                    model(x).backward(gy)

                torch.cuda.reset_peak_memory_stats()
                base_mem = torch.cuda.memory_allocated()
                y = model(x)
                saved = torch.cuda.memory_allocated() - base_mem - y.numel() * 2
                del y
                row[f"{'fused' if fused else 'peft'}_p{p}_ms"] = bench_ms(step)
                row[f"{'fused' if fused else 'peft'}_p{p}_saved_mib"] = saved / 2**20
                del model, x, gy
        res.setdefault("lora_timing", {})[name] = row
        print(name, json.dumps(row), flush=True)


def check_attention(res: dict) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    for b in (2, 16):
        qkv = [torch.randn(b, 4096, 16, 72, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for _ in range(3)]
        gy = torch.randn(b, 16, 4096, 72, device="cuda", dtype=torch.bfloat16)
        row: dict = {"batch": b}
        ref = None
        if b == 2:
            q32 = [t.detach().float().requires_grad_() for t in qkv]
            with sdpa_kernel([SDPBackend.MATH]):
                ref = F.scaled_dot_product_attention(*q32)
            ref_g = torch.autograd.grad(ref, q32, gy.float())
        import contextlib

        import vision_attention

        for name, ctx in (("default", contextlib.nullcontext), ("prefer_cudnn",
                                                                 lambda: sdpa_kernel(vision_attention.backend_order(),
                                                                                     set_priority=True)),
                          ("flash", lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])),
                          ("cudnn", lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])),
                          ("efficient", lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]))):
            try:
                with ctx():
                    out = F.scaled_dot_product_attention(*qkv)
                    grads = torch.autograd.grad(out, qkv, gy)
                    if ref is not None:
                        row[f"{name}_err_out"] = rel(out, ref)
                        row[f"{name}_err_dq"] = rel(grads[0], ref_g[0])

                    def fwd_bwd(qkv=qkv, gy=gy):
                        o = F.scaled_dot_product_attention(*qkv)
                        torch.autograd.grad(o, qkv, gy)

                    def fwd(qkv=qkv):
                        with torch.no_grad():
                            F.scaled_dot_product_attention(*qkv)

                    row[f"{name}_fwd_ms"] = bench_ms(fwd)
                    row[f"{name}_fwd_bwd_ms"] = bench_ms(fwd_bwd)
                    flops = 4 * b * 16 * 4096 * 4096 * 72
                    row[f"{name}_fwd_tflops"] = flops / row[f"{name}_fwd_ms"] / 1e9
                    row[f"{name}_fwd_bwd_tflops"] = 3.5 * flops / row[f"{name}_fwd_bwd_ms"] / 1e9
            except Exception as e:  # a backend that refuses the shape is a result too
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        res.setdefault("siglip_attention", []).append(row)
        print("attention", json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    import torch

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    parts = [p for p in (check_lora, check_attention)
             if p.__name__ in os.environ.get("KC_PARTS", "check_lora,check_attention").split(",")]
    for part in parts:
        try:
            part(res)
        except Exception as e:
            import traceback

            traceback.print_exc()
            res[f"{part.__name__}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    a.out.write_text(json.dumps(res, indent=1))
    print("KERNEL_CHECK " + json.dumps({k: v for k, v in res.items() if k != "lora_timing"}), flush=True)


if __name__ == "__main__":
    main()
