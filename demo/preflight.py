"""Bad input to `make demo` as one sentence, before the model, the data or a run folder is made.

The values file must exist; `helm template` must accept the values and every ``--set`` (its errors are
boiled down to one sentence per field, with the field's range from the chart's schema); and the trainer's
own flag checks (the chart's copy of trainer/job/, standard library only, run in a child Python on the files the
ConfigMap's items mount) must accept the entry point the chart renders, which catches what no schema rule can:
two flags that do not go together.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from demo.errors import DemoError
from localkit.chart_job import entry_args, parse_chart_job, render_chart

RELEASE = "demo"  # the demo's Helm release name (its objects are demo-gemma3-ray-...)
JOB_DIR = "trainer/job/"  # the trainer's flags and their checks, where the ConfigMap's items mount them
# The chart's own parser on the rendered words, in a child Python started in a folder of the chart's trainer/job/
# files (its first import path: the chart's trainer, never this checkout's): exit 3 and the UsageError's text when
# it refuses them.
_CHECK = """import sys
from trainer.job.arguments import parse_args
from trainer.job.flags import UsageError
try:
    parse_args(sys.argv[1:])
except UsageError as e:
    print(e)
    sys.exit(3)
"""

# Placeholders for the paths the demo builds later; the checks below never open them.
PLACEHOLDER_PATHS = {"training.model_id": "/demo-preflight/tiny-gemma3",
                     "training.dataset_name": "/demo-preflight/products.parquet"}
def require_files(chart: Path, values: Path) -> None:
    if not values.is_file():
        raise DemoError(f"the values file {values} does not exist: pass one with --values=<file> "
                        "(leave it out for values/local.yaml)")
    if not (chart / "Chart.yaml").is_file():
        raise DemoError(f"{chart} is not a Helm chart (no Chart.yaml): pass the chart folder with --chart=<dir>")


def check_trainer_flags(files: dict[str, str], items: dict[str, str], entrypoint: str) -> None:
    """The trainer's own flag checks on the rendered entry point (the chart's copy of trainer/job/)."""
    mounted = {path: files[key] for key, path in items.items()
               if path.startswith(JOB_DIR) or path == "trainer/__init__.py"}
    if JOB_DIR + "arguments.py" not in mounted:
        return
    words = entry_args(entrypoint)  # after `python -m trainer.vision_train`
    with tempfile.TemporaryDirectory(prefix="g3r-preflight-") as tmp:
        for path, text in mounted.items():
            (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / path).write_text(text)
        done = subprocess.run([sys.executable, "-s", "-c", _CHECK, *words], cwd=tmp, capture_output=True, text=True)
    if done.returncode == 3:
        problems = [ln.strip().removeprefix("- ") for ln in done.stdout.splitlines() if ln.strip().startswith("- ")]
        raise DemoError("the trainer refuses the flags the chart renders from the values and --set: "
                        + "; ".join(problems or [done.stdout.strip()]))
    if done.returncode != 0:
        raise DemoError("the chart's trainer flag checks could not run: "
                        + (done.stderr.strip().splitlines() or ["no output"])[-1])


def preflight(helm: str, chart: Path, values: Path, sets: dict[str, str]) -> None:
    """Every check above, in order; the first failure is a LocalKitError (or DemoError) of one line."""
    require_files(chart, values)
    rendered = render_chart(helm, chart, values, PLACEHOLDER_PATHS, sets, release=RELEASE)
    job = parse_chart_job(rendered)
    check_trainer_flags(job.files, job.items, job.entrypoint)
