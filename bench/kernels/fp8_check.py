"""GPU check of the FP8 experiment (bench/kernels/fp8_linear.py) at Gemma 3 4B's shapes, micro-batch 16.

Per shape: the relative error of the FP8 forward and input gradient against bf16, and the time of each
(bf16 matmul vs activation quantization + torch._scaled_mm), median of triton's do_bench.

    python3 -m bench.kernels.fp8_check --out fp8.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.kernels import fp8_linear

# (name, rows M = tokens or patches of a 16-sample micro-batch, in K, out N)
SHAPES = (
    ("siglip qkvo", 16 * 4096, 1152, 1152),
    ("siglip fc1", 16 * 4096, 1152, 4304),
    ("siglip fc2", 16 * 4096, 4304, 1152),
    ("lm q", 16 * 416, 2560, 2048),
    ("lm gate/up", 16 * 416, 2560, 10240),
    ("lm down", 16 * 416, 10240, 2560),
)


def main() -> None:
    import torch
    from triton.testing import do_bench

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    dev = torch.device("cuda")
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "capability_problem": fp8_linear.capability_problem(dev), "self_test": fp8_linear.self_test(dev),
           "shapes": []}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, m, k, n in SHAPES:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
        w = (torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g) / k**0.5)
        gy = torch.randn(m, n, device=dev, dtype=torch.bfloat16, generator=g)
        fw = fp8_linear.Fp8Weight(w)
        ref_y, ref_gx = x.float() @ w.float().t(), gy.float() @ w.float()
        row = {"name": name, "m": m, "k": k, "n": n,
               "err_y_fp8": float((fw.forward(x).float() - ref_y).norm() / ref_y.norm()),
               "err_y_bf16": float(((x @ w.t()).float() - ref_y).norm() / ref_y.norm()),
               "err_gx_fp8": float((fw.input_grad(gy).float() - ref_gx).norm() / ref_gx.norm()),
               "ms_fwd_bf16": do_bench(lambda x=x, w=w: x @ w.t(), return_mode="median"),
               "ms_fwd_fp8": do_bench(lambda x=x, fw=fw: fw.forward(x), return_mode="median"),
               "ms_gx_bf16": do_bench(lambda gy=gy, w=w: gy @ w, return_mode="median"),
               "ms_gx_fp8": do_bench(lambda gy=gy, fw=fw: fw.input_grad(gy), return_mode="median"),
               "ms_quantize_x": do_bench(lambda x=x: fp8_linear.quantize_rows(x), return_mode="median"),
               "ms_quantize_x_eager": do_bench(lambda x=x: fp8_linear._quantize_rows(x), return_mode="median")}
        out["shapes"].append(row)
        print(json.dumps(row), flush=True)
        del x, w, gy, fw
        torch.cuda.empty_cache()
    a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
