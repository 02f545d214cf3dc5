"""What the `fleet` stages place, as data: every values file in values/ whose workers want GPUs, `gemma3-ray
values --machine-type` of every GPU family machine_shapes knows, and the files on a fleet they cannot fit; each
with the simulated pools (e2e/support/fleet_nodes.py) it is installed on and what the scheduler must do.

A values file that asks for Kueue (kueue.queueName, capacity.type=fallback) is left out with that reason: its pods
exist only once Kueue admits the job; Kueue's admission on GPU pools is `fleet: Kueue on GPUs`
(e2e/support/fleet_fallback.py, with the chart's fallback values), not placement.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.support.errors import StageError
from e2e.support.fleet_nodes import Pool, cpu_pool, merged, pool_for_values

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gemma3-ray"
VALUES = ROOT / "values"
FAMILY_REPLICAS = 2  # two workers: one per node is then something the scheduler can get wrong


@dataclass(frozen=True)
class Case:
    name: str  # the release's name too (short, DNS)
    values: Path
    pools: tuple[Pool, ...]
    replicas: int
    pending: str = ""  # '' : every worker bound to the GPU pool; else the scheduler's reason the unplaced ones show
    placed: int = -1  # workers that must be bound (-1: all)

    @property
    def gpu_pool(self) -> Pool:
        return next(p for p in self.pools if p.gpus)


def chart_defaults() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def effective(path: Path) -> dict[str, Any]:
    return merged(chart_defaults(), yaml.safe_load(path.read_text()) or {})


def kueue_reason(values: dict[str, Any]) -> str:
    if (values.get("kueue") or {}).get("queueName"):
        return f"kueue.queueName={values['kueue']['queueName']}: its pods exist once Kueue admits it (issue #43, Kueue)"
    if (values.get("capacity") or {}).get("type") == "fallback":
        return "capacity.type=fallback: Kueue picks the flavor (issue #43, Kueue)"
    return ""


def values_cases(folder: Path = VALUES) -> tuple[list[Case], dict[str, str]]:
    """One case per values file whose workers want GPUs (the pool it is written for); the others with why not."""
    cases, left = [], {}
    for f in sorted(folder.glob("*.yaml")):
        v = effective(f)
        if not int(v["workers"].get("gpusPerNode") or 0):
            left[f.name] = "CPU-only workers"
            continue
        if kueue_reason(v):
            left[f.name] = kueue_reason(v)
            continue
        pool = pool_for_values(v)
        cases.append(Case(f"f-{f.stem}", f, (cpu_pool(), pool), pool.nodes))
    return cases, left


def families() -> list[str]:
    """One machine type per GPU family machine_shapes knows (the one with the most GPUs), in its order."""
    from gemma3_ray.config import machine_shapes

    best: dict[str, tuple[int, str]] = {}
    for mt in machine_shapes.KNOWN_MACHINE_TYPES:
        if machine_shapes.node_size(mt) is None:
            continue
        fam = "-".join(mt.split("-")[:2])
        gpus = machine_shapes.shape_for_machine_type(mt).gpus_per_node
        best[fam] = max(best.get(fam, (0, "")), (gpus, mt))
    return [mt for _, mt in sorted(best.values(), key=lambda g: g[1])]


def family_values(machine_type: str, out_dir: Path) -> Path:
    """`gemma3-ray values --machine-type MT --replicas 2` as a user runs it (flags for project and region, no
    gcloud configuration or kube context read), written to out_dir/values-MT.yaml."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"values-{machine_type}.yaml"
    env = {**os.environ, "CLOUDSDK_CONFIG": str(out_dir / "gcloud-none"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "plugin"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "gemma3_ray", "values", "--machine-type", machine_type,
                           "--replicas", str(FAMILY_REPLICAS), "--project", "fleet-e2e", "--region", "us-central1",
                           "--no-kube-context", "-o", str(path)], capture_output=True, text=True, timeout=120, env=env)
    if proc.returncode != 0:
        raise StageError(f"gemma3-ray values --machine-type {machine_type} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-300:]}")
    return path


def family_case(machine_type: str, values: Path) -> Case:
    return Case(f"f-{machine_type}", values, (cpu_pool(), Pool("gpu-pool", machine_type, FAMILY_REPLICAS)),
                FAMILY_REPLICAS)


def cannot_fit_cases(folder: Path = VALUES) -> list[Case]:
    """values/tutorial.yaml (2 x 8 B200 on a reservation) on a pool one node short, and on the same machines
    without the reservation: the scheduler leaves what does not fit Pending and says why."""
    f = folder / "tutorial.yaml"
    pool = pool_for_values(effective(f))
    short = Pool(pool.name, pool.machine_type, pool.nodes - 1, capacity=pool.capacity, reservation=pool.reservation,
                 driver=pool.driver)
    other = Pool(pool.name, pool.machine_type, pool.nodes, driver=pool.driver)
    return [Case("f-short", f, (cpu_pool(), short), pool.nodes, pending="Insufficient nvidia.com/gpu",
                 placed=short.nodes),
            Case("f-no-res", f, (cpu_pool(), other), pool.nodes,
                 pending="didn't match Pod's node affinity/selector", placed=0)]
