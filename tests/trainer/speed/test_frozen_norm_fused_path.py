"""Issue #45: with `frozen_norms` on, every fused LoRA group of the vision tower still takes the fused path under
bf16 autocast, as it does with the lever off (tiny Gemma 3 in bf16, CPU; CUDA autocast's float32 layer_norm given
by the stand-in of test_frozen_norm.py). At 12c4e6a the lever sent 760 of 976 fused calls of a GPU step to PEFT's
unfused path: the norm's float32 output differed from the layers' bf16 weights."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.trainer.speed.test_frozen_norm import cuda_autocast_policy  # noqa: F401 - fixture
from tests.trainer.speed.test_vision_kernels import images, model_for
from trainer.speed import fast_lora_peft, frozen_norm


def usable_answers(monkeypatch) -> list[bool]:
    """Each answer of the fused path's input check (`_usable`: False sends the call to PEFT's unfused layer)."""
    answers: list[bool] = []
    real = fast_lora_peft._usable

    def recording(layer, x, args, kwargs):
        answers.append(real(layer, x, args, kwargs))
        return answers[-1]

    monkeypatch.setattr(fast_lora_peft, "_usable", recording)
    return answers


def vision_step(core, pixels) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = core.vision_tower(pixels).last_hidden_state
    out.float().square().mean().backward()
    return out


def test_frozen_norms_keep_every_vision_lora_call_fused_and_activations_bf16(tiny_model: Path, monkeypatch,
                                                                          cuda_autocast_policy):  # noqa: F811
    _, model = model_for(tiny_model, "--fused_lora=true", "--lora_r=16")
    model = model.to(torch.bfloat16).train()
    core = model.base_model.model.model
    assert fast_lora_peft.apply(model)["fused"] > 0
    layers = core.vision_tower.config.num_hidden_layers
    assert frozen_norm.apply_to(core.vision_tower) == 2 * layers + 1
    answers = usable_answers(monkeypatch)
    out = vision_step(core, images(core).to(torch.bfloat16))
    # every SigLIP layer: the q/k/v group, out_proj, fc1, fc2 each ask once
    assert len(answers) >= 4 * layers
    assert all(answers), f"{answers.count(False)} of {len(answers)} fused LoRA calls fell back to PEFT's layer"
    assert out.dtype == torch.bfloat16
    assert not cuda_autocast_policy  # no frozen norm ran in float32
