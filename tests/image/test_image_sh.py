"""e2e/build/image.sh: image names are content keys of exactly their inputs; bad input gets one sentence."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ["e2e/build/image.sh", "trainer/requirements.txt", "images/trainer/Dockerfile", "images/trainer/check_pins.py"]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of the script and the files it keys on (the script finds them next to itself)."""
    for rel in INPUTS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    return tmp_path


def image_sh(tree: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tree), "GEMMA3_RAY_CACHE": str(tree / "cache")}
    return subprocess.run(["bash", str(tree / "e2e/build/image.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=60)


def names(tree: Path) -> tuple[str, str]:
    base, trainer = image_sh(tree, "name", "base"), image_sh(tree, "name", "trainer")
    assert base.returncode == 0 and trainer.returncode == 0, base.stderr + trainer.stderr
    return base.stdout.strip(), trainer.stdout.strip()


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def test_names_are_content_keys_and_the_default_is_the_trainer(tree: Path) -> None:
    base, trainer = names(tree)
    assert re.fullmatch(r"local/gemma3-ray-base:[0-9a-f]{16}", base), base
    assert re.fullmatch(r"local/gemma3-ray-trainer:[0-9a-f]{16}", trainer), trainer
    assert image_sh(tree, "name").stdout.strip() == trainer
    assert names(tree) == (base, trainer)
    path = image_sh(tree, "path", "trainer").stdout.strip()
    assert path == f"{tree}/cache/images/gemma3-ray-trainer-{trainer.rsplit(':', 1)[1]}.tar"


@pytest.mark.parametrize(("rel", "old", "new"), [
    ("images/trainer/Dockerfile", "WORKDIR /home/ray\n", "WORKDIR /home/ray/\n"),
    ("trainer/requirements.txt", "pillow==", "pillow==0.0.1 #"),
    ("images/trainer/check_pins.py", "def pins(", "def pins_(text):\n    pass\n\n\ndef pins("),
])
def test_a_trainer_input_changes_the_trainer_name_only(tree: Path, rel: str, old: str, new: str) -> None:
    base, trainer = names(tree)
    edit(tree / rel, old, new)
    assert names(tree)[0] == base
    assert names(tree)[1] != trainer


@pytest.mark.parametrize(("old", "new"), [
    ("BASE_PACKAGES=python3,", "BASE_PACKAGES=less,python3,"),   # the recipe's inputs
    ("--env LANG=C.UTF-8", "--env LANG=C"),                      # the recipe's own text
])
def test_the_base_recipe_changes_both_names(tree: Path, old: str, new: str) -> None:
    base, trainer = names(tree)
    edit(tree / "e2e/build/image.sh", old, new)
    new_base, new_trainer = names(tree)
    assert new_base != base and new_trainer != trainer


def test_the_ray_pin_of_the_requirements_keys_the_base(tree: Path) -> None:
    base, _ = names(tree)
    req = tree / "trainer/requirements.txt"
    pin = re.search(r"^ray\[[^\]]*\]==(\S+)", req.read_text(), re.M).group(1)
    edit(req, f"=={pin}", "==0.0.1")
    assert names(tree)[0] != base


@pytest.mark.parametrize("text", ["torch==2.11.0\n", "ray>=2\n", "ray==1\nray[train]==2\n"])
def test_requirements_without_one_exact_ray_pin_get_one_sentence(tree: Path, text: str) -> None:
    (tree / "trainer/requirements.txt").write_text(text)
    out = image_sh(tree, "name")
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "trainer/requirements.txt must pin ray exactly once" in out.stderr


def test_import_names_the_missing_socket(tree: Path) -> None:
    out = image_sh(tree, "import")
    assert out.returncode != 0 and out.stderr.count("\n") == 1 and "import SOCKET|DIR" in out.stderr, out.stderr
    out = image_sh(tree, "import", str(tree / "nothing"))
    assert out.returncode != 0 and out.stderr.count("\n") == 1, out.stderr
    assert f"no containerd socket at {tree}/nothing" in out.stderr and "e2e/cluster/cluster.sh start DIR" in out.stderr


@pytest.mark.skipif(shutil.which("ctr") is None, reason="ctr (Debian containerd) is not installed")
def test_import_names_a_socket_nobody_answers(tree: Path) -> None:
    sock = tree / "containerd.sock"
    with socket.socket(socket.AF_UNIX) as s:  # bound, never listening: a dead containerd's socket
        s.bind(str(sock))
        out = image_sh(tree, "import", str(tree))
    assert out.returncode != 0 and out.stderr.count("\n") == 1, out.stderr
    assert f"the containerd at {sock} does not answer" in out.stderr


def test_an_unknown_command_or_image_gets_the_usage(tree: Path) -> None:
    out = image_sh(tree, "push")
    assert out.returncode != 0 and out.stderr.startswith("e2e/build/image.sh: usage:"), out.stderr
    out = image_sh(tree, "name", "head")
    assert out.returncode != 0 and "unknown image 'head' (base, trainer or storage)" in out.stderr, out.stderr
