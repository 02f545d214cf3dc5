"""rayObjectStore: Ray's object store size and spill directory on the Ray pods (where a streamed run's rows in flight
live), rendered as `ray start` parameters of the head and the workers, the spill directory an emptyDir of a stated
size; nothing of it by default; a stream budget larger than the store, or the same parameters set by hand, refused at
install. Real `helm template`."""

from __future__ import annotations

from collections.abc import Callable

from helm_render import CHART, Render, pod_templates

CI = CHART / "ci"
GIB = 2**30


def _cluster(r: Render):
    assert r.returncode == 0, r.stderr
    return r.one("RayJob")["spec"]["rayClusterSpec"]


def test_off_by_default_ray_keeps_its_own_defaults(render: Callable[..., Render]) -> None:
    r = render(CI / "default-values.yaml")
    spec = _cluster(r)
    for params in (spec["headGroupSpec"]["rayStartParams"], spec["workerGroupSpecs"][0]["rayStartParams"] or {}):
        assert "object-store-memory" not in params and "object-spilling-directory" not in params
    for _, pod in pod_templates(r.one("RayJob")):
        assert all(v["name"] != "ray-spill" for v in pod["spec"]["volumes"])


def test_the_store_size_and_a_bounded_spill_directory_reach_every_ray_pod(render: Callable[..., Render]) -> None:
    r = render(CI / "default-values.yaml", sets={
        "rayObjectStore.workerGib": 48, "rayObjectStore.headGib": 8, "rayObjectStore.spillSizeLimit": "200Gi",
        "training.streaming": True, "training.streaming_object_store_gib": 16})
    spec = _cluster(r)
    head, worker = spec["headGroupSpec"]["rayStartParams"], spec["workerGroupSpecs"][0]["rayStartParams"]
    assert head["object-store-memory"] == str(8 * GIB) and worker["object-store-memory"] == str(48 * GIB)
    assert head["object-spilling-directory"] == worker["object-spilling-directory"] == "/mnt/ray-spill"
    assert head["dashboard-port"]  # the chart's own parameters stay
    for role, pod in pod_templates(r.one("RayJob")):
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "ray-spill"]
        assert volume["emptyDir"] == {"sizeLimit": "200Gi"}, role
        (container,) = [c for c in pod["spec"]["containers"] if c["name"].startswith("ray-")]
        assert {"name": "ray-spill", "mountPath": "/mnt/ray-spill"} in container["volumeMounts"], role


def test_a_stream_budget_beyond_the_workers_store_is_refused_at_install(render: Callable[..., Render]) -> None:
    r = render(CI / "default-values.yaml", sets={"rayObjectStore.workerGib": 4, "training.streaming": True,
                                                 "training.streaming_object_store_gib": 6})
    assert r.returncode != 0
    assert "training.streaming_object_store_gib (6) is more than rayObjectStore.workerGib (4)" in r.stderr
    ok = render(CI / "default-values.yaml", sets={"rayObjectStore.workerGib": 4, "training.streaming": False,
                                                  "training.streaming_object_store_gib": 6})
    assert ok.returncode == 0, ok.stderr  # the file path does not stream: no budget to fit


def test_the_same_ray_start_parameters_by_hand_or_a_bad_value_are_refused(render: Callable[..., Render]) -> None:
    for group in ("head", "workers"):
        r = render(CI / "default-values.yaml", sets={f"{group}.rayStartParams.object-store-memory": "1000"})
        assert r.returncode != 0 and f"{group}.rayStartParams.object-store-memory: set rayObjectStore" in r.stderr
    for key, value in (("workerGib", -1), ("spillSizeLimit", "lots"), ("spillPath", "relative"), ("size", 1)):
        r = render(CI / "default-values.yaml", sets={f"rayObjectStore.{key}": value})
        assert r.returncode != 0 and "rayObjectStore" in r.stderr, (key, r.stderr)
