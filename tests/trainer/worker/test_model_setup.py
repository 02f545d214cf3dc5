"""Model setup switches: where LoRA goes, the frozen vision tower, the tied embeddings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import get_peft_model

from trainer.job.arguments import parse_args
from trainer.worker.model import load_model, lora_config

CPU = ["--use_gpu=false", "--quantization=none"]
LORA_R = 4


def trainable(tiny_model: Path, *flags: str) -> tuple[dict[str, int], torch.nn.Module]:
    args = parse_args([*CPU, f"--model_id={tiny_model}", f"--lora_r={LORA_R}", *flags])
    model = get_peft_model(load_model(args, tiny_model, torch.device("cpu")), lora_config(args))
    return {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}, model


def test_all_linear_reaches_the_vision_tower(tiny_model: Path) -> None:
    params, _ = trainable(tiny_model)
    assert any("vision_tower" in n for n in params) and any("language_model" in n for n in params)
    assert all("lora_" in n for n in params)  # embeddings and LM head stay frozen by default


def test_freeze_vision_trains_only_the_language_model(tiny_model: Path) -> None:
    params, model = trainable(tiny_model, "--lora_target=language-model", "--freeze_vision=true")
    assert params and all("language_model" in n and "lora_" in n for n in params)
    tower = model.base_model.model.model.vision_tower
    side = tower.config.image_size
    features = tower(pixel_values=torch.zeros(1, 3, side, side, requires_grad=True)).last_hidden_state
    assert not features.requires_grad  # no autograd graph through SigLIP at all


def test_train_embeddings_keeps_one_tied_copy(tiny_model: Path) -> None:
    params, model = trainable(tiny_model, "--train_embeddings=true")
    base, _ = trainable(tiny_model)
    vocab, hidden = model.get_input_embeddings().weight.shape
    assert sum(params.values()) - sum(base.values()) == vocab * hidden  # not two copies (the tutorial untied)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize("flag", ["--lora_target=language-model"])
def test_language_model_target_without_freezing_is_allowed(tiny_model: Path, flag: str) -> None:
    params, _ = trainable(tiny_model, flag)
    assert params and not any("vision_tower" in n for n in params)
