"""Gemma 3's language-model attention through cuDNN's fused kernel with grouped kv heads (the `lm_attention` lever).

Transformers' SDPA path repeats the kv heads whenever there is a mask (always, with an image block), which PyTorch
then runs with its sm80 memory-efficient kernel. Here the language model's attention modules are routed (route
``cudnn_gqa`` of `sdpa_router`) to SDPA with `enable_gqa` and cuDNN's fused attention first: same function, same
mask, a Hopper kernel and no repeated-kv copies (bench/RESULTS.md measures it). torch is imported inside functions.
"""

from __future__ import annotations

from typing import Any

ROUTE = "cudnn_gqa"  # its route in sdpa_router (capability's kernel name)


def on(args) -> bool:
    return args.lm_attention == "cudnn" and args.attn_implementation == "sdpa"


def lever(run) -> dict[str, Any]:
    return {"cudnn_gqa_layers": lm_attention_cudnn(run.core.language_model)}


def lm_attention_cudnn(language_model, require_hopper: bool = True) -> int:
    """Route the attention of `language_model`'s layers (modules with kv groups) through cuDNN with GQA;
    returns how many. Other models in the process keep Transformers' SDPA path. Without a Hopper (or newer)
    GPU nothing changes (`require_hopper=False`: SDPA's own choice of kernel, with GQA: tests on CPU)."""
    from trainer.speed import capability, sdpa_router

    if require_hopper and capability.choose("lm_attention", capability.device_capability()).fallback:
        return 0  # cuDNN's fused attention with a mask and GQA: Hopper and Blackwell (capability.py)
    layers = [m for m in language_model.modules()
              if getattr(m, "num_key_value_groups", 0) >= 1 and hasattr(m, "q_proj")]
    return sdpa_router.route(layers, ROUTE, cudnn_gqa)


def cudnn_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
              **kwargs: Any):
    """A routed module's call through SDPA with grouped kv heads, cuDNN first (Transformers' output layout), or
    None (dropout, a position bias, a float mask, one query position: the router runs Transformers' path then)."""
    import torch

    mask = attention_mask
    if (dropout or kwargs.get("position_bias") is not None or (mask is not None and mask.dtype != torch.bool)
            or query.shape[2] == 1):
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    causal = mask is None and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                      SDPBackend.MATH], set_priority=True):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, is_causal=causal,
            enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None
