"""The rendered RayJob entrypoint is accepted by the trainer's own flag parser (the chart's copy of
trainer/), for every values file: names, types and cross-flag rules agree."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from types import ModuleType

import pytest
from helm_render import CHART, Render

SCRIPT = CHART / "files" / "trainer" / "vision_train.py"


# The trainer's modules (the entry point imports its siblings, as `python vision_train.py` does).
TRAINER_MODULES = sorted(p.stem for p in SCRIPT.parent.glob("*.py"))


@pytest.fixture(scope="module")
def trainer() -> ModuleType:
    """The chart's copy of the entry module, with its sibling modules from the chart's copy too."""
    assert SCRIPT.exists(), "the chart has no trainer: run `make sync-trainer`"
    saved_modules = {name: sys.modules.pop(name) for name in TRAINER_MODULES if name in sys.modules}
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("gemma3_ray_chart_trainer", SCRIPT)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        assert sys.modules["flags"].__file__ == str(SCRIPT.parent / "flags.py")
    finally:
        sys.path.remove(str(SCRIPT.parent))
        for name in TRAINER_MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved_modules)
    return module


def test_every_rendered_entrypoint_parses_with_the_trainer(renders: dict[str, Render], trainer: ModuleType,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "only-so-push_to_hub-validation-can-pass")
    for name, r in renders.items():
        argv = shlex.split(r.one("RayJob")["spec"]["entrypoint"])
        assert argv[:2] == ["python", "vision_train.py"], name  # run from the job's working_dir
        args = trainer.parse_args(argv[2:])
        assert args.storage_path.startswith("gs://"), name
        assert args.num_workers >= 1, name


def test_trainer_rejects_what_the_chart_must_never_render(trainer: ModuleType) -> None:
    with pytest.raises(trainer.UsageError):
        trainer.parse_args(["--num_worker=2"])
    with pytest.raises(trainer.UsageError):
        trainer.parse_args(["--use_gpu=false", "--quantization=4bit"])


def test_training_schema_is_generated_from_the_trainer_flags() -> None:
    """values.schema.json's `training` lists exactly the trainer's flags (make sync-trainer keeps it so)."""
    import json
    import subprocess

    root = CHART.parents[1]
    check = subprocess.run([sys.executable, str(root / "scripts" / "sync_trainer_schema.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["training"]
    assert schema["additionalProperties"] is False
    trainer_flags = set(_flag_names(root / "trainer" / "flags.py"))
    derived = {name for name, prop in schema["properties"].items() if "not" in prop}
    assert set(schema["properties"]) - derived == trainer_flags - derived


def _flag_names(path) -> list[str]:
    import ast

    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainArguments")
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
