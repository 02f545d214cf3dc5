"""Image-feature reuse under a frozen vision tower (trainer/feature_cache.py) and the SigLIP attention
switch (trainer/vision_attention.py), on the tiny Gemma 3."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import get_peft_model

from trainer.job.arguments import parse_args
from trainer.speed import feature_cache, vision_attention
from trainer.worker.model import load_model, lora_config

CPU = ["--use_gpu=false", "--quantization=none", "--lora_r=4"]


def model_for(tiny_model: Path, *flags: str):
    args = parse_args([*CPU, f"--model_id={tiny_model}", *flags])
    return get_peft_model(load_model(args, tiny_model, torch.device("cpu")), lora_config(args))


def images(n: int, side: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(seed))


def test_cached_features_equal_computed_ones_and_are_computed_once(tiny_model: Path) -> None:
    model = model_for(tiny_model, "--lora_target=language-model", "--freeze_vision=true")
    core = feature_cache.core_model(model)
    side = core.vision_tower.config.image_size
    compute = core.get_image_features
    cache = feature_cache.attach(model, max_gib=1.0)
    a, b = images(3, side, 0), images(2, side, 1)
    first = core.get_image_features(a).pooler_output
    assert (cache.hits, cache.misses) == (0, 3)
    torch.testing.assert_close(first, compute(a).pooler_output)
    # a batch mixing seen and unseen images, in another order: only the unseen ones are computed
    mixed = torch.cat([b[:1], a[2:], a[:1], b[1:]])
    got = core.get_image_features(mixed).pooler_output
    assert (cache.hits, cache.misses) == (2, 5)
    torch.testing.assert_close(got, compute(mixed).pooler_output)
    # one changed pixel is another image
    c = a[:1].clone()
    c[0, 0, 0, 0] += 1.0
    core.get_image_features(c)
    assert cache.misses == 6


def test_cache_budget_stops_storing_but_stays_correct(tiny_model: Path) -> None:
    model = model_for(tiny_model, "--lora_target=language-model", "--freeze_vision=true")
    core = feature_cache.core_model(model)
    side = core.vision_tower.config.image_size
    compute = core.get_image_features
    cache = feature_cache.attach(model, max_gib=0.0)
    a = images(2, side, 3)
    core.get_image_features(a)
    got = core.get_image_features(a).pooler_output
    assert cache.hits == 0 and cache.misses == 4 and not cache.store
    torch.testing.assert_close(got, compute(a).pooler_output)


def test_cache_refuses_a_trainable_vision_tower(tiny_model: Path) -> None:
    model = model_for(tiny_model)  # LoRA on all linear layers: SigLIP's features change every step
    with pytest.raises(ValueError, match="trainable"):
        feature_cache.attach(model, max_gib=1.0)


def test_prefer_cudnn_keeps_the_function(tiny_model: Path) -> None:
    model = model_for(tiny_model, "--attn_implementation=sdpa")
    tower = feature_cache.core_model(model).vision_tower
    side = tower.config.image_size
    x = images(2, side, 4)
    want = tower(pixel_values=x).last_hidden_state
    vision_attention.prefer_cudnn(tower)
    torch.testing.assert_close(tower(pixel_values=x).last_hidden_state, want)



def test_epoch_log_prints_reused_and_computed_features(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    model = model_for(tiny_model, "--lora_target=language-model", "--freeze_vision=true")
    core = feature_cache.core_model(model)
    cache = feature_cache.attach(model, max_gib=1.0)
    pics = images(2, core.vision_tower.config.image_size, 6)
    log = feature_cache.epoch_log_callback(cache)
    log.on_train_begin(None, None, None)
    for _ in range(2):
        core.get_image_features(pics)
    log.on_epoch_end(SimpleNamespace(process_index=0), SimpleNamespace(epoch=2.0), None)
    log.on_epoch_end(SimpleNamespace(process_index=1), SimpleNamespace(epoch=2.0), None)  # rank 1 prints nothing
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[trainer] image features at epoch 2.00: 2 reused, 2 computed, ")


def test_apply_reports_the_step_levers(tiny_model: Path) -> None:
    from trainer.speed import speed_levers

    args = parse_args([*CPU, f"--model_id={tiny_model}", "--attn_implementation=sdpa", "--lm_attention=cudnn",
                       "--lean_step=true"])
    model = get_peft_model(load_model(args, tiny_model, torch.device("cpu")), lora_config(args))
    levers = speed_levers.apply(args, model)
    # no Hopper GPU here: the language model keeps Transformers' attention; the image-token check moves on device
    assert levers["lm_attention"] == {"cudnn_gqa_layers": 0}
    assert levers["lean_step"] == {"device_image_token_check": True, "contiguous_patch_embeddings": True,
                                   "deferred_metrics": False, "device_nan_filter": False}
