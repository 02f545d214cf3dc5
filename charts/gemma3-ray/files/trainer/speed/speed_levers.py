"""The speed levers a worker applies to its model after PEFT (bench/RESULTS.md measures each).

Triton's compile cache kept on the storage, fused LoRA layers, SigLIP's and the language model's attention
kernels, a step without host syncs, image-feature reuse under a frozen vision tower; torch is imported only
by the modules these call, inside worker code.
"""

from __future__ import annotations

from typing import Any


def apply(args, model, trainer=None) -> dict[str, Any]:
    """The fused LoRA layers, cuDNN attention in SigLIP and the language model, the lean step (on `trainer`),
    and image-feature reuse (its per-epoch log goes to `trainer`) (bench/RESULTS.md)."""
    from trainer.speed import feature_cache

    levers: dict[str, Any] = {}
    if args.use_gpu and (args.fused_lora or args.use_liger_kernel):  # before the first Triton compile
        from trainer.speed import compile_cache

        try:
            levers["compile_cache"] = compile_cache.keep_on_storage(args, trainer)
        except Exception as e:  # without the cache the first step compiles, as before
            levers["compile_cache"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"[trainer] compile cache: {levers['compile_cache']}", flush=True)
    if args.fused_lora:
        from trainer.speed import fast_lora_peft

        levers["fused_lora"] = fast_lora_peft.apply(model)
        print(f"[trainer] fused LoRA layers: {levers['fused_lora']}", flush=True)
    core = feature_cache.core_model(model)
    if args.vision_attention == "cudnn" and args.attn_implementation == "sdpa":
        from trainer.speed import vision_attention

        vision_attention.prefer_cudnn(core.vision_tower)
        levers["vision_attention"] = "cudnn"
    if args.lm_attention == "cudnn" and args.attn_implementation == "sdpa":
        from trainer.speed import step_levers

        levers["lm_attention"] = {"cudnn_gqa_layers": step_levers.lm_attention_cudnn(core.language_model)}
    if args.lean_step:
        from trainer.speed import step_levers

        levers["lean_step"] = {
            "device_image_token_check": step_levers.device_image_token_check(core),
            "contiguous_patch_embeddings": step_levers.contiguous_patch_embeddings(core.vision_tower),
            "deferred_metrics": trainer is not None and step_levers.deferred_metrics(trainer),
            "device_nan_filter": trainer is not None and step_levers.device_nan_filter(trainer)}
    if args.freeze_vision and args.image_feature_cache_gib > 0:
        cache = levers["image_feature_cache"] = feature_cache.attach(model, args.image_feature_cache_gib)
        if trainer is not None:
            trainer.add_callback(feature_cache.epoch_log_callback(cache))
    return levers
