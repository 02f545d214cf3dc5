"""The fused LoRA layer (trainer/fast_lora.py): its mask generator, its autograd math, its PEFT hook,
and (Triton's interpreter, on CPU) its kernels against the PyTorch reference."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fast_lora
import pytest
import torch

TRAINER = Path(__file__).resolve().parents[2] / "trainer"


def test_philox_matches_random123_known_answers() -> None:
    # Random123's kat_vectors for philox4x32-10: (counter words, key words) -> output words.
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ]
    for (c0, c1, c2, c3), (k0, k1), want in cases:
        if c2 or c3:  # Triton's layout has c2 = c3 = 0; drive the rounds directly
            got = _philox_full((c0, c1, c2, c3), (k0, k1))
        else:
            counter = torch.tensor([c0 | (c1 << 32)], dtype=torch.int64)
            got = tuple(int(w[0]) for w in fast_lora.philox4x32(counter, k0 | (k1 << 32)))
        assert got == want


def _philox_full(ctr, key):
    c = [torch.tensor([v], dtype=torch.int64) for v in ctr]
    k0, k1 = key
    for _ in range(fast_lora.PHILOX_ROUNDS):
        hi0, lo0 = fast_lora._mulhilo(fast_lora.PHILOX_M0, c[0])
        hi1, lo1 = fast_lora._mulhilo(fast_lora.PHILOX_M1, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0, k1 = (k0 + fast_lora.PHILOX_W0) & fast_lora.U32, (k1 + fast_lora.PHILOX_W1) & fast_lora.U32
    return tuple(int(w[0]) for w in c)


def test_keep_mask_rate_and_independence() -> None:
    p = 0.05
    mask = fast_lora.keep_mask(seed=7, m=300, k=1000, p=p)
    assert mask.shape == (300, 1000)
    n = mask.numel()
    drop = 1.0 - mask.float().mean().item()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(drop - p) < 5 * sigma
    # other seeds, other masks; same seed, same mask
    assert torch.equal(mask, fast_lora.keep_mask(seed=7, m=300, k=1000, p=p))
    other = fast_lora.keep_mask(seed=8, m=300, k=1000, p=p)
    agree_dropped = (~mask & ~other).float().mean().item()
    assert abs(agree_dropped - p * p) < 5 * (p * p / n) ** 0.5 + 1e-4
    # every column position (all 8 sub-blocks and both 16-bit halves) drops at the rate p
    per_col = 1.0 - mask.float().mean(dim=0)
    per_sub = per_col[:896].reshape(7, 8, 16).mean(dim=(0, 2))
    assert torch.all((per_sub - p).abs() < 6 * (p * (1 - p) / (300 * 7 * 16)) ** 0.5)
    assert fast_lora.dropout_fraction_error(p) < 1e-5


def _reference(x, w, b, a, bm, s, keep, p_eff):
    d = x * keep / (1 - p_eff) if keep is not None else x
    y = x @ w.t() + s * (d @ a.t()) @ bm.t()
    return y + b if b is not None else y


@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_function_matches_the_explicit_formula(p: float, with_bias: bool) -> None:
    torch.manual_seed(0)
    m, k, n, r, s = 37, 200, 45, 16, 0.5
    x = torch.randn(3, m, k, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n, k, dtype=torch.float64)
    b = torch.randn(n, dtype=torch.float64) if with_bias else None
    a = torch.randn(r, k, dtype=torch.float64, requires_grad=True)
    bm = torch.randn(n, r, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(123)
    y = fast_lora.fused_lora_linear(x, w, b, a, bm, s, p, training=True)
    torch.manual_seed(123)
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    keep = fast_lora.keep_mask(seed, 3 * m, k, p).reshape(3, m, k) if p else None
    p_eff = fast_lora.threshold(p) / 2**16
    ref = _reference(x, w, b, a, bm, s, keep, p_eff)
    torch.testing.assert_close(y, ref)
    gy = torch.randn_like(ref)
    got = torch.autograd.grad(y, (x, a, bm), gy)
    want = torch.autograd.grad(ref, (x, a, bm), gy)
    for g, wnt in zip(got, want, strict=True):
        torch.testing.assert_close(g, wnt)


def test_fused_function_gradcheck() -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 130, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 130, dtype=torch.float64)
    a = torch.randn(16, 130, dtype=torch.float64, requires_grad=True)
    bm = torch.randn(7, 16, dtype=torch.float64, requires_grad=True)

    def f(x, a, bm):
        torch.manual_seed(5)  # the same mask at every evaluation
        return fast_lora.fused_lora_linear(x, w, None, a, bm, 2.0, 0.3, training=True)

    assert torch.autograd.gradcheck(f, (x, a, bm))


def test_eval_mode_has_no_dropout() -> None:
    torch.manual_seed(2)
    x, w = torch.randn(4, 32, dtype=torch.float64), torch.randn(8, 32, dtype=torch.float64)
    a, bm = torch.randn(16, 32, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    y = fast_lora.fused_lora_linear(x, w, None, a, bm, 1.0, 0.5, training=False)
    torch.testing.assert_close(y, _reference(x, w, None, a, bm, 1.0, None, 0.0))


def _peft_model(dropout: float, r: int = 16):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    base = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 24, bias=False))
    cfg = LoraConfig(r=r, lora_alpha=8, lora_dropout=dropout, target_modules=["0", "2"])
    model = get_peft_model(base, cfg)
    for mod in model.modules():  # non-zero B so the adapter contributes
        if hasattr(mod, "lora_B"):
            for lin in mod.lora_B.values():
                torch.nn.init.normal_(lin.weight)
    return model


def test_apply_equals_peft_without_dropout_and_trains_the_same_parameters() -> None:
    ref = _peft_model(0.0)
    fused = _peft_model(0.0)
    counts = fast_lora.apply(fused)
    assert counts == {"fused": 2, "skipped": {}}
    x = torch.randn(6, 24)
    torch.testing.assert_close(fused(x), ref(x))
    ref(x).square().sum().backward()
    fused(x).square().sum().backward()
    got = {n: p.grad for n, p in fused.named_parameters() if p.requires_grad}
    want = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
    assert got.keys() == want.keys() and len(got) == 4
    for name in got:
        torch.testing.assert_close(got[name], want[name])


def test_apply_dropout_in_training_and_not_in_eval() -> None:
    model = _peft_model(0.2)
    fast_lora.apply(model)
    x = torch.randn(6, 24)
    model.train()
    torch.manual_seed(10)
    y1 = model(x)
    torch.manual_seed(10)
    assert torch.equal(model(x), y1)  # the mask follows torch's RNG
    torch.manual_seed(11)
    assert not torch.allclose(model(x), y1)  # a fresh mask per step
    model.eval()
    peft_eval = _peft_model(0.2).eval()
    torch.testing.assert_close(model(x), peft_eval(x))
    with model.disable_adapter():
        assert not torch.allclose(model(x), peft_eval(x))  # disabled adapters fall back to the base


def test_apply_skips_what_it_cannot_fuse() -> None:
    model = _peft_model(0.1, r=8)
    counts = fast_lora.apply(model)
    assert counts["fused"] == 0 and "rank 8" in next(iter(counts["skipped"]))


@pytest.mark.slow
def test_triton_kernels_match_the_reference_in_the_interpreter() -> None:
    pytest.importorskip("triton")
    script = textwrap.dedent(
        """
        import sys, torch
        sys.path.insert(0, sys.argv[1])
        import fast_lora
        from fast_lora_kernels import keep_mask_kernel, dropout_lora_a_fwd, dropout_lora_bwd
        torch.manual_seed(0)
        m, k, r, p, seed = 70, 300, 16, 0.25, 12345
        kb = -(-k // 128)
        out = torch.full((m, k), 7, dtype=torch.uint8)
        keep_mask_kernel[(-(-m // 32), kb)](out, m, k, kb, seed, fast_lora.threshold(p), BM=32)
        ref = fast_lora.keep_mask(seed, m, k, p)
        assert torch.equal(out.bool(), ref), "mask"
        x = torch.randn(m, k)
        a = torch.randn(r, k)
        h = torch.zeros(2, m, r)
        dropout_lora_a_fwd[(-(-m // 32), 2)](x, a, h, m, k, kb, x.stride(0), h.stride(1), seed,
                                             fast_lora.threshold(p), 2, R=r, BM=32, DROPOUT=True)
        torch.testing.assert_close(h.sum(0), (x * ref) @ a.t(), rtol=1e-4, atol=1e-3)
        gs = torch.randn(m, r)
        gx0 = torch.randn(m, k)
        gx = gx0.clone()
        ga = torch.zeros(-(-m // 64), r, k)
        inv = 1 / (1 - fast_lora.threshold(p) / 65536)
        dropout_lora_bwd[(-(-m // 64), kb)](x, gs, a, gx, ga, m, k, kb, x.stride(0), gx.stride(0), gs.stride(0),
                                            seed, fast_lora.threshold(p), inv, 64, R=r, BM=32, HAS_GX=True)
        torch.testing.assert_close(gx, gx0 + (gs @ a) * ref * inv, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(ga.sum(0), gs.t() @ (x * ref) * inv, rtol=1e-4, atol=1e-3)
        print("ok")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", script, str(TRAINER)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
