"""The job's flags read from the command line and checked together, each problem with its fix.

``parse_args`` is the one way in: `--name=value` (or `--name value`), booleans true|false, unknown names
get the closest one; the recipe fills the unset speed flags; every range and combination is checked at
once; paths get one spelling.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

from trainer.job import flags
from trainer.job.flag_values import column_mapping, extra_pip
from trainer.job.flags import (
    GPU_ONLY,
    PATH_FLAGS,
    RETIRED,
    RUN_NAME_PATTERN,
    TrainArguments,
    UsageError,
    apply_recipe,
    canonical_path,
    is_checkpoint_path,
    range_text,
)

# Combinations no flag's own range can catch: (is it wrong?, the fix). Messages format with `a` = the args.
CONFLICTS: list[tuple[Callable[[TrainArguments], Any], str]] = [
    (lambda a: a.max_steps <= 0 and a.num_train_epochs <= 0, "set max_steps > 0 or num_train_epochs > 0"),
    (lambda a: a.min_workers is not None and a.min_workers > a.num_workers,
     "min_workers={a.min_workers} exceeds num_workers={a.num_workers}: lower min_workers (num_workers is the most "
     "the job uses)"),
    (lambda a: a.accelerator_type and not a.use_gpu,
     "accelerator_type needs --use_gpu=true (CPU workers have no accelerator)"),
    (lambda a: a.freeze_vision and a.lora_target == "all-linear",
     "freeze_vision=true leaves the vision tower without LoRA: set --lora_target=language-model"),
    (lambda a: a.merge_adapter and a.quantization == "4bit",
     "merge_adapter=true cannot merge into a 4-bit base (lossy); train with --quantization=none, "
     "or merge the adapter in final/ offline onto the bf16 base"),
    (lambda a: a.hub_model_id and not a.push_to_hub,
     "hub_model_id is set but push_to_hub=false: add --push_to_hub=true or drop hub_model_id"),
    (lambda a: a.push_to_hub and not os.environ.get("HF_TOKEN"),
     "push_to_hub=true needs the HF_TOKEN environment variable (a write token)"),
    (lambda a: a.gcs_bucket and ("/" in a.gcs_bucket or a.gcs_bucket.startswith("gs:")),
     "gcs_bucket is a bucket name without gs:// or a path (use storage_path for prefixes)"),
    (lambda a: a.gcs_bucket and a.storage_path and not (a.storage_path == f"gs://{a.gcs_bucket}"
                                                        or a.storage_path.startswith(f"gs://{a.gcs_bucket}/")),
     "gcs_bucket={a.gcs_bucket} disagrees with storage_path={a.storage_path}; set only one"),
    (lambda a: a.run_name is not None and not RUN_NAME_PATTERN.fullmatch(a.run_name),
     "run_name={a.run_name!r}: use letters, digits, '.', '_' and '-' (at most 100, no '/'), "
     "e.g. --run_name=r3-20260101-120000"),
    (lambda a: a.resume_from and not is_checkpoint_path(a.resume_from) and not RUN_NAME_PATTERN.fullmatch(a.resume_from),
     "resume_from={a.resume_from!r} is neither a run name nor a gs:// or local checkpoint path"),
    (lambda a: a.streaming and not a.dataset_name.startswith(("gs://", "/", ".")) and not os.path.isdir(a.dataset_name),
     "streaming=true reads shards: set dataset_name to their gs:// prefix (write them with `gemma3-ray data shard "
     "{a.dataset_name} --to gs://BUCKET/PREFIX --apply`)"),
    (lambda a: a.installer == "none" and a.extra_pip.strip() not in ("", "[]"),
     "extra_pip={a.extra_pip} needs --installer=uv or pip (with installer none the workers install nothing)"),
    (lambda a: a.resume_from and a.resume_from == a.run_name,
     "resume_from={a.resume_from!r} names this run itself; a restart of a run resumes its own checkpoints without it"),
]

# ----------------------------------------------------------------------------------------------
# Parsing: `--name=value` (or `--name value`); booleans true|false; unknown names get the closest one.
# ----------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(message)


def _to_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _annotation(hint: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vision_train.py", allow_abbrev=False,
                     description="Fine-tune Gemma 3 on image-text pairs with Ray Train, TRL and PEFT (trainer/README.md).")
    hints = typing.get_type_hints(TrainArguments, globalns=vars(flags))  # the names its annotations use
    for f in dataclasses.fields(TrainArguments):
        kind = _annotation(hints[f.name])
        help_text = f.metadata["help"].replace("%", "%%")
        if f.default not in (None, "") and "default" not in help_text and "\n" not in str(f.default):
            help_text += f" (default: {str(f.default).lower() if isinstance(f.default, bool) else f.default})"
        kwargs: dict[str, Any] = {"default": f.default, "help": help_text}
        if kind is bool:
            kwargs.update(type=_to_bool, nargs="?", const=True, metavar="true|false")
        elif typing.get_origin(kind) is Literal:
            kwargs.update(choices=list(typing.get_args(kind)))
        else:
            kwargs["type"] = kind
        parser.add_argument(f"--{f.name}", **kwargs)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainArguments:
    """Parse the flags, fill the unset ones from the recipe, and check them all at once."""
    argv = list(sys.argv[1:] if argv is None else argv)
    known = {f.name for f in dataclasses.fields(TrainArguments)}
    unknown = []
    for item in argv:
        if item.startswith("--"):
            name = item[2:].split("=", 1)[0]
            if name not in known and name not in ("help", "h"):
                hint = difflib.get_close_matches(name, known, n=1)
                unknown.append(f"--{name}" + (f" (did you mean --{hint[0]}?)" if hint else ""))
    retired = [f"--{name}: {why}" for name, why in RETIRED.items() if any(a.startswith(f"--{name}") for a in argv)]
    if retired:
        raise UsageError("retired flag(s): " + "; ".join(retired))
    if unknown:
        raise UsageError(f"unknown flag(s): {', '.join(unknown)}. Known flags: see trainer/README.md.")
    args = TrainArguments(**vars(build_parser().parse_args(argv)))
    apply_recipe(args)
    validate_args(args)
    for name in PATH_FLAGS:
        setattr(args, name, canonical_path(name, getattr(args, name)))
    return args



def _range_problem(name: str, value: Any, rules: dict[str, Any]) -> str | None:
    low, above, below, off = rules.get("min"), rules.get("above"), rules.get("below"), rules.get("off")
    if value is None or (low is None and above is None) or (off is not None and value == off):
        return None
    ok = (low is None or value >= low) and (above is None or value > above) and (below is None or value < below)
    return None if ok else f"{name} must be {range_text(rules)}"


def validate_args(args: TrainArguments) -> None:
    """Reject out-of-range values and contradictory flags, all at once, each with its fix."""
    errors = []
    for f in dataclasses.fields(TrainArguments):
        value = getattr(args, f.name)
        problem = _range_problem(f.name, value, dict(f.metadata))
        if problem:
            errors.append(problem)
        if not args.use_gpu and f.name in GPU_ONLY and value == GPU_ONLY[f.name][0]:
            text = str(value).lower() if isinstance(value, bool) else value
            errors.append(f"{f.name}={text} needs GPUs ({GPU_ONLY[f.name][1]})")
    errors += [message.format(a=args) for wrong, message in CONFLICTS if wrong(args)]
    for check in (column_mapping, extra_pip):
        try:
            check(args)
        except UsageError as e:
            errors.append(str(e))
    if errors:
        raise UsageError("invalid flags:\n  - " + "\n  - ".join(errors))


# ----------------------------------------------------------------------------------------------
