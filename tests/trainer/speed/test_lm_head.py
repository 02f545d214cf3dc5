"""The LM head scores only the labelled positions on CPU too (trainer/speed/lm_head.py): TRL's fused head, on the
tiny Gemma 3 (its real 262k vocabulary), gets the labelled positions alone and gives the same loss, per-token
log-probabilities, entropy, top-1 flags and gradients as when it scores every position."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trl.trainer import utils as trl_utils

from trainer.job.arguments import parse_args
from trainer.speed import lm_head
from trainer.worker.model import load_model

OUTPUTS = ("log_probs", "entropy", "is_top1")


@pytest.fixture
def trl_head(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """TRL's own choice for the test (another test of this process may have applied the lever), put back as it
    was after it; and the number of positions each call of the chunked head scored."""
    own = trl_utils._use_triton
    monkeypatch.setattr(trl_utils, "_use_triton", getattr(own, "__wrapped__", own))
    scored: list[int] = []
    real = trl_utils._ChunkedLogProbFunction

    class Counting:
        @staticmethod
        def apply(hidden, *rest):
            scored.append(hidden.shape[0])
            return real.apply(hidden, *rest)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Counting)
    return scored


def forward(model, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**batch, fused_lm_head=True)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    values = {"loss": out.loss.detach(), **{k: getattr(out, k).detach() for k in OUTPUTS}}
    return values, grads


def test_the_head_scores_only_labelled_positions_and_gives_the_same_numbers(tiny_model: Path, trl_head) -> None:
    args = parse_args(["--use_gpu=false", "--quantization=none", f"--model_id={tiny_model}"])
    model = load_model(args, tiny_model, torch.device("cpu")).float()
    model.requires_grad_(False)
    for name, param in model.named_parameters():  # the text stack trains; the tied embedding/head stays frozen
        param.requires_grad_("language_model" in name and "embed_tokens" not in name)
    trl_utils.add_fused_lm_head(model, outputs=OUTPUTS)
    ids = torch.randint(10, 1000, (2, 40), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[0, 30:38] = ids[0, 30:38]  # answer-only labels: a few positions of each row
    labels[1, 25:29] = ids[1, 25:29]
    mask = torch.ones_like(ids)
    mask[1, 35:] = 0  # padding
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}

    every, every_grads = forward(model, batch)
    assert trl_head == [2 * 39]  # without the lever: every position after the first of each row
    assert lm_head.labelled_positions_only() == {"applied": True, "devices": "all"}
    only, only_grads = forward(model, batch)
    assert trl_head[1:] == [int((labels[:, 1:] != -100).sum())] == [12]

    for key in ("loss", *OUTPUTS):
        torch.testing.assert_close(only[key], every[key], rtol=1e-5, atol=1e-5, msg=key)
    assert every_grads and sorted(only_grads) == sorted(every_grads)
    for name in every_grads:
        torch.testing.assert_close(only_grads[name], every_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_applying_twice_wraps_once_and_cuda_keeps_its_choice(trl_head) -> None:
    original = trl_utils._use_triton
    lm_head.labelled_positions_only()
    once = trl_utils._use_triton
    assert lm_head.labelled_positions_only() == {"applied": True, "devices": "all"}
    assert trl_utils._use_triton is once and once is not original
    assert once(torch.device("cpu")) is True
    assert once(torch.device("cuda")) is original(torch.device("cuda"))  # Triton's own answer, not forced


def test_a_trl_without_the_hook_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(trl_utils, "_use_triton")
    result = lm_head.labelled_positions_only()
    assert result["applied"] is False and "_use_triton" in result["reason"]
    assert not hasattr(trl_utils, "_use_triton")
