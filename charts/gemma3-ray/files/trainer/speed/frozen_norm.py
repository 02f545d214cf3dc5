"""LayerNorm with a frozen weight and bias: the backward computes the input gradient only (issue #33).

With LoRA the vision tower's LayerNorms (SigLIP's `layer_norm1`, `layer_norm2`, `post_layernorm`) are frozen,
yet Liger's LayerNorm backward still reduces the weight and bias gradients over all rows (partial sums per
program, then a sum): 0.51 ms a call at [65,536, 1,152] bf16, 110 ms of an optimizer step (profile of
2026-12-02), about 5x its memory floor (x and dy read, dx written: 0.45 GB, ~0.1 ms at 4.3 TB/s). Here:

- forward: y = (x - mean) * rstd * w + b, one row per program in fp32, mean and rstd kept (8 bytes a row);
- backward: dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy * xhat)), one pass over x and dy, no dW/dB.

The same function as `torch.nn.functional.layer_norm` (fp32 statistics, output in x's dtype). `apply_to`
swaps the forward of every LayerNorm module under a model whose weight and bias do not require grad, and only
where the kernel path is chosen for the device (`capability.choose("layer_norm", ...)`); others keep theirs.
torch and triton are imported inside functions: the Ray driver never imports them.
"""

from __future__ import annotations

from typing import Any

MARK = "_gemma3_ray_frozen_layer_norm"


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def ln_fwd(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N, stride, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        x = tl.load(x_ptr + row * stride + cols, mask=ok, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        xc = tl.where(ok, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * N + cols, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=ok)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def ln_bwd_dx(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, N, stride_x, stride_dy,
                  BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(ok, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + row * N + cols, dx.to(dx_ptr.dtype.element_ty), mask=ok)

    return ln_fwd, ln_bwd_dx


_KERNELS: Any = None


def kernels():
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _kernels()
    return _KERNELS


def _block(n: int) -> tuple[int, int]:
    import triton

    block = triton.next_power_of_2(n)
    return block, 4 if block <= 1024 else 8 if block <= 4096 else 16


def _use_triton(x) -> bool:
    import os

    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def forward_stats(x2, weight, bias, eps: float):
    """(y, mean, rstd) of the rows of x2 [M, N]: Triton on a GPU (or Triton's interpreter), PyTorch elsewhere."""
    import torch

    m, n = x2.shape
    if _use_triton(x2):
        ln_fwd, _ = kernels()
        y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
        mean = torch.empty(m, dtype=torch.float32, device=x2.device)
        rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
        block, warps = _block(n)
        ln_fwd[(m,)](x2, weight, bias, y, mean, rstd, n, x2.stride(0), eps, BLOCK=block, num_warps=warps)
        return y, mean, rstd
    acc = torch.promote_types(x2.dtype, torch.float32)  # float64 stays float64 (tests)
    xf = x2.to(acc)
    mean = xf.mean(dim=1)
    var = (xf - mean[:, None]).pow(2).mean(dim=1)
    rstd = torch.rsqrt(var + eps)
    y = ((xf - mean[:, None]) * rstd[:, None] * weight.to(acc) + bias.to(acc)).to(x2.dtype)
    return y, mean, rstd


def backward_dx(x2, dy2, weight, mean, rstd):
    """dx of the rows (weight and bias frozen): one pass over x and dy."""
    import torch

    m, n = x2.shape
    if _use_triton(x2):
        _, ln_bwd_dx = kernels()
        dx = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
        block, warps = _block(n)
        ln_bwd_dx[(m,)](x2, dy2, weight, mean, rstd, dx, n, x2.stride(0), dy2.stride(0), BLOCK=block,
                        num_warps=warps)
        return dx
    acc = torch.promote_types(x2.dtype, torch.float32)
    xhat = (x2.to(acc) - mean[:, None]) * rstd[:, None]
    wdy = weight.to(acc) * dy2.to(acc)
    c1 = (xhat * wdy).mean(dim=1, keepdim=True)
    c2 = wdy.mean(dim=1, keepdim=True)
    return ((wdy - (xhat * c1 + c2)) * rstd[:, None]).to(x2.dtype)


def _function():
    import torch

    class FrozenLayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, eps):
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            y, mean, rstd = forward_stats(x2, weight, bias, eps)
            ctx.save_for_backward(x2, weight, mean, rstd)
            return y.reshape(shape)

        @staticmethod
        def backward(ctx, dy):
            if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
                raise RuntimeError("frozen_layer_norm: the weight or bias requires grad; use torch's layer_norm")
            x2, weight, mean, rstd = ctx.saved_tensors
            dy2 = dy.reshape(-1, x2.shape[-1])
            if dy2.stride(-1) != 1:
                dy2 = dy2.contiguous()
            return backward_dx(x2, dy2, weight, mean, rstd).reshape(dy.shape), None, None, None

    return FrozenLayerNorm


_FUNCTION: Any = None


def frozen_layer_norm(x, weight, bias, eps: float):
    """layer_norm(x, weight, bias) whose backward gives x's gradient only (weight and bias must be frozen)."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _function()
    return _FUNCTION.apply(x, weight, bias, eps)


def eligible(module) -> bool:
    """A LayerNorm (torch's or Liger's) over the last dim with a frozen weight and bias."""
    w, b = getattr(module, "weight", None), getattr(module, "bias", None)
    if w is None or b is None or w.dim() != 1 or w.requires_grad or b.requires_grad:
        return False
    name = type(module).__name__
    return name in ("LayerNorm", "LigerLayerNorm")


def apply_to(root) -> int:
    """Route every eligible LayerNorm under `root` through `frozen_layer_norm`; returns how many."""
    count = 0
    for module in root.modules():
        if getattr(module, MARK, False) or not eligible(module):
            continue
        eps = float(getattr(module, "eps", getattr(module, "variance_epsilon", 1e-5)))

        def forward(x, _m=module, _eps=eps):
            return frozen_layer_norm(x, _m.weight, _m.bias, _eps)

        module.forward = forward
        setattr(module, MARK, True)
        count += 1
    return count
