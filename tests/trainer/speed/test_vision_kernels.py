"""SigLIP's kernels chosen by the device (issue #33): the FA4 route sends the vision tower's attention only and
keeps the logits, a failing FA4 self-test falls back to cuDNN, an unknown GPU keeps SDPA's order, and the frozen
LayerNorms keep the function and its input gradient (tiny Gemma 3, CPU; FA4's kernel itself needs a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from peft import get_peft_model

from trainer.job.arguments import parse_args
from trainer.speed import capability, fa4_attention, frozen_norm, vision_attention
from trainer.worker.model import load_model, lora_config

CPU = ["--use_gpu=false", "--quantization=none", "--lora_r=4", "--attn_implementation=sdpa"]


def model_for(tiny_model: Path, *flags: str):
    args = parse_args([*CPU, f"--model_id={tiny_model}", *flags])
    return args, get_peft_model(load_model(args, tiny_model, torch.device("cpu")), lora_config(args))


def images(core, n: int = 2, seed: int = 0) -> torch.Tensor:
    side = core.vision_tower.config.image_size
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(seed))


@pytest.fixture()
def sdpa_restored(monkeypatch):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"])


def test_fa4_route_takes_the_vision_tower_only_and_keeps_its_output(tiny_model: Path, monkeypatch, sdpa_restored):
    _, model = model_for(tiny_model)
    model = model.to(torch.bfloat16)
    core = model.base_model.model.model
    pixels = images(core).to(torch.bfloat16)
    want = core.vision_tower(pixels).last_hidden_state
    calls = []

    def stand_in(q, k, v, scale=None, pad_to=None):  # FA4's kernel runs on GPUs only: the same function here
        calls.append((tuple(q.shape), pad_to))
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    monkeypatch.setattr(fa4_attention, "attention_bhsd", stand_in)
    layers = core.vision_tower.config.num_hidden_layers
    assert fa4_attention.route_vision_attention(core.vision_tower) == layers
    got = core.vision_tower(pixels).last_hidden_state
    torch.testing.assert_close(got, want)
    assert len(calls) == layers
    n_lm_calls = len(calls)
    ids = torch.tensor([[2, 10, 11, 12]])
    core.language_model(input_ids=ids)
    assert len(calls) == n_lm_calls  # the language model keeps its own attention


def test_padding_the_head_dim_keeps_attention_exact():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 72, dtype=torch.float64) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v)
    pad = lambda t: F.pad(t, (0, 96 - 72))  # noqa: E731 - what attention_bhsd does before FA4
    got = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), scale=72 ** -0.5)[..., :72]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("cap", "available", "self_test_ok", "kernel"), [
    ((9, 0), {"fa4"}, True, "fa4"),
    ((10, 0), {"fa4"}, True, "fa4"),
    ((9, 0), {"fa4"}, False, "cudnn"),  # FA4's self-test fails: cuDNN, said in the levers
    ((9, 0), set(), True, "cudnn"),
    ((8, 0), {"fa4"}, True, "sdpa"),
    ((12, 1), {"fa4"}, True, "sdpa"),  # unknown architecture: the portable path
])
def test_speed_levers_choose_siglip_attention_by_capability(tiny_model: Path, monkeypatch, sdpa_restored, cap,
                                                            available, self_test_ok, kernel):
    args, model = model_for(tiny_model, "--vision_attention=auto")
    monkeypatch.setattr(capability, "device_capability", lambda: cap)
    monkeypatch.setattr(capability, "available_packages", lambda: frozenset(available))

    def self_test(*a, **k):
        if not self_test_ok:
            raise AssertionError("FA4 disagrees with SDPA: relative errors {'dq': 1.3}")
        return {"out": 0.004}

    monkeypatch.setattr(fa4_attention, "self_test", self_test)
    routed, cudnn = [], []
    monkeypatch.setattr(fa4_attention, "route_vision_attention", lambda tower: routed.append(tower) or 2)
    monkeypatch.setattr(vision_attention, "prefer_cudnn", lambda tower: cudnn.append(tower))
    levers = vision_attention.vision_kernels(args, model, capability.plan())
    assert levers["kernel"] == kernel
    assert bool(routed) == (kernel == "fa4") and bool(cudnn) == (kernel == "cudnn")
    if not self_test_ok:
        assert "dq" in levers["fa4"]


def test_frozen_layer_norms_of_the_vision_tower_keep_output_and_input_gradient(tiny_model: Path):
    _, model = model_for(tiny_model)
    core = model.base_model.model.model
    pixels = images(core).requires_grad_()
    out = core.vision_tower(pixels).last_hidden_state
    (g_want,) = torch.autograd.grad(out.square().sum(), (pixels,))
    layers = core.vision_tower.config.num_hidden_layers
    assert frozen_norm.apply_to(core.vision_tower) == 2 * layers + 1  # layer_norm1/2 of each layer, post_layernorm
    got = core.vision_tower(pixels).last_hidden_state
    (g_got,) = torch.autograd.grad(got.square().sum(), (pixels,))
    torch.testing.assert_close(got, out)
    torch.testing.assert_close(g_got, g_want)
    lora = [p for n, p in model.named_parameters() if "lora_" in n and "vision" in n]
    assert lora and all(p.requires_grad for p in lora)
