"""The flags whose values are JSON or a template, read into what the job uses: the fields a row must
have (image, answer and the prompt template's placeholders) and their dataset columns; the workers'
extra pip requirements. Each bad value is a UsageError naming the flag and the fix.
"""

from __future__ import annotations

import json
import string

from trainer.job.flags import (  # The fields a row must have: image, answer, and the prompt template's placeholders. # ----------------------------------------------------------------------------------------------
    ANSWER_FIELD,
    DEFAULT_COLUMN_MAPPING,
    IMAGE_FIELD,
    TrainArguments,
    UsageError,
)


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


def extra_pip(args: TrainArguments) -> list[str]:
    """The extra pip requirements of the workers (--extra_pip)."""
    try:
        value = json.loads(args.extra_pip or "[]")
    except json.JSONDecodeError as e:
        raise UsageError(f'extra_pip: not JSON ({e}); example: --extra_pip=["wandb==0.19.0"]') from e
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UsageError('extra_pip: must be a JSON list of requirement strings, e.g. ["wandb==0.19.0"]')
    return value
