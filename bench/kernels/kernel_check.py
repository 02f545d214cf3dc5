"""GPU check of the speed levers' kernels: correctness against a float32 reference, then timings.

- fused LoRA (trainer/speed/fast_lora.py, fast_lora_kernels.py): the kernels' mask bits equal `keep_bits`; a
  group's forward and the gradients of x, A and B match the explicit formula (float32, same masks);
  `lora_fwd`/`lora_bwd` alone at Gemma 3 4B's shapes (micro-batch 16) over a sweep of tile configs, in ms
  and GB/s, and the per-step projection (4 micro-batches of all 400 LoRA layers) of the best configs;
- language-model attention at Gemma 3 4B's shapes with its mask (causal text, bidirectional image block,
  padding): SDPA as the trainer runs it (kv heads repeated, the mask), cuDNN, cuDNN with GQA, flex
  attention; error against float32 and forward + backward time.

    python3 -m bench.kernels.kernel_check --out results.json [--parts lora,lm_attention]

Results are written after each part, so a run cut off by its time budget keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# (name, rows, in features, members): the LoRA groups of Gemma 3 4B at micro-batch 16 (408 tokens per sample)
SHAPES = (("siglip_qkv", 65536, 1152, 3), ("siglip_o_fc1", 65536, 1152, 1), ("siglip_fc2", 65536, 4304, 1),
          ("lm_qkv", 6528, 2560, 3), ("lm_gateup", 6528, 2560, 2), ("lm_o", 6528, 2048, 1),
          ("lm_down", 6528, 10240, 1))
# per micro-batch: how many groups of each shape (27 SigLIP layers: qkv, o, fc1, fc2; 34 LM: qkv, o, gate/up, down)
PER_MICRO_BATCH = {"siglip_qkv": 27, "siglip_o_fc1": 54, "siglip_fc2": 27, "lm_qkv": 34, "lm_gateup": 34,
                   "lm_o": 34, "lm_down": 34}
FWD_CONFIGS = ((64, 64, 4), (64, 64, 8), (64, 128, 4), (64, 128, 8), (32, 128, 4), (128, 64, 8))
BWD_CONFIGS = ((64, 64, 4), (64, 64, 8), (64, 128, 8), (32, 64, 4), (128, 64, 8))


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def bench_ms(fn) -> float:
    import torch
    from triton.testing import do_bench

    torch.cuda.synchronize()
    return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


def check_lora_correct(res: dict) -> None:
    import torch

    from trainer.speed import fast_lora

    dev = "cuda"
    torch.manual_seed(0)
    for m, k, n in ((4096 * 3 + 17, 1152, 3), (2000, 2560, 2), (333, 4304, 1), (70000, 1152, 1)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        members, leaves = [], []
        for _ in range(n):
            w = (torch.randn(1024, k, device=dev) / k**0.5).bfloat16()
            a = (torch.randn(16, k, device=dev) / k**0.5).bfloat16().requires_grad_()
            b = (torch.randn(1024, 16, device=dev) / 4).bfloat16().requires_grad_()
            members.append((w, None, a, b, None))
            leaves += [a, b]
        p, s = 0.05, 2.0
        torch.manual_seed(5)
        ys = fast_lora.fused_lora_group(x, members, s, p, training=True)
        torch.manual_seed(5)
        seed = int(torch.randint(0, fast_lora.SEED_MAX, (1,)).item())
        _, bits = fast_lora._a_forward(x.detach(), [mem[2].detach() for mem in members], seed, p, 1.0)
        equal = all(torch.equal(bits[i], fast_lora.keep_bits(seed + i, m, k, p, dev)) for i in range(n))
        xf = x.detach().float().requires_grad_()
        lf = [t.detach().float().requires_grad_() for t in leaves]
        refs = [xf @ w.float().t() + s * ((xf * fast_lora.keep_mask(seed + i, m, k, p, dev) * fast_lora.inv_keep(p))
                                          @ lf[2 * i].t()) @ lf[2 * i + 1].t() for i, (w, *_r) in enumerate(members)]
        gys = [torch.randn_like(r) for r in refs]
        got = torch.autograd.grad(ys, (x, *leaves), [g.bfloat16() for g in gys])
        want = torch.autograd.grad(refs, (xf, *lf), gys)
        res.setdefault("lora_correct", []).append({
            "m": m, "k": k, "members": n, "bits_equal": equal,
            "drop_rate": float(1 - fast_lora.unpack_bits(bits[0], k).float().mean()),
            "y": max(rel(y, r) for y, r in zip(ys, refs, strict=True)), "gx": rel(got[0], want[0]),
            "gA": max(rel(g, w) for g, w in zip(got[1::2], want[1::2], strict=True)),
            "gB": max(rel(g, w) for g, w in zip(got[2::2], want[2::2], strict=True))})
        print("lora_correct", json.dumps(res["lora_correct"][-1]), flush=True)


def _time_shape(m: int, k: int, n: int) -> dict:
    """lora_fwd/lora_bwd alone on one group shape over the config sweep, and as the trainer launches them."""
    import torch
    import triton

    from trainer.speed import fast_lora
    from trainer.speed.fast_lora_kernels import lora_bwd, lora_fwd

    dev = "cuda"
    kb8 = -(-k // 8)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    gx = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    a = [(torch.randn(16, k, device=dev) / k**0.5).bfloat16() for _ in range(n)]
    a0, a1, a2 = (a + [a[0]] * 2)[:3]
    h = torch.empty((n, m, 16), device=dev, dtype=torch.bfloat16)
    bits = torch.empty((n, m, kb8), device=dev, dtype=torch.uint8)
    gs = torch.randn((n, m, 16), device=dev, dtype=torch.bfloat16)
    row: dict = {"m": m, "k": k, "members": n}

    def fwd(bm: int, bk: int, w: int):
        return lora_fwd[(-(-m // bm),)](x, a0, a1, a2, h, bits, m, k, kb8, k, 1234, 3277, 1.0, NS=n, R=16, BM=bm,
                                        BK=bk, num_warps=w)

    def bwd(bm: int, bk: int, w: int, ga):
        n_k = triton.cdiv(k, bk)
        chunks = max(1, min(triton.cdiv(m, bm), -(-4 * 132 // n_k)))
        rows_per = triton.cdiv(triton.cdiv(m, chunks), bm) * bm
        return lora_bwd[(triton.cdiv(m, rows_per), n_k)](x, gx, gs, a0, a1, a2, bits, ga, m, k, kb8, k, k, rows_per,
                                                         1.0, NS=n, R=16, BM=bm, BK=bk, HAS_GX=True, num_warps=w)

    for bm, bk, w in FWD_CONFIGS:
        try:
            row[f"fwd_{bm}x{bk}w{w}_ms"] = round(bench_ms(lambda bm=bm, bk=bk, w=w: fwd(bm, bk, w)), 4)
        except Exception as e:
            row[f"fwd_{bm}x{bk}w{w}_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    for bm, bk, w in BWD_CONFIGS:
        ga = torch.empty((n, m // bm + 1, 16, k), device=dev, dtype=torch.float32)
        try:
            row[f"bwd_{bm}x{bk}w{w}_ms"] = round(bench_ms(lambda bm=bm, bk=bk, w=w, ga=ga: bwd(bm, bk, w, ga)), 4)
        except Exception as e:
            row[f"bwd_{bm}x{bk}w{w}_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    row["trainer_fwd_ms"] = round(bench_ms(lambda: fast_lora._a_forward(x, a, 1234, 0.05, 1.0)), 4)
    row["trainer_bwd_ms"] = round(bench_ms(lambda: fast_lora._a_backward(x, gs, a, bits, gx, 0.05, 1.0)), 4)
    fwd_ms = {kk: v for kk, v in row.items() if kk.startswith("fwd_") and kk.endswith("_ms")}
    bwd_ms = {kk: v for kk, v in row.items() if kk.startswith("bwd_") and kk.endswith("_ms")}
    if fwd_ms and bwd_ms:
        fk, bk_ = min(fwd_ms, key=fwd_ms.get), min(bwd_ms, key=bwd_ms.get)
        row.update(best_fwd=fk, best_fwd_ms=fwd_ms[fk], best_bwd=bk_, best_bwd_ms=bwd_ms[bk_],
                   fwd_gbs=round((m * k * 2 + n * m * kb8) / fwd_ms[fk] / 1e6, 1),
                   bwd_gbs=round((3 * m * k * 2 + n * m * kb8) / bwd_ms[bk_] / 1e6, 1))
    return row


def check_lora_speed(res: dict) -> None:
    import torch

    speed = res.setdefault("lora_speed", {})
    for name, m, k, n in SHAPES:
        speed[name] = _time_shape(m, k, n)
        print("lora_speed", name, json.dumps(speed[name]), flush=True)
        torch.cuda.empty_cache()
    if all("best_fwd_ms" in speed.get(nm, {}) for nm, *_ in SHAPES):
        best = 4 * sum(PER_MICRO_BATCH[nm] * (speed[nm]["best_fwd_ms"] + speed[nm]["best_bwd_ms"]) for nm in speed)
        now = 4 * sum(PER_MICRO_BATCH[nm] * (speed[nm]["trainer_fwd_ms"] + speed[nm]["trainer_bwd_ms"]) for nm in speed)
        res["lora_projected_ms_per_step"] = {"best_configs": round(best, 1), "trainer_configs": round(now, 1)}
        print("lora_projected_ms_per_step", res["lora_projected_ms_per_step"], flush=True)


def gemma3_mask(b: int, s: int, image: tuple[int, int], lengths: list[int], device):
    """[b, 1, s, s] bool: causal, bidirectional inside the image block [start, end), padded keys masked."""
    import torch

    q = torch.arange(s, device=device)[:, None]
    kv = torch.arange(s, device=device)[None, :]
    in_img = lambda t: (t >= image[0]) & (t < image[1])  # noqa: E731
    allowed = (kv <= q) | (in_img(q) & in_img(kv))
    valid = torch.arange(s, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    return (allowed[None] & valid[:, None, :])[:, None]


def check_lm_attention(res: dict) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev, b, s, hq, hkv, d = "cuda", 16, 416, 8, 4, 256
    image = (6, 262)
    lengths = [s - (i * 7) % 40 for i in range(b)]
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16)
    mask = gemma3_mask(b, s, image, lengths, dev)
    scale = 256**-0.5
    rep = lambda t: t.repeat_interleave(hq // hkv, dim=1)  # noqa: E731
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(qf, rep(kf), rep(vf), attn_mask=mask, scale=scale)
    ref_g = torch.autograd.grad(ref, (qf, kf, vf), gy.float())

    def sdpa(backends, gqa):
        def f():
            with sdpa_kernel(backends):
                if gqa:
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
                return F.scaled_dot_product_attention(q, rep(k), rep(v), attn_mask=mask, scale=scale)
        return f

    variants = {"trainer_now (default order, kv repeated)": sdpa(
                    [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], False),
                "efficient, kv repeated": sdpa([SDPBackend.EFFICIENT_ATTENTION], False),
                "cudnn, kv repeated": sdpa([SDPBackend.CUDNN_ATTENTION], False),
                "cudnn, gqa": sdpa([SDPBackend.CUDNN_ATTENTION], True)}
    bias = torch.zeros(mask.shape, device=dev, dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))

    def cudnn_bias():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=True)

    variants["cudnn, gqa, additive mask"] = cudnn_bias
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        lens = torch.tensor(lengths, device=dev)

        def mask_mod(bi, h, qi, ki):
            img = (qi >= image[0]) & (qi < image[1]) & (ki >= image[0]) & (ki < image[1])
            return ((ki <= qi) | img) & (ki < lens[bi])

        block = create_block_mask(mask_mod, b, None, s, s, device=dev)
        flex = torch.compile(flex_attention, dynamic=False)
        variants["flex (compiled, gqa)"] = lambda: flex(q, k, v, block_mask=block, scale=scale, enable_gqa=True)
    except Exception as e:
        res.setdefault("lm_attention", {})["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    for name, fn in variants.items():
        row: dict = {}
        try:
            t0 = time.time()
            out = fn()
            grads = torch.autograd.grad(out, (q, k, v), gy)
            row["first_call_s"] = round(time.time() - t0, 2)
            row.update(err_out=rel(out, ref), err_dq=rel(grads[0], ref_g[0]), err_dk=rel(grads[1], ref_g[1]),
                       err_dv=rel(grads[2], ref_g[2]))
            row["fwd_ms"] = round(bench_ms(lambda fn=fn: fn().detach()), 3)
            row["fwd_bwd_ms"] = round(bench_ms(lambda fn=fn: torch.autograd.grad(fn(), (q, k, v), gy)), 3)
        except Exception as e:  # a backend that refuses the inputs is a result too
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        res.setdefault("lm_attention", {})[name] = row
        print("lm_attention", name, json.dumps(row), flush=True)


PARTS = {"lora_correct": check_lora_correct, "lora_speed": check_lora_speed, "lm_attention": check_lm_attention}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default=",".join(PARTS))
    a = parser.parse_args()
    import torch

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for part in a.parts.split(","):
        t0 = time.time()
        try:
            PARTS[part](res)
        except Exception as e:
            import traceback

            traceback.print_exc()
            res[f"{part}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
        res[f"{part}_s"] = round(time.time() - t0, 1)
        a.out.write_text(json.dumps(res, indent=1))
    print("KERNEL_CHECK " + json.dumps({k: v for k, v in res.items() if k not in ("lora_speed", "lm_attention")}),
          flush=True)


if __name__ == "__main__":
    main()
