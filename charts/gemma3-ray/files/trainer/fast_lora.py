"""Fused LoRA linear layers: base matmul, dropout and the adapter in one autograd Function.

PEFT's LoRA layer computes `base(x) + lora_B(lora_A(dropout(x))) * scaling`: dropout materialises a
copy of every LoRA input (kept alive for backward: ~25 GiB on Gemma 3 4B at batch 12), and the
scaling and the add are separate passes over the output. Here, per layer and step:

- forward: `h = dropout(x) @ A^T` in one pass over x (the mask is generated while x is loaded, never
  stored), `y = (s*h) @ B^T`, then `y += x @ W^T` in the GEMM's epilogue (cuBLAS beta=1);
- backward: `gx = gy @ W`, then one kernel adds `keep * ((s * gy @ B) @ A) / (1-p)` to gx in place
  and accumulates `gA = (s * gy @ B)^T @ (keep * x) / (1-p)`, regenerating the mask from the seed;
  `gB = gy^T @ (s*h)`.

Same training semantics as PEFT's layer: inverted dropout with probability p on the adapter's input
(independent per layer and step, drawn from torch's RNG through a per-call seed), the frozen base
weight, the same gradients. The mask's random numbers differ from torch's dropout (another generator),
not its distribution. `keep_mask` is the mask in PyTorch, bit for bit the kernels' (tests; the CPU
reference path). torch/triton are imported inside functions: the Ray driver never imports them.
"""

from __future__ import annotations

import math
from typing import Any

MASK_BLOCK = 128  # columns per mask block (fast_lora_kernels.py documents the layout)
SUB = 16
BITS = 16  # random bits per element: p is rounded to a multiple of 2**-16
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10
U32 = 0xFFFFFFFF
SUPPORTED_RANKS = (16, 32, 64, 128)


def threshold(p: float) -> int:
    """Elements whose 16 random bits are below this are dropped: P(drop) = threshold / 2**16."""
    return int(round(p * (1 << BITS)))


# ------------------------------------------------------------------------------------------------
# The mask in PyTorch (reference, CPU path, tests)
# ------------------------------------------------------------------------------------------------
def _mulhilo(a: int, b):
    """(hi, lo) 32-bit halves of the 64-bit product of constant a and int64 tensor b (< 2**32)."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    t1 = b * a_lo  # < 2**48
    t2 = b * a_hi
    hi = (t2 + (t1 >> 16)) >> 16
    lo = (t1 + ((t2 & 0xFFFF) << 16)) & U32
    return hi & U32, lo


def philox4x32(counter, seed: int, rounds: int = PHILOX_ROUNDS):
    """Philox-4x32 as Triton's `randint4x(seed, counter)`: counter (int64 tensor) -> 4 int64 tensors."""
    import torch

    c0, c1 = counter & U32, (counter >> 32) & U32
    c2 = torch.zeros_like(counter)
    c3 = torch.zeros_like(counter)
    k0, k1 = seed & U32, (seed >> 32) & U32
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + PHILOX_W0) & U32, (k1 + PHILOX_W1) & U32
    return c0, c1, c2, c3


def keep_mask(seed: int, m: int, k: int, p: float, device=None):
    """Bool [m, k]: which elements of x[m, k] dropout keeps (the kernels' mask, bit for bit)."""
    import torch

    kb = -(-k // MASK_BLOCK)
    rows = torch.arange(m, dtype=torch.int64, device=device)[:, None, None]
    blocks = torch.arange(kb, dtype=torch.int64, device=device)[None, :, None]
    c = torch.arange(SUB, dtype=torch.int64, device=device)[None, None, :]
    r = philox4x32((rows * kb + blocks) * SUB + c, seed)  # 4 x [m, kb, 16]
    subs = []
    for j in range(MASK_BLOCK // SUB):
        word = r[j // 2]
        subs.append((word >> 16) if j % 2 else (word & 0xFFFF))
    bits = torch.stack(subs, dim=2).reshape(m, kb * MASK_BLOCK)[:, :k]  # [m, kb, 8, 16] -> columns
    return bits >= threshold(p)


# ------------------------------------------------------------------------------------------------
# The autograd Function
# ------------------------------------------------------------------------------------------------
def _use_triton(x) -> bool:
    return x.is_cuda


def _fwd_h(x2, a, seed: int, p: float):
    """(x2 * keep) @ a^T in fp32 (unscaled)."""
    import torch

    m, k = x2.shape
    acc = torch.promote_types(x2.dtype, torch.float32)
    if p == 0.0:
        return (x2 @ a.t()).to(acc)
    if not _use_triton(x2):
        keep = keep_mask(seed, m, k, p, x2.device)
        return (x2 * keep).to(acc) @ a.t().to(acc)
    import triton
    from fast_lora_kernels import dropout_lora_a_fwd

    kb = -(-k // MASK_BLOCK)
    bm = 64
    grid_m = triton.cdiv(m, bm)
    split = max(1, min(kb, -(-4 * 132 // grid_m)))  # enough programs to fill the GPU
    per = -(-kb // split)
    n_k = -(-kb // per)
    h = torch.empty((n_k, m, a.shape[0]), device=x2.device, dtype=torch.float32)
    dropout_lora_a_fwd[(grid_m, n_k)](
        x2, a, h, m, k, kb, x2.stride(0), h.stride(1), seed, threshold(p), per, R=a.shape[0], BM=bm, DROPOUT=True
    )
    return h.sum(dim=0) if n_k > 1 else h[0]


def _bwd_lora(x2, gs, a, gx, seed: int, p: float):
    """gx += keep * (gs @ a) / (1-p) in place (gx may be None); returns gA = gs^T @ (keep * x2) / (1-p)."""
    import torch

    m, k = x2.shape
    if p == 0.0:
        if gx is not None:
            gx.addmm_(gs, a)
        return gs.t() @ x2
    inv_keep = 1.0 / (1.0 - threshold(p) / (1 << BITS))
    if not _use_triton(x2):
        keep = keep_mask(seed, m, k, p, x2.device)
        if gx is not None:
            gx.add_((gs @ a) * keep * inv_keep)
        return (gs.t() @ (x2 * keep)) * inv_keep
    import triton
    from fast_lora_kernels import dropout_lora_bwd

    kb = -(-k // MASK_BLOCK)
    bm = 64
    chunks = max(1, min(triton.cdiv(m, bm), -(-4 * 132 // kb)))
    rows_per = triton.cdiv(triton.cdiv(m, chunks), bm) * bm
    n_m = triton.cdiv(m, rows_per)
    ga = torch.empty((n_m, a.shape[0], k), device=x2.device, dtype=torch.float32)
    gx_arg = gx if gx is not None else x2  # unused when HAS_GX is false
    dropout_lora_bwd[(n_m, kb)](
        x2, gs, a, gx_arg, ga, m, k, kb, x2.stride(0), gx_arg.stride(0), gs.stride(0), seed, threshold(p), inv_keep,
        rows_per,
        R=a.shape[0], BM=bm, HAS_GX=gx is not None,
    )
    return ga.sum(dim=0)


def _function():
    import torch

    class FusedLoraLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, lora_a, lora_b, scaling: float, p: float, seed: int, base_matmuls=None):
            shape = x.shape
            k = shape[-1]
            x2 = x.reshape(-1, k)
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            inv_keep = 1.0 / (1.0 - threshold(p) / (1 << BITS)) if p > 0 else 1.0
            hs = (_fwd_h(x2, lora_a, seed, p) * (scaling * inv_keep)).to(x.dtype)
            y = torch.addmm(bias, hs, lora_b.t()) if bias is not None else hs @ lora_b.t()
            if base_matmuls is None:
                y.addmm_(x2, weight.t())
            else:
                y.add_(base_matmuls.forward(x2))
            ctx.save_for_backward(x2, weight, lora_a, lora_b, hs)
            ctx.scaling, ctx.p, ctx.seed, ctx.shape, ctx.base_matmuls = scaling, p, seed, shape, base_matmuls
            return y.view(*shape[:-1], weight.shape[0])

        @staticmethod
        def backward(ctx, gy):
            x2, weight, lora_a, lora_b, hs = ctx.saved_tensors
            gy2 = gy.reshape(-1, weight.shape[0])
            gs = (gy2 @ lora_b) * ctx.scaling
            gb = gy2.t() @ hs
            gx = None
            if ctx.needs_input_grad[0]:
                gx = gy2 @ weight if ctx.base_matmuls is None else ctx.base_matmuls.input_grad(gy2.contiguous())
            ga = _bwd_lora(x2, gs, lora_a, gx, ctx.seed, ctx.p)
            gx_out = gx.view(ctx.shape) if gx is not None else None
            return gx_out, None, None, ga.to(lora_a.dtype), gb.to(lora_b.dtype), None, None, None, None

    return FusedLoraLinear


_FUNCTION: Any = None


def fused_lora_linear(x, weight, bias, lora_a, lora_b, scaling: float, p: float, training: bool,
                      base_matmuls=None):
    """y = x @ W^T + b + scaling * dropout_p(x) @ A^T @ B^T, as PEFT's LoRA layer (W and b frozen).

    `base_matmuls` (the base layer's attribute of that name), if given, computes the two products with the
    frozen W instead: `.forward(x2)` = x2 @ W^T and `.input_grad(gy2)` = gy2 @ W (the trainer sets none;
    bench/fp8_linear.py's unshipped experiment does)."""
    import torch

    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _function()
    p = p if training else 0.0
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if p > 0 else 0  # CPU generator: no GPU sync
    return _FUNCTION.apply(x, weight, bias, lora_a, lora_b, float(scaling), float(p), seed, base_matmuls)


# ------------------------------------------------------------------------------------------------
# PEFT integration
# ------------------------------------------------------------------------------------------------
def _fusable(layer) -> str | None:
    """Why this PEFT LoRA layer cannot take the fused path (None: it can)."""
    import torch

    base = getattr(layer, "base_layer", None)
    if type(base) is not torch.nn.Linear:
        return "base layer is not a plain Linear (quantized?)"
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return "base weight is trainable"
    if len(layer.lora_A) != 1 or getattr(layer, "lora_variant", {}):
        return "several adapters or a LoRA variant (DoRA)"
    name = next(iter(layer.lora_A))
    a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
    if a.shape[0] not in SUPPORTED_RANKS:
        return f"rank {a.shape[0]} not in {SUPPORTED_RANKS}"
    if not (a.dtype == b.dtype == base.weight.dtype):
        return "adapter dtype differs from the base weight's"
    if getattr(layer, "lora_bias", {}).get(name):
        return "lora_bias"
    return None


def _fused_forward(layer, original):
    import torch

    fused = torch.compiler.disable(fused_lora_linear)  # compiled regions (compile_vision) stop around it

    def forward(x, *args: Any, **kwargs: Any):
        name = next(iter(layer.lora_A))
        if (layer.disable_adapters or layer.merged or args or kwargs or name not in layer.active_adapters
                or x.dtype != layer.base_layer.weight.dtype):
            return original(x, *args, **kwargs)
        drop = layer.lora_dropout[name]
        p = drop.p if isinstance(drop, torch.nn.Dropout) else 0.0
        base = layer.base_layer
        return fused(x, base.weight, base.bias, layer.lora_A[name].weight, layer.lora_B[name].weight,
                                 layer.scaling[name], p, layer.training, getattr(base, "base_matmuls", None))

    return forward


def self_test(device, shapes: tuple[tuple[int, int], ...] = ((80, 1152), (48, 4304))) -> str | None:
    """Compile and check the kernels on `device` against the reference (None: they agree)."""
    import torch

    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        for m, k in shapes:
            x = torch.randn(m, k, generator=g).to(device, torch.bfloat16).requires_grad_()
            w = (torch.randn(32, k, generator=g) / k**0.5).to(device, torch.bfloat16)
            a = (torch.randn(16, k, generator=g) / k**0.5).to(device, torch.bfloat16).requires_grad_()
            b = torch.randn(32, 16, generator=g).to(device, torch.bfloat16).requires_grad_()
            seed, p = 1234, 0.05
            fn = _function() if _FUNCTION is None else _FUNCTION
            y = fn.apply(x, w, None, a, b, 1.0, p, seed)
            gy = torch.randn(m, 32, generator=g).to(device, torch.bfloat16)
            got = torch.autograd.grad(y, (x, a, b), gy)
            keep = keep_mask(seed, m, k, p, device)
            inv = 1.0 / (1.0 - threshold(p) / (1 << BITS))
            xf, af, bf = (t.detach().float().requires_grad_() for t in (x, a, b))
            ref = xf @ w.float().t() + ((xf * keep * inv) @ af.t()) @ bf.t()
            want = torch.autograd.grad(ref, (xf, af, bf), gy.float())
            for name, u, v in zip(("y", "gx", "gA", "gB"), (y, *got), (ref, *want), strict=True):
                err = float((u.float() - v).norm() / v.norm())
                if not err < 2e-2:
                    return f"{name} differs from the reference at [{m}, {k}]: relative error {err:.3g}"
    except Exception as e:  # a kernel that does not compile on this GPU/Triton: stay on PEFT's layer
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def apply(model) -> dict[str, Any]:
    """Route every eligible PEFT LoRA Linear of `model` through the fused Function; returns counts.

    On a GPU the kernels are compiled and checked first; if that fails, nothing is fused and the
    counts say why (training then runs PEFT's own layer)."""
    from peft.tuners.lora import Linear as LoraLinear

    device = next(model.parameters()).device
    if device.type == "cuda":
        problem = self_test(device)
        if problem:
            return {"fused": 0, "skipped": {f"kernel self-test failed: {problem}": -1}}
    fused, skipped = 0, {}
    for module in model.modules():
        if not isinstance(module, LoraLinear):
            continue
        why = _fusable(module)
        if why is None:
            module.forward = _fused_forward(module, module.forward)
            fused += 1
        else:
            skipped[why] = skipped.get(why, 0) + 1
    return {"fused": fused, "skipped": skipped}


def dropout_fraction_error(p: float) -> float:
    """|P(drop) - p| of the 16-bit threshold (5e-6 at p = 0.05)."""
    return math.fabs(threshold(p) / (1 << BITS) - p)
