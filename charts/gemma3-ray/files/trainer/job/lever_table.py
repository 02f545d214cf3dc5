"""The speed levers as data: one row per lever, in the order a worker applies them (issue #41 (4)).

A row names the lever's key in the run's levers (metrics, summary.json), the flag that turns it on with that flag's
type, help, range rules and default (a recipe's three values, or one plain default), the kernel path of
``trainer/speed/capability.py`` it chooses by the device's capability, what it patches, its module under
trainer/speed/ and that module's CPU test. ``flags`` declares every lever flag from these rows (the one place a lever
flag is defined: its field, its recipe row, restart-free); ``speed.speed_levers.apply`` walks them, asking each row's
module ``on(args)`` and then calling its ``lever(run)``. A new lever is one row here and one module with those two
functions (trainer/README.md, "Speed levers"); tests/trainer/speed/test_lever_table.py holds the rows, the flags, the
chart's schema, the modules and their tests equal. Standard library only: the driver on the Ray head imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

RECIPE_FROM = "default: from --recipe"  # what the help of a recipe lever flag ends with


@dataclass(frozen=True)
class Lever:
    name: str  # its key in the run's levers
    module: str  # trainer/speed/<module>.py: `on(args) -> bool`, `lever(run) -> what the run's levers report`
    patches: str  # what it replaces or adds, in words
    test: str  # its CPU test, from the repository root
    flag: str | None = None  # the flag that turns it on (None: no flag of its own; `on` says when)
    kind: Any = None  # the flag's type: bool, float or a Literal of its choices
    help: str = ""  # the flag's help, as `--help` and the chart's schema show it
    recipe: tuple[Any, Any, Any] | None = None  # (fast, tutorial, on CPU) values; the flag's own default is then None
    default: Any = None  # the default of a flag without a recipe
    rules: tuple[tuple[str, Any], ...] = ()  # flags.flag()'s range rules, e.g. (("min", 0),)
    kernels: str | None = None  # the capability.PATHS entry whose kernel it runs (None: the same kernel everywhere)
    says: str | None = None  # the worker's log line "[trainer] <says>: <its report>" (None: no line)


LEVERS: tuple[Lever, ...] = (
    Lever("lm_head", "lm_head", "trl.trainer.utils._use_triton: TRL's fused LM head scores only the labelled "
          "positions on CPU too", "tests/trainer/speed/test_lm_head.py"),
    # before the first Triton compile (the fused LoRA self-test, Liger's kernels, FA4's JIT)
    Lever("compile_cache", "compile_cache", "TRITON_CACHE_DIR, restored from the storage; a Trainer callback stores "
          "it after step 1 (on with use_gpu and fused_lora or use_liger_kernel)", "tests/trainer/speed/test_compile_cache.py",
          says="compile cache"),
    Lever("fused_lora", "fast_lora_peft", "the forward of PEFT's LoRA Linear layers (grouped by shared input)",
          "tests/trainer/speed/test_fast_lora.py", flag="fused_lora", kind=bool,
          help="LoRA layers as one fused Function: dropout applied while loading x, no copies (Triton; same semantics "
               f"as PEFT's layer; {RECIPE_FROM}).",
          recipe=(True, False, False), kernels="fused_lora", says="fused LoRA layers"),
    Lever("vision_attention", "vision_attention", "SigLIP's attention modules: routed to FA4 through the SDPA router "
          "(sdpa_router), or the vision tower's forward under cuDNN-first SDPA priority",
          "tests/trainer/speed/test_vision_kernels.py", flag="vision_attention",
          kind=Literal["sdpa", "cudnn", "fa4", "auto"],
          help="SigLIP attention kernel: SDPA's choice, cuDNN's fused attention first, FlashAttention 4 (flash-attn-4, "
               "sm90/sm100, self-tested; else cuDNN), or auto: the device's choice (trainer/speed/capability.py; "
               f"{RECIPE_FROM}).",
          recipe=("auto", "sdpa", "sdpa"), kernels="siglip_attention", says="SigLIP attention"),
    # in a Trainer: at train begin, after the Trainer's own Liger patch of these modules
    Lever("frozen_norms", "frozen_norm", "the forward of SigLIP's frozen LayerNorms (torch's or Liger's)",
          "tests/trainer/speed/test_frozen_norm.py", flag="frozen_norms", kind=bool,
          help="SigLIP's frozen LayerNorms through PyTorch's kernel, whose backward skips the weight and bias "
               f"gradients ({RECIPE_FROM}).",
          recipe=(True, False, False)),
    Lever("lm_attention", "lm_attention", "the language model's attention modules with kv groups: routed to cuDNN "
          "with grouped kv heads through the SDPA router (sdpa_router)", "tests/trainer/speed/test_sdpa_router.py",
          flag="lm_attention", kind=Literal["sdpa", "cudnn"],
          help="Language-model attention kernel: Transformers' SDPA path (kv heads repeated) or cuDNN's fused attention "
               f"with grouped kv heads (Hopper and newer; {RECIPE_FROM}).",
          recipe=("cudnn", "sdpa", "sdpa"), kernels="lm_attention"),
    Lever("lean_step", "step_levers", "Gemma3Model.get_placeholder_mask, SigLIP's patch embeddings (a forward hook), "
          "the Trainer's compute_loss, log and training_step", "tests/trainer/speed/test_step_levers.py",
          flag="lean_step", kind=bool,
          help="No host syncs inside an optimizer step: the image-token check on the GPU, TRL's metrics read when "
               f"logged ({RECIPE_FROM}).",
          recipe=(True, False, False)),
    Lever("image_feature_cache", "feature_cache", "Gemma3Model.get_image_features (with freeze_vision); a Trainer "
          "callback logs each epoch's reuse", "tests/trainer/speed/test_speed_levers.py",
          flag="image_feature_cache_gib", kind=float,
          help="With freeze_vision: GPU memory for image features reused across epochs (0: off).",
          default=8.0, rules=(("min", 0),)),
)
LEVER_FLAGS = tuple(lever.flag for lever in LEVERS if lever.flag)
