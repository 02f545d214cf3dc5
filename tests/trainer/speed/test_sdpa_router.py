"""One router owns Transformers' SDPA slot (trainer/speed/sdpa_router.py, issue #41 (4)): each call goes to the kernel
its module is routed to, a kernel that declines and an unrouted module run the replaced function, two levers
(FA4 for SigLIP in fa4_attention, cuDNN with grouped kv heads for the language model in lm_attention) install one
wrapper between them and each gets only its own layers, and on CPU the levers leave SDPA as it is. FA4's and cuDNN's
kernels need a GPU: recording stand-ins compute the same function here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from trainer.job.arguments import parse_args
from trainer.speed import fa4_attention, lm_attention, sdpa_router, speed_levers
from trainer.worker.model import load_model


@pytest.fixture()
def sdpa_restored(monkeypatch):
    """Transformers' own function back in its slot after the test, the router's routes as they were."""
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"])
    monkeypatch.setattr(sdpa_router, "KERNELS", dict(sdpa_router.KERNELS))
    return ALL_ATTENTION_FUNCTIONS["sdpa"]


def qkv(seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, 5, 8, generator=g).to(dtype) for _ in range(3))


def test_each_call_goes_to_its_modules_kernel_and_the_rest_to_sdpa(sdpa_restored) -> None:
    calls: list[tuple[str, object]] = []

    def kernel(name: str, declines: bool = False):
        def run(module, query, key, value, attention_mask, **kwargs):
            calls.append((name, module))
            return None if declines else (f"{name} output", None)
        return run

    a, b, c, plain = (torch.nn.Module() for _ in range(4))
    assert sdpa_router.route([a], "a", kernel("a")) == 1
    assert sdpa_router.route([b], "b", kernel("b")) == 1
    sdpa_router.route([c], "declines", kernel("declines", declines=True))
    router = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert router.original is sdpa_restored, "one wrapper, over Transformers' own function"
    q, k, v = qkv()
    want = sdpa_restored(plain, q, k, v, None)[0]
    assert router(a, q, k, v, None)[0] == "a output"
    assert router(b, q, k, v, None)[0] == "b output"
    torch.testing.assert_close(router(c, q, k, v, None)[0], want)  # declined: SDPA's own result
    torch.testing.assert_close(router(plain, q, k, v, None)[0], want)  # not routed
    assert calls == [("a", a), ("b", b), ("declines", c)]
    assert sdpa_router.remove() and ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_restored
    assert not sdpa_router.remove()
    torch.testing.assert_close(ALL_ATTENTION_FUNCTIONS["sdpa"](a, q, k, v, None)[0], want)


@pytest.fixture()
def inputs(processor):
    images = [[Image.new("RGB", (64, 64), c)] for c in ((200, 30, 30), (20, 90, 200))]
    texts = [f"{processor.boi_token} a red square," + " described at some length" * 12, f"{processor.boi_token} blue"]
    return processor(text=texts, images=images, return_tensors="pt", padding=True)


def test_both_levers_share_one_router_and_each_gets_its_own_layers(tiny_model: Path, inputs, monkeypatch,
                                                                  sdpa_restored) -> None:
    args = parse_args([f"--model_id={tiny_model}", "--use_gpu=false", "--quantization=none",
                       "--attn_implementation=sdpa"])
    model = load_model(args, tiny_model, torch.device("cpu")).to(torch.bfloat16)
    batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
    want = model(**batch).logits
    fa4_calls, gqa_calls = [], []
    sdpa = F.scaled_dot_product_attention

    def fa4_stand_in(q, k, v, scale=None, pad_to=-1):  # FA4's kernel runs on GPUs only: the same function here
        fa4_calls.append(tuple(q.shape))
        return sdpa(q, k, v, scale=scale)

    def spy(*a, **kw):
        if kw.get("enable_gqa") is not None:
            gqa_calls.append(kw["attn_mask"] is not None)
        return sdpa(*a, **kw)

    monkeypatch.setattr(fa4_attention, "attention_bhsd", fa4_stand_in)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    core = model.model
    vision_layers = core.vision_tower.config.num_hidden_layers
    lm_layers = core.language_model.config.num_hidden_layers
    assert fa4_attention.route_vision_attention(core.vision_tower) == vision_layers
    assert lm_attention.lm_attention_cudnn(core.language_model, require_hopper=False) == lm_layers
    router = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert router.original is sdpa_restored, "the second lever found the router: one wrapper, not two"
    got = model(**batch).logits
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert len(fa4_calls) == vision_layers  # SigLIP's layers through FA4, padded no further here
    assert gqa_calls == [True] * lm_layers  # the language model's through cuDNN-GQA, its mask kept


def test_on_cpu_the_levers_leave_sdpa_as_it_is(tiny_model: Path, inputs, sdpa_restored) -> None:
    args = parse_args([f"--model_id={tiny_model}", "--use_gpu=false", "--quantization=none",
                       "--attn_implementation=sdpa", "--lm_attention=cudnn", "--vision_attention=auto"])
    model = load_model(args, tiny_model, torch.device("cpu"))
    want = model(**inputs).logits
    levers = speed_levers.apply(args, model)
    assert levers["lm_attention"] == {"cudnn_gqa_layers": 0}
    assert levers["vision_attention"]["kernel"] == "sdpa"
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_restored, "no GPU: nothing in SDPA's slot but SDPA"
    torch.testing.assert_close(model(**inputs).logits, want)


def test_a_routed_call_the_kernel_cannot_take_runs_sdpa(sdpa_restored) -> None:
    """FA4 takes no mask and no fp32; cuDNN-GQA takes no float mask: both decline and SDPA runs the call."""
    module = SimpleNamespace(is_causal=False)
    q, k, v = qkv(1)
    assert fa4_attention.routed(module, q, k, v, None) is None  # fp32
    qb, kb, vb = qkv(1, torch.bfloat16)
    assert fa4_attention.routed(module, qb, kb, vb, torch.ones(1, 1, 5, 5, dtype=torch.bool)) is None
    assert lm_attention.cudnn_gqa(module, q, k, v, torch.zeros(1, 1, 5, 5)) is None
