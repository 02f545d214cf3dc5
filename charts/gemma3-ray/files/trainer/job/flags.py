"""The job's flags, declared: names, defaults, help and ranges on the dataclass, and the recipes.

What each flag is lives here; reading them from the command line and checking them together is
``arguments``; the JSON- and template-valued flags read into what the job uses are ``flag_values``.
Standard library only: the driver on the Ray head imports it.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from trainer.job.lever_table import LEVER_FLAGS, LEVERS

# ----------------------------------------------------------------------------------------------
# The tutorial's task: a product description from the product name, its category and its photo.
# ----------------------------------------------------------------------------------------------
DEFAULT_SYSTEM_MESSAGE = "You are an expert product description writer for Amazon."
DEFAULT_PROMPT_TEMPLATE = """Create a Short Product description based on the provided <PRODUCT> and <CATEGORY> and image.
Only return description. The description should be SEO optimized and for a better mobile search experience.

<PRODUCT>
{product}
</PRODUCT>

<CATEGORY>
{category}
</CATEGORY>
"""
# Field of the job -> column of the dataset. `image` and `answer` are always needed; every
# `{placeholder}` of the prompt template is a field too. `--column_mapping` overrides entries.
IMAGE_FIELD = "image"
ANSWER_FIELD = "answer"
DEFAULT_COLUMN_MAPPING = {
    IMAGE_FIELD: "image",
    ANSWER_FIELD: "description",
    "product": "Product Name",
    "category": "Category",
}
RUN_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

# ----------------------------------------------------------------------------------------------
# Recipes: the one place the speed/memory flags get their defaults. A flag given on the command line
# always wins. Columns: the fast recipe, the tutorial's recipe, and what either becomes on CPU workers
# (KEEP: the recipe's value; the CPU path has no Triton kernels, trains in fp32, decodes in-process).
# bench/RESULTS.md measures both recipes.
# ----------------------------------------------------------------------------------------------
KEEP = object()
RECIPE_COLUMNS = ("fast", "tutorial")
RECIPES: dict[str, tuple[Any, ...]] = {
    #                              fast    tutorial  on CPU
    "quantization":               ("none", "4bit",   KEEP),
    "attn_implementation":        ("sdpa", "eager",  KEEP),
    "gradient_checkpointing":     (False,  True,     KEEP),
    # the micro-batch cap: 16 x ~410 tokens with fused LoRA peak at ~97-108 GiB on 4B (H200/B200); 8 (~72 GiB)
    # on an 80 GB H100
    "per_device_train_batch_size": (16,    1,        KEEP),
    "use_liger_kernel":           (True,   False,    False),
    "adapter_dtype":              ("bf16", "fp32",   "fp32"),
    "dataloader_num_workers":     (4,      0,        0),
    "compile_vision":             (False,  False,    False),
    # the speed levers' rows: lever_table.py
    **{lever.flag: lever.recipe for lever in LEVERS if lever.flag and lever.recipe},
}
# Values only a GPU worker can use: flag -> (value, why and the fix on CPU).
GPU_ONLY: dict[str, tuple[Any, str]] = {
    "quantization": ("4bit", "bitsandbytes; use --quantization=none with --use_gpu=false"),
    "attn_implementation": ("flash_attention_2", "use eager or sdpa on CPU"),
    "use_liger_kernel": (True, "Triton kernels; drop it or set --use_gpu=true"),
    "adapter_dtype": ("bf16", "the CPU path trains in fp32; drop it or set --use_gpu=true"),
    "compile_vision": (True, "drop it or set --use_gpu=true"),
}


def flag(default: Any, help: str, **rules: Any) -> Any:  # noqa: A002 - the dataclass metadata key
    """A flag: its default, help text and range rules (`min`: >=, `above`: >, `below`: <, `off`: the one value
    outside the range that turns the flag off). The chart's values.schema.json is generated from these rules
    (make sync-trainer), so helm refuses what the trainer would."""
    return field(default=default, metadata={"help": help, **rules})


LEVER_FLAGS_AFTER = "dataloader_num_workers"  # the speed levers' flags come after this one (--help, the schema)


def with_lever_flags(cls: type) -> type:
    """`cls` with a field per lever flag of lever_table.LEVERS, after LEVER_FLAGS_AFTER: a recipe lever's default is
    None (RECIPES fills it), any other's its row's default."""
    annotations: dict[str, Any] = {}
    for name, hint in cls.__annotations__.items():
        annotations[name] = hint
        if name != LEVER_FLAGS_AFTER:
            continue
        for lever in LEVERS:
            if lever.flag:
                annotations[lever.flag] = lever.kind | None if lever.recipe else lever.kind
                setattr(cls, lever.flag, flag(None if lever.recipe else lever.default, lever.help, **dict(lever.rules)))
    if LEVER_FLAGS_AFTER not in annotations:
        raise TypeError(f"{cls.__name__} has no field {LEVER_FLAGS_AFTER} to put the lever flags after")
    cls.__annotations__ = annotations
    return cls


@dataclass
@with_lever_flags
class TrainArguments:
    """Every flag of the job. The chart renders its `training:` map as exactly these names."""

    # --- the tutorial's flags (its names; where a default differs, the help says what the tutorial used) ---
    model_id: str = flag("google/gemma-3-4b-it", "Hub id, local directory or gs:// directory of a Gemma 3 vision model.")
    dataset_name: str = flag("philschmid/amazon-product-descriptions-vlm",
                             "Hub dataset id, or a local/gs:// .parquet/.jsonl file or a directory of them.")
    output_dir: str = flag("gemma-product-description",
                           "Folder of the runs when storage_path is unset: gs://<gcs_bucket>/<output_dir>, else "
                           "./<output_dir> (the tutorial saved its model there on the pod's disk).")
    gcs_bucket: str | None = flag(None, "Bucket for the runs when storage_path is unset.")
    push_to_hub: bool = flag(False, "Push the final adapter to hub_model_id (HF_TOKEN).")
    lora_r: int = flag(16, "LoRA rank.", min=1)
    lora_alpha: int = flag(16, "LoRA alpha.", min=1)
    lora_dropout: float = flag(0.05, "LoRA dropout.", min=0, below=1)
    max_seq_length: int = flag(1024, "Longest sample in tokens (image tokens included); longer rows are skipped, "
                                     "never cut (the tutorial: 512, truncating).", min=1)
    num_train_epochs: float = flag(3.0, "Epochs (max_steps wins when > 0).", min=0)
    global_batch_size: int = flag(64, "Samples per optimizer step over all workers, exactly, on every worker count "
                                      "the run may take (the tutorial: 16 workers x 1 x 4 = 64); a count that does "
                                      "not divide it is refused at the start. Each worker's share is split into "
                                      "micro-batches; accumulation is derived.", min=1)
    per_device_train_batch_size: int | None = flag(
        None, "Most samples per worker per forward pass: the micro-batch is the largest divisor of "
              "global_batch_size / workers up to this (default: from --recipe: fast 16, tutorial 1).", min=1)
    learning_rate: float = flag(2e-4, "Peak learning rate (constant schedule).", above=0)
    logging_steps: int = flag(5, "Log every N optimizer steps (the tutorial: 10).", min=1)
    save_strategy: Literal["steps", "epoch", "no"] = flag("epoch", "When to checkpoint.")
    save_steps: int = flag(100, "Checkpoint every N steps (save_strategy=steps).", min=1)
    # --- added ---
    num_workers: int = flag(1, "Ray Train workers (one per GPU); with min_workers, the most the job uses.", min=1)
    min_workers: int | None = flag(
        None, "Elastic: keep training on as few as this many workers when capacity is lost (same global batch, "
              "more accumulation) and grow back to num_workers when it returns (unset: always num_workers).", min=1)
    use_gpu: bool = flag(True, "One GPU per worker; false trains on CPU (tests).")
    accelerator_type: str | None = flag(None, "Ray accelerator type, e.g. H100.")
    storage_path: str | None = flag(None, "Root of the release's runs: gs://bucket/prefix or a local/shared path; "
                                          "each run lives in <storage_path>/runs/<run_name>.")
    run_name: str | None = flag(None, "This run (derived: the chart passes one per Helm revision). Its files live in "
                                      "<storage_path>/runs/<run_name>; a restart of the same run resumes its newest "
                                      "checkpoint, a finished run is not trained again (default: a fresh name from "
                                      "the UTC time).")
    resume_from: str = flag("", "Continue an earlier run: its run name (under <storage_path>/runs/) or the gs:// or "
                                "local path of a checkpoint ('' starts fresh). This run's own checkpoints win.")
    installer: Literal["none", "uv", "pip"] = flag(
        "none", "What the Ray Train workers install at start (derived: the chart's dependencies and "
                "rayJob.runtimeEnv.installer): none (their image has the packages), or uv/pip: Ray's runtime env "
                "of the workers only installs requirements.txt beside vision_train.py (ray excluded) and extra_pip.")
    extra_pip: str = flag("[]", 'JSON list of extra pip requirements the workers install with installer uv/pip '
                                '(derived: rayJob.runtimeEnv.extraPip), e.g. ["wandb==0.19.0"].')
    recipe: Literal["fast", "tutorial"] = flag(
        "fast", "Preset for the speed/memory flags left unset: fast (bf16 fused LoRA, sdpa, no checkpointing, "
                "micro-batch up to 16, Liger kernels, data loader processes; ~108 GiB/GPU on 4B, for H200/B200) or "
                "tutorial (the tutorial's QLoRA: 4-bit, eager, checkpointing, micro-batch 1; fits small GPUs). Both "
                "keep the tutorial's optimization (global_batch_size, learning rate, schedule). See bench/RESULTS.md.")
    quantization: Literal["none", "4bit"] | None = flag(None, "4bit = QLoRA (NF4) (default: from --recipe).")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = flag(
        None, "Attention kernel (default: from --recipe).")
    gradient_checkpointing: bool | None = flag(None, "Recompute activations in backward (default: from --recipe).")
    use_liger_kernel: bool | None = flag(None, "Liger's Triton RMSNorm/GeGLU/RoPE kernels (GPU; default: from --recipe).")
    adapter_dtype: Literal["bf16", "fp32"] | None = flag(
        None, "LoRA weight dtype on a bf16 base: bf16 skips the fp32 casts (default: from --recipe).")
    lora_target: Literal["all-linear", "language-model"] = flag(
        "all-linear", "LoRA on every linear layer (vision too) or on the language model only.")
    train_embeddings: bool = flag(False, "Also train the (tied) token embeddings / LM head: ~0.7B params on 4B.")
    freeze_vision: bool = flag(False, "Run the vision tower without gradients (needs lora_target=language-model).")
    max_steps: int = flag(-1, "Stop after N optimizer steps (-1: use epochs).", min=1, off=-1)
    eval_fraction: float = flag(0.05, "Held-out share of the rows, for eval loss (0 disables eval; the tutorial held "
                                      "nothing out).", min=0, below=1)
    eval_steps: int | None = flag(None, "Evaluate every N steps (default: at each save).", min=1)
    seed: int = flag(42, "Seed of the split, the shuffling and the adapter init.")
    column_mapping: str = flag("{}", 'JSON {field: column}, e.g. {"image":"img","answer":"caption"}.')
    prompt_template: str = flag(DEFAULT_PROMPT_TEMPLATE, "User prompt; {field} placeholders are filled per row.")
    system_message: str = flag(DEFAULT_SYSTEM_MESSAGE, "System prompt ('' for none).")
    bad_rows: Literal["skip", "fail"] = flag("skip", "Missing/corrupt image, empty text or too long: skip (counted) "
                                                     "or fail.")
    max_failures: int = flag(3, "Worker-group restarts Ray may do (-1: unlimited).", min=-1)
    save_total_limit: int = flag(2, "Checkpoints kept in storage.", min=1)
    hub_model_id: str | None = flag(None, "Hub repo for push_to_hub.")
    merge_adapter: bool = flag(False, "Also write a merged model to the run's merged/.")
    cache_dir: str | None = flag(None, "Node-local cache for the model and data (default: the HF cache).")
    compile_vision: bool | None = flag(None, "torch.compile each SigLIP encoder layer (static shapes: compiles once; "
                                             "GPU; default: from --recipe).")
    dataloader_num_workers: int | None = flag(
        None, "Processes decoding images per worker (default: from --recipe on GPU; 0 on CPU).", min=0)
    # --- the speed levers' flags (fused_lora ... image_feature_cache_gib) follow here: lever_table.py ---
    streaming: bool = flag(
        False, "Stream the rows through Ray Data from the shards `gemma3-ray data shard` wrote (dataset_name: their "
               "gs:// prefix or directory, with manifest.json): no copy of the data on any node and no scan before "
               "step 1; bad rows are skipped as they come (false: the data files are copied to each node and scanned "
               "once per run, best for data that fits).")
    streaming_shuffle_window: int = flag(
        1024, "Streaming: rows in each worker's shuffle window (Ray Data's local shuffle buffer) after the "
              "per-epoch shard order; 0 keeps the manifest's order (no shuffle).", min=0)
    streaming_decoders: int = flag(
        2, "Streaming: Ray Data actors (one CPU each) that check, decode, process and tokenise the rows.", min=1)
    streaming_object_store_gib: float = flag(
        4.0, "Streaming: object store memory the stream may hold (Ray Data waits beyond it instead of spilling; "
             "0: Ray Data's default).", min=0)
    sample_rows: int = flag(8, "Eval rows (fixed, spread over the split) whose description the end of the run "
                               "generates with the base model and with the adapter: samples.jsonl, report.html "
                               "(0: none).", min=0)
    sample_max_new_tokens: int = flag(256, "Longest generated sample description in tokens (greedy).", min=1)
    sample_batch_size: int = flag(8, "Sample rows generated together.", min=1)
    sample_time_budget_s: float = flag(600.0, "Seconds sample generation may take; a batch that would not fit "
                                              "is left out (the log and the report say so).", min=0)
    sample_at_eval: bool = flag(False, "Also generate the samples at each evaluation (report.html is refreshed "
                                       "at each evaluation either way).")


# The flags that may change when a run restarts (a retry, a resize, a new job with the same --run_name)
# without making it another run: where it lives and what it is called, reporting and checkpoint cadence,
# the workers (the global batch is exact on every worker count), speed levers with the same arithmetic,
# and what happens after training. Every other flag, and the data's content, defines the run
# (run_definition.py): a restart with another value is refused, naming it.
RESTART_FREE = (
    "output_dir", "gcs_bucket", "storage_path", "run_name", "resume_from",
    "logging_steps", "eval_steps", "save_strategy", "save_steps", "save_total_limit",
    "num_workers", "min_workers", "per_device_train_batch_size", "accelerator_type", "installer", "extra_pip",
    "max_failures", "cache_dir", "dataloader_num_workers", "streaming_decoders", "streaming_object_store_gib",
    "recipe", "attn_implementation", "gradient_checkpointing", "use_liger_kernel", "compile_vision", *LEVER_FLAGS,
    "push_to_hub", "hub_model_id", "merge_adapter", "sample_rows", "sample_max_new_tokens", "sample_batch_size",
    "sample_time_budget_s", "sample_at_eval",
)


class UsageError(ValueError):
    """A flag or an input the user has to fix; the message says which and how."""


# Flags that are gone, and what replaces them.
RETIRED = {
    "gradient_accumulation_steps": "accumulation is derived: set --global_batch_size (samples per optimizer "
                                   "step over all workers) and --per_device_train_batch_size (the micro-batch cap)",
}



def is_checkpoint_path(value: str) -> bool:
    """A resume_from value that is a path (gs://, absolute, relative with a '/'), not a run name."""
    return value.startswith(("gs://", "/", ".")) or "/" in value


# Flags that name a path: parse_args gives each one spelling (gs://b/x/ = gs://b/x; ./data = data/ = /abs/data), so a
# path spelled two ways is never two runs (#27.13). A hub id (model_id, dataset_name) or run name stays as given.
PATH_FLAGS = ("model_id", "dataset_name", "storage_path", "cache_dir", "resume_from")


def canonical_path(name: str, value: str | None) -> str | None:
    """The one spelling of flag `name`'s `value`: gs:// normalised, a local path absolute, else without a trailing /."""
    if not value or (name == "resume_from" and not is_checkpoint_path(value)):
        return value
    if value.startswith("gs://"):
        return "gs://" + posixpath.normpath(value[5:]).strip("/") if value[5:].strip("/") else value
    if name in ("storage_path", "cache_dir") or value.startswith(("/", ".")) or os.path.exists(value):
        return os.path.abspath(value)
    return value.rstrip("/") or value


def apply_recipe(args: TrainArguments) -> None:
    """Every speed/memory flag left unset takes its recipe's value (its CPU value on CPU workers)."""
    column = RECIPE_COLUMNS.index(args.recipe)
    for name, values in RECIPES.items():
        if getattr(args, name) is None:
            value = values[column] if args.use_gpu or values[-1] is KEEP else values[-1]
            setattr(args, name, value)


def range_text(rules: dict[str, Any]) -> str | None:
    """A flag's range rules in words (">= 1", "> 0", "in [0, 1)", "-1 or >= 1"); None without rules."""
    low, above, below, off = rules.get("min"), rules.get("above"), rules.get("below"), rules.get("off")
    if low is None and above is None:
        return None
    text = f"in [{low}, {below})" if low is not None and below is not None else (
        f"> {above}" if above is not None else f">= {low}")
    return f"{off} or {text}" if off is not None else text
