"""The speed levers' table (trainer/job/lever_table.py, issue #41 (4)), checked as the e2e stage table is: every row's
flag is the trainer's flag with the row's type, help and default (through the real parser, in both recipes and on
CPU), restart-free, and in the chart's schema; every row's module has `on` and `lever`, every module with a `lever`
is a row, every row's CPU test exists and names its module, and every kernel path of capability.py is a row's. Each
check is fed a planted fault and finds it. speed_levers.apply walks the rows in order, printing each row's line."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts import sync_trainer_schema
from trainer.job import flags
from trainer.job.arguments import parse_args
from trainer.job.lever_table import LEVERS, Lever
from trainer.speed import capability, speed_levers

ROOT = Path(__file__).resolve().parents[3]
SPEED = ROOT / "trainer" / "speed"
# The order the GPU measurements were taken with (bench/RESULTS.md): compile cache before the first Triton compile,
# fused LoRA, SigLIP's attention, the frozen norms, the LM's attention, the lean step, the image-feature cache.
# Changing it changes what runs on the GPU: measure it, then change this line.
MEASURED_ORDER = ("lm_head", "compile_cache", "fused_lora", "vision_attention", "frozen_norms", "lm_attention",
                  "lean_step", "image_feature_cache")


def top_functions(module: str) -> set[str]:
    path = SPEED / f"{module}.py"
    if not path.is_file():
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def module_level_imports(module: str) -> set[str]:
    path = SPEED / f"{module}.py"
    tree = ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else ast.Module(body=[], type_ignores=[])
    names = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)]
    return {name.split(".")[0] for name in names}


def lever_modules() -> set[str]:
    """The modules of trainer/speed/ that define a lever (a top-level `lever` function)."""
    return {p.stem for p in SPEED.glob("*.py") if "lever" in top_functions(p.stem)}


def table_problems(levers: tuple[Lever, ...]) -> list[str]:
    """What is wrong with `levers` against the trainer's flags, trainer/speed/ and the tests (nothing: [])."""
    out: list[str] = []
    fields = {f.name: f for f in dataclasses.fields(flags.TrainArguments)}
    hints = typing.get_type_hints(flags.TrainArguments)
    names = [lever.name for lever in levers]
    out += [f"{n}: two rows" for n in sorted({n for n in names if names.count(n) > 1})]
    for lever in levers:
        where = f"{lever.name} (trainer/speed/{lever.module}.py)"
        missing = {"on", "lever"} - top_functions(lever.module)
        if missing:
            out.append(f"{where} has no {', '.join(sorted(missing))}()")
        heavy = sorted(module_level_imports(lever.module) - set(sys.stdlib_module_names) - {"__future__", "trainer"})
        if heavy:  # apply imports every row's module, on or off
            out.append(f"{where} imports {', '.join(heavy)} at module level; import it inside the functions")
        test = ROOT / lever.test
        if not test.is_file():
            out.append(f"{lever.name}: its CPU test {lever.test} does not exist")
        elif lever.module not in test.read_text(encoding="utf-8"):
            out.append(f"{lever.name}: {lever.test} does not name {lever.module}")
        if lever.kernels is not None and lever.kernels not in capability.PATHS:
            out.append(f"{lever.name}: kernels {lever.kernels!r} is no path of capability.py")
        if not lever.patches:
            out.append(f"{lever.name}: says nothing of what it patches")
        if lever.flag is None:
            continue
        field = fields.get(lever.flag)
        if field is None:
            out.append(f"{lever.name}: no flag --{lever.flag}")
            continue
        want_default = None if lever.recipe else lever.default
        if field.default != want_default:
            out.append(f"{lever.name}: --{lever.flag} defaults to {field.default!r}, the row says {want_default!r}")
        if lever.recipe and flags.RECIPES.get(lever.flag) != lever.recipe:
            out.append(f"{lever.name}: RECIPES[{lever.flag!r}] is {flags.RECIPES.get(lever.flag)!r}, the row says "
                       f"{lever.recipe!r}")
        if field.metadata["help"] != lever.help or {k: v for k, v in field.metadata.items() if k != "help"} != dict(
                lever.rules):
            out.append(f"{lever.name}: --{lever.flag}'s help or range rules differ from the row's")
        if hints[lever.flag] != (lever.kind | None if lever.recipe else lever.kind):
            out.append(f"{lever.name}: --{lever.flag} is {hints[lever.flag]}, the row says {lever.kind}")
        if lever.flag not in flags.RESTART_FREE:
            out.append(f"{lever.name}: --{lever.flag} is not restart-free (a lever keeps the arithmetic)")
    for module in sorted(lever_modules() - {lever.module for lever in levers}):
        out.append(f"trainer/speed/{module}.py defines lever() but no row names it")
    return out


def test_every_row_is_the_trainers_flag_module_and_test() -> None:
    assert table_problems(LEVERS) == []


def test_the_checks_find_planted_faults() -> None:
    by_name = {lever.name: lever for lever in LEVERS}
    planted = {
        "flag": dataclasses.replace(by_name["lean_step"], flag="lean_stepp"),
        "default": dataclasses.replace(by_name["image_feature_cache"], default=4.0),
        "recipe": dataclasses.replace(by_name["frozen_norms"], recipe=(False, False, False)),
        "help": dataclasses.replace(by_name["fused_lora"], help="other words"),
        "kind": dataclasses.replace(by_name["lm_attention"], kind=bool),
        "test": dataclasses.replace(by_name["lm_head"], test="tests/trainer/speed/test_nothing.py"),
        "module": dataclasses.replace(by_name["compile_cache"], module="compile_cachee"),
        "kernels": dataclasses.replace(by_name["vision_attention"], kernels="siglip"),
    }
    expected = {
        "flag": "lean_step: no flag --lean_stepp",
        "default": "image_feature_cache: --image_feature_cache_gib defaults to 8.0, the row says 4.0",
        "recipe": "frozen_norms: RECIPES['frozen_norms'] is (True, False, False), the row says (False, False, False)",
        "help": "fused_lora: --fused_lora's help or range rules differ from the row's",
        "kind": "lm_attention: --lm_attention is ",
        "test": "lm_head: its CPU test tests/trainer/speed/test_nothing.py does not exist",
        "module": "compile_cache (trainer/speed/compile_cachee.py) has no lever, on()",
        "kernels": "vision_attention: kernels 'siglip' is no path of capability.py",
    }
    for fault, row in planted.items():
        table = tuple(row if lever.name == row.name else lever for lever in LEVERS)
        problems = table_problems(table)
        assert any(p.startswith(expected[fault]) for p in problems), (fault, problems)
    without = tuple(lever for lever in LEVERS if lever.name != "frozen_norms")
    assert "trainer/speed/frozen_norm.py defines lever() but no row names it" in table_problems(without)
    assert "lean_step: two rows" in table_problems((*LEVERS, by_name["lean_step"]))


def test_the_rows_are_in_the_measured_order() -> None:
    assert tuple(lever.name for lever in LEVERS) == MEASURED_ORDER


def test_every_kernel_path_is_chosen_by_a_lever() -> None:
    assert sorted(lever.kernels for lever in LEVERS if lever.kernels) == sorted(capability.PATHS)


@pytest.mark.parametrize(("argv", "column"), [([], 0), (["--recipe=tutorial"], 1),
                                              (["--use_gpu=false", "--quantization=none"], 2)])
def test_the_parser_gives_each_lever_flag_its_rows_value(argv: list[str], column: int) -> None:
    args = parse_args(argv)
    for lever in LEVERS:
        if lever.flag:
            want = lever.recipe[column] if lever.recipe else lever.default
            assert getattr(args, lever.flag) == want, lever.flag


def test_the_charts_schema_is_generated_from_the_rows() -> None:
    old, new = sync_trainer_schema.render()
    assert old == new, "charts/gemma3-ray/values.schema.json is out of date: run make sync-trainer"
    training = json.loads(old)["properties"]["training"]["properties"]
    for lever in LEVERS:
        if lever.flag:
            prop = training[lever.flag]
            assert prop["description"].startswith(lever.help), lever.flag
            if typing.get_origin(lever.kind) is typing.Literal:
                assert prop["enum"] == list(typing.get_args(lever.kind)), lever.flag


def test_apply_walks_the_rows_in_order_and_prints_each_rows_line(monkeypatch, capsys) -> None:
    table = (Lever("first", "m1", "x", "t", says="first thing"), Lever("off", "m2", "x", "t"),
             Lever("second", "m3", "x", "t"))
    calls: list[str] = []

    def module(name: str, on: bool):
        return SimpleNamespace(on=lambda args: on, lever=lambda run: calls.append(name) or {"done": name})

    fakes = {"m1": module("first", True), "m2": module("off", False), "m3": module("second", True)}
    monkeypatch.setattr(speed_levers, "module_of", lambda lever: fakes[lever.module])
    report = speed_levers.apply(SimpleNamespace(), model=None, levers=table)
    assert calls == ["first", "second"]
    assert list(report) == ["kernels", "first", "second"] and report["second"] == {"done": "second"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[trainer] kernels for ")
    assert lines[1:] == ["[trainer] first thing: {'done': 'first'}"]


def test_the_readmes_new_lever_example_is_a_row_and_a_module() -> None:
    """trainer/README.md, "Speed levers": its row builds, and its module's on/lever run on a model part."""
    import re

    import torch

    section = (ROOT / "trainer" / "README.md").read_text(encoding="utf-8").split("## Speed levers", 1)[1]
    row_code, module_code = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    row = eval(row_code.strip().rstrip(","), {"Lever": Lever})  # noqa: S307 - the README's own example
    assert isinstance(row, Lever) and row.recipe and row.help.endswith("(default: from --recipe).")
    module: dict = {}
    exec(module_code, module)  # noqa: S102 - the README's own example
    assert module["on"](SimpleNamespace(**{row.flag: True})) is True
    projector = torch.nn.Linear(4, 4)
    assert module["lever"](SimpleNamespace(core=SimpleNamespace(multi_modal_projector=projector))) is True
    assert len(projector._forward_hooks) == 1 and projector(torch.randn(3, 4)).shape == (3, 4)


def test_a_lever_module_importing_torch_at_module_level_is_found(monkeypatch) -> None:
    real = module_level_imports
    monkeypatch.setitem(globals(), "module_level_imports",
                        lambda m: real(m) | ({"torch"} if m == "frozen_norm" else set()))
    assert table_problems(LEVERS) == ["frozen_norms (trainer/speed/frozen_norm.py) imports torch at module level; "
                                      "import it inside the functions"]
