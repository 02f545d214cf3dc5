"""The trainer package's own rules, read with the house's import reader (tests/layering.py; its folders' "May
import" lines and the absence of cycles are checked house-wide by tests/test_layering.py): each folder names its
modules, job/ is the bottom floor, and the driver's side stays light: ``job/`` and ``vision_train`` import nothing
but the standard library, what the head may import (``HEAD_PACKAGES``, tests/trainer/import_blocker.py) and
``job/`` (the one exception: ``vision_train.train_loop_per_worker``, the workers' entry, imports ``worker/``; and
the functions of ``job/`` that Ray runs on the workers, named in ``RUN_ON_WORKERS``). A process that cannot
import the worker packages imports the driver, as the stock Ray head does; and nothing in bench/, tests/,
scripts/, demo/, localkit/ or e2e/ loads the trainer by file path."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.layering import Package, owner, read_imports
from tests.trainer.import_blocker import HEAD_PACKAGES, WORKER_FOLDERS, WORKER_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "trainer"
SOURCE = ROOT / PACKAGE
ENTRY = "vision_train"  # the driver's entry, above every folder
WORKER_ENTRY = "train_loop_per_worker"  # vision_train's function that Ray Train runs on the workers
DRIVER_FOLDER = "job"
# Functions of job/ modules that Ray runs on the workers only (passed to worker_group.execute*): they
# may import worker packages in their bodies. Each must be used only as such an argument.
RUN_ON_WORKERS = {("job.torch_backend", "_setup_process_group"): "torch.distributed.is_available(), as Ray's own"}


LAYERS = Package(SOURCE, PACKAGE)
_files, folders, folder_of, graph = LAYERS.files, LAYERS.folders, LAYERS.folder_of, LAYERS.graph
may_import = LAYERS.may_import


def driver_side_problems(module: str, source: str) -> list[str]:
    """What a driver-side module (job/, the entry) imports beyond the standard library, the head's packages
    and job/."""
    files = _files()
    out = []
    for imp in read_imports(source, f"{PACKAGE}.{module}"):
        top = imp.name.split(".")[0]
        if top in sys.stdlib_module_names or top in HEAD_PACKAGES or top == "__future__":
            continue
        if top == PACKAGE:
            dep = owner(imp.name.removeprefix(PACKAGE + "."), files)
            allowed = {DRIVER_FOLDER, "worker"} if (module, imp.function) == (ENTRY, WORKER_ENTRY) else {DRIVER_FOLDER}
            if dep and folder_of(dep) not in allowed:
                out.append(f"{module}: line {imp.line} imports {PACKAGE}.{dep}")
        elif (module, imp.function) not in RUN_ON_WORKERS:
            out.append(f"{module}: line {imp.line} imports {top}" + (f" (in {imp.function})" if imp.function else ""))
    return out


def test_the_graph_is_read_from_the_source() -> None:
    g = graph()
    assert {"job.flags", "job.runs", "job.storage", "job.dataset_check"} <= g[ENTRY]
    assert "job.flags" in g["data.dataset"] and "data.dataset" in g["worker.model"]
    assert g["worker.model"] >= {"data.sampler", "speed.speed_levers"}  # lazy imports count
    assert set(folders()) == {"job", "data", "speed", "worker"}
    assert {owner(n, _files()) for n in ("job.flags.UsageError", "job")} == {"job.flags", "job"}


def test_the_driver_side_check_finds_what_it_looks_for() -> None:
    assert driver_side_problems("job.x", "import json\nimport ray.train\nimport pyarrow.fs\n") == []
    assert driver_side_problems("job.x", "def f():\n    import torch\n") == ["job.x: line 2 imports torch (in f)"]
    assert driver_side_problems("job.x", "from transformers import TrainerCallback\n") == [
        "job.x: line 1 imports transformers"]
    assert driver_side_problems("job.x", "from trainer.data import dataset\n") == ["job.x: line 1 imports trainer.data.dataset"]
    assert driver_side_problems("job.x", "from ..data import dataset\n") == ["job.x: line 1 imports trainer.data.dataset"]
    assert driver_side_problems(ENTRY, "def main():\n    from trainer.worker import worker\n") == [
        f"{ENTRY}: line 2 imports trainer.worker.worker"]
    assert driver_side_problems(ENTRY, f"def {WORKER_ENTRY}(c):\n    from trainer.worker import worker\n") == []
    assert set(HEAD_PACKAGES).isdisjoint(WORKER_PACKAGES)


def test_each_folder_names_what_it_owns_and_job_is_the_bottom_floor() -> None:
    allowed = may_import()
    files = _files()
    for folder in allowed:
        doc = ast.get_docstring(ast.parse((SOURCE / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert doc.startswith(f"{folder}: ") and "\nOwns: " in doc, f"{folder}/__init__.py: '{folder}: ...', then 'Owns: ...'"
        modules = {m.split(".", 1)[1] for m in files if folder_of(m) == folder and "." in m}
        named = set(re.findall(r"``(\w+)``", doc.split("\nMay import:")[0]))
        assert named == modules, f"{folder}/__init__.py names {sorted(named)}, the folder holds {sorted(modules)}"
    assert allowed[DRIVER_FOLDER] == set(), "job/ is the bottom floor: the driver imports it"


def test_nothing_imports_the_driver_entry() -> None:
    assert sorted(m for m, deps in graph().items() if ENTRY in deps) == []


def test_job_and_the_driver_entry_import_only_the_standard_library_ray_and_job() -> None:
    files = _files()
    problems = []
    for module, path in files.items():
        if module == ENTRY or folder_of(module) == DRIVER_FOLDER:
            problems += driver_side_problems(module, path.read_text(encoding="utf-8"))
    assert problems == []


def test_functions_of_job_that_import_worker_packages_run_on_the_workers_only() -> None:
    """Each RUN_ON_WORKERS function exists and is used only as the function of a worker_group.execute* call."""
    files = _files()
    for (module, fn), why in RUN_ON_WORKERS.items():
        assert why
        tree = ast.parse(files[module].read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == fn for n in tree.body), f"{module}.{fn} is gone"
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == fn]
        calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                 and c.func.attr.startswith("execute") and any(a is u for a in c.args for u in uses)]
        assert uses and len(calls) == len(uses), f"{module}.{fn} must be used only as worker_group.execute*(…, {fn}, …)"


def test_package_inits_import_nothing() -> None:
    for path in _files().values():
        if path.name == "__init__.py":
            tree = ast.parse(path.read_text(encoding="utf-8"))
            assert [type(n).__name__ for n in tree.body] == ["Expr"], f"{path}: a docstring only"


BLOCKED_IMPORT = """
import importlib, json, pkgutil, sys
BLOCKED = set(json.loads(sys.argv[1]))
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is not installed on this head", name=name)
sys.meta_path.insert(0, Refuse())
import trainer.vision_train
for info in pkgutil.iter_modules(importlib.import_module("trainer.job").__path__, "trainer.job."):
    importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_driver_and_job_import_in_a_process_without_worker_packages() -> None:
    """As on the stock Ray head (no torch, transformers, …): the entry and every job/ module import, and
    neither a worker package nor a worker folder of the trainer is loaded."""
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT, json.dumps(WORKER_PACKAGES)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "trainer.job.flags" in loaded and "trainer.vision_train" in loaded
    assert [m for m in loaded if m.split(".")[0] in WORKER_PACKAGES] == []
    assert [m for m in loaded if m.startswith(WORKER_FOLDERS)] == []


LOADERS = re.compile(r"sys\.path\.insert|sys\.path\[:0\]|sys\.path\.append|spec_from_file_location|runpy\.run_path")
# Every line of bench/, tests/, scripts/, demo/, localkit/ and e2e/ that puts a path on sys.path or loads a file
# as a module, and why it is no trainer load. A new one fails the test below until it is listed here (or becomes an import).
NOT_TRAINER_LOADS = {
    ("tests/conftest.py", "sys.path.insert(0, str(path))"): "the checkout root and plugin/ (the gemma3_ray package)",
    ("tests/chart/conftest.py", "sys.path.insert(0, str(Path(__file__).resolve().parent))"): "the chart tests' helpers",
    ("tests/lifecycle/conftest.py", "sys.path.insert(0, str(Path(__file__).resolve().parent))"): "lifecycle helpers",
    ("tests/lifecycle/conftest.py", 'sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))'):
        "the chart tests' helpers",
    ("tests/trainer/test_light_driver_job.py",
     'spec = importlib.util.spec_from_file_location("import_blocker", os.path.join(site, "sitecustomize.py"))'):
        "the test's import blocker, installed as sitecustomize",
}


def test_nothing_loads_the_trainer_by_file_path() -> None:
    """bench/, tests/, scripts/, demo/, localkit/ and e2e/ import the trainer as the package, never by a path: every
    line that loads by path is one of NOT_TRAINER_LOADS, each with its reason."""
    found = set()
    for folder in ("bench", "tests", "scripts", "demo", "localkit", "e2e"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__):
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                code = line.split("  #", 1)[0].strip()
                if LOADERS.search(code):
                    found.add((path.relative_to(ROOT).as_posix(), code))
    assert sorted(found - set(NOT_TRAINER_LOADS)) == [], "a path load: import the trainer package instead"
    assert sorted(set(NOT_TRAINER_LOADS) - found) == [], "listed loads that are gone: take them off the list"
