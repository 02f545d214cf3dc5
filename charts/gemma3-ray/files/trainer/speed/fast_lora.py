"""Fused LoRA linear layers: base matmul, dropout and the adapter in one autograd Function per group.

PEFT's LoRA layer computes `base(x) + lora_B(lora_A(dropout(x))) * scaling`: dropout materialises a
copy of every LoRA input (kept alive for backward: ~25 GiB on Gemma 3 4B at batch 12), and the
scaling and the add are separate passes over the output. Here a group is 1 to 3 LoRA layers that read
the same x (q/k/v of an attention block, gate/up of an MLP: `fast_lora_peft.py` finds them and its
`apply(model)` routes them here); per group:

- forward: one Triton pass over x draws every member's dropout mask (kept as 1 bit per element for the
  backward) and computes `h_i = s * dropout_i(x) @ A_i^T`; then `y_i = h_i @ B_i^T`, and `y_i += x @ W_i^T`
  in the GEMM's epilogue (cuBLAS beta=1);
- backward: `gx = sum_i gy_i @ W_i` (cuBLAS, accumulating), then one Triton pass over x and gx adds
  `sum_i keep_i * (gy_i @ B_i @ A_i) * s / (1-p)` to gx in place and computes every
  `gA_i = s * (gy_i @ B_i)^T @ (keep_i * x) / (1-p)`; `gB_i = gy_i^T @ h_i`.

Same training semantics as PEFT's layers: inverted dropout with probability p on each adapter's input,
independent per layer and step (member i of a group uses key seed + i; the seed comes from torch's RNG),
the frozen base weights, the same gradients. The mask's random numbers differ from torch's dropout
(another generator), not its distribution. `keep_bits`/`keep_mask` are the masks in PyTorch, bit for
bit the kernels' (tests; the CPU path). torch/triton are imported inside functions: the Ray driver never
imports them.
"""

from __future__ import annotations

import math
from typing import Any

BITS = 16  # random bits per element: p is rounded to a multiple of 2**-16
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10
U32 = 0xFFFFFFFF
SUPPORTED_RANKS = (16, 32, 64, 128)
MAX_GROUP = 3
SEED_MAX = 2**31 - 1 - MAX_GROUP


def threshold(p: float) -> int:
    """Elements whose 16 random bits are below this are dropped: P(drop) = threshold / 2**16."""
    return int(round(p * (1 << BITS)))


def inv_keep(p: float) -> float:
    return 1.0 / (1.0 - threshold(p) / (1 << BITS)) if p > 0 else 1.0


# ------------------------------------------------------------------------------------------------
# The masks in PyTorch (reference, CPU path, tests)
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


def keep_bits(seed: int, m: int, k: int, p: float, device=None):
    """uint8 [m, ceil(k/8)]: bit j of byte (r, c) = dropout keeps element (r, 8c + j) (the kernels' bits)."""
    import torch

    kb8 = -(-k // 8)
    counter = torch.arange(m * kb8, dtype=torch.int64, device=device).reshape(m, kb8)
    words = philox4x32(counter, seed)
    out = torch.zeros((m, kb8), dtype=torch.int64, device=device)
    for j in range(8):
        half = (words[j // 2] >> (16 * (j % 2))) & 0xFFFF
        out |= (half >= threshold(p)).to(torch.int64) << j
    return out.to(torch.uint8)


def unpack_bits(bits, k: int):
    """uint8 [m, ceil(k/8)] -> bool [m, k]."""
    import torch

    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits[..., None] >> shifts) & 1).bool().flatten(-2)[..., :k]


def keep_mask(seed: int, m: int, k: int, p: float, device=None):
    """Bool [m, k]: which elements of x[m, k] dropout keeps (the kernels' mask, bit for bit)."""
    return unpack_bits(keep_bits(seed, m, k, p, device), k)


# ------------------------------------------------------------------------------------------------
# The adapter's A side: forward h, backward gx and gA (Triton on a GPU, PyTorch elsewhere)
# ------------------------------------------------------------------------------------------------
def _fwd_config(m: int, n: int) -> tuple[int, int, int]:
    """(BM, BK, warps) of lora_fwd: the fastest of a sweep at Gemma 3 4B's shapes on an H200 (bench/RESULTS.md)."""
    return (64, 64, 4) if n > 2 and m >= 64 * 264 else (32, 128, 4)


def _bwd_config(n: int) -> tuple[int, int, int]:
    """(BM, BK, warps) of lora_bwd, likewise."""
    return (64, 64, 4) if n > 1 else (32, 64, 4)


def _a_forward(x2, a_list, seed: int, p: float, scale: float):
    """(h [n, M, R] in x's dtype = scale * dropout_i(x2) @ A_i^T, bits [n, M, K/8] or None)."""
    import torch

    m, k = x2.shape
    n, r = len(a_list), a_list[0].shape[0]
    if p == 0.0:
        return torch.stack([(x2 @ a.t()) * scale for a in a_list]).to(x2.dtype), None
    if not x2.is_cuda:
        acc = torch.promote_types(x2.dtype, torch.float32)
        bits = torch.stack([keep_bits(seed + i, m, k, p, x2.device) for i in range(n)])
        h = [((x2 * unpack_bits(bits[i], k)).to(acc) @ a.t().to(acc)) * scale for i, a in enumerate(a_list)]
        return torch.stack(h).to(x2.dtype), bits
    from trainer.speed.fast_lora_kernels import lora_fwd

    kb8 = -(-k // 8)
    h = torch.empty((n, m, r), device=x2.device, dtype=x2.dtype)
    bits = torch.empty((n, m, kb8), device=x2.device, dtype=torch.uint8)
    bm, bk, warps = _fwd_config(m, n)
    a0, a1, a2 = (a_list + [a_list[0]] * 2)[:3]
    lora_fwd[(-(-m // bm),)](x2, a0, a1, a2, h, bits, m, k, kb8, x2.stride(0), seed, threshold(p), scale,
                             NS=n, R=r, BM=bm, BK=bk, num_warps=warps)
    return h, bits


def _a_backward(x2, gs, a_list, bits, gx, p: float, scale: float):
    """gx += scale * sum_i keep_i * (gs_i @ A_i) in place (gx may be None); returns [gA_i] (fp32)."""
    import torch

    m, k = x2.shape
    n = len(a_list)
    if bits is None:
        if gx is not None:
            for i, a in enumerate(a_list):
                gx.addmm_(gs[i], a, alpha=scale)
        return [(gs[i].t() @ x2) * scale for i in range(n)]
    if not x2.is_cuda:
        keep = [unpack_bits(bits[i], k) for i in range(n)]
        if gx is not None:
            for i, a in enumerate(a_list):
                gx.add_((gs[i] @ a) * keep[i] * scale)
        return [(gs[i].t() @ (x2 * keep[i])) * scale for i in range(n)]
    import triton

    from trainer.speed.fast_lora_kernels import lora_bwd

    kb8 = -(-k // 8)
    bm, bk, warps = _bwd_config(n)
    n_k = triton.cdiv(k, bk)
    chunks = max(1, min(triton.cdiv(m, bm), -(-4 * 132 // n_k)))
    rows_per = triton.cdiv(triton.cdiv(m, chunks), bm) * bm
    n_m = triton.cdiv(m, rows_per)
    ga = torch.empty((n, n_m, a_list[0].shape[0], k), device=x2.device, dtype=torch.float32)
    gx_arg = gx if gx is not None else x2  # unused when HAS_GX is false
    a0, a1, a2 = (a_list + [a_list[0]] * 2)[:3]
    lora_bwd[(n_m, n_k)](x2, gx_arg, gs, a0, a1, a2, bits, ga, m, k, kb8, x2.stride(0), gx_arg.stride(0), rows_per,
                         scale, NS=n, R=a0.shape[0], BM=bm, BK=bk, HAS_GX=gx is not None, num_warps=warps)
    total = ga.sum(dim=1) if n_m > 1 else ga[:, 0]
    return list(total.unbind(0))


# ------------------------------------------------------------------------------------------------
# The autograd Function of a group
# ------------------------------------------------------------------------------------------------
def _function():
    import torch

    class FusedLoraGroup(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, scaling: float, p: float, seed: int, base_matmuls, *params):
            n = len(params) // 4
            ws, bs, a_list, b_list = params[0::4], params[1::4], list(params[2::4]), params[3::4]
            shape = x.shape
            k = shape[-1]
            x2 = x.reshape(-1, k)
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            h, bits = _a_forward(x2, a_list, seed, p, scaling * inv_keep(p))
            ys = []
            for i in range(n):
                y = torch.addmm(bs[i], h[i], b_list[i].t()) if bs[i] is not None else h[i] @ b_list[i].t()
                if base_matmuls[i] is None:
                    y.addmm_(x2, ws[i].t())
                else:
                    y.add_(base_matmuls[i].forward(x2))
                ys.append(y.view(*shape[:-1], ws[i].shape[0]))
            ctx.save_for_backward(x2, h, bits, *ws, *a_list, *b_list)
            ctx.n, ctx.scaling, ctx.p, ctx.shape, ctx.base_matmuls = n, scaling, p, shape, base_matmuls
            return tuple(ys)

        @staticmethod
        def backward(ctx, *gys):
            n = ctx.n
            x2, h, bits, *rest = ctx.saved_tensors
            ws, a_list, b_list = rest[:n], rest[n:2 * n], rest[2 * n:]
            m = x2.shape[0]
            gy2 = [(gy if gy is not None else torch.zeros((*ctx.shape[:-1], w.shape[0]), dtype=x2.dtype,
                                                          device=x2.device)).reshape(m, w.shape[0])
                   for gy, w in zip(gys, ws, strict=True)]
            gs = torch.empty((n, m, a_list[0].shape[0]), device=x2.device, dtype=h.dtype)
            for i in range(n):
                torch.mm(gy2[i], b_list[i], out=gs[i])
            gbs = [gy2[i].t() @ h[i] for i in range(n)]
            gx = None
            if ctx.needs_input_grad[0]:
                for i in range(n):
                    bm = ctx.base_matmuls[i]
                    if bm is not None:
                        part = bm.input_grad(gy2[i].contiguous())
                        gx = part if gx is None else gx.add_(part)
                    elif gx is None:
                        gx = gy2[i] @ ws[i]
                    else:
                        gx.addmm_(gy2[i], ws[i])
            gas = _a_backward(x2, gs, a_list, bits, gx, ctx.p, ctx.scaling * inv_keep(ctx.p))
            grads: list[Any] = [gx.view(ctx.shape) if gx is not None else None, None, None, None, None]
            for i in range(n):
                grads += [None, None, gas[i].to(a_list[i].dtype), gbs[i].to(b_list[i].dtype)]
            return tuple(grads)

    return FusedLoraGroup


_FUNCTION: Any = None


def fused_lora_group(x, members, scaling: float, p: float, training: bool) -> tuple:
    """(y_i = x @ W_i^T + b_i + scaling * dropout_p,i(x) @ A_i^T @ B_i^T for each member), as PEFT's layers.

    `members`: (W, b or None, A, B, base_matmuls or None) per layer, all reading x. `base_matmuls`, if given,
    computes the products with the frozen W instead: `.forward(x2)` = x2 @ W^T and `.input_grad(gy2)` = gy2 @ W
    (the trainer sets none; bench/fp8_linear.py's unshipped experiment does)."""
    import torch

    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _function()
    p = p if training else 0.0
    seed = int(torch.randint(0, SEED_MAX, (1,)).item()) if p > 0 else 0  # CPU generator: no GPU sync
    params: list[Any] = []
    for w, b, a, bm, _ in members:
        params += [w, b, a, bm]
    return _FUNCTION.apply(x, float(scaling), float(p), seed, tuple(m[4] for m in members), *params)


def fused_lora_linear(x, weight, bias, lora_a, lora_b, scaling: float, p: float, training: bool,
                      base_matmuls=None):
    """y = x @ W^T + b + scaling * dropout_p(x) @ A^T @ B^T, as PEFT's LoRA layer (W and b frozen)."""
    return fused_lora_group(x, [(weight, bias, lora_a, lora_b, base_matmuls)], scaling, p, training)[0]


def dropout_fraction_error(p: float) -> float:
    """|P(drop) - p| of the 16-bit threshold (5e-6 at p = 0.05)."""
    return math.fabs(threshold(p) / (1 << BITS) - p)
