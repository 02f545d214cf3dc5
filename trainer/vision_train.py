#!/usr/bin/env python3
"""Fine-tune Gemma 3 on image-text pairs with Ray Train, TRL's SFTTrainer and PEFT LoRA/QLoRA.

The tutorial's job (google/gemma-3-4b-it on philschmid/amazon-product-descriptions-vlm), made correct,
configurable and resumable:

- the loss covers the assistant's answer and its end-of-turn marker only, with exactly one ``<bos>``
  and image token ids taken from the processor; ``token_type_ids`` marks the image soft tokens;
- the logged loss is the true mean token loss over the accumulation steps and the workers;
- rows are decoded lazily; bad rows are counted and skipped (or fail the job); a held-out eval split;
- the model and dataset are fetched once per node; everything works offline from local paths;
- each run lives in ``<storage_path>/runs/<run_name>``: checkpoints go to its ``checkpoints/`` through
  Ray Train, a restart of the run resumes from the newest one; the adapter lands in its ``final/``;
  ``metrics.jsonl``, ``summary.json`` and TensorBoard events sit next to it. A finished run is never
  trained again; ``--resume_from`` continues an earlier run explicitly.

Usage (flags are ``--name=value``; booleans ``true|false``; maps as JSON; see trainer/README.md)::

    python vision_train.py --model_id=google/gemma-3-4b-it --num_workers=16 --storage_path=gs://b/run1
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import string
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from transformers import TrainerCallback

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

# The tutorial's fixed hyperparameters (QLoRA paper): not flags.
MAX_GRAD_NORM = 0.3
LR_SCHEDULER = "constant"
LABEL_IGNORE = -100
# Test-only fault injection: the worker of rank 1 (rank 0 on one worker) kills itself once, right
# after this optimizer step, to drill Ray's restart and the resume from the last checkpoint.
FAULT_AT_STEP_ENV = "GEMMA3_RAY_FAULT_AT_STEP"
# The fake GCS server (tests, demo): `http://host:port`; pyarrow then talks plain HTTP, anonymously.
STORAGE_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
RUNS_DIR = "runs"
CHECKPOINTS_DIR = "checkpoints"
# Ray Train's record of the checkpoints it registered (written in CHECKPOINTS_DIR; restored on restart).
RAY_CHECKPOINT_SNAPSHOT = "checkpoint_manager_snapshot.json"
TRAINER_STATE_FILE = "trainer_state.json"
RUN_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
CHECKPOINT_NAME_PATTERN = re.compile(r"checkpoint-(\d+)")
FINAL_DIR = "final"
MERGED_DIR = "merged"
TENSORBOARD_DIR = "tensorboard"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
GIB = 2**30
SCAN_BATCH_ROWS = 64
# Recipes: values for the speed/memory flags a user leaves unset (bench/RESULTS.md measures both).
RECIPES: dict[str, dict[str, Any]] = {
    "fast": {
        "quantization": "none",
        "attn_implementation": "sdpa",
        "gradient_checkpointing": False,
        # 12 x ~410 tokens: ~108 GiB peak on 4B (H200/B200); set 8 (~71 GiB) on an 80 GB H100
        "per_device_train_batch_size": 12,
        "gradient_accumulation_steps": 1,
        "use_liger_kernel": True,
        "adapter_dtype": "bf16",
        "dataloader_num_workers": 4,
        "compile_vision": False,
    },
    "tutorial": {
        "quantization": "4bit",
        "attn_implementation": "eager",
        "gradient_checkpointing": True,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 4,
        "use_liger_kernel": False,
        "adapter_dtype": "fp32",
        "dataloader_num_workers": 0,
        "compile_vision": False,
    },
}
# GPU micro-batches are padded to a multiple of this many tokens (2% more tokens on average, steadier steps).
GPU_PAD_MULTIPLE = 16
# Varying sequence lengths fragment PyTorch's CUDA cache; expandable segments avoid the stalls.
CUDA_ALLOC_CONF = "expandable_segments:True"
CPU_OVERRIDES: dict[str, Any] = {
    "use_liger_kernel": False,
    "adapter_dtype": "fp32",
    "dataloader_num_workers": 0,
    "compile_vision": False,
}
LANGUAGE_MODEL_LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@dataclass
class TrainArguments:
    """Every flag of the job. The chart renders its `training:` map as exactly these names."""

    # --- the tutorial's flags (same defaults and meaning) ---
    model_id: str = field(
        default="google/gemma-3-4b-it",
        metadata={"help": "Hub id, local directory or gs:// directory of a Gemma 3 vision model."},
    )
    dataset_name: str = field(
        default="philschmid/amazon-product-descriptions-vlm",
        metadata={"help": "Hub dataset id, or a local/gs:// .parquet/.jsonl file or a directory of them."},
    )
    output_dir: str = field(
        default="gemma-product-description",
        metadata={"help": "Folder of the runs when storage_path is unset: gs://<gcs_bucket>/<output_dir>, else ./<output_dir>."},
    )
    gcs_bucket: str | None = field(default=None, metadata={"help": "Bucket for the runs when storage_path is unset."})
    push_to_hub: bool = field(default=False, metadata={"help": "Push the final adapter to hub_model_id (HF_TOKEN)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    max_seq_length: int = field(
        default=1024,
        metadata={"help": "Longest sample in tokens (image tokens included); longer rows are skipped, never cut."},
    )
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs (max_steps wins when > 0)."})
    per_device_train_batch_size: int | None = field(
        default=None, metadata={"help": "Samples per worker per micro-batch (default: from --recipe; tutorial: 1)."}
    )
    gradient_accumulation_steps: int | None = field(
        default=None, metadata={"help": "Micro-batches per optimizer step (default: from --recipe; tutorial: 4)."}
    )
    learning_rate: float = field(default=2e-4, metadata={"help": "Peak learning rate (constant schedule)."})
    logging_steps: int = field(default=5, metadata={"help": "Log every N optimizer steps."})
    save_strategy: Literal["steps", "epoch", "no"] = field(default="epoch", metadata={"help": "When to checkpoint."})
    save_steps: int = field(default=100, metadata={"help": "Checkpoint every N steps (save_strategy=steps)."})
    # --- added ---
    num_workers: int = field(default=1, metadata={"help": "Ray Train workers (one per GPU)."})
    use_gpu: bool = field(default=True, metadata={"help": "One GPU per worker; false trains on CPU (tests)."})
    accelerator_type: str | None = field(default=None, metadata={"help": "Ray accelerator type, e.g. H100."})
    storage_path: str | None = field(
        default=None,
        metadata={"help": "Root of the release's runs: gs://bucket/prefix or a local/shared path; each run "
                          "lives in <storage_path>/runs/<run_name>."},
    )
    run_name: str | None = field(
        default=None,
        metadata={"help": "This run (derived: the chart passes one per Helm revision). Its files live in "
                          "<storage_path>/runs/<run_name>; a restart of the same run resumes its newest checkpoint, "
                          "a finished run is not trained again (default: a fresh name from the UTC time)."},
    )
    resume_from: str = field(
        default="",
        metadata={"help": "Continue an earlier run: its run name (under <storage_path>/runs/) or the gs:// or "
                          "local path of a checkpoint ('' starts fresh). This run's own checkpoints win."},
    )
    recipe: Literal["fast", "tutorial"] = field(
        default="fast",
        metadata={
            "help": "Preset for the speed/memory flags left unset: fast (bf16 LoRA, sdpa, no checkpointing, "
            "batch 12, Liger kernels, data loader processes; ~108 GiB/GPU on 4B, for H200/B200) or tutorial (the tutorial's QLoRA: "
            "4-bit, eager, checkpointing, batch 1 x 4; fits small GPUs). See bench/RESULTS.md."
        },
    )
    quantization: Literal["none", "4bit"] | None = field(
        default=None, metadata={"help": "4bit = QLoRA (NF4) (default: from --recipe)."}
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = field(
        default=None, metadata={"help": "Attention kernel (default: from --recipe)."}
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Recompute activations in backward (default: from --recipe)."}
    )
    use_liger_kernel: bool | None = field(
        default=None,
        metadata={"help": "Liger's Triton RMSNorm/GeGLU/RoPE kernels (GPU; default: from --recipe)."},
    )
    adapter_dtype: Literal["bf16", "fp32"] | None = field(
        default=None,
        metadata={"help": "LoRA weight dtype on a bf16 base: bf16 skips the fp32 casts (default: from --recipe)."},
    )
    lora_target: Literal["all-linear", "language-model"] = field(
        default="all-linear",
        metadata={"help": "LoRA on every linear layer (vision too) or on the language model only."},
    )
    train_embeddings: bool = field(
        default=False, metadata={"help": "Also train the (tied) token embeddings / LM head: ~0.7B params on 4B."}
    )
    freeze_vision: bool = field(
        default=False,
        metadata={"help": "Run the vision tower without gradients (needs lora_target=language-model)."},
    )
    max_steps: int = field(default=-1, metadata={"help": "Stop after N optimizer steps (-1: use epochs)."})
    eval_fraction: float = field(default=0.05, metadata={"help": "Held-out share of the rows (0 disables eval)."})
    eval_steps: int | None = field(default=None, metadata={"help": "Evaluate every N steps (default: at each save)."})
    seed: int = field(default=42, metadata={"help": "Seed of the split, the shuffling and the adapter init."})
    column_mapping: str = field(
        default="{}", metadata={"help": 'JSON {field: column}, e.g. {"image":"img","answer":"caption"}.'}
    )
    prompt_template: str = field(
        default=DEFAULT_PROMPT_TEMPLATE, metadata={"help": "User prompt; {field} placeholders are filled per row."}
    )
    system_message: str = field(default=DEFAULT_SYSTEM_MESSAGE, metadata={"help": "System prompt ('' for none)."})
    bad_rows: Literal["skip", "fail"] = field(
        default="skip", metadata={"help": "Missing/corrupt image, empty text or too long: skip (counted) or fail."}
    )
    max_failures: int = field(default=3, metadata={"help": "Worker-group restarts Ray may do (-1: unlimited)."})
    save_total_limit: int = field(default=2, metadata={"help": "Checkpoints kept in storage."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repo for push_to_hub."})
    merge_adapter: bool = field(default=False, metadata={"help": "Also write a merged model to <storage>/merged."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Node-local cache for the model and data (default: the HF cache)."}
    )
    compile_vision: bool | None = field(
        default=None,
        metadata={"help": "torch.compile each SigLIP encoder layer (static shapes: compiles once; GPU)."},
    )
    dataloader_num_workers: int | None = field(
        default=None,
        metadata={"help": "Processes decoding images per worker (default: from --recipe on GPU; 0 on CPU)."},
    )

    def __post_init__(self) -> None:
        # Flags left unset take the recipe's value; an explicit flag always wins.
        preset = dict(RECIPES.get(self.recipe, {}))
        if not self.use_gpu:  # CPU workers: no Triton kernels, fp32 weights, images decoded in-process
            preset.update(CPU_OVERRIDES)
        for name, value in preset.items():
            if getattr(self, name) is None:
                setattr(self, name, value)


class UsageError(ValueError):
    """A flag or an input the user has to fix; the message says which and how."""


# ----------------------------------------------------------------------------------------------
# Flags
# ----------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> TrainArguments:
    """Parse `--name=value` flags; unknown ones fail with the closest known name."""
    from transformers import HfArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    known = {f.name for f in dataclasses.fields(TrainArguments)}
    unknown = []
    for item in argv:
        if item.startswith("--"):
            name = item[2:].split("=", 1)[0]
            if name not in known and name not in ("help", "h"):
                hint = difflib.get_close_matches(name, known, n=1)
                unknown.append(f"--{name}" + (f" (did you mean --{hint[0]}?)" if hint else ""))
    if unknown:
        raise UsageError(f"unknown flag(s): {', '.join(unknown)}. Known flags: see trainer/README.md.")
    (args,) = HfArgumentParser(TrainArguments).parse_args_into_dataclasses(args=argv)
    validate_args(args)
    return args


def prompt_fields(template: str) -> list[str]:
    """The `{placeholder}` names of a prompt template, in order, each once."""
    names: list[str] = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name not in names:
            if not name.isidentifier():
                raise UsageError(
                    f"prompt_template: placeholder {{{name}}} is not a plain field name; use names like "
                    "{product} and map them with column_mapping."
                )
            names.append(name)
    return names


def column_mapping(args: TrainArguments) -> dict[str, str]:
    """Field -> dataset column, for every field the job reads."""
    try:
        overrides = json.loads(args.column_mapping or "{}")
    except json.JSONDecodeError as e:
        raise UsageError(f'column_mapping: not JSON ({e}); example: --column_mapping={{"image":"img"}}') from e
    if not isinstance(overrides, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in overrides.items()
    ):
        raise UsageError('column_mapping: must be a JSON object of strings, e.g. {"answer":"caption"}')
    fields = [IMAGE_FIELD, ANSWER_FIELD, *prompt_fields(args.prompt_template)]
    stray = sorted(set(overrides) - set(fields))
    if stray:
        raise UsageError(
            f"column_mapping: unknown field(s) {stray}; the fields are {fields} "
            "(image, answer and the prompt_template placeholders)."
        )
    merged = {**DEFAULT_COLUMN_MAPPING, **overrides}
    return {f: merged.get(f, f) for f in fields}


def validate_args(args: TrainArguments) -> None:
    """Reject contradictory or out-of-range flags, all at once, each with its fix."""
    errors: list[str] = []

    def need(cond: bool, msg: str) -> None:
        if not cond:
            errors.append(msg)

    need(args.num_workers >= 1, "num_workers must be >= 1")
    need(args.per_device_train_batch_size >= 1, "per_device_train_batch_size must be >= 1")
    need(args.gradient_accumulation_steps >= 1, "gradient_accumulation_steps must be >= 1")
    need(args.learning_rate > 0, "learning_rate must be > 0")
    need(args.lora_r >= 1 and args.lora_alpha >= 1, "lora_r and lora_alpha must be >= 1")
    need(0 <= args.lora_dropout < 1, "lora_dropout must be in [0, 1)")
    need(args.max_seq_length >= 1, "max_seq_length must be >= 1")
    need(args.logging_steps >= 1 and args.save_steps >= 1, "logging_steps and save_steps must be >= 1")
    need(args.eval_steps is None or args.eval_steps >= 1, "eval_steps must be >= 1 (or unset)")
    need(0 <= args.eval_fraction < 1, "eval_fraction must be in [0, 1)")
    need(args.max_steps > 0 or args.num_train_epochs > 0, "set max_steps > 0 or num_train_epochs > 0")
    need(args.save_total_limit >= 1, "save_total_limit must be >= 1")
    need(args.max_failures >= -1, "max_failures must be >= -1 (-1: unlimited)")
    need(args.dataloader_num_workers >= 0, "dataloader_num_workers must be >= 0")
    need(
        not (args.use_liger_kernel and not args.use_gpu),
        "use_liger_kernel=true needs GPUs (Triton kernels); drop it or set --use_gpu=true",
    )
    need(
        not (args.compile_vision and not args.use_gpu),
        "compile_vision=true needs GPUs; drop it or set --use_gpu=true",
    )
    need(
        not (args.adapter_dtype == "bf16" and not args.use_gpu),
        "adapter_dtype=bf16 needs GPUs (the CPU path trains in fp32); drop it or set --use_gpu=true",
    )
    need(
        not (args.quantization == "4bit" and not args.use_gpu),
        "quantization=4bit needs GPUs (bitsandbytes); use --quantization=none with --use_gpu=false",
    )
    need(
        not (args.accelerator_type and not args.use_gpu),
        "accelerator_type needs --use_gpu=true (CPU workers have no accelerator)",
    )
    need(
        not (args.attn_implementation == "flash_attention_2" and not args.use_gpu),
        "attn_implementation=flash_attention_2 needs GPUs; use eager or sdpa on CPU",
    )
    need(
        not (args.freeze_vision and args.lora_target == "all-linear"),
        "freeze_vision=true leaves the vision tower without LoRA: set --lora_target=language-model",
    )
    need(
        not (args.merge_adapter and args.quantization == "4bit"),
        "merge_adapter=true cannot merge into a 4-bit base (lossy); train with --quantization=none, "
        "or merge the adapter in final/ offline onto the bf16 base",
    )
    need(
        not (args.hub_model_id and not args.push_to_hub),
        "hub_model_id is set but push_to_hub=false: add --push_to_hub=true or drop hub_model_id",
    )
    need(
        not (args.push_to_hub and not os.environ.get("HF_TOKEN")),
        "push_to_hub=true needs the HF_TOKEN environment variable (a write token)",
    )
    if args.gcs_bucket and args.storage_path:
        need(
            args.storage_path.startswith(f"gs://{args.gcs_bucket}/") or args.storage_path == f"gs://{args.gcs_bucket}",
            f"gcs_bucket={args.gcs_bucket} disagrees with storage_path={args.storage_path}; set only one",
        )
    if args.gcs_bucket:
        need(
            "/" not in args.gcs_bucket and not args.gcs_bucket.startswith("gs:"),
            "gcs_bucket is a bucket name without gs:// or a path (use storage_path for prefixes)",
        )
    if args.run_name is not None:
        need(
            RUN_NAME_PATTERN.fullmatch(args.run_name) is not None,
            f"run_name={args.run_name!r}: use letters, digits, '.', '_' and '-' (at most 100, no '/'), "
            "e.g. --run_name=r3-20260101-120000",
        )
    if args.resume_from and not is_checkpoint_path(args.resume_from):
        need(
            RUN_NAME_PATTERN.fullmatch(args.resume_from) is not None,
            f"resume_from={args.resume_from!r} is neither a run name nor a gs:// or local checkpoint path",
        )
        need(args.resume_from != args.run_name, f"resume_from={args.resume_from!r} names this run itself; "
             "a restart of a run resumes its own checkpoints without it")
    try:
        column_mapping(args)
    except UsageError as e:
        errors.append(str(e))
    if errors:
        raise UsageError("invalid flags:\n  - " + "\n  - ".join(errors))


# ----------------------------------------------------------------------------------------------
# Storage: one pyarrow filesystem for gs:// (real GCS or the fake server) and local paths.
# ----------------------------------------------------------------------------------------------
def run_root(args: TrainArguments) -> str:
    """The run's root: storage_path, else gs://<gcs_bucket>/<output_dir>, else ./<output_dir>."""
    if args.storage_path:
        return args.storage_path.rstrip("/")
    if args.gcs_bucket:
        return f"gs://{args.gcs_bucket}/{args.output_dir.strip('/')}"
    return str(Path(args.output_dir).resolve())


def filesystem(uri: str, emulator_host: str | None = None):
    """(pyarrow filesystem, path without scheme) for a gs:// URI or a local path."""
    import pyarrow.fs as pafs

    if uri.startswith("gs://"):
        path = uri[len("gs://") :]
        if emulator_host:
            scheme, _, host = emulator_host.rpartition("://")
            return pafs.GcsFileSystem(anonymous=True, endpoint_override=host, scheme=scheme or "http"), path
        return pafs.GcsFileSystem(), path
    if "://" in uri:
        raise UsageError(f"unsupported storage scheme in {uri!r}: use gs://bucket/prefix or a local path")
    return pafs.LocalFileSystem(), str(Path(uri).resolve())


@dataclass
class Storage:
    """Where the run's files go. Picklable: it travels to the Ray workers in the train config."""

    root: str
    emulator_host: str | None = None

    def fs(self):
        return filesystem(self.root, self.emulator_host)

    def uri(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write_bytes(self, rel: str, data: bytes) -> None:
        fs, base = self.fs()
        path = f"{base}/{rel}"
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(data)

    def read_bytes(self, rel: str) -> bytes | None:
        import pyarrow.fs as pafs

        fs, base = self.fs()
        if fs.get_file_info(f"{base}/{rel}").type != pafs.FileType.File:
            return None
        with fs.open_input_stream(f"{base}/{rel}") as src:
            return src.read()

    def child(self, rel: str) -> Storage:
        return Storage(root=self.uri(rel), emulator_host=self.emulator_host)

    def exists(self, rel: str) -> bool:
        import pyarrow.fs as pafs

        fs, base = self.fs()
        return fs.get_file_info(f"{base}/{rel}").type != pafs.FileType.NotFound

    def list_dir(self, rel: str) -> list[str]:
        """Names directly under `rel` (empty when it does not exist)."""
        import pyarrow.fs as pafs

        fs, base = self.fs()
        infos = fs.get_file_info(pafs.FileSelector(f"{base}/{rel}", allow_not_found=True))
        return sorted(Path(i.path).name for i in infos)

    def upload_dir(self, local: Path, rel: str) -> None:
        import pyarrow.fs as pafs

        fs, base = self.fs()
        fs.create_dir(f"{base}/{rel}", recursive=True)
        pafs.copy_files(str(local), f"{base}/{rel}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def storage_for(args: TrainArguments) -> Storage:
    """The release's storage root (runs live under it)."""
    return storage_at(run_root(args))


def storage_at(uri: str) -> Storage:
    return Storage(root=uri.rstrip("/"), emulator_host=os.environ.get(STORAGE_EMULATOR_ENV) if uri.startswith("gs://")
                   else None)


# ----------------------------------------------------------------------------------------------
# Run identity: <storage_path>/runs/<run_name>; restarts resume within the run, resume_from crosses runs.
# ----------------------------------------------------------------------------------------------
def is_checkpoint_path(value: str) -> bool:
    """A resume_from value that is a path (gs://, absolute, relative with a '/'), not a run name."""
    return value.startswith("gs://") or "/" in value or value.startswith(".")


def new_run_name(root: Storage) -> str:
    """A fresh run name from the UTC time (a suffix when that name is taken)."""
    base = datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S")
    name, n = base, 1
    while root.exists(f"{RUNS_DIR}/{name}"):
        n += 1
        name = f"{base}-{n}"
    return name


def registered_checkpoints(run: Storage) -> list[tuple[int, str]]:
    """(step, URI) of the checkpoints Ray Train registered for this run, oldest first.

    Ray Train lists them in its checkpoint-manager snapshot and restores the newest on a restart; a
    directory it never registered (an upload cut short) is not a checkpoint.
    """
    raw = run.read_bytes(f"{CHECKPOINTS_DIR}/{RAY_CHECKPOINT_SNAPSHOT}")
    if not raw:
        return []
    snapshot = json.loads(raw)
    names = {r["checkpoint_dir_name"] for r in snapshot.get("checkpoint_results", [])}
    if snapshot.get("latest_checkpoint_result"):
        names.add(snapshot["latest_checkpoint_result"]["checkpoint_dir_name"])
    found = []
    for name in names:
        match = CHECKPOINT_NAME_PATTERN.fullmatch(name)
        if match:
            found.append((int(match.group(1)), run.uri(CHECKPOINTS_DIR, name)))
    return sorted(found)


def checkpoint_step(uri: str) -> int:
    """The optimizer step of a checkpoint directory (its trainer_state.json)."""
    raw = storage_at(uri).read_bytes(TRAINER_STATE_FILE)
    if raw is None:
        raise UsageError(f"resume_from: {uri} is not a checkpoint (no {TRAINER_STATE_FILE} in it)")
    return int(json.loads(raw)["global_step"])


@dataclass
class RunPlan:
    """What the driver decided about this run before any worker starts."""

    name: str
    storage: Storage  # <storage_path>/runs/<name>
    resume_checkpoint: str | None  # another run's checkpoint, used when this run has none of its own
    log_line: str  # the driver's first line
    finished: dict[str, Any] | None  # the summary of a completed run (nothing to train)


def plan_run(args: TrainArguments, root: Storage) -> RunPlan:
    """Name the run, and decide: fresh, resume within the run, continue another run, or already finished."""
    named = args.run_name is not None
    name = args.run_name or new_run_name(root)
    run = root.child(f"{RUNS_DIR}/{name}")
    raw = run.read_bytes(SUMMARY_FILE)
    summary = json.loads(raw) if raw else None
    if summary and summary.get("completed"):
        line = f"run {name} already finished at step {summary.get('global_step')}; nothing to train"
        return RunPlan(name, run, None, line, summary)
    own = registered_checkpoints(run)
    if own:
        step, uri = own[-1]
        return RunPlan(name, run, None, f"resuming {name} from step {step} (restart of this run: its newest "
                                        f"checkpoint {uri})", None)
    if args.resume_from:
        if is_checkpoint_path(args.resume_from):
            uri = args.resume_from.rstrip("/")
            if not uri.startswith("gs://"):
                uri = str(Path(uri).resolve())
            step = checkpoint_step(uri)
        else:
            other = registered_checkpoints(root.child(f"{RUNS_DIR}/{args.resume_from}"))
            if not other:
                raise UsageError(f"resume_from={args.resume_from}: no checkpoint of that run under "
                                 f"{root.uri(RUNS_DIR, args.resume_from)}; runs there: {root.list_dir(RUNS_DIR)}")
            step, uri = other[-1]
        return RunPlan(name, run, uri, f"resuming {name} from step {step} (--resume_from={args.resume_from}: "
                                       f"checkpoint {uri})", None)
    why = "" if named else " (no --run_name given: named from the UTC time)"
    return RunPlan(name, run, None, f"fresh run {name}{why}", None)


# ----------------------------------------------------------------------------------------------
# Fetching once per node: a file lock in the cache directory serialises the workers of a node.
# ----------------------------------------------------------------------------------------------
def cache_root(args: TrainArguments) -> Path:
    if args.cache_dir:
        return Path(args.cache_dir)
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))


@contextlib.contextmanager
def node_lock(cache: Path, name: str) -> Iterator[None]:
    """An exclusive lock shared by every process of this node that uses `cache`."""
    lock = cache / "locks" / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def copy_from_gcs(uri: str, cache: Path, emulator_host: str | None) -> Path:
    """Copy a gs:// file or prefix into the node cache once; later calls reuse the copy."""
    import pyarrow.fs as pafs

    dest = cache / "gcs" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    with node_lock(cache, f"gcs:{uri}"):
        done = dest / ".complete"
        if not done.exists():
            fs, path = filesystem(uri, emulator_host)
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise UsageError(f"{uri} does not exist")
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            if info.type == pafs.FileType.File:
                pafs.copy_files(path, str(dest / Path(path).name), source_filesystem=fs)
            else:
                pafs.copy_files(path, str(dest), source_filesystem=fs)
            done.touch()
    if (dest / Path(uri).name).is_file():
        return dest / Path(uri).name
    return dest


def fetch_model(args: TrainArguments, emulator_host: str | None = None) -> Path:
    """A local directory with the model and processor: as given, copied from gs://, or from the hub."""
    if Path(args.model_id).is_dir():
        return Path(args.model_id)
    cache = cache_root(args)
    if args.model_id.startswith("gs://"):
        return copy_from_gcs(args.model_id, cache, emulator_host)
    from huggingface_hub import snapshot_download

    with node_lock(cache, f"model:{args.model_id}"):
        return Path(
            snapshot_download(
                args.model_id,
                cache_dir=str(cache / "hub") if args.cache_dir else None,
                token=os.environ.get("HF_TOKEN"),
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja", "*.txt"],
            )
        )


# ----------------------------------------------------------------------------------------------
# Data: sources, schema check, lazy rows, bad-row scan, split, collator
# ----------------------------------------------------------------------------------------------
DATA_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


def is_file_source(name: str) -> bool:
    return name.startswith("gs://") or name.startswith("/") or name.startswith(".") or Path(name).exists()


def data_files(name: str, local: Path) -> tuple[list[Path], str]:
    """The data files under a local path and the builder that reads them (parquet or json)."""
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.suffix in DATA_SUFFIXES)
    kinds = {DATA_SUFFIXES.get(p.suffix) for p in files}
    if not files or None in kinds or len(kinds) != 1:
        raise UsageError(
            f"dataset_name: {name} must be one .parquet/.jsonl file or a directory of one kind of them "
            f"(found {[p.name for p in files][:5]})"
        )
    return files, kinds.pop()


def load_rows(args: TrainArguments, emulator_host: str | None = None):
    """(raw rows as a memory-mapped `datasets.Dataset` with images not decoded, base of relative image paths)."""
    import datasets

    cache = cache_root(args)
    ds_cache = str(cache / "datasets") if args.cache_dir else None
    name = args.dataset_name
    if not is_file_source(name):
        with node_lock(cache, f"dataset:{name}"):
            ds = datasets.load_dataset(name, split="train", cache_dir=ds_cache, token=os.environ.get("HF_TOKEN"))
        return ds, "."
    local = copy_from_gcs(name, cache, emulator_host) if name.startswith("gs://") else Path(name)
    if not local.exists():
        raise UsageError(f"dataset_name: {name} does not exist")
    files, builder = data_files(name, local)
    with node_lock(cache, f"dataset:{local}"):
        ds = datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", cache_dir=ds_cache)
    # Relative image paths resolve against the data's directory (the gs:// prefix for gs:// data).
    if name.startswith("gs://"):
        image_base = name.rstrip("/") if local.is_dir() else name.rsplit("/", 1)[0]
    else:
        image_base = str(local.resolve() if local.is_dir() else local.resolve().parent)
    return ds, image_base


def check_schema(columns: list[str], mapping: dict[str, str], source: str) -> None:
    """Fail before any model download when a mapped column is missing."""
    missing = {f: c for f, c in mapping.items() if c not in columns}
    if missing:
        wanted = ", ".join(f"{c!r} (for {f})" for f, c in missing.items())
        raise UsageError(
            f"dataset {source}: missing column(s) {wanted}. Expected columns {sorted(set(mapping.values()))}, "
            f"found {sorted(columns)}. Rename them with --column_mapping, "
            f'e.g. --column_mapping={{"{next(iter(missing))}":"<your column>"}}.'
        )


def canonical_rows(ds, mapping: dict[str, str]):
    """Only the mapped columns, renamed to the job's fields, images left encoded."""
    import datasets

    ds = ds.select_columns(sorted(set(mapping.values())))
    feature = ds.features[mapping[IMAGE_FIELD]]
    if isinstance(feature, datasets.Image) and feature.decode:
        ds = ds.cast_column(mapping[IMAGE_FIELD], datasets.Image(decode=False))
    by_column: dict[str, list[str]] = {}
    for f, c in mapping.items():
        by_column.setdefault(c, []).append(f)
    for c, fields in by_column.items():  # one column may feed several fields
        for extra in fields[1:]:
            ds = ds.add_column(extra, ds[c])
        if fields[0] != c:
            ds = ds.rename_column(c, fields[0])
    return ds


def image_bytes(value: Any, image_base: str, emulator_host: str | None) -> bytes | None:
    """The encoded image of a row: {bytes, path} struct, raw bytes, or a local/gs:// path."""
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("bytes"):
            return value["bytes"]
        value = value.get("path")
        if not value:
            return None
    if isinstance(value, bytes | bytearray):
        return bytes(value) or None
    path = str(value)
    if not path.startswith("gs://") and not os.path.isabs(path):
        path = f"{image_base}/{path}"
    if path.startswith("gs://"):
        fs, p = filesystem(path, emulator_host)
        try:
            with fs.open_input_stream(p) as src:
                return src.read()
        except (FileNotFoundError, OSError):
            return None
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def decode_image(data: bytes):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


class SampleEncoder:
    """Turns a row into the chat-formatted prompt and answer, and into token ids with labels.

    The prompt is the chat template rendered up to the model turn's header (`add_generation_prompt`),
    exactly what the model sees when it generates; the answer is the rest of the rendered conversation.
    Only the answer and its end-of-turn token are labelled; what the template adds after the
    end-of-turn (a newline) stays unlabelled. `<bos>` comes from the template alone (the tokenizer's own
    special tokens are off), so there is exactly one.
    """

    def __init__(self, processor, args: TrainArguments):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.args = args
        self.fields = prompt_fields(args.prompt_template)
        # Gemma3Processor: the chat template puts `boi_token` (<start_of_image>) where the image goes and the
        # processor expands it into `full_image_sequence` (boi, image_seq_length soft tokens, eoi). The ids
        # come from the tokenizer; the model's config must agree (checked in load_model).
        self.soft_token_id = self.tokenizer.convert_tokens_to_ids(self.tokenizer.image_token)
        self.boi_token = processor.boi_token
        self.full_image_sequence = processor.full_image_sequence
        if getattr(processor.image_processor, "do_pan_and_scan", False):
            raise UsageError("the processor has do_pan_and_scan=true, which varies the image tokens; disable it")
        end = "<end_of_turn>"
        self.end_of_turn_id = self.tokenizer.convert_tokens_to_ids(end) if end in self.tokenizer.get_vocab() else None

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        prompt = self.args.prompt_template.format(**{f: row[f] for f in self.fields})
        msgs: list[dict[str, Any]] = []
        if self.args.system_message:
            msgs.append({"role": "system", "content": [{"type": "text", "text": self.args.system_message}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": prompt}, {"type": "image"}]})
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": row[ANSWER_FIELD]}]})
        return msgs

    def texts(self, row: dict[str, Any]) -> tuple[str, str]:
        """(prompt text with one image placeholder, answer text incl. the end-of-turn)."""
        msgs = self.messages(row)
        prompt = self.processor.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
        full = self.processor.apply_chat_template(msgs, tokenize=False)
        if not full.startswith(prompt):
            raise UsageError("the chat template does not render the prompt as a prefix of the conversation")
        return prompt, full[len(prompt) :]

    def answer_ids(self, answer: str) -> tuple[list[int], list[int]]:
        ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        n_labelled = len(ids)
        if self.end_of_turn_id is not None and self.end_of_turn_id in ids:
            n_labelled = ids.index(self.end_of_turn_id) + 1
        return ids, ids[:n_labelled] + [LABEL_IGNORE] * (len(ids) - n_labelled)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Prompt token ids with the image placeholder expanded as Gemma3Processor does."""
        expanded = prompt.replace(self.boi_token, self.full_image_sequence)
        return self.tokenizer(expanded, add_special_tokens=False)["input_ids"]

    def num_tokens(self, row: dict[str, Any]) -> int:
        """Sequence length of a row, without touching its image."""
        prompt, answer = self.texts(row)
        return len(self.prompt_ids(prompt)) + len(self.answer_ids(answer)[0])

    def __call__(self, rows: list[dict[str, Any]], images: list[Any]) -> dict[str, Any]:
        import torch

        seqs, labels = [], []
        for row in rows:
            prompt, answer = self.texts(row)
            p_ids = self.prompt_ids(prompt)
            a_ids, a_labels = self.answer_ids(answer)
            seqs.append(list(p_ids) + a_ids)
            labels.append([LABEL_IGNORE] * len(p_ids) + a_labels)
        width = max(len(s) for s in seqs)
        if self.args.use_gpu:  # few distinct shapes: Triton kernels specialise on 16-divisible sizes
            width = -(-width // GPU_PAD_MULTIPLE) * GPU_PAD_MULTIPLE
        pad = self.tokenizer.pad_token_id
        batch = {
            "input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in seqs]),
            "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
            "labels": torch.tensor([lab + [LABEL_IGNORE] * (width - len(lab)) for lab in labels]),
            "pixel_values": self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"],
        }
        # Gemma 3 attends bidirectionally within an image: token_type_ids marks its soft tokens.
        batch["token_type_ids"] = (batch["input_ids"] == self.soft_token_id).long()
        return batch


class Collator:
    """Decodes the images of a micro-batch (lazily: only here) and encodes it."""

    def __init__(self, encoder: SampleEncoder, image_base: str, emulator_host: str | None):
        self.encoder, self.image_base, self.emulator_host = encoder, image_base, emulator_host

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        images = []
        for r in rows:
            data = image_bytes(r[IMAGE_FIELD], self.image_base, self.emulator_host)
            if data is None:
                raise RuntimeError(f"image vanished after the scan: {str(r[IMAGE_FIELD])[:80]}")
            images.append(decode_image(data))
        return self.encoder(rows, images)


def row_problem(row: dict[str, Any], encoder: SampleEncoder, image_base: str, emulator_host: str | None,
                max_seq_length: int) -> str | None:
    """Why a row cannot be trained on, or None."""
    from PIL import Image, UnidentifiedImageError

    answer = row.get(ANSWER_FIELD)
    if not isinstance(answer, str) or not answer.strip():
        return "empty_answer"
    for f in encoder.fields:
        if row.get(f) is None or (isinstance(row[f], str) and not row[f].strip()):
            return "empty_prompt_field"
    data = image_bytes(row.get(IMAGE_FIELD), image_base, emulator_host)
    if data is None:
        return "missing_image"
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        return "corrupt_image"
    if encoder.num_tokens(row) > max_seq_length:
        return "too_long"
    return None


def clean_rows(ds, encoder: SampleEncoder, args: TrainArguments, image_base: str, emulator_host: str | None):
    """(rows without the bad ones, Counter of skipped rows by reason). bad_rows=fail raises instead."""
    keep: list[int] = []
    skipped: Counter[str] = Counter()
    for start in range(0, len(ds), SCAN_BATCH_ROWS):
        chunk = ds[start : start + SCAN_BATCH_ROWS]
        for i in range(len(next(iter(chunk.values())))):
            row = {k: v[i] for k, v in chunk.items()}
            problem = row_problem(row, encoder, image_base, emulator_host, args.max_seq_length)
            if problem is None:
                keep.append(start + i)
                continue
            if args.bad_rows == "fail":
                hint = " (raise --max_seq_length)" if problem == "too_long" else ""
                raise UsageError(f"row {start + i}: {problem}{hint}; --bad_rows=skip would skip such rows")
            skipped[problem] += 1
    if not keep:
        raise UsageError(f"no usable rows in {args.dataset_name} (skipped: {dict(skipped)})")
    return ds.select(keep), skipped


def split_rows(ds, args: TrainArguments):
    """Deterministic (train, eval or None) by eval_fraction and seed."""
    n_eval = math.ceil(len(ds) * args.eval_fraction) if args.eval_fraction > 0 else 0
    if n_eval == 0:
        return ds, None
    if n_eval >= len(ds):
        raise UsageError(f"eval_fraction={args.eval_fraction} leaves no training rows out of {len(ds)}")
    parts = ds.train_test_split(test_size=n_eval, seed=args.seed, shuffle=True)
    return parts["train"], parts["test"]


def prepare_data(args: TrainArguments, processor, emulator_host: str | None):
    """Everything a worker needs from the data: (train, eval, collator, stats)."""
    mapping = column_mapping(args)
    raw, image_base = load_rows(args, emulator_host)
    check_schema(list(raw.column_names), mapping, args.dataset_name)
    rows = canonical_rows(raw, mapping)
    encoder = SampleEncoder(processor, args)
    rows, skipped = clean_rows(rows, encoder, args, image_base, emulator_host)
    train, evaluation = split_rows(rows, args)
    stats = {
        "rows": len(raw),
        "train_rows": len(train),
        "eval_rows": len(evaluation) if evaluation is not None else 0,
        "skipped_rows": dict(skipped),
    }
    return train, evaluation, Collator(encoder, image_base, emulator_host), stats


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------
def load_model(args: TrainArguments, model_dir: Path, device):
    import torch
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig

    kwargs: dict[str, Any] = {
        "dtype": torch.bfloat16 if args.use_gpu else torch.float32,
        "attn_implementation": args.attn_implementation,
    }
    if args.quantization == "4bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_quant_storage=torch.bfloat16,
        )
        kwargs["device_map"] = {"": device}
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), **kwargs)
    model.config.use_cache = False
    if args.freeze_vision:
        tower = model.model.vision_tower
        tower.requires_grad_(False)
        tower.forward = torch.no_grad()(tower.forward)
    return model


def lora_config(args: TrainArguments):
    from peft import LoraConfig

    extra: dict[str, Any] = {}
    if args.train_embeddings:
        # One trainable copy shared by the tied embedding and LM head (the tutorial untied them).
        extra = {"modules_to_save": ["lm_head", "embed_tokens"], "ensure_weight_tying": True}
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules="all-linear" if args.lora_target == "all-linear" else LANGUAGE_MODEL_LORA_TARGETS,
        **extra,
    )


# ----------------------------------------------------------------------------------------------
# Callbacks: metrics to storage, checkpoints to Ray, fault injection
# ----------------------------------------------------------------------------------------------
class RunReporter(TrainerCallback):
    """Writes metrics.jsonl / TensorBoard to storage (rank 0) and reports checkpoints to Ray (all ranks).

    Throughput counts the time from the end of one optimizer step (or of an eval/save/log) to the end
    of the next: data loading and the step itself, not evaluation or checkpoint uploads.
    """

    def __init__(self, storage: Storage, rank: int, world_size: int, global_batch: int, tb_dir: Path,
                 resumed_from_step: int | None):
        self.storage, self.rank, self.world_size = storage, rank, world_size
        self.global_batch, self.tb_dir = global_batch, tb_dir
        self.resumed_from_step = resumed_from_step
        self.records: list[dict[str, Any]] = []
        self.mark = time.perf_counter()
        self.window = {"time": 0.0, "steps": 0}
        self.totals = {"time": 0.0, "steps": 0, "tokens": 0}
        self.last_num_tokens: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.rank == 0 and self.resumed_from_step is not None:
            old = self.storage.read_bytes(METRICS_FILE) or b""
            for line in old.decode().splitlines():
                rec = json.loads(line)
                if rec.get("step", 0) <= self.resumed_from_step:
                    self.records.append(rec)
        self.mark = time.perf_counter()

    def _remark(self) -> None:
        self.mark = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.window["time"] += now - self.mark
        self.window["steps"] += 1
        self.mark = now

    def on_evaluate(self, args, state, control, **kwargs):
        self._remark()

    def on_log(self, args, state, control, logs=None, **kwargs):
        import torch

        logs = dict(logs or {})
        rec: dict[str, Any] = {"step": state.global_step, "epoch": state.epoch}
        if "loss" in logs:
            rec["kind"] = "train"
            if "mean_token_accuracy" in logs:
                logs["answer_token_accuracy"] = logs["mean_token_accuracy"]
            num_tokens = logs.get("num_tokens")
            if self.window["time"] > 0:
                rec["samples_per_second"] = self.window["steps"] * self.global_batch / self.window["time"]
                if num_tokens is not None and self.last_num_tokens is not None and num_tokens >= self.last_num_tokens:
                    rec["tokens_per_second"] = (num_tokens - self.last_num_tokens) / self.window["time"]
                    self.totals["tokens"] += num_tokens - self.last_num_tokens
                elif num_tokens is not None and self.last_num_tokens is None:
                    rec["tokens_per_second"] = num_tokens / self.window["time"]
                    self.totals["tokens"] += num_tokens
            self.totals["time"] += self.window["time"]
            self.totals["steps"] += self.window["steps"]
            self.window = {"time": 0.0, "steps": 0}
            self.last_num_tokens = num_tokens
            if torch.cuda.is_available():
                rec["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated() / GIB
        elif any(k.startswith("eval_") for k in logs):
            rec["kind"] = "eval"
        else:
            rec["kind"] = "end"
        rec.update(logs)
        self._remark()
        if self.rank != 0:
            return
        self.records.append(rec)
        self.storage.write_bytes(METRICS_FILE, "".join(json.dumps(r) + "\n" for r in self.records).encode())

    def on_save(self, args, state, control, **kwargs):
        import ray.train

        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        metrics = {"step": state.global_step, "epoch": state.epoch}
        for rec in reversed(self.records):
            if "loss" in rec:
                metrics["loss"] = rec["loss"]
                break
        # Every rank reports: rank 0 holds the adapter, optimizer and trainer state, each rank its RNG
        # state; Ray merges them into one checkpoint directory.
        checkpoint = ray.train.Checkpoint.from_directory(str(ckpt)) if ckpt.is_dir() else None
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=f"checkpoint-{state.global_step:06d}")
        if self.rank == 0 and self.tb_dir.is_dir():
            self.storage.upload_dir(self.tb_dir, TENSORBOARD_DIR)
        self._remark()


class FaultInjector(TrainerCallback):
    """Test-only: kill this worker's process once, after optimizer step N (a marker in storage)."""

    def __init__(self, at_step: int, storage: Storage, rank: int, world_size: int):
        self.at_step, self.storage = at_step, storage
        self.armed = rank == min(1, world_size - 1)

    def on_step_end(self, args, state, control, **kwargs):
        marker = f".fault-injected-at-step-{self.at_step}"
        if self.armed and state.global_step == self.at_step and self.storage.read_bytes(marker) is None:
            self.storage.write_bytes(marker, str(os.getpid()).encode())
            print(f"[fault injection] killing worker pid {os.getpid()} after step {state.global_step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------------------------
# The worker
# ----------------------------------------------------------------------------------------------
def sft_config(args: TrainArguments, local_dir: Path, has_eval: bool):
    from trl import SFTConfig

    eval_kwargs: dict[str, Any] = {"eval_strategy": "no"}
    if has_eval:
        if args.eval_steps:
            eval_kwargs = {"eval_strategy": "steps", "eval_steps": args.eval_steps}
        elif args.save_strategy == "steps":
            eval_kwargs = {"eval_strategy": "steps", "eval_steps": args.save_steps}
        else:
            eval_kwargs = {"eval_strategy": "epoch"}
    return SFTConfig(
        output_dir=str(local_dir),
        num_train_epochs=args.num_train_epochs,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type=LR_SCHEDULER,
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch_fused" if args.use_gpu else "adamw_torch",
        bf16=args.use_gpu,
        use_cpu=not args.use_gpu,
        logging_steps=args.logging_steps,
        save_strategy=args.save_strategy,
        save_steps=args.save_steps,
        save_total_limit=1,  # local scratch; storage keeps `save_total_limit` through Ray
        seed=args.seed,
        data_seed=args.seed,
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if args.gradient_checkpointing else None,
        dataloader_num_workers=args.dataloader_num_workers,
        dataloader_persistent_workers=args.dataloader_num_workers > 0,
        dataloader_pin_memory=args.use_gpu,
        use_liger_kernel=bool(args.use_liger_kernel),
        # Only the layer kernels: TRL's fused LM head already scores just the labelled positions.
        liger_kernel_config={"rope": True, "rms_norm": True, "geglu": True,
                             # compiled vision layers fuse their LayerNorms themselves
                             "layer_norm": not args.compile_vision,
                             "cross_entropy": False, "fused_linear_cross_entropy": False}
        if args.use_liger_kernel else None,
        report_to=["tensorboard"],
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=None,  # length is enforced per row (rows over max_seq_length are skipped, never cut)
        # Every row has an image, so every parameter gets a gradient in every step.
        ddp_find_unused_parameters=False,
        average_tokens_across_devices=True,
        disable_tqdm=True,
        push_to_hub=False,
        **eval_kwargs,
    )


def token_mean_eval(trainer_cls):
    """`trainer_cls` whose eval loss is the mean over every labelled eval token on all workers.

    Trainer's own `eval_loss` averages per-batch token means (weighted by rows), which over-weights
    short answers. TRL's fused LM head returns per-token log-probabilities and the label mask; a forward
    hook sums them per row during evaluation, `gather_for_metrics` collects the rows of every worker
    (dropping the rows the sampler repeats to even out the last batch), and the loss is recomputed from
    the token totals.
    """
    import torch

    class TokenMeanEval(trainer_cls):
        def evaluation_loop(self, *args, **kwargs):
            prefix = kwargs.get("metric_key_prefix", "eval")
            rows: list[tuple[Any, Any]] = []

            def keep(_module, _inputs, output) -> None:
                log_probs = getattr(output, "log_probs", None)
                mask = getattr(output, "label_mask", None)
                if log_probs is None or mask is None:
                    return  # not the fused forward (e.g. a logits-only pass)
                nll = -log_probs.detach().float().sum(dim=1)
                rows.append(self.accelerator.gather_for_metrics((nll, mask.sum(dim=1).float())))

            handle = self.model.register_forward_hook(keep)
            try:
                output = super().evaluation_loop(*args, **kwargs)
            finally:
                handle.remove()
            if rows:
                nll = torch.cat([r[0] for r in rows]).sum()
                tokens = torch.cat([r[1] for r in rows]).sum()
                output.metrics[f"{prefix}_loss"] = float(nll / tokens.clamp(min=1))
            return output

    TokenMeanEval.__name__ = TokenMeanEval.__qualname__ = f"TokenMeanEval{trainer_cls.__name__}"
    return TokenMeanEval


def build_trainer(args: TrainArguments, model_dir: Path, local_dir: Path, device, emulator_host: str | None,
                  callbacks: list | None = None):
    """The TRL SFTTrainer of one worker, plus the data stats. Usable without Ray (tests)."""
    from transformers import AutoProcessor
    from trl import SFTTrainer

    processor = AutoProcessor.from_pretrained(str(model_dir))
    train, evaluation, collator, stats = prepare_data(args, processor, emulator_host)
    model = load_model(args, model_dir, device)
    model_image_token = getattr(model.config, "image_token_id", None)
    if model_image_token is not None and model_image_token != collator.encoder.soft_token_id:
        raise UsageError(
            f"{args.model_id}: the processor's image token id {collator.encoder.soft_token_id} differs from the "
            f"model's image_token_id {model_image_token}; use the processor saved with the model"
        )
    peft_config = lora_config(args)
    if args.adapter_dtype == "bf16" and args.quantization == "none":
        # PEFT upcasts LoRA weights to fp32 by default; on a bf16 base that costs a cast per LoRA layer per
        # step (bench/RESULTS.md). QLoRA adapters are bf16 already (TRL casts them).
        from peft import get_peft_model

        model = get_peft_model(model, peft_config, autocast_adapter_dtype=False)
        peft_config = None
    trainer = token_mean_eval(SFTTrainer)(
        model=model,
        args=sft_config(args, local_dir, evaluation is not None),
        data_collator=collator,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    # TRL scores only the labelled positions and divides the summed token loss by `num_items_in_batch`:
    # the labelled tokens of all micro-batches of the optimizer step on all workers, then multiplies by
    # the world size because DDP averages gradients. Trainer computes `num_items_in_batch` only when it
    # believes the model takes loss kwargs; say so explicitly rather than rely on the signature of
    # Gemma3ForConditionalGeneration.forward. (Position 0 is `<bos>`, never labelled, so counting over
    # `labels` or `labels[:, 1:]` is the same.)
    trainer.model_accepts_loss_kwargs = True
    if args.compile_vision:
        # The vision tower sees one image size, so its layers compile once (and share the compiled code);
        # the fused elementwise LoRA work (dropout, scaling, adds, casts) is most of the gain.
        for module in trainer.model.modules():
            if type(module).__name__ == "SiglipEncoderLayer":
                module.compile()
    return trainer, processor, stats


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch

    args = TrainArguments(**config["args"])
    storage = Storage(**config["storage"])
    if args.use_gpu:  # before the first CUDA allocation of this worker process
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    if not args.use_gpu:
        torch.set_flush_denormal(True)  # CPU: denormals make small models ~8x slower
    device = ray.train.torch.get_device()
    model_dir = fetch_model(args, storage.emulator_host)
    local_dir = Path(tempfile.mkdtemp(prefix=f"gemma3-ray-rank{rank}-"))
    tb_dir = local_dir / "tensorboard"
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(tb_dir)

    # This run's newest checkpoint (Ray Train restores it on every restart), else the earlier run's
    # checkpoint that --resume_from named.
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and config.get("resume_checkpoint"):
        fs, path = filesystem(config["resume_checkpoint"], storage.emulator_host)
        checkpoint = ray.train.Checkpoint(path=path, filesystem=fs)
    resume_dir = None
    resumed_from_step = None
    with contextlib.ExitStack() as stack:
        if checkpoint is not None:
            resume_dir = stack.enter_context(checkpoint.as_directory())
            state = json.loads((Path(resume_dir) / "trainer_state.json").read_text())
            resumed_from_step = int(state["global_step"])
            if rank == 0:
                print(f"[rank 0] resuming from {checkpoint.path} at step {resumed_from_step}", flush=True)
        global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size
        reporter = RunReporter(storage, rank, world_size, global_batch, tb_dir, resumed_from_step)
        callbacks: list = [reporter]
        if config.get("fault_at_step"):
            callbacks.append(FaultInjector(int(config["fault_at_step"]), storage, rank, world_size))
        trainer, processor, stats = build_trainer(args, model_dir, local_dir, device, storage.emulator_host, callbacks)
        if rank == 0:
            print(f"[data] {json.dumps(stats)}", flush=True)
            trainer.model.print_trainable_parameters()
        result = trainer.train(resume_from_checkpoint=resume_dir)
    # The same decision on every rank (evaluation is collective): from the trainer state, not rank 0's records.
    evaluated_last = any(
        "eval_loss" in h and h.get("step") == trainer.state.global_step for h in trainer.state.log_history
    )
    final_eval = trainer.evaluate() if trainer.eval_dataset is not None and not evaluated_last else {}

    summary: dict[str, Any] = {}
    if rank == 0:
        summary = finish(args, trainer, processor, storage, stats, reporter, result, final_eval, resumed_from_step,
                         config["run_name"])
    if rank == 0 and tb_dir.is_dir():
        storage.upload_dir(tb_dir, TENSORBOARD_DIR)
    ray.train.report({"step": trainer.state.global_step, "done": True, **{k: v for k, v in summary.items()
                                                                          if isinstance(v, int | float)}})


def finish(args: TrainArguments, trainer, processor, storage: Storage, stats: dict[str, Any], reporter: RunReporter,
           result, final_eval: dict[str, float], resumed_from_step: int | None, run_name: str) -> dict[str, Any]:
    """Rank 0: write final/ (and merged/, hub), summary.json; return the summary."""
    out = Path(trainer.args.output_dir) / FINAL_DIR
    trainer.model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    storage.upload_dir(out, FINAL_DIR)
    merged_uri = None
    if args.merge_adapter:
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(str(out.parent / MERGED_DIR))
        processor.save_pretrained(str(out.parent / MERGED_DIR))
        storage.upload_dir(out.parent / MERGED_DIR, MERGED_DIR)
        merged_uri = storage.uri(MERGED_DIR)
    if args.push_to_hub:
        repo = args.hub_model_id or Path(args.output_dir).name
        trainer.model.push_to_hub(repo, token=os.environ["HF_TOKEN"], private=True)
        processor.push_to_hub(repo, token=os.environ["HF_TOKEN"], private=True)

    history = [r for r in reporter.records if r.get("kind") in ("train", "eval")]
    train_losses = [r["loss"] for r in history if "loss" in r]
    eval_losses = [r["eval_loss"] for r in history if "eval_loss" in r]
    if final_eval.get("eval_loss") is not None:
        eval_losses.append(final_eval["eval_loss"])
    t = reporter.totals
    summary = {
        "run_name": run_name,
        "completed": True,
        "global_step": trainer.state.global_step,
        "epochs": trainer.state.epoch,
        "max_steps": trainer.state.max_steps,
        **stats,
        "num_workers": int(trainer.args.world_size),
        "global_batch_size": reporter.global_batch,
        "first_train_loss": train_losses[0] if train_losses else None,
        "final_train_loss": train_losses[-1] if train_losses else None,
        "first_eval_loss": eval_losses[0] if eval_losses else None,
        "final_eval_loss": eval_losses[-1] if eval_losses else None,
        "final_answer_token_accuracy": next(
            (r["answer_token_accuracy"] for r in reversed(history) if "answer_token_accuracy" in r), None
        ),
        "samples_per_second": t["steps"] * reporter.global_batch / t["time"] if t["time"] else None,
        "tokens_per_second": t["tokens"] / t["time"] if t["time"] else None,
        "train_runtime_s": result.metrics.get("train_runtime"),
        "resumed_from_step": resumed_from_step,
        "final_adapter": storage.uri(FINAL_DIR),
        "merged_model": merged_uri,
        "hub_model_id": (args.hub_model_id or Path(args.output_dir).name) if args.push_to_hub else None,
        "metrics": storage.uri(METRICS_FILE),
        "tensorboard": storage.uri(TENSORBOARD_DIR),
        "newest_checkpoint": None,  # filled in by the driver from Ray's result
    }
    storage.write_bytes(SUMMARY_FILE, json.dumps(summary, indent=2).encode())
    return summary


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------
def check_dataset_before_download(args: TrainArguments, emulator_host: str | None) -> None:
    """Columns of the data, checked before any model download (reads only the schema where it can)."""
    mapping = column_mapping(args)
    name = args.dataset_name
    if is_file_source(name) and not name.startswith("gs://"):
        path = Path(name)
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in DATA_SUFFIXES)
        if not files:
            raise UsageError(f"dataset_name: no .parquet/.jsonl files at {name}")
        if files[0].suffix == ".parquet":
            import pyarrow.parquet as pq

            columns = pq.read_schema(files[0]).names
        else:
            with open(files[0]) as fh:
                first = fh.readline()
            columns = list(json.loads(first).keys()) if first.strip() else []
        check_schema(columns, mapping, name)
        return
    check_schema(list(load_rows(args, emulator_host)[0].column_names), mapping, name)


def print_summary(summary: dict[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    keys = ["run_name", "global_step", "epochs", "train_rows", "eval_rows", "skipped_rows", "first_train_loss",
            "final_train_loss", "first_eval_loss", "final_eval_loss", "final_answer_token_accuracy",
            "samples_per_second", "tokens_per_second", "resumed_from_step", "newest_checkpoint", "final_adapter",
            "merged_model", "metrics", "tensorboard"]
    print("=" * 72)
    print("gemma3-ray training summary")
    for k in keys:
        if summary.get(k) is not None:
            print(f"  {k:<28} {fmt(summary[k])}")
    print("=" * 72, flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import ray.train
    from ray.train.torch import TorchTrainer

    try:
        args = parse_args(argv)
        plan = plan_run(args, storage_for(args))
        print(plan.log_line, flush=True)
        if plan.finished is not None:
            return plan.finished
        storage = plan.storage
        check_dataset_before_download(args, storage.emulator_host)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    fs, base = storage.fs()
    fs.create_dir(base, recursive=True)
    fault_at = os.environ.get(FAULT_AT_STEP_ENV)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "args": asdict(args),
            "storage": asdict(storage),
            "run_name": plan.name,
            "resume_checkpoint": plan.resume_checkpoint,
            "fault_at_step": int(fault_at) if fault_at else None,
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=args.num_workers,
            use_gpu=args.use_gpu,
            accelerator_type=args.accelerator_type,
            resources_per_worker=None if args.use_gpu else {"CPU": 1},
        ),
        run_config=ray.train.RunConfig(
            name=CHECKPOINTS_DIR,
            storage_path=base,
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=args.save_total_limit),
            failure_config=ray.train.FailureConfig(max_failures=args.max_failures),
        ),
    )
    result = trainer.fit()
    raw = storage.read_bytes(SUMMARY_FILE)
    summary = json.loads(raw) if raw else {}
    if result.checkpoint is not None:
        newest = result.checkpoint.path
        if storage.root.startswith("gs://"):
            newest = "gs://" + newest.removeprefix("gs://")
        summary["newest_checkpoint"] = newest
        storage.write_bytes(SUMMARY_FILE, json.dumps(summary, indent=2).encode())
    print_summary(summary)
    return summary


if __name__ == "__main__":
    main()
