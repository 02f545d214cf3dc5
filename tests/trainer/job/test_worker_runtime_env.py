"""What only the Ray Train workers install (--installer, --extra_pip): the trainer's pins without ray,
plus the extras, under Ray's uv or pip field; nothing with installer none; bad flags fail first."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.job.arguments import parse_args
from trainer.job.flag_values import extra_pip
from trainer.job.flags import UsageError
from trainer.job.worker_runtime_env import pinned_packages, worker_runtime_env

ROOT = Path(__file__).resolve().parents[3]
CPU = ["--use_gpu=false", "--quantization=none"]


def test_the_pins_are_requirements_txt_without_ray_or_comments(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("# a comment\nray[train]==2.60.0\n\ntorch==2.11.0  # trailing comment\nraylib==1.0\n"
                   "ray>=2; python_version>'3'\npillow==13.0.0\n")
    assert pinned_packages(req) == ["torch==2.11.0", "raylib==1.0", "pillow==13.0.0"]
    shipped = pinned_packages(ROOT / "trainer" / "requirements.txt")
    assert "torch==2.11.0" in shipped and not [p for p in shipped if p.startswith("ray")]


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_the_workers_get_the_installers_field(installer: str) -> None:
    args = parse_args([*CPU, f"--installer={installer}", '--extra_pip=[ "wandb==0.19.0", "a>=1; python_version>\'3\'" ]'])
    env = worker_runtime_env(args.installer, extra_pip(args))
    assert env == {installer: {"packages": [*pinned_packages(), "wandb==0.19.0", "a>=1; python_version>'3'"],
                               f"{installer}_check": False}}


def test_installer_none_installs_nothing() -> None:
    args = parse_args(CPU)
    assert args.installer == "none"
    assert worker_runtime_env(args.installer, extra_pip(args)) == {}


@pytest.mark.parametrize(("argv", "message"), [
    (['--extra_pip=["wandb"]'], "extra_pip=[\"wandb\"] needs --installer=uv or pip"),
    (["--installer=uv", "--extra_pip=wandb"], "extra_pip: not JSON"),
    (["--installer=uv", '--extra_pip={"a": 1}'], "extra_pip: must be a JSON list of requirement strings"),
    (["--installer=uv", '--extra_pip=[""]'], "extra_pip: must be a JSON list of requirement strings"),
    (["--installer=conda"], "invalid choice: 'conda'"),
])
def test_bad_installer_flags_fail_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=None) as e:
        parse_args([*CPU, *argv])
    assert message in str(e.value)
