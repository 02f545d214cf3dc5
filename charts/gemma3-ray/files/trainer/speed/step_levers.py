"""The lean step (the `lean_step` lever): no host synchronisation inside an optimizer step (bench/RESULTS.md
measures it).

Transformers' image-token check reads a count back from the GPU after the vision tower is queued, and TRL's
per-micro-batch metrics (entropy, token accuracy, tokens) read three more after the forward: each makes the CPU wait
for the GPU, which then waits, idle, for the CPU to queue the next kernels. Here the image-token check runs on the
device (`torch._assert_async`), the metrics stay on the GPU until the step is logged, and the Trainer's NaN/inf
filter of the logged loss runs on the GPU; the loss, its gradients and the logged values are the same. Also one
layout copy instead of hundreds: SigLIP's patch embeddings come out of a transposed convolution output, and every
encoder layer kept that layout (strided residual adds, a copy before each LayerNorm); they are made contiguous once.
(The language model's attention lever is `lm_attention`.)
"""

from __future__ import annotations

from typing import Any


def on(args) -> bool:
    return bool(args.lean_step)


def lever(run) -> dict[str, bool]:
    """Each part of the lean step, applied to the run's model (and its Trainer, when there is one)."""
    trainer = run.trainer
    return {"device_image_token_check": device_image_token_check(run.core),
            "contiguous_patch_embeddings": contiguous_patch_embeddings(run.core.vision_tower),
            "deferred_metrics": trainer is not None and deferred_metrics(trainer),
            "device_nan_filter": trainer is not None and device_nan_filter(trainer)}


def device_image_token_check(core) -> bool:
    """`core` (Gemma3Model)'s image-token check without a host sync: the same mask, the count compared on
    the GPU (a mismatch stops the step with a device-side assertion naming it)."""
    import torch

    original = getattr(core, "get_placeholder_mask", None)
    image_token_id = getattr(core.config, "image_token_id", None)
    if original is None or image_token_id is None:
        return False

    def get_placeholder_mask(input_ids, inputs_embeds, image_features):
        if input_ids is None:
            return original(input_ids, inputs_embeds, image_features)
        mask = input_ids == image_token_id
        torch._assert_async(mask.sum() * inputs_embeds.shape[-1] == image_features.numel(),
                            "Image features and image tokens do not match")
        return mask.unsqueeze(-1).to(inputs_embeds.device)

    core.get_placeholder_mask = get_placeholder_mask
    return True


def contiguous_patch_embeddings(vision_tower) -> bool:
    """SigLIP's embeddings as a contiguous tensor (the same values), so the encoder layers keep that layout."""
    for module in vision_tower.modules():
        if type(module).__name__.endswith("VisionEmbeddings"):
            module.register_forward_hook(lambda _m, _i, out: out.contiguous())
            return True
    return False


def device_nan_filter(trainer) -> bool:
    """The Trainer's `logging_nan_inf_filter` without its host sync after every micro-batch: a non-finite
    micro-batch loss is replaced on the GPU by the average of the losses since the last log, as the Trainer
    does on the host."""
    import torch

    args = trainer.args
    if not getattr(args, "logging_nan_inf_filter", False):
        return False
    original = trainer.training_step

    def training_step(*a: Any, **kw: Any):
        loss = original(*a, **kw)
        tr, last = getattr(trainer, "_tr_loss", None), getattr(trainer, "_globalstep_last_logged", None)
        if not isinstance(tr, torch.Tensor) or last is None:  # not the Trainer loop this was written against
            return loss
        previous = tr / (1 + trainer.state.global_step - last)
        return torch.where(torch.isfinite(loss), loss, previous.to(loss.device, loss.dtype))

    try:
        args.logging_nan_inf_filter = False
    except Exception:  # frozen arguments: keep the Trainer's own filter
        return False
    trainer.training_step = training_step
    return True


def deferred_metrics(trainer) -> bool:
    """TRL's training loss as TRL computes it, its metrics kept on the GPU until `trainer.log` reads them."""
    import torch

    original_loss, original_log = trainer.compute_loss, trainer.log
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None or not hasattr(trainer, "_total_train_tokens"):
        return False  # not the TRL SFTTrainer this was written against
    pending: list[Any] = []  # GPU token counts not yet added to _total_train_tokens

    def plain(model) -> bool:
        return bool(trainer.model.training and trainer.compute_loss_func is None and trainer.label_smoother is None
                    and getattr(trainer.args, "loss_type", "nll") == "nll" and not trainer.aux_loss_enabled
                    and getattr(trainer.accelerator, "parallelism_config", None) is None)

    def compute_loss(model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs or not plain(model):
            return original_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        inputs["use_cache"] = False
        outputs = model(**inputs, fused_lm_head=True)
        num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = (-outputs.log_probs).sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if trainer.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (trainer.accelerator.num_processes // trainer.get_tp_size())
        gather = trainer.accelerator.gather_for_metrics
        valid = gather(outputs.label_mask.sum()).sum().clamp(min=1)  # entropy and hits are 0 without labels
        metrics["train"]["entropy"].append(gather(outputs.entropy.detach().sum()).sum() / valid)
        metrics["train"]["mean_token_accuracy"].append(gather(outputs.is_top1.sum()).sum() / valid)
        pending.append(gather(inputs["attention_mask"].sum()).sum())
        return loss

    def log(logs, *args: Any, **kwargs: Any):
        for values in metrics["train"].values():
            tensors = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
            if tensors:
                read = torch.stack([values[i].float() for i in tensors]).tolist()  # one sync for the list
                for i, v in zip(tensors, read, strict=True):
                    values[i] = v
        if pending:
            trainer._total_train_tokens += int(torch.stack(pending).sum()) // trainer._tp_size
            pending.clear()
            metrics["train"]["num_tokens"] = [trainer._total_train_tokens]
        return original_log(logs, *args, **kwargs)

    trainer.compute_loss, trainer.log = compute_loss, log
    return True
