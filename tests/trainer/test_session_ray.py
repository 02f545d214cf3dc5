"""The trainer tests' local Ray cluster (tests/trainer/conftest.py: SessionRay) is up only while tests that use it
run: stopped when the run moves on to a module that does not use it, started again for a later one, and its
processes' TMPDIR is the same throughout. Checked in a child test run of three modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

A_RAY = '''
import ray
from tests.trainer.conftest import _SESSION_RAY

def test_first(ray_cluster):
    assert ray.is_initialized() and _SESSION_RAY[0].starts == 1
    (ray_cluster / "left-by-a-job").write_text("x")
'''
B_PLAIN = '''
import ray, psutil
from tests.trainer.conftest import _SESSION_RAY

def test_between():
    assert not ray.is_initialized()
    assert not [p for p in psutil.Process().children(recursive=True) if "raylet" in p.name()]
'''
C_RAY = '''
import os
import ray
from tests.trainer.conftest import _SESSION_RAY

def test_again(ray_cluster):
    assert ray.is_initialized() and _SESSION_RAY[0].starts == 2
    assert (ray_cluster / "left-by-a-job").read_text() == "x"  # the same TMPDIR
    assert os.environ["TMPDIR"] == str(ray_cluster)
'''


def test_the_cluster_is_up_only_while_its_tests_run(tmp_path: Path) -> None:
    for name, text in (("test_a_ray.py", A_RAY), ("test_b_plain.py", B_PLAIN), ("test_c_ray.py", C_RAY)):
        (tmp_path / name).write_text(text)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.trainer.conftest", "-p", "tests.sigterm",
                           "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout, proc.stdout[-2000:]
