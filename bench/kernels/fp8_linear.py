"""FP8 (e4m3) copies of LoRA layers' frozen base weights through torch._scaled_mm: an experiment, not shipped.

Not a trainer recipe or flag. Round 3 (issue #20) built it and measured it on one H200 (bench/RESULTS.md):
the `fp8` row ran at 10.65 samples/s, slower than the bf16 default's 12.06, and its loss comparison
against bf16 covers 11 steps of a reduced model, not the >= 200 steps issue #20 asks before a change of
numerics may ship. So it lives here, and `bench/bench.py` applies it itself (`apply_to`) to the model the
trainer's own path built, for its `fp8` row only. What the next round must measure before it ships: a
row at least as fast as the same call's default (the per-layer check shows the separate activation
quantization eating the e4m3 matmul's gain: fuse it into the op that produces x and gy, or scale per
tensor), and the FP8 vs bf16 loss over >= 200 steps of the same batches, with the curves and the max
relative gap.

Every base weight W [N, K] under a fused LoRA layer (trainer/speed/fast_lora.py) is quantized once, with one
scale per channel, into two e4m3 copies laid out for the two matmuls that use it:

- forward `y = x @ W^T`: W itself, one scale per output channel (row of W);
- input gradient `gx = gy @ W`: W^T made contiguous, one scale per input channel (column of W);

the activations (x, then gy) are quantized per row (per token) on the fly; `torch._scaled_mm` multiplies
the e4m3 operands with both sets of scales and returns bf16. The adapters, their gradients and every
other tensor stay bf16; the base weight needs no gradient (it is frozen). The bf16 weight stays in place
(evaluation without the fused layer, merging, saving); the two copies add one byte per weight element each.
On CPU (tests) the same quantized math runs as a dequantized matmul; `torch._scaled_mm` needs the GPU.
"""
from __future__ import annotations

from typing import Any

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell
ALIGN = 16  # torch._scaled_mm wants every dimension a multiple of 16


def capability_problem(device) -> str | None:
    """Why FP8 matmuls cannot run on `device`, as one sentence with the fix (None: they can)."""
    import torch

    fix = "run the fp8 row on one of those, or the default row (bf16)"
    if device.type != "cuda":
        return f"the fp8 row needs a GPU with FP8 (compute capability 8.9 or newer: L4, H100, H200, B200); {fix}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (f"the fp8 row needs FP8 matmuls (compute capability 8.9 or newer: L4, H100, H200, B200), and "
                f"this {name} has {major}.{minor}; {fix}")
    if not hasattr(torch, "_scaled_mm"):
        return f"the fp8 row needs torch._scaled_mm (torch {torch.__version__} lacks it); run the default row"
    return None


def _quantize_rows(t) -> tuple[Any, Any]:
    import torch

    amax = t.abs().amax(dim=1, keepdim=True).float()
    scale = amax.clamp(min=1e-12) / E4M3_MAX
    q = (t.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


_COMPILED: dict[str, Any] = {}


def quantize_rows(t) -> tuple[Any, Any]:
    """t [R, C] -> (q [R, C] float8_e4m3fn, scale [R, 1] fp32) with t ≈ q * scale (scale = row amax / 448).

    On the GPU the same function compiled (one reduction and one pointwise pass instead of five eager
    ones); if compiling fails, the eager one."""
    t = t.detach()
    if not t.is_cuda:
        return _quantize_rows(t)
    fn = _COMPILED.get("fn")
    if fn is None:
        import torch

        fn = _COMPILED["fn"] = torch.compile(_quantize_rows, dynamic=True)
    try:
        return fn(t)
    except Exception as e:  # noqa: BLE001 - a compiler problem costs speed, not the run
        if fn is _quantize_rows:
            raise
        print(f"[bench] FP8: compiling the activation quantization failed ({type(e).__name__}); eager", flush=True)
        _COMPILED["fn"] = _quantize_rows
        return _quantize_rows(t)


def dequantize(q, scale):
    return q.float() * scale


class Fp8Weight:
    """The two e4m3 copies of one frozen weight W [N, K] and their per-channel scales."""

    def __init__(self, weight):
        self.shape = tuple(weight.shape)
        self.w, w_scale = quantize_rows(weight)  # [N, K], one scale per output channel
        self.wt, wt_scale = quantize_rows(weight.t().contiguous())  # [K, N], one scale per input channel
        self.w_scale = w_scale.reshape(1, -1).contiguous()  # [1, N]: _scaled_mm's scale_b
        self.wt_scale = wt_scale.reshape(1, -1).contiguous()  # [1, K]
        self.dtype = weight.dtype

    def forward(self, x2):
        """x2 [M, K] @ W^T -> [M, N] in x2's dtype."""
        return _mm(x2, self.w, self.w_scale)

    def input_grad(self, gy2):
        """gy2 [M, N] @ W -> [M, K] in gy2's dtype."""
        return _mm(gy2, self.wt, self.wt_scale)


def _mm(a, b_q, b_scale):
    """a [M, C] (bf16/fp32) @ b^T, with a quantized per row here and b [R, C] e4m3 scaled per row."""
    import torch

    m = a.shape[0]
    pad = (-m) % ALIGN if a.is_cuda else 0
    if pad:
        a = torch.nn.functional.pad(a, (0, 0, 0, pad))
    a_q, a_scale = quantize_rows(a)
    if a.is_cuda:
        out = torch._scaled_mm(a_q, b_q.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=a.dtype)
    else:  # the same quantized operands, dequantized: the reference of the GPU path
        out = (dequantize(a_q, a_scale) @ dequantize(b_q, b_scale.reshape(-1, 1)).t()).to(a.dtype)
    return out[:m] if pad else out


def apply(model) -> dict[str, Any]:
    """Give every PEFT LoRA Linear of `model` whose base is a plain frozen Linear its FP8 copies (the fused
    layer of trainer/speed/fast_lora.py reads them as `base_matmuls`); returns how many and their bytes."""
    import torch
    from peft.tuners.lora import Linear as LoraLinear

    count, nbytes, skipped = 0, 0, 0
    for module in model.modules():
        if not isinstance(module, LoraLinear):
            continue
        base = module.base_layer
        dims_ok = all(d % ALIGN == 0 for d in base.weight.shape) if type(base) is torch.nn.Linear else False
        if not dims_ok or base.weight.requires_grad:
            skipped += 1
            continue
        base.base_matmuls = Fp8Weight(base.weight)  # fast_lora's fused Function runs W's matmuls through it
        count += 1
        nbytes += 2 * base.weight.numel()
    return {"fp8_layers": count, "fp8_gib": round(nbytes / 2**30, 2), "skipped": skipped}


def self_test(device) -> str | None:
    """Check `torch._scaled_mm` on `device` against the dequantized reference (None: they agree)."""
    import torch

    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(72, 160, generator=g).to(device, torch.bfloat16)
        w = Fp8Weight((torch.randn(48, 160, generator=g) / 160**0.5).to(device, torch.bfloat16))
        for got, a, b_q, b_s in ((w.forward(x), x, w.w, w.w_scale),
                                 (w.input_grad(x[:, :48].contiguous()), x[:, :48], w.wt, w.wt_scale)):
            a_q, a_s = quantize_rows(a)
            want = dequantize(a_q, a_s) @ dequantize(b_q, b_s.reshape(-1, 1)).t()
            err = float((got.float() - want).norm() / want.norm())
            if not err < 1e-2:
                return f"torch._scaled_mm differs from the dequantized product: relative error {err:.3g}"
    except Exception as e:  # noqa: BLE001 - reported, and apply_to refuses the row with it
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def apply_to(model, levers: dict[str, Any]) -> dict[str, Any]:
    """The bench's `fp8` row: check the GPU and `torch._scaled_mm`, and that the trainer's own path fused the
    LoRA layers (`levers`: its speed_levers), then give `model`'s LoRA layers their FP8 copies; refuses in
    one sentence (RuntimeError)."""
    device = next(model.parameters()).device
    fused = levers.get("fused_lora", {})
    problem = capability_problem(device) or (f"the fp8 row: {why}" if (why := self_test(device)) else None)
    if problem is None and not fused.get("fused"):
        problem = (f"the fp8 row runs through the fused LoRA layer, which did not run here "
                   f"({fused.get('skipped', 'fused_lora is off')}); drop --fused_lora=false")
    if problem:
        raise RuntimeError(problem)
    counts = apply(model)
    print(f"[bench] FP8 base weights: {counts}", flush=True)
    return counts
