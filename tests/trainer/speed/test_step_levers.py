"""The lean step (trainer/speed/step_levers.py) and the language model's attention lever
(trainer/speed/lm_attention.py) on the tiny Gemma 3, CPU: the language model's attention through SDPA with grouped
kv heads equals Transformers' path, the image-token check on the device keeps its mask and
still refuses a mismatch, and deferred metrics log what TRL logs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from localkit.sample_data import build_sample_dataset
from trainer.job.arguments import parse_args
from trainer.speed import lm_attention, step_levers
from trainer.worker.model import build_trainer, load_model


@pytest.fixture()
def inputs(processor):
    images = [[Image.new("RGB", (64, 64), c)] for c in ((200, 30, 30), (20, 90, 200))]
    texts = [f"{processor.boi_token} a red square," + " described at some length" * 12, f"{processor.boi_token} blue"]
    return processor(text=texts, images=images, return_tensors="pt", padding=True)


def tiny(tiny_model: Path):
    args = parse_args([f"--model_id={tiny_model}", "--use_gpu=false", "--quantization=none", "--attn_implementation=sdpa"])
    return load_model(args, tiny_model, torch.device("cpu"))


def test_lm_attention_with_grouped_kv_equals_transformers_path(tiny_model: Path, inputs, monkeypatch) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = tiny(tiny_model)
    want = model(**inputs).logits
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"])
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("enable_gqa"), kwargs.get("attn_mask") is not None))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    assert lm_attention.lm_attention_cudnn(model.model.language_model, require_hopper=False) == 2
    got = model(**inputs).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert calls.count((True, True)) == 2  # both layers: kv heads grouped, not repeated; the mask kept
    # the vision tower (no kv groups) keeps Transformers' path
    assert len(calls) > 2 and all(c != (True, True) for c in calls[:-2])


def test_device_image_token_check_keeps_the_mask_and_refuses_a_mismatch(tiny_model: Path, inputs) -> None:
    model = tiny(tiny_model)
    want = model(**inputs).logits
    core = model.model
    assert step_levers.device_image_token_check(core)
    torch.testing.assert_close(model(**inputs).logits, want)
    broken = dict(inputs)
    ids = broken["input_ids"].clone()
    ids[ids == model.config.image_token_id] = 0  # fewer image tokens than features
    broken["input_ids"] = ids
    with pytest.raises(RuntimeError, match="Image features and image tokens do not match"):
        model(**broken)


def test_contiguous_patch_embeddings_keep_the_values_and_the_encoder_layout(tiny_model: Path) -> None:
    tower = tiny(tiny_model).model.vision_tower
    x = torch.randn(2, 3, 64, 64)
    layers = [m for m in tower.modules() if type(m).__name__ == "SiglipEncoderLayer"]
    seen: list[torch.Tensor] = []
    layers[-1].register_forward_hook(lambda _m, _i, out: seen.append(out[0] if isinstance(out, tuple) else out))
    want = tower(pixel_values=x).last_hidden_state
    assert not seen[-1].is_contiguous()  # the convolution's transposed layout, through every layer
    assert step_levers.contiguous_patch_embeddings(tower)
    torch.testing.assert_close(tower(pixel_values=x).last_hidden_state, want)
    assert seen[-1].is_contiguous()


def test_device_nan_filter_replaces_a_non_finite_loss_as_the_trainer_does() -> None:
    from types import SimpleNamespace as NS

    losses = iter([torch.tensor(2.0), torch.tensor(float("nan")), torch.tensor(float("inf"))])
    trainer = NS(args=NS(logging_nan_inf_filter=True), training_step=lambda *a, **k: next(losses),
                 _tr_loss=torch.tensor(6.0), _globalstep_last_logged=3, state=NS(global_step=5))
    assert step_levers.device_nan_filter(trainer) and trainer.args.logging_nan_inf_filter is False
    assert float(trainer.training_step()) == 2.0
    assert float(trainer.training_step()) == 2.0  # 6 / (1 + 5 - 3): the Trainer's substitute
    assert float(trainer.training_step()) == 2.0


def _train(tiny_model: Path, tmp: Path, lean: bool) -> list[dict]:
    data = build_sample_dataset(tmp / "data", n_rows=12, seed=3)
    args = parse_args([f"--model_id={tiny_model}", f"--dataset_name={data}", "--use_gpu=false", "--quantization=none",
                       "--num_workers=1", "--eval_fraction=0", "--global_batch_size=4",
                       "--per_device_train_batch_size=2", "--save_strategy=no", "--seed=5", "--max_steps=3",
                       "--logging_steps=1", "--lora_dropout=0"])
    trainer, _, _ = build_trainer(args, tiny_model, tmp / f"out-{lean}", torch.device("cpu"), None)
    if lean:
        assert step_levers.deferred_metrics(trainer) and step_levers.device_nan_filter(trainer)
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


def test_deferred_metrics_log_what_trl_logs(tiny_model: Path, tmp_path: Path) -> None:
    plain, lean = _train(tiny_model, tmp_path, False), _train(tiny_model, tmp_path, True)
    assert len(plain) == len(lean) == 3
    for p, q in zip(plain, lean, strict=True):
        assert q["num_tokens"] == p["num_tokens"]
        for key in ("loss", "entropy", "mean_token_accuracy", "grad_norm"):
            assert q[key] == pytest.approx(p[key], rel=1e-4, abs=1e-6), key
