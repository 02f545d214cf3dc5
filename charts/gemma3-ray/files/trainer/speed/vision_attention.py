"""SigLIP attention through cuDNN's fused attention kernel on Hopper (SDPA's own choice is FlashAttention-2).

The vision tower's attention is 16 heads of 72 over 4,096 patches, unmasked, at every layer: about a
third of a step's FLOPs with LoRA on all linear layers. PyTorch's SDPA prefers its FlashAttention-2
kernel, which pads a head dim of 72 to the next kernel size; cuDNN's kernel (the FlashAttention-3 design
on Hopper) takes it as is. Same function, same precision: only the kernel changes, and the backward
pass uses the backend the forward chose. Falls back to SDPA's order when cuDNN cannot take the inputs.
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
