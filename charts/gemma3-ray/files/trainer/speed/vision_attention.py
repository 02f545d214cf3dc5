"""SigLIP attention through cuDNN's fused attention kernel on Hopper (SDPA's own choice is FlashAttention-2).

The vision tower's attention is 16 heads of 72 over 4,096 patches, unmasked, at every layer: about a
third of a step's FLOPs with LoRA on all linear layers. PyTorch's SDPA prefers its FlashAttention-2
kernel, which pads a head dim of 72 to the next kernel size; cuDNN's kernel (the FlashAttention-3 design
on Hopper) takes it as is. Same function, same precision: only the kernel changes, and the backward
pass uses the backend the forward chose. Falls back to SDPA's order when cuDNN cannot take the inputs.

The `vision_attention` lever (`vision_kernels`): FlashAttention 4 where the device's plan names it and its GPU
self-test passes (`fa4_attention`, routed through `sdpa_router`), else this cuDNN priority, else SDPA's own order.
"""

from __future__ import annotations

from typing import Any


def backend_order() -> list:
    from torch.nn.attention import SDPBackend

    return [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH]


def prefer_cudnn(vision_tower) -> None:
    """Run `vision_tower`'s forward (and so its attention's backward) with cuDNN attention first."""
    from torch.nn.attention import sdpa_kernel

    forward = vision_tower.forward
    order = backend_order()

    def wrapped(*args: Any, **kwargs: Any):
        with sdpa_kernel(order, set_priority=True):
            return forward(*args, **kwargs)

    vision_tower.forward = wrapped


def on(args) -> bool:
    return args.vision_attention != "sdpa" and args.attn_implementation == "sdpa"


def lever(run) -> dict[str, Any]:
    return vision_kernels(run.args, run.model, run.plan)


def vision_kernels(args, model, plan) -> dict[str, Any]:
    """SigLIP's attention kernel: FA4 where the device's plan names it and its GPU self-test passes (`auto` or
    `fa4`), else cuDNN's fused attention on Hopper and Blackwell (or wherever `cudnn` is asked for), else SDPA's
    own order (an older or unknown GPU)."""
    from trainer.speed import feature_cache

    tower = feature_cache.core_model(model).vision_tower
    choice = plan["siglip_attention"]
    out: dict[str, Any] = {}
    if args.vision_attention in ("auto", "fa4"):
        if choice.kernel == "fa4":
            from trainer.speed import fa4_attention

            try:
                fa4_attention.cache_with_triton()
                out["self_test"] = fa4_attention.self_test()
                out.update(kernel="fa4", layers=fa4_attention.route_vision_attention(tower))
                return out
            except Exception as e:  # a failing build or a wrong result: cuDNN, as without FA4
                out["fa4"] = f"{type(e).__name__}: {str(e)[:200]}"
        else:
            out["fa4"] = choice.reason
    if args.vision_attention == "cudnn" or choice.kernel in ("fa4", "cudnn"):
        prefer_cudnn(tower)
        out["kernel"] = "cudnn"
    else:
        out.update(kernel="sdpa", reason=choice.reason)
    return out
