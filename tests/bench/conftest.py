"""The trainer's modules importable by name, as bench/bench.py imports them; bench modules loaded from their files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "trainer") not in sys.path:
    sys.path.insert(0, str(ROOT / "trainer"))


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py, loaded from its file (bench/ itself stays off sys.path: its names are generic)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
