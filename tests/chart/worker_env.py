"""What a rendered release's Ray Train workers would install: the RayJob's entry point after both shells
of a Ray job (KubeRay's submitter, then `ray job submit`'s list2cmdline and the job's /bin/sh), parsed
and turned into the workers' runtime env by the trainer ConfigMap's own code, run from its files in
the kubelet's layout as the job's working directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from helm_render import Render

from localkit.chart_job import parse_chart_job, write_files

ENTRY = ["python", "-m", "trainer.vision_train"]
# The driver's own calls (vision_train.main): parse the flags, then the workers' runtime env.
DRIVER_CALLS = """
import json, os, sys
from trainer.job.arguments import parse_args
from trainer.job.flag_values import extra_pip
from trainer.job.worker_runtime_env import worker_runtime_env
assert os.path.realpath(worker_runtime_env.__code__.co_filename).startswith(os.path.realpath(".")), "not the render's"
args = parse_args(json.loads(sys.argv[1]))
print(json.dumps(worker_runtime_env(args.installer, extra_pip(args))))
"""


def sh_words(command: str) -> list[str]:
    """The argv a real /bin/sh makes of `command` (the first word replaced by printf)."""
    out = subprocess.run(["/bin/sh", "-c", f"printf '%s\\0' {command}"], capture_output=True, text=True,
                         check=True, env={"HOME": "/home/ray", "PATH": "/usr/bin:/bin"}, cwd="/").stdout
    return out.split("\0")[:-1]


def job_argv(render: Render) -> list[str]:
    """The trainer's argv as the Ray job's /bin/sh runs it."""
    entrypoint = render.one("RayJob")["spec"]["entrypoint"]
    prefix = " ".join(ENTRY) + " "
    assert entrypoint.startswith(prefix), entrypoint
    return sh_words(subprocess.list2cmdline(sh_words(entrypoint[len(prefix):])))


def workers_runtime_env(render: Render, scratch: Path) -> dict[str, Any]:
    """`RunConfig(worker_runtime_env=…)` as the job's driver builds it from this render."""
    code = scratch / "trainer"
    write_files(parse_chart_job(render.stdout), code)
    proc = subprocess.run([sys.executable, "-c", DRIVER_CALLS, json.dumps(job_argv(render))], cwd=code,
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
