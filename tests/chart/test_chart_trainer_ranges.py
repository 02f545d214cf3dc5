"""The chart's schema holds the trainer's own range rules, generated from them (#27 item 5).

One source of truth: each flag's rules (``flag(..., min=, above=, below=, off=)`` in trainer/flags.py) are
what the trainer checks at job start and what ``make sync-trainer`` writes into values.schema.json. So a
value the trainer would refuse after the GPUs are up is refused by ``helm install``/``template`` first,
naming the field; a value it accepts passes, as a YAML number, a ``--set`` integer or the text of a
number (``--set`` passes floats as strings).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
from helm_render import CHART, ROOT
from test_chart_value_checks import HELMS, helm_sets

from trainer.job.arguments import parse_args  # the chart's copy (trainer/ is a symlink to files/trainer)

FLAGS = CHART / "files" / "trainer" / "job" / "flags.py"
# Texts around every bound the rules use (-1, 0, 1), in the spellings a user types.
PROBES = ["-5", "-1", "-1.0", "-0.5", "-0", "0", "0.0", ".0", "0e3", "1e-9", "0.05", ".5", "5e-2", "0.5e1",
          "9.99e-1", "1", "+1", "1.0", "1e0", "2", "7", "1e3", "100", "1.5", "-1e-2", "1e-2"]
RANGE_KEYS = ("min", "above", "below", "off")


@pytest.fixture(scope="module")
def flags() -> ModuleType:
    from trainer.job import flags  # the chart's copy (trainer/ is a symlink to files/trainer)

    assert Path(flags.__file__).resolve() == FLAGS.resolve()
    return flags


def _ranged(flags: ModuleType) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(flags.TrainArguments) if any(k in f.metadata for k in RANGE_KEYS)]


def _trainer_accepts(flags: ModuleType, name: str, text: str) -> bool:
    """The trainer's own verdict on this one flag (other problems of the same argv are ignored)."""
    base = ["--storage_path=gs://b/p", "--use_gpu=false", "--max_steps=10", "--num_workers=1000"]
    try:
        parse_args([*base, f"--{name}={text}"])
    except flags.UsageError as e:
        return not any(line.strip(" -").startswith(name) or f"--{name}" in line for line in str(e).splitlines())
    return True


def _schema_accepts(prop: dict, value: object) -> bool:
    return jsonschema.Draft7Validator(prop).is_valid(value)


def test_every_trainer_range_rule_has_a_schema_counterpart(flags: ModuleType) -> None:
    """For every flag with a range rule, and every probe spelled as text and as a number, the schema and
    the trainer give the same verdict."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["training"]["properties"]
    ranged = _ranged(flags)
    assert {"learning_rate", "lora_r", "lora_dropout", "eval_steps", "max_steps"} <= {f.name for f in ranged}
    disagree = []
    for f in ranged:
        if "not" in schema[f.name]:
            continue  # derived by the chart, never set in values
        for text in PROBES:
            is_int = text.lstrip("+-").isdigit()
            # As text (--set of a float, --set-string, a quoted YAML value), and as a YAML number, which
            # the chart renders as Go prints it (an integer flag gets integers only).
            forms: list[tuple[object, str]] = [(text, text)]
            if is_int:
                forms.append((int(text), str(int(text))))
            elif flags.TrainArguments.__annotations__[f.name] in ("float", float):
                forms.append((float(text), repr(float(text))))
            for value, rendered in forms:
                trainer = _trainer_accepts(flags, f.name, rendered)
                if _schema_accepts(schema[f.name], value) != trainer:
                    disagree.append(f"{f.name}={value!r}: trainer {'accepts' if trainer else 'refuses'}")
    assert disagree == []


def test_max_steps_below_minus_one_is_refused_by_the_trainer(flags: ModuleType) -> None:
    """-1 means "use epochs"; -5 or 0 used to mean the same silently."""
    for text in ("-5", "0"):
        with pytest.raises(flags.UsageError, match="max_steps"):
            parse_args(["--storage_path=gs://b/p", f"--max_steps={text}"])
    assert parse_args(["--storage_path=gs://b/p", "--max_steps=-1"]).max_steps == -1


@pytest.mark.parametrize("helm", HELMS)
@pytest.mark.parametrize(("set_arg", "field"), [
    ("training.learning_rate=-1", "learning_rate"),     # --set: an integer
    ("training.learning_rate=-0.0001", "learning_rate"),  # --set: a float, passed as text
    ("training.learning_rate=0", "learning_rate"),
    ("training.max_steps=-5", "max_steps"),
    ("training.max_steps=0", "max_steps"),
    ("training.lora_r=0", "lora_r"),
    ("training.lora_dropout=1", "lora_dropout"),
    ("training.lora_dropout=1.5", "lora_dropout"),
    ("training.eval_steps=0", "eval_steps"),
    ("training.eval_fraction=-0.1", "eval_fraction"),
    ("training.num_train_epochs=-2", "num_train_epochs"),
])
def test_helm_refuses_an_out_of_range_flag_naming_it(helm: str, set_arg: str, field: str) -> None:
    r = helm_sets("--set", set_arg, helm=helm)
    assert r.returncode != 0, f"{helm} accepted --set {set_arg}"
    assert f"/training/{field}" in r.stderr or f"training.{field}" in r.stderr, r.stderr


@pytest.mark.parametrize("helm", HELMS)
def test_helm_accepts_in_range_flags_in_every_spelling(helm: str) -> None:
    r = helm_sets("--set", "training.learning_rate=1e-4", "--set", "training.lora_dropout=5e-2",
                  "--set", "training.max_steps=-1", "--set", "training.eval_fraction=0",
                  "--set-string", "training.lora_r=8", "--set", "training.max_failures=-1",
                  "--set", "training.num_train_epochs=0.5", helm=helm)
    assert r.returncode == 0, r.stderr
    r = helm_sets("--set-json", 'training={"learning_rate": 0.0002, "lora_dropout": 0.1, "max_steps": 12}', helm=helm)
    assert r.returncode == 0, r.stderr


def _with_lora_r(flags: ModuleType, **rules: Any) -> ModuleType:
    """A copy of the trainer's flags module whose lora_r flag has other range rules."""
    assert 'flag(16, "LoRA rank.", min=1)' in FLAGS.read_text()  # the rule this changes

    @dataclasses.dataclass
    class TrainArguments(flags.TrainArguments):
        lora_r: int = flags.flag(16, "LoRA rank.", **rules)

    changed = ModuleType("changed_trainer_flags")
    changed.__dict__.update({k: v for k, v in vars(flags).items() if not k.startswith("__")})
    changed.TrainArguments = TrainArguments
    return changed


def test_the_schema_check_fails_when_a_trainer_rule_changes(tmp_path: Path, flags: ModuleType,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Drift: a trainer whose rule changed makes `sync_trainer_schema --check` fail until re-synced."""
    from scripts import sync_trainer_schema as sync

    schema = tmp_path / "values.schema.json"
    shutil.copy(CHART / "values.schema.json", schema)
    same = subprocess.run([sys.executable, "-m", "scripts.sync_trainer_schema", f"--schema={schema}", "--check"],
                          cwd=ROOT, capture_output=True, text=True)
    assert same.returncode == 0, same.stderr
    changed = _with_lora_r(flags, min=4)
    assert sync.main([f"--schema={schema}", "--check"], changed) == 1
    assert "make sync-trainer" in capsys.readouterr().err
    assert sync.main([f"--schema={schema}"], changed) == 0
    prop = json.loads(schema.read_text())["properties"]["training"]["properties"]["lora_r"]
    assert not _schema_accepts(prop, 3) and not _schema_accepts(prop, "3") and _schema_accepts(prop, "4")
    # A rule the generator has no text pattern for stops it, in one sentence: never a looser schema.
    assert sync.main([f"--schema={schema}"], _with_lora_r(flags, min=1, below=100)) == 2
    err = capsys.readouterr().err
    assert "lora_r" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
