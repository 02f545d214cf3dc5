"""The speed levers a worker applies to its model after PEFT (bench/RESULTS.md measures each).

FP8 base weights, fused LoRA layers, SigLIP's attention kernel, image-feature reuse under a frozen vision
tower; torch is
imported only by the modules these call, inside worker code.
"""

from __future__ import annotations

from typing import Any


def apply(args, model, trainer=None) -> dict[str, Any]:
    """FP8 base weights, the fused LoRA layers, cuDNN attention in SigLIP, and image-feature reuse (its
    per-epoch log goes to `trainer`) (bench/RESULTS.md)."""
    import feature_cache
    from flags import UsageError

    levers: dict[str, Any] = {}
    if args.fp8_base_weights:
        import fp8_linear

        device = next(model.parameters()).device
        problem = fp8_linear.capability_problem(device) or (
            f"recipe=fp8: {why}" if (why := fp8_linear.self_test(device)) else None)
        if problem:
            raise UsageError(problem)
        levers["fp8"] = fp8_linear.apply(model)
        print(f"[trainer] FP8 base weights: {levers['fp8']}", flush=True)
    if args.fused_lora:
        import fast_lora

        levers["fused_lora"] = fast_lora.apply(model)
        print(f"[trainer] fused LoRA layers: {levers['fused_lora']}", flush=True)
        if args.fp8_base_weights and not levers["fused_lora"]["fused"]:
            raise UsageError(f"recipe=fp8 runs through the fused LoRA layer, which cannot run here: "
                             f"{levers['fused_lora']['skipped']}; use --recipe=fast")
    core = feature_cache.core_model(model)
    if args.vision_attention == "cudnn" and args.attn_implementation == "sdpa":
        import vision_attention

        vision_attention.prefer_cudnn(core.vision_tower)
        levers["vision_attention"] = "cudnn"
    if args.freeze_vision and args.image_feature_cache_gib > 0:
        cache = levers["image_feature_cache"] = feature_cache.attach(model, args.image_feature_cache_gib)
        if trainer is not None:
            trainer.add_callback(feature_cache.epoch_log_callback(cache))
    return levers
