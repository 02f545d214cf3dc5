"""Image features computed once per image and reused across epochs while the vision tower is frozen.

With `freeze_vision` the tower and the projector have no trainable weights and no dropout, so an
image's features (256 soft tokens x hidden size after the projector) are the same in every epoch. The
cache keys each image by an exact 128-bit fingerprint of its pixel values (two wrapping integer dot
products of the raw bits with fixed random weights: the same bits give the same key, and two different
images collide with probability ~2^-64 per pair), computes only the images it has not seen, and keeps
the features on the GPU up to a byte budget (then it computes the rest every time). `epoch_log_callback`
prints, per epoch, how many were reused and computed. (A batched pre-pass over the rows before training
was measured slower than computing the features inside epoch 1: bench/RESULTS.md, round 3.)
"""

from __future__ import annotations

from typing import Any

GIB = 2**30
FINGERPRINT_SEED = 20261201


def core_model(model):
    """The Gemma3Model inside a PEFT/Trainer-wrapped model (it owns get_image_features)."""
    for module in model.modules():
        if hasattr(module, "get_image_features") and hasattr(module, "vision_tower") \
                and hasattr(module, "multi_modal_projector"):
            return module
    raise ValueError("no Gemma 3 vision model (vision_tower + multi_modal_projector) inside the model")


def frozen_problem(core) -> str | None:
    """Why the image features of `core` may change between epochs (None: they cannot)."""
    import torch

    for part in (core.vision_tower, core.multi_modal_projector):
        if any(p.requires_grad for p in part.parameters()):
            return "the vision tower or projector has trainable parameters"
        if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in part.modules()):
            return "the vision tower or projector has dropout"
    return None


class ImageFeatureCache:
    """fingerprint -> features [tokens, hidden] on the GPU, up to `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.store: dict[tuple[int, int], Any] = {}
        self.hits = self.misses = 0
        self._weights: dict[tuple[str, int], Any] = {}

    def _w(self, device, n: int):
        import torch

        key = (str(device), n)
        if key not in self._weights:
            g = torch.Generator().manual_seed(FINGERPRINT_SEED)
            w = torch.randint(1, 2**31 - 1, (2, n), generator=g, dtype=torch.int64)
            self._weights[key] = (w | 1).to(device)
        return self._weights[key]

    def keys(self, pixel_values) -> list[tuple[int, int]]:
        import torch

        flat = pixel_values.reshape(pixel_values.shape[0], -1)
        ints = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[flat.element_size()]
        w = self._w(flat.device, flat.shape[1])
        # one image at a time (bounded temporaries), read back once per batch (one host sync, not one per image)
        sums = torch.stack([(w * row.contiguous().view(ints).to(torch.int64)).sum(dim=1) for row in flat])
        return [tuple(int(v) for v in pair) for pair in sums.tolist()]

    def put(self, key: tuple[int, int], features) -> None:
        size = features.numel() * features.element_size()
        if self.bytes + size <= self.max_bytes:
            self.store[key] = features.detach().clone()
            self.bytes += size


def attach(model, max_gib: float) -> ImageFeatureCache:
    """Wrap the Gemma3Model's get_image_features with a cache; refuses when features are not frozen."""
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    core = core_model(model)
    problem = frozen_problem(core)
    if problem:
        raise ValueError(f"image features cannot be reused across epochs: {problem}")
    cache = ImageFeatureCache(int(max_gib * GIB))
    compute = core.get_image_features

    def get_image_features(pixel_values, **kwargs: Any):
        keys = cache.keys(pixel_values)
        missing = [i for i, k in enumerate(keys) if k not in cache.store]
        fresh = {}
        if missing:
            with torch.no_grad():
                out = compute(pixel_values[missing], **kwargs).pooler_output
            for j, i in enumerate(missing):
                fresh[i] = out[j]
                cache.put(keys[i], out[j])
        cache.misses += len(missing)
        cache.hits += len(keys) - len(missing)
        feats = torch.stack([fresh[i] if i in fresh else cache.store[k] for i, k in enumerate(keys)])
        return BaseModelOutputWithPooling(pooler_output=feats)

    core.get_image_features = get_image_features
    return cache


def epoch_log_callback(cache: ImageFeatureCache):
    """A TrainerCallback: rank 0 prints the features reused and computed, and the training time, per epoch."""
    import time

    from transformers import TrainerCallback

    class EpochLog(TrainerCallback):
        t0 = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            if args.process_index == 0:
                print(f"[trainer] image features at epoch {state.epoch:.2f}: {cache.hits} reused, {cache.misses} "
                      f"computed, {time.perf_counter() - self.t0:.1f} s of training", flush=True)

    return EpochLog()


def on(args) -> bool:
    return bool(args.freeze_vision and args.image_feature_cache_gib > 0)


def lever(run) -> ImageFeatureCache:
    cache = attach(run.model, run.args.image_feature_cache_gib)
    if run.trainer is not None:
        run.trainer.add_callback(epoch_log_callback(cache))
    return cache
