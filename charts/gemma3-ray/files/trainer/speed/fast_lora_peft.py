"""PEFT integration of the fused LoRA layers (fast_lora.py): which layers fuse, and their groups.

Layers of one module that read the same input (q/k/v, gate/up) form a group: the first member called
computes the whole group in one fused Function and keeps the other members' outputs for them; a member
called with another input tensor (or in another grad/train mode) computes alone. Nothing changes for the
model's code: every layer is still called as before.
"""

from __future__ import annotations

from typing import Any

# Sibling layers that read the same input in Gemma 3 (and most transformers): fused as one group.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fusable(layer) -> str | None:
    """Why this PEFT LoRA layer cannot take the fused path (None: it can)."""
    import torch

    from trainer.speed.fast_lora import SUPPORTED_RANKS

    base = getattr(layer, "base_layer", None)
    if type(base) is not torch.nn.Linear:
        return "base layer is not a plain Linear (quantized?)"
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return "base weight is trainable"
    if len(layer.lora_A) != 1 or getattr(layer, "lora_variant", {}):
        return "several adapters or a LoRA variant (DoRA)"
    name = next(iter(layer.lora_A))
    a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
    if a.shape[0] not in SUPPORTED_RANKS:
        return f"rank {a.shape[0]} not in {SUPPORTED_RANKS}"
    if not (a.dtype == b.dtype == base.weight.dtype):
        return "adapter dtype differs from the base weight's"
    if getattr(layer, "lora_bias", {}).get(name):
        return "lora_bias"
    return None


def _dropout_p(layer) -> float:
    import torch

    drop = layer.lora_dropout[next(iter(layer.lora_A))]
    return drop.p if isinstance(drop, torch.nn.Dropout) else 0.0


def _usable(layer, x, args: tuple, kwargs: dict) -> bool:
    name = next(iter(layer.lora_A))
    return not (layer.disable_adapters or layer.merged or args or kwargs or name not in layer.active_adapters
                or x.dtype != layer.base_layer.weight.dtype)


class Group:
    """Layers reading one input; `stash` holds the outputs computed for members not yet called."""

    def __init__(self, layers: list) -> None:
        self.layers = layers
        self.stash: dict[str, Any] | None = None

    def member(self, layer) -> tuple:
        name = next(iter(layer.lora_A))
        base = layer.base_layer
        return (base.weight, base.bias, layer.lora_A[name].weight, layer.lora_B[name].weight,
                getattr(base, "base_matmuls", None))

    def run(self, index: int, x):
        import torch

        from trainer.speed import fast_lora

        layer = self.layers[index]
        st = self.stash
        mode = (torch.is_grad_enabled(), layer.training)
        if st is not None and st["x"] is x and st["mode"] == mode and index in st["outs"]:
            out = st["outs"].pop(index)
            if not st["outs"]:
                self.stash = None
            return out
        scaling = layer.scaling[next(iter(layer.lora_A))]
        others = [i for i, other in enumerate(self.layers) if i != index and _usable(other, x, (), {})]
        order = [index, *others]
        ys = fast_lora.fused_lora_group(x, [self.member(self.layers[i]) for i in order], scaling,
                                        _dropout_p(layer), layer.training)
        self.stash = {"x": x, "mode": mode, "outs": dict(zip(order[1:], ys[1:], strict=True))} if others else None
        return ys[0]


def _forward(group: Group, index: int, original):
    import torch

    layer = group.layers[index]

    @torch.compiler.disable  # compiled regions (compile_vision) stop around it
    def forward(x, *args: Any, **kwargs: Any):
        if not _usable(layer, x, args, kwargs):
            return original(x, *args, **kwargs)
        return group.run(index, x)

    return forward


def _groups(layers: dict[str, Any]) -> list[list]:
    """Split one parent's fusable layers {child name: layer} into groups of siblings."""
    done: set[str] = set()
    out = []
    for names in SIBLINGS:
        present = [layers[n] for n in names if n in layers]
        if len(present) > 1:
            first = present[0]
            same = [lay for lay in present
                    if lay.base_layer.in_features == first.base_layer.in_features
                    and _dropout_p(lay) == _dropout_p(first)
                    and lay.scaling[next(iter(lay.lora_A))] == first.scaling[next(iter(first.lora_A))]
                    and lay.lora_A[next(iter(lay.lora_A))].weight.shape[0]
                    == first.lora_A[next(iter(first.lora_A))].weight.shape[0]]
            if len(same) > 1:
                out.append(same)
                done.update(n for n in names if n in layers and layers[n] in same)
    out += [[lay] for n, lay in layers.items() if n not in done]
    return out


def self_test(device) -> str | None:
    """Compile and check the kernels on `device` against the reference (None: they agree)."""
    import torch

    from trainer.speed import fast_lora

    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        for m, k, n in ((80, 1152, 1), (48, 4304, 1), (3 * 64 * 264 + 5, 256, 3), (200, 640, 2)):
            x = torch.randn(m, k, generator=g).to(device, torch.bfloat16).requires_grad_()
            members, leaves = [], []
            for _ in range(n):
                w = (torch.randn(32, k, generator=g) / k**0.5).to(device, torch.bfloat16)
                a = (torch.randn(16, k, generator=g) / k**0.5).to(device, torch.bfloat16).requires_grad_()
                b = torch.randn(32, 16, generator=g).to(device, torch.bfloat16).requires_grad_()
                members.append((w, None, a, b, None))
                leaves += [a, b]
            p, s = 0.05, 2.0
            torch.manual_seed(1234)
            ys = fast_lora.fused_lora_group(x, members, s, p, True)
            torch.manual_seed(1234)
            seed = int(torch.randint(0, fast_lora.SEED_MAX, (1,)).item())
            gys = [torch.randn(m, 32, generator=g).to(device, torch.bfloat16) for _ in range(n)]
            got = torch.autograd.grad(ys, (x, *leaves), gys)
            inv = fast_lora.inv_keep(p)
            xf = x.detach().float().requires_grad_()
            lf = [t.detach().float().requires_grad_() for t in leaves]
            refs = []
            for i, (w, _, _, _, _) in enumerate(members):
                keep = fast_lora.keep_mask(seed + i, m, k, p, device)
                refs.append(xf @ w.float().t() + s * ((xf * keep * inv) @ lf[2 * i].t()) @ lf[2 * i + 1].t())
            want = torch.autograd.grad(refs, (xf, *lf), [gy.float() for gy in gys])
            for name, u, v in zip(("y", "gx", *["gA", "gB"] * n), (torch.cat(ys), *got),
                                  (torch.cat(refs), *want), strict=True):
                err = float((u.float() - v).norm() / v.norm())
                if not err < 2e-2:
                    return f"{name} differs from the reference at [{m}, {k}] x{n}: relative error {err:.3g}"
    except Exception as e:  # a kernel that does not compile on this GPU/Triton: stay on PEFT's layer
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def apply(model) -> dict[str, Any]:
    """Route every eligible PEFT LoRA Linear of `model` through the fused Function; returns counts.

    On a GPU the kernels are compiled and checked first; if that fails, nothing is fused and the
    counts say why (training then runs PEFT's own layer)."""
    from peft.tuners.lora import Linear as LoraLinear

    device = next(model.parameters()).device
    if device.type == "cuda":
        problem = self_test(device)
        if problem:
            return {"fused": 0, "groups": 0, "skipped": {f"kernel self-test failed: {problem}": -1}}
    fused, groups, skipped = 0, 0, {}
    for parent in model.modules():
        children: dict[str, Any] = {}
        for child_name, child in parent.named_children():
            if not isinstance(child, LoraLinear):
                continue
            why = fusable(child)
            if why is None:
                children[child_name] = child
            else:
                skipped[why] = skipped.get(why, 0) + 1
        for layers in _groups(children):
            group = Group(layers)
            for i, layer in enumerate(layers):
                layer.forward = _forward(group, i, layer.forward)
            fused += len(layers)
            groups += 1
    return {"fused": fused, "groups": groups, "skipped": skipped}


def on(args) -> bool:
    return bool(args.fused_lora)


def lever(run) -> dict[str, Any]:
    """The fused layers, or PEFT's where the device's plan has no Triton kernels for the GPU (an unknown one)."""
    if run.args.use_gpu and run.plan["fused_lora"].fallback:
        return {"skipped": run.plan["fused_lora"].reason}
    return apply(run.model)
