"""`python -m e2e` without a tool it needs says so in one sentence, before anything is written.

Seen: with helm not on PATH (python -m e2e run outside make), the run printed "FileNotFoundError: [Errno 2] No
such file or directory: 'helm'" - a class name and a traceback's words, not what to do."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.support.errors import StageError
from e2e.support.kube import Kube

ROOT = Path(__file__).resolve().parents[2]


def _env_without(tmp_path: Path, tool: str) -> dict[str, str]:
    """PATH of this machine with every folder holding `tool` left out (python itself stays reachable)."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / tool).exists()]
    env = {k: v for k, v in os.environ.items() if k not in {"KUBECONFIG", "HELM"}}
    env.update({"PATH": os.pathsep.join(keep), "GEMMA3_RAY_CACHE": str(tmp_path / "cache"),
                "E2E_OUTPUT": str(tmp_path / "out")})
    return env


@pytest.mark.parametrize("tool", ["helm", "kubectl"])
def test_a_missing_tool_stops_the_run_with_one_sentence_before_anything(tmp_path: Path, tool: str) -> None:
    env = _env_without(tmp_path, tool)
    if tool != "helm":  # helm found (make puts .tools/bin on PATH; here by its path) so that the check reaches tool
        env["HELM"] = shutil.which("helm") or str(ROOT / ".tools" / "bin" / "helm")
    env["KUBECONFIG"] = str(tmp_path / "kubeconfig")  # any cluster: nothing local would start either
    out = subprocess.run([sys.executable, "-m", "e2e", "--only", "first"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(lines) == 1 and tool in lines[0] and "PATH" in lines[0] and "make e2e" in lines[0], lines
    assert "Error" not in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


def test_helm_named_by_the_HELM_variable_must_exist(tmp_path: Path) -> None:
    env = _env_without(tmp_path, "nothing-to-drop")
    env.update({"KUBECONFIG": str(tmp_path / "kubeconfig"), "HELM": str(tmp_path / "no-helm")})
    out = subprocess.run([sys.executable, "-m", "e2e", "--only", "first"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "HELM" in lines[0] and "no-helm" in lines[0], lines


def test_a_command_that_vanished_mid_run_is_a_stage_error_naming_it(tmp_path: Path) -> None:
    kube = Kube(tmp_path / "kubeconfig", tmp_path / "log", helm=str(tmp_path / "gone-helm"))
    with pytest.raises(StageError) as e:
        kube.h("version", what="helm version")
    said = str(e.value)
    assert "gone-helm" in said and "not found" in said and "\n" not in said, said
