"""trainer/requirements.txt covers every third-party package the trainer imports."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "trainer"


def pinned() -> dict[str, Requirement]:
    reqs = {}
    for line in (TRAINER / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[canonicalize_name(req.name)] = req
    return reqs


def imported_top_level_modules() -> set[str]:
    """Top-level names of every import in the trainer package, every folder of it (module level or inside
    functions); the package's own name and its entry modules are local, not requirements."""
    local = {"trainer"} | {p.stem for p in TRAINER.glob("*.py")}
    names: set[str] = set()
    for path in sorted(TRAINER.resolve().rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in local and n != "__future__"}


def hard_dependencies(reqs: dict[str, Requirement]) -> set[str]:
    """Every distribution the pinned requirements pull in (with their extras), as installed here."""
    seen: set[str] = set()
    todo = [(name, set(req.extras)) for name, req in reqs.items()]
    while todo:
        name, extras = todo.pop()
        key = f"{name}{sorted(extras)}"
        if key in seen:
            continue
        seen.add(key)
        for raw in distribution(name).requires or []:
            dep = Requirement(raw)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if dep.marker is None or any(dep.marker.evaluate(env) for env in envs):
                todo.append((canonicalize_name(dep.name), set(dep.extras)))
    return {k.split("[", 1)[0] for k in seen}


# Imported only where present, with a tested fallback, and deliberately not pinned: each with where its
# absence is handled. A new name here needs the same: a fallback the tests exercise.
OPTIONAL = {
    # FlashAttention 4 (CuTe DSL): trainer/speed/capability.py picks it only when find_spec finds
    # flash_attn.cute on an sm90/sm100 device, else cuDNN (tests/trainer/speed); not in the image (bench/README.md).
    "flash_attn": "trainer/speed/capability.py",
}


def test_the_optional_imports_have_their_fallback_where_named() -> None:
    """Each optional import's named file checks for it before use (find_spec), so its absence is a choice, not a crash."""
    for module, where in OPTIONAL.items():
        text = (ROOT / where).read_text()
        assert f'find_spec("{module}")' in text, f"{where} does not check for {module} before using it"


def test_every_imported_package_is_pinned() -> None:
    """A package the trainer imports must be pinned, not arrive by luck (PIL was: nothing required Pillow)."""
    reqs = pinned()
    dists = packages_distributions()
    direct = set(reqs)
    unpinned = {}
    for module in sorted(imported_top_level_modules()):
        owners = {canonicalize_name(d) for d in dists.get(module, [module])}
        if not owners & direct:
            unpinned[module] = sorted(owners)
    # Packages that are hard dependencies of a pin (huggingface_hub of transformers, pyarrow of datasets)
    # follow their parent's resolution; anything else must be a pin of its own.
    deps = hard_dependencies(reqs)
    missing = {m: o for m, o in unpinned.items() if not set(o) & deps and m not in OPTIONAL}
    assert not missing, f"imported by trainer/ but not in trainer/requirements.txt (nor required by a pin): {missing}"


def test_imports_seen_include_the_known_ones() -> None:
    """The import scan itself works: it finds the trainer's lazily imported packages."""
    assert {"torch", "transformers", "peft", "trl", "PIL", "ray"} <= imported_top_level_modules()
