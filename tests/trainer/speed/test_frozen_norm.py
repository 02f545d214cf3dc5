"""The frozen LayerNorm (issue #33): the same function and input gradient as the module it replaces, no weight or
bias gradient, only where weight and bias are frozen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.speed import frozen_norm


def reference(x, w, b, eps, dy):
    xd = x.detach().double().requires_grad_()
    yd = F.layer_norm(xd, (x.shape[-1],), w.double(), b.double(), eps)
    (dxd,) = torch.autograd.grad(yd, (xd,), dy.double())
    return yd, dxd


@pytest.mark.parametrize("shape", [(3, 5, 64), (7, 100), (2, 1152)])
def test_same_function_and_input_gradient_as_layer_norm(shape):
    torch.manual_seed(sum(shape))
    x = (torch.randn(*shape, dtype=torch.float64) * 3 + 0.7).requires_grad_()
    w = torch.randn(shape[-1], dtype=torch.float64) * 0.3 + 1
    b = torch.randn(shape[-1], dtype=torch.float64) * 0.1
    dy = torch.randn(*shape, dtype=torch.float64)
    y = frozen_norm.frozen_layer_norm(x, w, b, 1e-6)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    yd, dxd = reference(x, w, b, 1e-6, dy)
    assert y.shape == x.shape and dx.shape == x.shape
    assert torch.allclose(y.double(), yd, atol=1e-6, rtol=1e-6)
    assert torch.allclose(dx.double(), dxd, atol=1e-6, rtol=1e-6)


def test_gradcheck_in_float64():
    torch.manual_seed(1)
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    w, b = torch.randn(9, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: frozen_norm.frozen_layer_norm(t, w, b, 1e-5), (x,))


def test_a_trainable_weight_is_refused_not_silently_frozen():
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        frozen_norm.frozen_layer_norm(x, torch.ones(8, requires_grad=True), torch.zeros(8), 1e-5)


def test_apply_to_swaps_frozen_layer_norms_only():
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    model[2].weight.requires_grad_(False)  # bias still trainable: not eligible
    for p in model[0].parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-0.2, 0.2)
    x = torch.randn(3, 16, requires_grad=True)
    before = model(x)
    (g_before,) = torch.autograd.grad(before.sum(), (x,))
    assert frozen_norm.apply_to(model) == 1
    assert frozen_norm.apply_to(model) == 0  # marked once
    after = model(x)
    (g_after,) = torch.autograd.grad(after.sum(), (x,))
    assert torch.allclose(before, after, atol=1e-5) and torch.allclose(g_before, g_after, atol=1e-5)
    assert getattr(model[0], frozen_norm.MARK, False) and not getattr(model[2], frozen_norm.MARK, False)


def test_at_train_begin_wins_over_a_later_patch_like_liger():
    """The Trainer applies Liger in train(), after the levers: the callback routes the norms once training starts."""
    model = torch.nn.Sequential(torch.nn.LayerNorm(8))
    for p in model.parameters():
        p.requires_grad_(False)
    report: dict = {"applied": None}
    callback = frozen_norm.at_train_begin(model, report)
    model[0].forward = lambda x: x * 0  # a patch applied after the levers (as Liger's is)
    callback.on_train_begin(None, None, None)
    assert report["applied"] == 1
    x = torch.randn(2, 8)
    torch.testing.assert_close(model(x), F.layer_norm(x, (8,), model[0].weight, model[0].bias, model[0].eps))


@pytest.fixture()
def cuda_autocast_policy(monkeypatch):
    """CUDA autocast's policy for layer_norm, on the CPU: PyTorch lists layer_norm among the ops that "autocast to
    float32" on CUDA (torch.amp's op reference), so under bf16 autocast on a GPU its output is float32. CPU autocast
    leaves it in x's dtype, so a CPU test would not see what a GPU step does: this stand-in gives F.layer_norm that
    CUDA behaviour whenever autocast is on (and only then), and counts the calls it upcast."""
    real = F.layer_norm
    upcast = []

    def layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
        if torch.is_autocast_enabled(x.device.type):
            upcast.append(x.dtype)
            return real(x.float(), shape, None if weight is None else weight.float(),
                        None if bias is None else bias.float(), eps)
        return real(x, shape, weight, bias, eps)

    monkeypatch.setattr(F, "layer_norm", layer_norm)
    return upcast


def test_output_keeps_x_dtype_under_autocast_as_liger_does(cuda_autocast_policy):
    """Issue #45: under bf16 autocast the frozen norm returned float32 on the GPU (the module it replaces, Liger's
    LayerNorm, returns x's dtype), so the fused LoRA layers reading it declined their input."""
    x = torch.randn(4, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.rand(64) + 0.5).to(torch.bfloat16)
    b = (torch.rand(64) * 0.1).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = frozen_norm.frozen_layer_norm(x, w, b, 1e-6)
    assert y.dtype == torch.bfloat16 and not cuda_autocast_policy
    (dx,) = torch.autograd.grad(y.float().sum(), (x,))
    assert dx.dtype == torch.bfloat16
    torch.testing.assert_close(y, F.layer_norm(x, (64,), w, b, 1e-6))  # outside autocast: the same bf16 result
