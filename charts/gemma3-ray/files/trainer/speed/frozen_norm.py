"""SigLIP's frozen LayerNorms through PyTorch's own layer_norm, whose backward skips the weight and bias
gradients they do not need (issue #33).

With LoRA the vision tower's LayerNorms (`layer_norm1`, `layer_norm2`, `post_layernorm`) are frozen, yet
Liger's LayerNorm (which `use_liger_kernel` installs) reduces the weight and bias gradients over every row in
its backward anyway: 0.51 ms a call at [65,536, 1,152] bf16, 110 ms of an optimizer step (profile of
2026-12-02). PyTorch's native kernel, told that neither needs a gradient, computes the input gradient alone:
0.142 ms a call on an H200 (bench/results/2026-12-02-1818-kernels.jsonl; forward 0.166 ms against Liger's
0.149), the same function (fp32 statistics, output in x's dtype — also under autocast, which would otherwise
return float32: issue #45). `apply_to` swaps the forward of each
eligible module under a model: a LayerNorm (torch's or Liger's) whose weight and bias are frozen; in a Trainer,
`at_train_begin` does it when training starts, after the Trainer's own Liger patch (bench/RESULTS.md, round 5:
applied before it, Liger's patch replaced this one). It is a
PyTorch kernel on every architecture, so there is no per-capability choice to make. torch is imported inside
functions: the Ray driver never imports it.
"""

from __future__ import annotations

MARK = "_gemma3_ray_frozen_layer_norm"


def frozen_layer_norm(x, weight, bias, eps: float):
    """layer_norm over the last dim; its backward gives x's gradient only (weight and bias must be frozen)."""
    import torch
    import torch.nn.functional as F

    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise RuntimeError("frozen_layer_norm: the weight or bias requires grad; use the module's own forward")
    # Autocast lists layer_norm among its float32 ops: inside it the output would be float32, the fused LoRA layers
    # that read it would decline it (its dtype differs from their weights') and run PEFT's unfused path, and the
    # float32 activations would stay alive for backward (issue #45: 760 of 976 fused calls a step, +20-30 GiB).
    # Liger's LayerNorm, which this replaces, returns x's dtype with float32 statistics; so does this.
    with torch.autocast(x.device.type, enabled=False):
        w = weight if weight.dtype == x.dtype else weight.to(x.dtype)
        b = bias if bias is None or bias.dtype == x.dtype else bias.to(x.dtype)
        return F.layer_norm(x, (weight.shape[0],), w, b, eps)


def eligible(module) -> bool:
    """A LayerNorm (torch's or Liger's) over the last dim with a frozen weight and bias."""
    w, b = getattr(module, "weight", None), getattr(module, "bias", None)
    if w is None or b is None or w.dim() != 1 or w.requires_grad or b.requires_grad:
        return False
    return type(module).__name__ in ("LayerNorm", "LigerLayerNorm")


def apply_to(root) -> int:
    """Route every eligible LayerNorm under `root` through `frozen_layer_norm`; returns how many."""
    count = 0
    for module in root.modules():
        if getattr(module, MARK, False) or not eligible(module):
            continue
        eps = float(getattr(module, "eps", getattr(module, "variance_epsilon", 1e-5)))

        def forward(x, _m=module, _eps=eps):
            return frozen_layer_norm(x, _m.weight, _m.bias, _eps)

        module.forward = forward
        setattr(module, MARK, True)
        count += 1
    return count


def at_train_begin(root, report: dict):
    """A Trainer callback that routes `root`'s frozen LayerNorms at the start of training: after the Trainer has
    applied Liger (in `train()`), whose patch would otherwise replace this one; `report["applied"]` says how many."""
    from transformers import TrainerCallback

    class FrozenNorms(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            report["applied"] = apply_to(root)

    return FrozenNorms()


def on(args) -> bool:
    return bool(args.frozen_norms)


def lever(run):
    """Without a Trainer: the norms now (their count); in one: at train begin, after its Liger patch (a report whose
    "applied" the callback fills in)."""
    if run.trainer is None:
        return apply_to(run.core.vision_tower)
    report = {"applied": None}
    run.trainer.add_callback(at_train_begin(run.core.vision_tower, report))
    return report
