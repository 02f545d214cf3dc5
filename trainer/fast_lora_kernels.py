"""Triton kernels of the fused LoRA linear layer: dropout applied while loading x, regenerated in backward.

The dropout mask is a pure function of (seed, row, column, number of columns), so the forward and the
backward kernels compute the same mask without ever storing it, and `fast_lora.keep_mask` (PyTorch)
computes it bit for bit on any device (tests, CPU). Layout of the mask over x[M, K]:

- columns are grouped in blocks of `MASK_BLOCK` (128); a block is 8 sub-blocks of 16 columns;
- element (m, k) uses Philox-4x32-10 (Triton's `randint4x`) at counter
  `(m * ceil(K / 128) + k // 128) * 16 + k % 16`; of its four 32-bit outputs it takes output
  `j // 2` for sub-block `j = (k % 128) // 16`, the low 16 bits for even `j`, the high 16 for odd;
- the element is kept when those 16 bits are >= `threshold` = round(p * 65536).

Imported only on a GPU worker (or under TRITON_INTERPRET=1 in tests).
"""

from __future__ import annotations

import triton
import triton.language as tl

MASK_BLOCK = tl.constexpr(128)
SUB = tl.constexpr(16)


@triton.jit
def _bits(r, j: tl.constexpr):
    # 16 random bits of sub-block j from the four Philox outputs r (uint32), as int32
    if j % 2 == 0:  # noqa: SIM108 - the statement form is what Triton 3.6 compiled on the GPU
        out = r & 0xFFFF
    else:
        out = r >> 16
    return out.to(tl.int32)


@triton.jit
def _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0, bits, threshold,
             R: tl.constexpr, DROPOUT: tl.constexpr):
    cols = k0 + tl.arange(0, SUB)
    col_ok = cols < K
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    if DROPOUT:
        x = tl.where(bits >= threshold, x, 0.0)
    a = tl.load(a_ptr + tl.arange(0, R)[:, None] * K + cols[None, :], mask=col_ok[None, :], other=0.0)
    return acc + tl.dot(x, tl.trans(a))


# Triton 3.6 fails to compile these kernels (an assertion in ConvertTritonGPUToLLVM) when it may vectorize
# the 16-column tiles: the row strides and the small [M, R] operands are passed unspecialised.
NO_VECTOR_STRIDES = ["stride_xm", "stride_gxm", "stride_hm", "stride_gsm"]
NO_VECTOR_PTRS = ["h_ptr", "gs_ptr"]


@triton.jit(do_not_specialize=NO_VECTOR_STRIDES, do_not_specialize_on_alignment=NO_VECTOR_PTRS)
def dropout_lora_a_fwd(x_ptr, a_ptr, h_ptr, M, K, KB, stride_xm, stride_hm, seed, threshold, blocks_per_prog,
                       R: tl.constexpr, BM: tl.constexpr, DROPOUT: tl.constexpr):
    """h[pid_k, M, R] = (x * keep) @ A^T over this program's column blocks (fp32 partial sums; the caller
    adds the pid_k slices: plain stores, since atomics on an MMA-layout tile fail to compile in Triton 3.6)."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    c = tl.arange(0, SUB).to(tl.int64)
    acc = tl.zeros((BM, R), dtype=tl.float32)
    kb_start = pid_k * blocks_per_prog
    for kb in range(kb_start, tl.minimum(kb_start + blocks_per_prog, KB)):
        counter = (rows64[:, None] * KB + kb) * SUB + c[None, :]
        r0, r1, r2, r3 = tl.randint4x(seed, counter)
        k0 = kb * MASK_BLOCK
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 0 * SUB, _bits(r0, 0), threshold, R, DROPOUT)
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 1 * SUB, _bits(r0, 1), threshold, R, DROPOUT)
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 2 * SUB, _bits(r1, 2), threshold, R, DROPOUT)
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 3 * SUB, _bits(r1, 3), threshold, R, DROPOUT)
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 4 * SUB, _bits(r2, 4), threshold, R, DROPOUT)
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 5 * SUB, _bits(r2, 5), threshold, R, DROPOUT)
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 6 * SUB, _bits(r3, 6), threshold, R, DROPOUT)
        acc = _fwd_sub(acc, x_ptr, a_ptr, rows, row_ok, stride_xm, K, k0 + 7 * SUB, _bits(r3, 7), threshold, R, DROPOUT)
    out = h_ptr + pid_k.to(tl.int64) * M * stride_hm + rows[:, None] * stride_hm + tl.arange(0, R)[None, :]
    tl.store(out, acc, mask=row_ok[:, None])


@triton.jit
def _bwd_sub(ga, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0, bits, threshold, inv_keep,
             R: tl.constexpr, HAS_GX: tl.constexpr):
    cols = k0 + tl.arange(0, SUB)
    col_ok = cols < K
    ok = row_ok[:, None] & col_ok[None, :]
    keep = bits >= threshold
    if HAS_GX:
        a = tl.load(a_ptr + tl.arange(0, R)[:, None] * K + cols[None, :], mask=col_ok[None, :], other=0.0)
        t = tl.dot(gs, a)  # [BM, SUB]
        t = tl.where(keep, t * inv_keep, 0.0)
        gptr = gx_ptr + rows[:, None] * stride_gxm + cols[None, :]
        g = tl.load(gptr, mask=ok, other=0.0)
        tl.store(gptr, (g.to(tl.float32) + t).to(g.dtype), mask=ok)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
    x = tl.where(keep, x, 0.0)
    return ga + tl.dot(tl.trans(gs), x)  # [R, SUB]


@triton.jit
def _store_ga(ga_ptr, ga, K, k0, inv_keep, R: tl.constexpr):
    cols = k0 + tl.arange(0, SUB)
    ptr = ga_ptr + tl.arange(0, R)[:, None] * K + cols[None, :]
    tl.store(ptr, ga * inv_keep, mask=(cols < K)[None, :])


@triton.jit(do_not_specialize=NO_VECTOR_STRIDES, do_not_specialize_on_alignment=NO_VECTOR_PTRS)
def dropout_lora_bwd(x_ptr, gs_ptr, a_ptr, gx_ptr, ga_ptr, M, K, KB, stride_xm, stride_gxm, stride_gsm, seed,
                     threshold,
                     inv_keep, rows_per_prog,
                     R: tl.constexpr, BM: tl.constexpr, HAS_GX: tl.constexpr):
    """One 128-column block over rows_per_prog rows: gx += keep * (gs @ A) / (1-p) in place, and
    gA[pid_m, R, block] = gs^T @ (x * keep) / (1-p) (fp32 partial sums over row chunks; the caller adds them)."""
    pid_m = tl.program_id(0)
    kb = tl.program_id(1)
    k0 = kb * MASK_BLOCK
    c = tl.arange(0, SUB).to(tl.int64)
    z = tl.zeros((R, SUB), dtype=tl.float32)
    g0, g1, g2, g3, g4, g5, g6, g7 = z, z, z, z, z, z, z, z
    row_start = pid_m * rows_per_prog
    for m0 in range(row_start, tl.minimum(row_start + rows_per_prog, M), BM):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < M
        gs = tl.load(gs_ptr + rows[:, None] * stride_gsm + tl.arange(0, R)[None, :], mask=row_ok[:, None], other=0.0)
        counter = (rows.to(tl.int64)[:, None] * KB + kb) * SUB + c[None, :]
        r0, r1, r2, r3 = tl.randint4x(seed, counter)
        g0 = _bwd_sub(g0, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 0 * SUB,
                      _bits(r0, 0), threshold, inv_keep, R, HAS_GX)
        g1 = _bwd_sub(g1, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 1 * SUB,
                      _bits(r0, 1), threshold, inv_keep, R, HAS_GX)
        g2 = _bwd_sub(g2, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 2 * SUB,
                      _bits(r1, 2), threshold, inv_keep, R, HAS_GX)
        g3 = _bwd_sub(g3, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 3 * SUB,
                      _bits(r1, 3), threshold, inv_keep, R, HAS_GX)
        g4 = _bwd_sub(g4, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 4 * SUB,
                      _bits(r2, 4), threshold, inv_keep, R, HAS_GX)
        g5 = _bwd_sub(g5, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 5 * SUB,
                      _bits(r2, 5), threshold, inv_keep, R, HAS_GX)
        g6 = _bwd_sub(g6, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 6 * SUB,
                      _bits(r3, 6), threshold, inv_keep, R, HAS_GX)
        g7 = _bwd_sub(g7, x_ptr, gs, a_ptr, gx_ptr, rows, row_ok, stride_xm, stride_gxm, K, k0 + 7 * SUB,
                      _bits(r3, 7), threshold, inv_keep, R, HAS_GX)
    ga_ptr += pid_m.to(tl.int64) * R * K
    _store_ga(ga_ptr, g0, K, k0 + 0 * SUB, inv_keep, R)
    _store_ga(ga_ptr, g1, K, k0 + 1 * SUB, inv_keep, R)
    _store_ga(ga_ptr, g2, K, k0 + 2 * SUB, inv_keep, R)
    _store_ga(ga_ptr, g3, K, k0 + 3 * SUB, inv_keep, R)
    _store_ga(ga_ptr, g4, K, k0 + 4 * SUB, inv_keep, R)
    _store_ga(ga_ptr, g5, K, k0 + 5 * SUB, inv_keep, R)
    _store_ga(ga_ptr, g6, K, k0 + 6 * SUB, inv_keep, R)
    _store_ga(ga_ptr, g7, K, k0 + 7 * SUB, inv_keep, R)


@triton.jit
def keep_mask_kernel(out_ptr, M, K, KB, seed, threshold, BM: tl.constexpr):
    """The mask itself (uint8, 1 = kept), for tests against `fast_lora.keep_mask`."""
    pid_m = tl.program_id(0)
    kb = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    c = tl.arange(0, SUB)
    counter = (rows.to(tl.int64)[:, None] * KB + kb) * SUB + c.to(tl.int64)[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, counter)
    for j in tl.static_range(8):
        if j // 2 == 0:
            r = r0
        elif j // 2 == 1:
            r = r1
        elif j // 2 == 2:
            r = r2
        else:
            r = r3
        bits = _bits(r, j)
        cols = kb * MASK_BLOCK + j * SUB + c
        ok = (rows < M)[:, None] & (cols < K)[None, :]
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], (bits >= threshold).to(tl.uint8), mask=ok)
