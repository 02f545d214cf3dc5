"""What the Ray Train workers install when the job starts: their own runtime env.

With `--installer=uv|pip` (the chart's `dependencies: runtimeEnv`), the workers, and only they, get
Ray's `uv` or `pip` runtime env field with the pins of the package's requirements.txt (ray
excluded: the Ray image provides it) plus `--extra_pip`. The driver and Ray Train's controller, on
the CPU head, need only Ray. Ray merges this env into the job's (a child's fields win, env_vars merge
per variable), so the workers keep the job's working_dir, excludes, env_vars and setup timeout.
With `--installer=none` (the training image) the workers install nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"  # the trainer package's pins
NO_INSTALLER = "none"
# ray itself: `ray`, `ray[...]`, or ray followed by a version or marker.
_RAY_LINE = re.compile(r"^ray([\[=<>~!; ]|$)")


def pinned_packages(requirements: Path = REQUIREMENTS) -> list[str]:
    """The requirement lines of the trainer except comments, blank lines and ray itself."""
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in requirements.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#") and not _RAY_LINE.match(line)]


def worker_runtime_env(installer: str, extra_pip: list[str], requirements: Path = REQUIREMENTS) -> dict[str, Any]:
    """`RunConfig(worker_runtime_env=…)`: the installer's field with the packages, or {} for none."""
    if installer == NO_INSTALLER:
        return {}
    packages = [*pinned_packages(requirements), *extra_pip]
    return {installer: {"packages": packages, f"{installer}_check": False}}
