"""The frozen LayerNorm (issue #33): the same function as torch's layer_norm and the same input gradient,
no weight or bias gradient, only where weight and bias are frozen; its Triton kernels in Triton's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainer.speed import frozen_norm

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_trainable_weight_is_refused_in_backward_not_silently_dropped():
    x = torch.randn(2, 8, requires_grad=True)
    w = torch.ones(8, requires_grad=True)
    y = frozen_norm.frozen_layer_norm(x, w, torch.zeros(8), 1e-5)
    with pytest.raises(RuntimeError, match="requires grad"):
        y.sum().backward()


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


KERNEL_SCRIPT = r"""
import torch, torch.nn.functional as F
from trainer.speed import frozen_norm
torch.manual_seed(0)
for m, n in [(7, 1152), (5, 100), (3, 64)]:
    x = (torch.randn(m, n) * 3 + 0.5).requires_grad_()
    w = torch.randn(n) * 0.2 + 1
    b = torch.randn(n) * 0.1
    dy = torch.randn(m, n)
    y = frozen_norm.frozen_layer_norm(x, w, b, 1e-6)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    xd = x.detach().double().requires_grad_()
    yd = F.layer_norm(xd, (n,), w.double(), b.double(), 1e-6)
    (dxd,) = torch.autograd.grad(yd, (xd,), dy.double())
    ey = float((y.detach().double() - yd).norm() / yd.norm())
    edx = float((dx.double() - dxd).norm() / dxd.norm())
    assert ey < 1e-5 and edx < 1e-5, (m, n, ey, edx)
print("ok")
"""


def test_the_triton_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", KERNEL_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
