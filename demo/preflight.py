"""Bad input to `make demo` as one sentence, before the model, the data or a run folder is made.

The values file must exist; `helm template` must accept the values and every ``--set`` (its errors are
boiled down to one sentence per field, with the field's range from the chart's schema); and the trainer's
own flag checks (the chart's copy of trainer/job/flags.py, standard library only) must accept the entry point
the chart renders, which catches what no schema rule can: two flags that do not go together.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from demo.chart_job import DemoError, entry_args, parse_chart_job, render_chart

FLAGS_PATH = "trainer/job/flags.py"  # the trainer's flag checks, where the ConfigMap's items mount them

# Placeholders for the paths the demo builds later; the checks below never open them.
PLACEHOLDER_PATHS = {"training.model_id": "/demo-preflight/tiny-gemma3",
                     "training.dataset_name": "/demo-preflight/products.parquet"}
def require_files(chart: Path, values: Path) -> None:
    if not values.is_file():
        raise DemoError(f"the values file {values} does not exist: pass one with --values=<file> "
                        "(leave it out for values/local.yaml)")
    if not (chart / "Chart.yaml").is_file():
        raise DemoError(f"{chart} is not a Helm chart (no Chart.yaml): pass the chart folder with --chart=<dir>")


def _trainer_flags_module(source: str):
    spec = importlib.util.spec_from_loader("gemma3_ray_demo_preflight_flags", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    exec(compile(source, "flags.py", "exec"), module.__dict__)  # noqa: S102 - the chart's own trainer code
    return module


def check_trainer_flags(files: dict[str, str], items: dict[str, str], entrypoint: str) -> None:
    """The trainer's own flag checks on the rendered entry point (the chart's copy of job/flags.py)."""
    key = next((k for k, path in items.items() if path == FLAGS_PATH), None)
    if key is None:
        return
    flags = _trainer_flags_module(files[key])
    words = entry_args(entrypoint)  # after `python -m trainer.vision_train`
    try:
        flags.parse_args(words)
    except flags.UsageError as e:
        problems = [ln.strip().removeprefix("- ") for ln in str(e).splitlines() if ln.strip().startswith("- ")]
        raise DemoError("the trainer refuses the flags the chart renders from the values and --set: "
                        + "; ".join(problems or [str(e)])) from None


def preflight(helm: str, chart: Path, values: Path, sets: dict[str, str]) -> None:
    """Every check above, in order; the first failure is a DemoError of one line."""
    require_files(chart, values)
    rendered = render_chart(helm, chart, values, PLACEHOLDER_PATHS, sets)
    job = parse_chart_job(rendered)
    check_trainer_flags(job.files, job.items, job.entrypoint)
