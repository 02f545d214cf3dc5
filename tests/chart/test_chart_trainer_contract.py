"""The rendered RayJob entrypoint is accepted by the trainer's own flag parser (trainer.job.arguments, the
chart's copy of trainer/), for every values file: names, types and cross-flag rules agree."""

from __future__ import annotations

import dataclasses
import shlex
import sys

import pytest
from helm_render import CHART, Render

from trainer.job import arguments as trainer  # the chart's copy: trainer/ is a symlink to files/trainer
from trainer.job.flags import TrainArguments, UsageError

ENTRY = ["python", "-m", "trainer.vision_train"]  # run from the job's working_dir, which holds the package


def test_the_trainer_is_the_charts_copy() -> None:
    assert trainer.__file__ and __import__("pathlib").Path(trainer.__file__).resolve() == (
        CHART / "files" / "trainer" / "job" / "arguments.py").resolve()


def test_every_rendered_entrypoint_parses_with_the_trainer(renders: dict[str, Render],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "only-so-push_to_hub-validation-can-pass")
    for name, r in renders.items():
        argv = shlex.split(r.one("RayJob")["spec"]["entrypoint"])
        assert argv[:3] == ENTRY, name
        args = trainer.parse_args(argv[3:])
        assert args.storage_path.startswith("gs://"), name
        assert args.num_workers >= 1, name


def test_trainer_rejects_what_the_chart_must_never_render() -> None:
    with pytest.raises(UsageError):
        trainer.parse_args(["--num_worker=2"])
    with pytest.raises(UsageError):
        trainer.parse_args(["--use_gpu=false", "--quantization=4bit"])


def test_training_schema_is_generated_from_the_trainer_flags() -> None:
    """values.schema.json's `training` lists exactly the trainer's flags (make sync-trainer keeps it so)."""
    import json
    import subprocess

    root = CHART.parents[1]
    check = subprocess.run([sys.executable, "-m", "scripts.sync_trainer_schema", "--check"], cwd=root,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["training"]
    assert schema["additionalProperties"] is False
    trainer_flags = {f.name for f in dataclasses.fields(TrainArguments)}  # the lever flags come from lever_table.py
    derived = {name for name, prop in schema["properties"].items() if "not" in prop}
    assert set(schema["properties"]) - derived == trainer_flags - derived
