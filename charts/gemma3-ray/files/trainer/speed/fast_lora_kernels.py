"""Triton kernels of the fused LoRA layers: dropout drawn while x is read, kept as bits for the backward.

A group is 1 to 3 LoRA layers that read the same x (q/k/v, gate/up); each has its own adapter and its own
dropout mask. The forward reads each x tile once for the whole group; the backward reads x and the input
gradient once for the whole group, adding every member's term to the gradient in place.

The mask of member i over x[M, K] is a pure function of (seed + i, row, column, K), stored as one bit per
element (uint8 [M, ceil(K/8)]; bit j of byte (m, c) is element (m, 8c + j)); `fast_lora.keep_bits`
computes it bit for bit in PyTorch (tests, CPU path):

- byte (m, c) draws Philox-4x32-10 (Triton's `randint4x`) at counter `m * ceil(K/8) + c` with key
  `seed + i`; element 8c + j takes the 16-bit half `j % 2` (low half first) of output word `j // 2`;
- the element is kept when those 16 bits are >= `threshold` = round(p * 65536).

Imported only on a GPU worker (or under TRITON_INTERPRET=1 in tests).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _half(r, j: tl.constexpr, threshold):
    if j % 2 == 0:  # noqa: SIM108 - the statement form compiles on Triton 3.6
        v = r & 0xFFFF
    else:
        v = r >> 16
    return (v.to(tl.int32) >= threshold).to(tl.int32)


@triton.jit
def _draw_bytes(seed, counter, threshold):
    """uint8-valued int32 tile: bit j = keep of the j-th element of each 8-element group."""
    r0, r1, r2, r3 = tl.randint4x(seed, counter)
    b = _half(r0, 0, threshold) | (_half(r0, 1, threshold) << 1)
    b |= (_half(r1, 2, threshold) << 2) | (_half(r1, 3, threshold) << 3)
    b |= (_half(r2, 4, threshold) << 4) | (_half(r2, 5, threshold) << 5)
    b |= (_half(r3, 6, threshold) << 6) | (_half(r3, 7, threshold) << 7)
    return b


@triton.jit
def _expand(b, BM: tl.constexpr, BK: tl.constexpr):
    """[BM, BK // 8] bytes -> [BM, BK] keep (int8 0/1), column 8c + j from bit j of byte c."""
    p0, p1, p2, p3 = (b & 1), ((b >> 1) & 1), ((b >> 2) & 1), ((b >> 3) & 1)
    p4, p5, p6, p7 = ((b >> 4) & 1), ((b >> 5) & 1), ((b >> 6) & 1), ((b >> 7) & 1)
    # join() appends an innermost axis; joining the most significant bit of j first gives [.., 2, 2, 2] = j
    q = tl.join(tl.join(tl.join(p0, p4), tl.join(p2, p6)), tl.join(tl.join(p1, p5), tl.join(p3, p7)))
    return tl.reshape(q, (BM, BK)).to(tl.int8)


@triton.jit
def _fwd_member(acc, x, a_ptr, cols, col_ok, K, seed, counter, byte_ok, bits_ptr, threshold,
                R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    b = _draw_bytes(seed, counter, threshold)
    tl.store(bits_ptr, b.to(tl.uint8), mask=byte_ok)
    keep = _expand(b, BM, BK)
    xm = tl.where(keep != 0, x, 0.0)
    a = tl.load(a_ptr + tl.arange(0, R)[:, None] * K + cols[None, :], mask=col_ok[None, :], other=0.0)
    return acc + tl.dot(xm, tl.trans(a))


@triton.jit
def _store_h(h_ptr, acc, rows, row_ok, scale, R: tl.constexpr):
    tl.store(h_ptr + rows[:, None] * R + tl.arange(0, R)[None, :], (acc * scale).to(h_ptr.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def lora_fwd(x_ptr, a0_ptr, a1_ptr, a2_ptr, h_ptr, bits_ptr, M, K, KB8, stride_xm, seed, threshold, scale,
             NS: tl.constexpr, R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """h[i, M, R] = scale * (x * keep_i) @ A_i^T for the NS members, and bits[i, M, KB8] = keep_i packed."""
    pid = tl.program_id(0)
    rows = pid * BM + tl.arange(0, BM)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    acc0 = tl.zeros((BM, R), dtype=tl.float32)
    acc1 = tl.zeros((BM, R), dtype=tl.float32)
    acc2 = tl.zeros((BM, R), dtype=tl.float32)
    plane = M.to(tl.int64) * KB8
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        col_ok = cols < K
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0)
        cb = k0 // 8 + tl.arange(0, BK // 8)
        counter = rows64[:, None] * KB8 + cb[None, :]
        byte_ok = row_ok[:, None] & (cb < KB8)[None, :]
        bptr = bits_ptr + counter
        acc0 = _fwd_member(acc0, x, a0_ptr, cols, col_ok, K, seed, counter, byte_ok, bptr, threshold, R, BM, BK)
        if NS > 1:
            acc1 = _fwd_member(acc1, x, a1_ptr, cols, col_ok, K, seed + 1, counter, byte_ok, bptr + plane,
                               threshold, R, BM, BK)
        if NS > 2:
            acc2 = _fwd_member(acc2, x, a2_ptr, cols, col_ok, K, seed + 2, counter, byte_ok, bptr + 2 * plane,
                               threshold, R, BM, BK)
    _store_h(h_ptr, acc0, rows64, row_ok, scale, R)
    if NS > 1:
        _store_h(h_ptr + M.to(tl.int64) * R, acc1, rows64, row_ok, scale, R)
    if NS > 2:
        _store_h(h_ptr + 2 * M.to(tl.int64) * R, acc2, rows64, row_ok, scale, R)


@triton.jit
def _keep_tile(bits_ptr, rows64, KB8, cb, byte_ok, BM: tl.constexpr, BK: tl.constexpr):
    b = tl.load(bits_ptr + rows64[:, None] * KB8 + cb[None, :], mask=byte_ok, other=0).to(tl.int32)
    return _expand(b, BM, BK)


@triton.jit
def _bwd_step(t, ga, x, gs_ptr, a, bits_ptr, rows64, row_ok, KB8, cb, byte_ok,
              R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, HAS_GX: tl.constexpr):
    keep = _keep_tile(bits_ptr, rows64, KB8, cb, byte_ok, BM, BK) != 0
    gs = tl.load(gs_ptr + rows64[:, None] * R + tl.arange(0, R)[None, :], mask=row_ok[:, None], other=0.0)
    if HAS_GX:
        t += tl.where(keep, tl.dot(gs, a), 0.0)
    xm = tl.where(keep, x, 0.0)
    ga += tl.dot(tl.trans(gs), xm)
    return t, ga


@triton.jit
def _store_ga(ga_ptr, ga, K, cols, col_ok, scale, R: tl.constexpr):
    tl.store(ga_ptr + tl.arange(0, R)[:, None] * K + cols[None, :], ga * scale, mask=col_ok[None, :])


@triton.jit
def lora_bwd(x_ptr, gx_ptr, gs_ptr, a0_ptr, a1_ptr, a2_ptr, bits_ptr, ga_ptr, M, K, KB8, stride_xm, stride_gxm,
             rows_per_prog, scale,
             NS: tl.constexpr, R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, HAS_GX: tl.constexpr):
    """Over one BK-column block and rows_per_prog rows: gx += scale * sum_i keep_i * (gs_i @ A_i) in place,
    and ga[i, pid_m, R, block] = scale * gs_i^T @ (x * keep_i) (fp32 partial sums over row chunks; the caller
    adds them). gs[i, M, R] is gy_i @ B_i; scale is the LoRA scaling over the keep probability."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_k * BK + tl.arange(0, BK)
    col_ok = cols < K
    cb = pid_k * (BK // 8) + tl.arange(0, BK // 8)
    cb_ok = cb < KB8
    arow = tl.arange(0, R)[:, None] * K + cols[None, :]
    a0 = tl.load(a0_ptr + arow, mask=col_ok[None, :], other=0.0)
    a1 = a0
    a2 = a0
    if NS > 1:
        a1 = tl.load(a1_ptr + arow, mask=col_ok[None, :], other=0.0)
    if NS > 2:
        a2 = tl.load(a2_ptr + arow, mask=col_ok[None, :], other=0.0)
    ga0 = tl.zeros((R, BK), dtype=tl.float32)
    ga1 = tl.zeros((R, BK), dtype=tl.float32)
    ga2 = tl.zeros((R, BK), dtype=tl.float32)
    plane = M.to(tl.int64) * KB8
    gplane = M.to(tl.int64) * R
    row_start = pid_m * rows_per_prog
    for m0 in range(row_start, tl.minimum(row_start + rows_per_prog, M), BM):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        ok = row_ok[:, None] & col_ok[None, :]
        byte_ok = row_ok[:, None] & cb_ok[None, :]
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
        t = tl.zeros((BM, BK), dtype=tl.float32)
        t, ga0 = _bwd_step(t, ga0, x, gs_ptr, a0, bits_ptr, rows64, row_ok, KB8, cb, byte_ok, R, BM, BK, HAS_GX)
        if NS > 1:
            t, ga1 = _bwd_step(t, ga1, x, gs_ptr + gplane, a1, bits_ptr + plane, rows64, row_ok, KB8, cb, byte_ok,
                               R, BM, BK, HAS_GX)
        if NS > 2:
            t, ga2 = _bwd_step(t, ga2, x, gs_ptr + 2 * gplane, a2, bits_ptr + 2 * plane, rows64, row_ok, KB8, cb,
                               byte_ok, R, BM, BK, HAS_GX)
        if HAS_GX:
            gptr = gx_ptr + rows64[:, None] * stride_gxm + cols[None, :]
            g = tl.load(gptr, mask=ok, other=0.0)
            tl.store(gptr, (g.to(tl.float32) + t * scale).to(g.dtype), mask=ok)
    chunks = tl.num_programs(0)
    gbase = ga_ptr + pid_m.to(tl.int64) * R * K
    _store_ga(gbase, ga0, K, cols, col_ok, scale, R)
    if NS > 1:
        _store_ga(gbase + chunks.to(tl.int64) * R * K, ga1, K, cols, col_ok, scale, R)
    if NS > 2:
        _store_ga(gbase + 2 * chunks.to(tl.int64) * R * K, ga2, K, cols, col_ok, scale, R)
