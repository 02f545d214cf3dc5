"""The fused LoRA layer (trainer/speed/fast_lora.py, wired by fast_lora_peft.py): its mask generator, its autograd math, its PEFT hook,
and (Triton's interpreter, on CPU) its kernels against the PyTorch reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.speed import fast_lora, fast_lora_peft

ROOT = Path(__file__).resolve().parents[3]  # holds the trainer package


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
    # every bit of a byte (both 16-bit halves of all four Philox words) drops at the rate p
    per_bit = 1.0 - mask.float().reshape(300, 125, 8).mean(dim=(0, 1))
    assert torch.all((per_bit - p).abs() < 6 * (p * (1 - p) / (300 * 125)) ** 0.5)
    assert fast_lora.dropout_fraction_error(p) < 1e-5


def test_keep_bits_layout_is_the_documented_one() -> None:
    # element (r, 8c + j): Philox at counter r * ceil(k/8) + c, word j // 2, 16-bit half j % 2, kept if >= threshold
    seed, m, k, p = 99, 5, 21, 0.3
    mask = fast_lora.keep_mask(seed, m, k, p)
    kb8 = 3
    for r, col in ((0, 0), (1, 9), (4, 20), (3, 15), (2, 7)):
        c, j = divmod(col, 8)
        words = fast_lora.philox4x32(torch.tensor([r * kb8 + c], dtype=torch.int64), seed)
        half = (int(words[j // 2][0]) >> (16 * (j % 2))) & 0xFFFF
        assert bool(mask[r, col]) == (half >= fast_lora.threshold(p))


def _members(k: int, ns: tuple[int, ...], with_bias: bool, dtype=torch.float64):
    out = []
    for n in ns:
        w = torch.randn(n, k, dtype=dtype)
        b = torch.randn(n, dtype=dtype) if with_bias else None
        a = torch.randn(16, k, dtype=dtype, requires_grad=True)
        bm = torch.randn(n, 16, dtype=dtype, requires_grad=True)
        out.append((w, b, a, bm, None))
    return out


def _reference(x, w, b, a, bm, s, keep, p_eff):
    d = x * keep / (1 - p_eff) if keep is not None else x
    y = x @ w.t() + s * (d @ a.t()) @ bm.t()
    return y + b if b is not None else y


@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("ns", [(45,), (45, 20, 20)])
def test_fused_group_matches_the_explicit_formula(p: float, with_bias: bool, ns: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    m, k, s = 37, 200, 0.5
    x = torch.randn(3, m, k, dtype=torch.float64, requires_grad=True)
    members = _members(k, ns, with_bias)
    torch.manual_seed(123)
    ys = fast_lora.fused_lora_group(x, members, s, p, training=True)
    torch.manual_seed(123)
    seed = int(torch.randint(0, fast_lora.SEED_MAX, (1,)).item())
    p_eff = fast_lora.threshold(p) / 2**16
    refs = []
    for i, (w, b, a, bm, _) in enumerate(members):  # member i: its own mask, key seed + i
        keep = fast_lora.keep_mask(seed + i, 3 * m, k, p).reshape(3, m, k) if p else None
        refs.append(_reference(x, w, b, a, bm, s, keep, p_eff))
    for y, ref in zip(ys, refs, strict=True):
        torch.testing.assert_close(y, ref)
    if p and len(ns) > 1:
        assert not torch.equal(fast_lora.keep_mask(seed, 3 * m, k, p), fast_lora.keep_mask(seed + 1, 3 * m, k, p))
    gys = [torch.randn_like(r) for r in refs]
    leaves = [x] + [t for mem in members for t in (mem[2], mem[3])]
    got = torch.autograd.grad(ys, leaves, gys)
    want = torch.autograd.grad(refs, leaves, gys)
    for g, wnt in zip(got, want, strict=True):
        torch.testing.assert_close(g, wnt)


def test_fused_group_gradcheck() -> None:
    torch.manual_seed(1)
    x = torch.randn(3, 20, dtype=torch.float64, requires_grad=True)
    members = _members(20, (7, 3), with_bias=False)
    leaves = [t for mem in members for t in (mem[2], mem[3])]

    def f(x, *leaves):
        torch.manual_seed(5)  # the same masks at every evaluation
        mems = [(w, b, leaves[2 * i], leaves[2 * i + 1], None) for i, (w, b, _, _, _) in enumerate(members)]
        return fast_lora.fused_lora_group(x, mems, 2.0, 0.3, training=True)

    assert torch.autograd.gradcheck(f, (x, *leaves), fast_mode=True)


def test_eval_mode_has_no_dropout() -> None:
    torch.manual_seed(2)
    x, w = torch.randn(4, 32, dtype=torch.float64), torch.randn(8, 32, dtype=torch.float64)
    a, bm = torch.randn(16, 32, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    y = fast_lora.fused_lora_linear(x, w, None, a, bm, 1.0, 0.5, training=False)
    torch.testing.assert_close(y, _reference(x, w, None, a, bm, 1.0, None, 0.0))


class Block(torch.nn.Module):
    """An attention-like block: q/k/v read one input (a group), o alone; an MLP's gate/up (a group) and down."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(24, d) for d in (32, 16, 16))
        self.o_proj = torch.nn.Linear(64, 24, bias=False)
        self.gate_proj, self.up_proj = torch.nn.Linear(24, 40, bias=False), torch.nn.Linear(24, 40, bias=False)
        self.down_proj = torch.nn.Linear(40, 24, bias=False)

    def forward(self, x):
        h = self.o_proj(torch.cat([self.q_proj(x), self.k_proj(x), torch.tanh(self.v_proj(x))], dim=-1))
        h = x + h
        return self.down_proj(torch.nn.functional.gelu(self.gate_proj(h)) * self.up_proj(h))


NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_model(dropout: float, r: int = 16):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    model = get_peft_model(Block().double(), LoraConfig(r=r, lora_alpha=8, lora_dropout=dropout, target_modules=NAMES))
    for mod in model.modules():  # non-zero B so the adapter contributes
        if hasattr(mod, "lora_B"):
            for lin in mod.lora_B.values():
                torch.nn.init.normal_(lin.weight)
    return model


class SeededDropout(torch.nn.Module):
    """PEFT's dropout slot with the fused layers' mask: `keep_mask(seed)` scaled by 1 / P(keep)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p, self.seed = p, 0

    def forward(self, x):
        keep = fast_lora.keep_mask(self.seed, x[..., 0].numel(), x.shape[-1], self.p).reshape(x.shape)
        return x * keep * fast_lora.inv_keep(self.p)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_apply_equals_peft_layers_forward_and_gradients(p: float) -> None:
    # PEFT's own LoRA layers, their dropout drawing the fused layers' masks: the same y and gradients of x, A, B
    ref, fused = _peft_model(p), _peft_model(p)
    counts = fast_lora_peft.apply(fused)
    assert counts == {"fused": 7, "groups": 4, "skipped": {}}  # {q,k,v}, {o}, {gate,up}, {down}
    x = torch.randn(2, 6, 24, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(10)
    seeds = iter([int(torch.randint(0, fast_lora.SEED_MAX, (1,)).item()) for _ in range(4)])  # one per group call
    group_of = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 2, "up_proj": 2, "down_proj": 3}
    first = [next(seeds) for _ in range(4)]
    for name in NAMES:
        layer = getattr(ref.base_model.model, name)
        drop = SeededDropout(p)
        members = [n for n, g in group_of.items() if g == group_of[name]]
        drop.seed = first[group_of[name]] + members.index(name)  # call order inside the block
        layer.lora_dropout["default"] = drop
    torch.manual_seed(10)
    y = fused(x)
    x_ref = x.detach().clone().requires_grad_()
    want = ref(x_ref)
    torch.testing.assert_close(y, want)
    gy = torch.randn_like(y)
    y.backward(gy)
    want.backward(gy)
    torch.testing.assert_close(x.grad, x_ref.grad)
    got, wanted = _grads(fused), _grads(ref)
    assert got.keys() == wanted.keys() and len(got) == 14
    for name in got:
        torch.testing.assert_close(got[name], wanted[name])


def test_group_runs_once_per_input_and_members_alone_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _peft_model(0.1)
    fast_lora_peft.apply(model)
    calls: list[int] = []
    real = fast_lora.fused_lora_group

    def counting(x, members, *args, **kwargs):
        calls.append(len(members))
        return real(x, members, *args, **kwargs)

    monkeypatch.setattr(fast_lora, "fused_lora_group", counting)
    block = model.base_model.model
    x = torch.randn(3, 24, dtype=torch.float64)
    block(x)
    assert calls == [3, 1, 2, 1]  # q/k/v, o, gate/up, down
    calls.clear()
    block.q_proj(x)
    block.k_proj(x.clone())  # another tensor: computed alone (its stashed output is not for this input)
    assert calls == [3, 3]
    with torch.no_grad():  # another grad mode: not served from the stash
        block.v_proj(x)
    assert calls == [3, 3, 3]


def test_apply_dropout_in_training_and_not_in_eval() -> None:
    model = _peft_model(0.2)
    fast_lora_peft.apply(model)
    x = torch.randn(6, 24, dtype=torch.float64)
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
    counts = fast_lora_peft.apply(model)
    assert counts["fused"] == 0 and "rank 8" in next(iter(counts["skipped"]))


KERNEL_SCRIPT = """
import torch
from trainer.speed import fast_lora
from trainer.speed.fast_lora_kernels import lora_fwd, lora_bwd
torch.manual_seed(0)
for (m, k, n, bm, bk) in ((70, 300, 1, 32, 64), (50, 200, 3, 16, 128)):
    r, p, seed = 16, 0.25, 12345
    kb8 = -(-k // 8)
    x = torch.randn(m, k)
    As = [torch.randn(r, k) for _ in range(n)]
    a0, a1, a2 = (As + [As[0]] * 2)[:3]
    h = torch.full((n, m, r), float("nan"))
    bits = torch.full((n, m, kb8), 77, dtype=torch.uint8)
    lora_fwd[(-(-m // bm),)](x, a0, a1, a2, h, bits, m, k, kb8, x.stride(0), seed, fast_lora.threshold(p), 0.5,
                             NS=n, R=r, BM=bm, BK=bk)
    for i in range(n):
        ref_bits = fast_lora.keep_bits(seed + i, m, k, p)
        assert torch.equal(bits[i], ref_bits), ("bits", i)
        keep = fast_lora.unpack_bits(ref_bits, k)
        torch.testing.assert_close(h[i], 0.5 * (x * keep) @ As[i].t(), rtol=1e-4, atol=1e-3)
    gs = torch.randn(n, m, r)
    gx0 = torch.randn(m, k)
    gx = gx0.clone()
    rows_per = 2 * bm
    n_m = -(-m // rows_per)
    ga = torch.full((n, n_m, r, k), float("nan"))
    lora_bwd[(n_m, -(-k // bk))](x, gx, gs, a0, a1, a2, bits, ga, m, k, kb8, x.stride(0), gx.stride(0), rows_per,
                                 0.7, NS=n, R=r, BM=bm, BK=bk, HAS_GX=True)
    want = gx0.clone()
    for i in range(n):
        keep = fast_lora.unpack_bits(bits[i], k)
        want += 0.7 * (gs[i] @ As[i]) * keep
        torch.testing.assert_close(ga[i].sum(0), 0.7 * gs[i].t() @ (x * keep), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(gx, want, rtol=1e-4, atol=1e-3)
print("ok")
"""


@pytest.mark.slow
def test_triton_kernels_match_the_reference_in_the_interpreter() -> None:
    # the mask bits bit for bit, h, the in-place gx and gA of a single layer and of a group of 3
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", KERNEL_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
