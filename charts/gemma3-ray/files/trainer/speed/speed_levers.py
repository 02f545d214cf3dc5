"""The speed levers a worker applies to its model after PEFT (bench/RESULTS.md measures each).

Triton's compile cache kept on the storage, fused LoRA layers, SigLIP's and the language model's attention
kernels, a step without host syncs, image-feature reuse under a frozen vision tower, and an LM head that scores
only the labelled positions on every device (`lm_head`); torch is imported only by the modules these call,
inside worker code.
"""

from __future__ import annotations

from typing import Any


def apply(args, model, trainer=None) -> dict[str, Any]:
    """The fused LoRA layers, cuDNN attention in SigLIP and the language model, the lean step (on `trainer`),
    and image-feature reuse (its per-epoch log goes to `trainer`) (bench/RESULTS.md)."""
    from trainer.speed import capability, feature_cache, lm_head

    levers: dict[str, Any] = {"lm_head": lm_head.labelled_positions_only()}
    plan = capability.plan()
    levers["kernels"] = {p: c.kernel for p, c in plan.items()}
    print(f"[trainer] kernels for {capability.arch(capability.device_capability())}: "
          + ", ".join(f"{p} {c.kernel} ({c.reason})" for p, c in plan.items()), flush=True)
    if args.use_gpu and (args.fused_lora or args.use_liger_kernel):  # before the first Triton compile
        from trainer.speed import compile_cache

        try:
            levers["compile_cache"] = compile_cache.keep_on_storage(args, trainer)
        except Exception as e:  # without the cache the first step compiles, as before
            levers["compile_cache"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"[trainer] compile cache: {levers['compile_cache']}", flush=True)
    if args.fused_lora and args.use_gpu and plan["fused_lora"].fallback:
        levers["fused_lora"] = {"skipped": plan["fused_lora"].reason}  # PEFT's layer, as on an unknown GPU
        print(f"[trainer] fused LoRA layers: {levers['fused_lora']}", flush=True)
    elif args.fused_lora:
        from trainer.speed import fast_lora_peft

        levers["fused_lora"] = fast_lora_peft.apply(model)
        print(f"[trainer] fused LoRA layers: {levers['fused_lora']}", flush=True)
    core = feature_cache.core_model(model)
    if args.vision_attention != "sdpa" and args.attn_implementation == "sdpa":
        levers["vision_attention"] = vision_kernels(args, model, plan)
        print(f"[trainer] SigLIP attention: {levers['vision_attention']}", flush=True)
    if args.frozen_norms:
        from trainer.speed import frozen_norm

        if trainer is None:
            levers["frozen_norms"] = frozen_norm.apply_to(core.vision_tower)
        else:  # the Trainer applies Liger (which patches these modules) when train() starts: after it
            levers["frozen_norms"] = report = {"applied": None}
            trainer.add_callback(frozen_norm.at_train_begin(core.vision_tower, report))
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


def vision_kernels(args, model, plan) -> dict[str, Any]:
    """SigLIP's attention kernel: FA4 where the device's plan names it and its GPU self-test passes (`auto` or
    `fa4`), else cuDNN's fused attention on Hopper and Blackwell (or wherever `cudnn` is asked for), else SDPA's
    own order (an older or unknown GPU)."""
    from trainer.speed import feature_cache, vision_attention

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
        vision_attention.prefer_cudnn(tower)
        out["kernel"] = "cudnn"
    else:
        out.update(kernel="sdpa", reason=choice.reason)
    return out
