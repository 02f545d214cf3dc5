"""trainer/worker/unused_libraries.py: a run without --quantization=4bit keeps bitsandbytes out of its workers
(peft would import it, 1.4-3 s a worker); a 4-bit run, and a process that already has it, keep it. The job-level
check (a real Ray Train worker) is tests/trainer/test_ray_job.py::test_a_cpu_run_leaves_bitsandbytes_out_of_its_workers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.conftest import ROOT
from trainer.worker import unused_libraries

# A fresh interpreter, as a Ray Train worker is: the trainer's imports after leave_out("none").
CHILD = """
import importlib.util, sys
from trainer.worker import unused_libraries
assert unused_libraries.leave_out("none") == ["bitsandbytes"]
import trainer.worker.worker, peft, peft.import_utils
from transformers.utils import is_bitsandbytes_available
assert sys.modules.get("bitsandbytes") is None, "loaded"
assert not peft.import_utils.is_bnb_available() and not is_bitsandbytes_available()
assert importlib.util.find_spec("bitsandbytes") is None
try:
    import bitsandbytes
except ImportError:
    print("not importable")
"""


def test_a_run_without_4bit_never_loads_bitsandbytes() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "not importable", proc.stderr[-3000:]


def test_a_4bit_run_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)
    assert unused_libraries.leave_out("4bit") == []
    assert "bitsandbytes" not in sys.modules  # not marked: importable as before


def test_a_library_already_loaded_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = object()
    monkeypatch.setitem(sys.modules, "bitsandbytes", loaded)
    assert unused_libraries.leave_out("none") == []
    assert sys.modules["bitsandbytes"] is loaded
