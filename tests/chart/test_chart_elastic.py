"""Elastic training in the chart: `training.min_workers` reaches the trainer as `--min_workers`, next to
the derived `--num_workers` (its maximum), and the worker group can grow back to it."""

from __future__ import annotations

import shlex

from helm_render import Render


def flags(r: Render) -> dict[str, str]:
    argv = shlex.split(r.one("RayJob")["spec"]["entrypoint"])
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))


def test_min_workers_is_passed_with_the_derived_maximum(renders: dict[str, Render]) -> None:
    r = renders["spot-autoscaling-values.yaml"]
    got = flags(r)
    # 3 spot pods x 4 GPUs at most; training continues on one pod's 4 GPUs when the others are reclaimed.
    assert (got["num_workers"], got["min_workers"]) == ("12", "4")
    (group,) = r.one("RayCluster")["spec"]["workerGroupSpecs"]
    assert group["maxReplicas"] * 4 == 12  # the autoscaler can bring back every worker the job may use


def test_without_min_workers_the_job_waits_for_every_worker(renders: dict[str, Render]) -> None:
    assert "min_workers" not in flags(renders["tutorial.yaml"])
