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


# Run in a child with the checkout as its working directory: the recipes of that checkout's trainer, imported as the
# trainer package (never loaded by path), and nothing of it left in this process.
RECIPES_CHILD = """
import json
from trainer.job import flags
table = {n: ["KEEP" if v is flags.KEEP else repr(v) for v in vals] for n, vals in flags.RECIPES.items()}
print(json.dumps({"columns": list(flags.RECIPE_COLUMNS), "recipes": table}, sort_keys=True))
"""


def recipes_text(root: Path = ROOT) -> str:
    """The recipes as sorted JSON, from trainer/job/flags.py's own table (the trainer's flags use the standard
    library only, so `python3 -S` reads them)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable or "python3", "-S", "-c", RECIPES_CHILD], cwd=root, check=True,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}).stdout


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
