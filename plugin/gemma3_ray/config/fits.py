"""The fit table (fits.toml): which recipe and micro-batch fit a Gemma 3 size on a GPU, as measured.

`values` writes the cell's recipe and micro-batch for the machine's accelerator and the model's size; a size that
does not fit the GPU is refused in one sentence naming what does, before anything is written. `doctor` checks a
release's values against the same cells. The table's rules (every accelerator in one class, every cell measured,
derived or refused, the headroom) are held by tests/plugin/test_fits.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import tomllib

from gemma3_ray.utils.errors import ConfigError

TABLE = Path(__file__).with_name("fits.toml")
SIZES = ("4b", "12b", "27b")
DEFAULT_MODEL = "google/gemma-3-4b-it"
# A model id or path that names its Gemma 3 size: google/gemma-3-27b-it, gs://b/gemma-3-12b-pt-copy, ...
_SIZE_IN_ID = re.compile(r"gemma-?3-(4|12|27)b", re.IGNORECASE)
# The trainer's recipe defaults for the micro-batch cap (trainer/job/flags.py RECIPES): what need not be written.
RECIPE_MICRO_BATCH = {"fast": 16, "tutorial": 1}


@dataclass(frozen=True)
class GpuClass:
    name: str
    memory_gb: int
    accelerators: tuple[str, ...]
    emulated_gib: float | None  # None: above the H200, not emulated here


@dataclass(frozen=True)
class Cell:
    size: str
    gpu: str
    fits: bool
    recipe: str = ""
    micro_batch: int = 0
    peak_gib: float | None = None
    samples_per_s: float | None = None
    source: str = ""
    derived: str = ""
    instead: str = ""


@dataclass(frozen=True)
class Table:
    headroom: float
    gpus: tuple[GpuClass, ...]
    cells: tuple[Cell, ...]

    def gpu_class(self, accelerator: str) -> GpuClass | None:
        return next((g for g in self.gpus if accelerator in g.accelerators), None)

    def cell(self, size: str, accelerator: str) -> Cell | None:
        gpu = self.gpu_class(accelerator)
        if gpu is None:
            return None
        return next((c for c in self.cells if c.size == size and c.gpu == gpu.name), None)


@cache
def table(path: Path = TABLE) -> Table:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    gpus = tuple(GpuClass(g["class"], int(g["memory_gb"]), tuple(g["accelerators"]), g.get("emulated_gib"))
                 for g in data["gpu"])
    cells = tuple(Cell(size=c["size"], gpu=c["gpu"], fits=c.get("fits", True), recipe=c.get("recipe", ""),
                       micro_batch=int(c.get("micro_batch", 0)), peak_gib=c.get("peak_gib"),
                       samples_per_s=c.get("samples_per_s"), source=c.get("source", ""), derived=c.get("derived", ""),
                       instead=c.get("instead", ""))
                  for c in data["cell"])
    return Table(float(data["headroom"]), gpus, cells)


def size_of(model_id: str | None, given: str | None = None) -> str:
    """The Gemma 3 size a run trains: --model-size when given, else the one its model id names (4B by default)."""
    if given:
        if given.lower() not in SIZES:
            raise ConfigError(f"--model-size {given} is not a Gemma 3 vision size: use one of {', '.join(SIZES)}.")
        return given.lower()
    m = _SIZE_IN_ID.search(model_id or DEFAULT_MODEL)
    if m is None:
        raise ConfigError("training.model_id does not name its Gemma 3 size (gemma-3-4b, -12b or -27b in the id): "
                          "pass --model-size 4b, 12b or 27b so the recipe and micro-batch fit the GPU.")
    return m.group(1) + "b"


def fitting(size: str, accelerator: str) -> Cell | None:
    """The cell for `size` on `accelerator`; None for an accelerator the table has no class for. A size that does
    not fit is refused (ConfigError) in one sentence naming what does."""
    cell = table().cell(size, accelerator)
    if cell is not None and not cell.fits:
        raise ConfigError(f"Gemma 3 {size.upper()} does not fit {accelerator}: {cell.instead} "
                          "(plugin/gemma3_ray/config/fits.toml).")
    return cell


def check_values(size: str, accelerator: str, recipe: str | None, micro_batch: int | None) -> str | None:
    """One sentence when a release's training values need more memory than the table measured on its GPU, else None
    (`doctor`): the recipe differs from the cell's (fast where the cell needs QLoRA) or the micro-batch is larger."""
    try:
        cell = fitting(size, accelerator)
    except ConfigError as exc:
        return str(exc)
    if cell is None:
        return None
    recipe = recipe or "fast"
    micro = micro_batch or RECIPE_MICRO_BATCH.get(recipe, 1)
    if cell.recipe == "tutorial" and recipe == "fast":
        return (f"training.recipe fast on {accelerator} with Gemma 3 {size.upper()}: the fit table measured only the "
                f"tutorial's QLoRA recipe there (micro-batch {cell.micro_batch}); set training.recipe: tutorial "
                f"(`gemma3-ray values` writes it).")
    if recipe == cell.recipe and micro > cell.micro_batch:
        return (f"training.per_device_train_batch_size {micro} on {accelerator} with Gemma 3 {size.upper()}: the fit "
                f"table's largest measured micro-batch there is {cell.micro_batch} ({cell.peak_gib} GiB reserved); "
                f"set it to {cell.micro_batch} or less.")
    return None


def markdown() -> str:
    """The table as the plugin README shows it (tests/plugin/test_fits.py keeps the README equal to this)."""
    t = table()
    head = "| Gemma 3 | " + " | ".join(f"{g.name} ({g.memory_gb} GB)" for g in t.gpus) + " |"
    lines = [head, "|---|" + "---|" * len(t.gpus)]
    for size in SIZES:
        row = [size.upper()]
        for g in t.gpus:
            c = next(c for c in t.cells if c.size == size and c.gpu == g.name)
            if not c.fits:
                row.append(f"does not fit ({c.peak_gib} GiB of {g.emulated_gib})")
            elif c.source:
                row.append(f"{c.recipe} × {c.micro_batch}: {c.peak_gib} GiB, {c.samples_per_s}/s")
            else:
                row.append(f"{c.recipe} × {c.micro_batch} (derived, not emulated)")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
