"""SigLIP attention through FlashAttention 4 (`flash-attn-4`, CuTe DSL; sm90 and sm100), with cuDNN as fallback.

SigLIP's attention (16 heads of 72 over 4,096 patches, no mask) is ~38% of a default step. cuDNN runs it at
~400 TF/s forward and ~324 forward+backward (2026-12-02 profile), and padding the head dim changes nothing:
its kernels tile the head dim at 128. FA4 has head-dim-96 tiles for sm90 (and 64-128 for sm100): the same
function at fewer wasted FLOPs, if it is faster on the device (bench/attention_check.py measures it).

`route_vision_attention(vision_tower)` routes the tower's attention modules through the SDPA router
(`sdpa_router`); routed modules with no mask, no dropout and bf16/fp16 inputs run `attention_bhsd`; everything else
(other models, masks, fp32) keeps Transformers' SDPA path. `self_test()` runs FA4 once on the GPU against SDPA
before anything is routed, so a failing build or JIT leaves cuDNN in place (the tested fallback of
`capability.choose`). torch and FA4 are imported inside functions.
"""

from __future__ import annotations

from typing import Any

ROUTE = "fa4"  # its route in sdpa_router


# Head dims FA4 runs SigLIP's 72 at, first that passes the self-test. On sm90 (flash-attn-4 4.0.0b36) its backward
# gave a wrong dq (1.31 relative error; out, dk, dv right) at 72 and at 80, a right one at 96, where forward +
# backward took 11.71 ms against cuDNN's 13.38 (bench/results/2026-12-02-1834-kernels.jsonl).
PAD_CHOICES = (96,)
PAD_TO: int | None = 96


def padded_dim(d: int, pad_to: int | None) -> int:
    return max(d, pad_to) if pad_to else d


def attention_bhsd(q, k, v, scale: float | None = None, pad_to: int | None = -1):
    """softmax(q k^T * scale) v for q, k, v [B, H, S, D] (no mask): FA4 in its [B, S, H, D] layout, the head dim
    zero-padded to `pad_to` (the same scores and output: zero columns add nothing to q k^T, and the output's
    extra columns are dropped), the output back as [B, H, S, D]."""
    import torch.nn.functional as F
    from flash_attn.cute import flash_attn_func

    d = q.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    width = padded_dim(d, PAD_TO if pad_to == -1 else pad_to)

    def bshd(t):
        t = t.transpose(1, 2)
        return F.pad(t, (0, width - d)) if width > d else t

    out = flash_attn_func(bshd(q), bshd(k), bshd(v), softmax_scale=scale)
    if isinstance(out, tuple):
        out = out[0]
    return out[..., :d].transpose(1, 2)


def cache_with_triton() -> str | None:
    """FA4 keeps its compiled kernels beside Triton's (`TRITON_CACHE_DIR`, which `compile_cache` restores from and
    stores to the release's storage), so a later pod skips their JIT; set before FA4 is first imported."""
    import os
    import sys

    triton_dir = os.environ.get("TRITON_CACHE_DIR")
    if not triton_dir or "flash_attn.cute" in sys.modules:
        return None
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", os.path.join(triton_dir, "fa4"))
    return os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]


def self_test(head_dim: int = 72, dtype_name: str = "bfloat16") -> dict[str, Any]:
    """FA4 forward and backward at a small SigLIP-like shape against SDPA (math backend, float32), at each head
    dim of PAD_CHOICES until one agrees; that one is used from then on. Returns its errors, or raises with every
    choice's errors (nothing is routed then)."""
    global PAD_TO
    failures = {}
    for pad in PAD_CHOICES:
        try:
            errors = _self_test(head_dim, dtype_name, pad)
        except AssertionError as e:
            failures[pad] = str(e)
            continue
        PAD_TO = pad
        return {"pad_to": pad, **errors}
    raise AssertionError(f"FA4 disagrees with SDPA at every head dim tried: {failures}")


def _self_test(head_dim: int, dtype_name: str, pad_to: int | None) -> dict[str, float]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 512, head_dim, device="cuda", generator=g) for _ in range(3))
    dout = torch.randn(2, 4, 512, head_dim, device="cuda", generator=g)
    scale = head_dim ** -0.5
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        out_ref = F.scaled_dot_product_attention(*ref, scale=scale)
    grads_ref = torch.autograd.grad(out_ref, ref, dout)
    low = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = attention_bhsd(*low, scale, pad_to)
    grads = torch.autograd.grad(out, low, dout.to(dtype))
    errors: dict[str, float] = {"out": float((out.float() - out_ref).norm() / out_ref.norm())}
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        errors[name] = float((a.float() - b).norm() / b.norm())
    if not all(e < 2e-2 for e in errors.values()):  # bf16 lands near 4e-3
        raise AssertionError(f"FA4 disagrees with SDPA: relative errors {errors}")
    return errors


def route_vision_attention(vision_tower) -> int:
    """Send the attention of `vision_tower`'s layers through FA4 (route "fa4" of the SDPA router); returns how many
    modules were marked."""
    from trainer.speed import sdpa_router

    layers = [m for m in vision_tower.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "q_proj")]
    return sdpa_router.route(layers, ROUTE, routed)


def routed(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
           **kwargs: Any):
    """A routed module's call through FA4 (Transformers' output layout), or None (no mask, no dropout, not causal,
    bf16/fp16 only: the router runs Transformers' SDPA path then)."""
    import torch

    if (attention_mask is not None or dropout or is_causal or query.dtype not in (torch.bfloat16, torch.float16)
            or kwargs.get("position_bias") is not None):
        return None
    out = attention_bhsd(query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None
