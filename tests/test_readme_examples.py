"""The READMEs' command examples name what exists: plugin commands and flags its parser accepts,
trainer flags the trainer's parser accepts, Makefile targets, demo flags, chart value keys, files."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from trainer.job import arguments  # the trainer's parser (the chart's copy)

ROOT = Path(__file__).resolve().parents[1]
READMES = sorted({ROOT / "README.md", *ROOT.glob("*/README.md"), *ROOT.glob("*/*/README.md")})
SCHEMA = json.loads((ROOT / "charts" / "gemma3-ray" / "values.schema.json").read_text())
FENCE = re.compile(r"^```(?:bash|sh|console)\n(.*?)^```", re.M | re.S)
PLACEHOLDER = re.compile(r"<[^<>\n]+>")
SET_FLAG = re.compile(r"--set(?:-string|-json)?[ =]([A-Za-z_][\w.-]*)=")


def _commands(readme: Path) -> Iterator[tuple[str, list[str]]]:
    """Every shell command of the README's bash blocks, as (the line, its words); `a && b` are two."""
    for block in FENCE.findall(readme.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = PLACEHOLDER.sub("PLACEHOLDER", line)
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                yield line.strip(), words[:cut]
                words = words[cut + 1:]


COMMANDS = [(readme.relative_to(ROOT).as_posix(), line, words)
            for readme in READMES for line, words in _commands(readme)]


def _of(*programs: str) -> list[tuple[str, str, list[str]]]:
    return [(r, line, words) for r, line, words in COMMANDS if words and words[0] in programs]


def _plugin_argv(words: list[str]) -> list[str]:
    return words[2:] if words[0] == "helm" else words[1:]


PLUGIN = [c for c in _of("gemma3-ray", ".venv/bin/gemma3-ray", "helm") if c[2][0] != "helm" or c[2][1:2] == ["gemma3-ray"]]


@pytest.fixture(scope="module")
def trainer() -> ModuleType:
    from trainer.job import flags  # the flags declared (their parser: trainer.job.arguments)

    return flags


def test_the_readmes_have_the_examples_this_test_reads() -> None:
    assert len(PLUGIN) >= 12 and _of("python") and _of("make") and _of("helm")


@pytest.mark.parametrize(("readme", "line", "words"), PLUGIN, ids=[c[1] for c in PLUGIN])
def test_plugin_examples_parse(readme: str, line: str, words: list[str]) -> None:
    from gemma3_ray.cli import build_parser

    argv = _plugin_argv(words)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help exits 0; a rejected flag exits 2
        assert exc.code == 0 and "--help" in argv, f"{readme}: `{line}` is not accepted by the plugin's parser"
        return
    assert callable(args.handler), f"{readme}: `{line}`"


# `make setup` installs helm and the plugin's console script inside the repository (.tools/bin, .venv/bin):
# a README runs them by bare name only after the step that puts those folders on PATH (#27 item 3).
PATH_STEP = ["export", "PATH=$PWD/.tools/bin:$PWD/.venv/bin:$PATH"]
INSTALLED_BY_SETUP = {"helm": ".tools/bin", "gemma3-ray": ".venv/bin"}


def test_helm_and_the_plugin_run_by_name_only_after_the_path_step() -> None:
    late = []
    for readme in READMES:
        on_path = False
        for line, words in _commands(readme):
            on_path = on_path or words == PATH_STEP
            if words and words[0] in INSTALLED_BY_SETUP and not on_path:
                late.append(f"{readme.relative_to(ROOT)}: `{line}` runs before `{' '.join(PATH_STEP)}`")
    assert not late, late
    assert any(words == PATH_STEP for _, line, words in COMMANDS if _ == "README.md")


def test_the_path_step_finds_what_make_setup_installed() -> None:
    """The README's step, run as written from the repository root with nothing of ours on PATH."""
    import subprocess

    step = f'export PATH="{PATH_STEP[1].removeprefix("PATH=")}"'
    found = subprocess.run(["bash", "-c", f"{step} && command -v helm && command -v gemma3-ray"], cwd=ROOT,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}, capture_output=True, text=True, timeout=30)
    assert found.returncode == 0, found.stderr
    helm, plugin = found.stdout.split()
    assert helm == str(ROOT / INSTALLED_BY_SETUP["helm"] / "helm")
    assert plugin == str(ROOT / INSTALLED_BY_SETUP["gemma3-ray"] / "gemma3-ray")


def test_plugin_commands_table_parses() -> None:
    """Every row of plugin/README.md's command table, optional parts included, is accepted."""
    from gemma3_ray.cli import build_parser

    text = (ROOT / "plugin" / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z][^`]*)` \|", table, re.M)
    assert len(rows) >= 10
    for row in rows:
        argv = re.sub(r"[\[\]]", " ", row).replace("|", " ").split()
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"plugin/README.md's command table: `{row}` is not accepted")


def test_make_prereqs_args_parse() -> None:
    """`make prereqs [APPLY=1] ARGS="…"` runs `gemma3-ray prereqs [--apply] …` (the Makefile's rule)."""
    from gemma3_ray.cli import build_parser

    runs = [c for c in _of("make") if c[2][1:2] == ["prereqs"]]
    assert runs
    for readme, line, words in runs:
        argv = ["prereqs"] + (["--apply"] if "APPLY=1" in words else [])
        argv += [a for w in words if w.startswith("ARGS=") for a in shlex.split(w[len("ARGS="):])]
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{readme}: `{line}`: gemma3-ray {shlex.join(argv)} is not accepted")


def test_trainer_examples_parse(trainer: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [c for c in _of("python") if c[2][1:3] == ["-m", "trainer.vision_train"]]
    assert runs
    monkeypatch.setenv("HF_TOKEN", "only-so-push_to_hub-validation-can-pass")
    for readme, line, words in runs:
        try:
            arguments.parse_args(words[3:])
        except (trainer.UsageError, SystemExit) as exc:
            pytest.fail(f"{readme}: `{line}` is rejected by the trainer: {exc}")


def test_make_examples_name_existing_targets() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+):", makefile, re.M))
    for readme, line, words in _of("make"):
        for word in words[1:]:
            if "=" not in word and not word.startswith("-"):
                assert word in targets, f"{readme}: `{line}`: the Makefile has no target {word}"


def test_demo_args_in_readmes_are_demo_flags() -> None:
    from demo.__main__ import parse_args

    found = [args for readme in READMES
             for _, args in re.findall(r"make\s+demo\s+ARGS=(['\"])(.*?)\1", readme.read_text())]
    assert found
    for args in found:
        parse_args(shlex.split(args))  # exits 2 (fails the test) on an unknown flag


def _schema_has(path: list[str]) -> bool:
    node = SCHEMA
    for key in path:
        props = node.get("properties", {})
        if key not in props:
            return False
        node = props[key]
    return True


def test_every_set_key_in_the_readmes_and_notes_is_a_chart_value() -> None:
    notes = ROOT / "charts" / "gemma3-ray" / "templates" / "NOTES.txt"
    found = [(r.relative_to(ROOT).as_posix(), key) for r in [*READMES, notes] for key in SET_FLAG.findall(r.read_text())]
    assert found
    bad = [f"{r}: --set {key}" for r, key in found if not _schema_has(key.split("."))]
    assert not bad, f"not a key of charts/gemma3-ray/values.schema.json: {bad}"


def test_files_the_examples_pass_exist() -> None:
    """`-f values/X.yaml`, `--values`, chart directories and scripts named in the examples exist."""
    for readme, line, words in COMMANDS:
        for word in words:
            if re.fullmatch(r"(values|charts|images|trainer|bench|scripts|plugin)/[\w./-]*", word) or word == "./plugin":
                assert (ROOT / word).exists(), f"{readme}: `{line}` names {word}, which does not exist"


def test_readme_test_command_is_what_ci_runs() -> None:
    """README.md's `make test` and its account of `.ci/run` match the commands `.ci/run` runs."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith("make ")]
    readme = (ROOT / "README.md").read_text()
    assert ci == ["make setup", "make test", "make e2e"], ci
    assert f"`.ci/run` (= `{' && '.join(ci)}`" in readme, ci
    assert any(words[:2] == ["make", "test"] for r, _, words in COMMANDS if r == "README.md")


def test_trainer_readme_flag_table_is_the_trainer_flags(trainer: ModuleType) -> None:
    """trainer/README.md's flag table lists every trainer flag, and only those."""
    import dataclasses

    flags = {f.name for f in dataclasses.fields(trainer.TrainArguments)}
    section = (ROOT / "trainer" / "README.md").read_text().split("## Flags", 1)[1].split("\n## ", 1)[0]
    documented = {name for cell in re.findall(r"^\| ((?:`\w+`(?: / )?)+) \|", section, re.M)
                  for name in re.findall(r"`(\w+)`", cell)}
    assert not flags - documented, f"trainer flags missing from trainer/README.md: {sorted(flags - documented)}"
    assert not documented - flags, f"trainer/README.md documents flags that do not exist: {sorted(documented - flags)}"
