"""chart-testing on the real cluster: `ct lint` of the chart, `ct install` with the ci/ values a CPU node can run."""

from __future__ import annotations

import shlex
import shutil
import subprocess

from e2e.support.errors import StageError
from e2e.support.harness import CHART, ROOT, Harness

# The ci/ values files a one-node CPU cluster can run (the others ask for GPU nodes, GKE node pools,
# reservations or a newer KubeRay). ct installs every ci/*-values.yaml of the chart it is given, so
# `ct install` gets a copy of the chart whose ci/ holds only these.
CPU_NODE_VALUES = ["cpu-node-values.yaml"]


def ct_binary() -> str:
    """ct on PATH (a user's machine), else the part e2e/build/parts.sh built."""
    if shutil.which("ct"):
        return shutil.which("ct")
    out = subprocess.run([str(ROOT / "e2e" / "build" / "parts.sh"), "path", "ct"], capture_output=True, text=True, check=True)
    return f"{out.stdout.strip()}/ct"


def ct_lint(h: Harness) -> str:
    h.kube.run([ct_binary(), "lint", "--config", str(ROOT / "ct.yaml")], timeout=600, what="ct lint")  # all charts
    return f"{len(list((CHART / 'ci').glob('*-values.yaml')))} ci values files"


def ct_install(h: Harness) -> str:
    missing = [v for v in CPU_NODE_VALUES if not (CHART / "ci" / v).is_file()]
    if missing:
        raise StageError(f"charts/gemma3-ray/ci/{missing[0]} is missing")
    config = ROOT / "ct.yaml"
    work = ROOT / "e2e-output" / "ct"
    shutil.rmtree(work, ignore_errors=True)
    copy = work / CHART.name
    shutil.copytree(CHART, copy, symlinks=False)
    for f in (copy / "ci").glob("*-values.yaml"):
        if f.name not in CPU_NODE_VALUES:
            f.unlink()
    # ct.yaml as it is, but for the copy's folder (ct refuses --charts beside ct.yaml's `all: true`)
    import yaml

    cfg = yaml.safe_load(config.read_text())
    cfg["chart-dirs"] = [str(work)]
    for key in ("lint-conf", "chart-yaml-schema"):
        cfg[key] = str(ROOT / cfg[key])
    (work / "ct.yaml").write_text(yaml.safe_dump(cfg))
    sets = " ".join(f"--set-string {shlex.quote(f'{k}={v}')}" for k, v in h.base_sets().items())
    extra = " ".join(f"--values {shlex.quote(str(v))}" for v in h.values_files()) + f" {sets}"
    h.kube.run([ct_binary(), "install", "--config", str(work / "ct.yaml"), "--helm-extra-set-args", extra,
                "--helm-extra-args", "--timeout 600s"], timeout=1200, what="ct install")
    return f"ci/{', '.join(CPU_NODE_VALUES)}: installed, helm test passed, uninstalled (ct's own namespace)"
