"""What a speed number was measured on: a digest of the trainer's speed path (issue #45 item 1).

Every results line of a GPU call records `speed_path` (this digest) and `speed_files` (each part's own digest), and
`commit` when the call was told it (`BENCH_COMMIT`). tests/bench/test_headline_fresh.py holds RESULTS.md's headline
to the tree: when any part below differs from what the headline's call measured, the test fails naming the parts,
so a change to the measured path cannot reach the default unmeasured.

The parts: every module of trainer/speed/ (the levers and kernels), the lever table (which lever is on by default,
in which order), the worker's model set-up (trainer/worker/model.py), and the recipes' values — read from
trainer/job/flags.py's RECIPES rather than the file's bytes, so a new flag of another concern does not mark the
headline stale. Standard library only: `python3 -S -m bench.call` imports this on the GPU machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "trainer"
FILES = ("trainer/job/lever_table.py", "trainer/worker/model.py")
FOLDERS = ("trainer/speed",)
RECIPES = "trainer/job/flags.py:RECIPES"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def recipes_text(root: Path = ROOT) -> str:
    """The recipes as sorted JSON, from flags.py's own table (imported by path: the trainer's flags use the standard
    library only)."""
    import importlib.util
    import sys

    # flags imports trainer.job.lever_table: the trainer package must resolve from `root`
    added = str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        spec = importlib.util.spec_from_file_location("_bench_flags", root / "trainer" / "job" / "flags.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        keep = getattr(module, "KEEP", None)  # a sentinel object: its repr holds an address
        table = {name: ["KEEP" if v is keep else repr(v) for v in values] for name, values in module.RECIPES.items()}
        return json.dumps({"columns": list(module.RECIPE_COLUMNS), "recipes": table}, sort_keys=True)
    finally:
        sys.modules.pop("_bench_flags", None)
        if added:
            sys.path.remove(str(root))


def parts(root: Path = ROOT) -> dict[str, str]:
    """Each part of the speed path -> its digest."""
    out: dict[str, str] = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[path.relative_to(root).as_posix()] = _sha(path.read_bytes())
    for name in FILES:
        out[name] = _sha((root / name).read_bytes())
    out[RECIPES] = _sha(recipes_text(root).encode())
    return dict(sorted(out.items()))


def digest(files: dict[str, str]) -> str:
    return _sha(json.dumps(files, sort_keys=True).encode())


def stamp(root: Path = ROOT) -> dict[str, object]:
    """What a results line records: the digest, each part's digest."""
    files = parts(root)
    return {"speed_path": digest(files), "speed_files": files}


def changed(measured: dict[str, str], now: dict[str, str]) -> list[str]:
    """The parts that differ between a measurement and the tree (added, removed or changed)."""
    return sorted(k for k in set(measured) | set(now) if measured.get(k) != now.get(k))
