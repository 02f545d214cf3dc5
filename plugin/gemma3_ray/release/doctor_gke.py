"""doctor's GKE and image checks: the cluster, its Ray add-on and workload pool, the GPU driver, the image.

doctor's GKE checks: the cluster exists, its Ray operator add-on and workload pool, and whether the
GPU driver its nodes get satisfies the pinned torch (a warning, with the fix)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.cloud import container_v1 as gke

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gke import cluster as gke_cluster
from gemma3_ray.gke import gpu_driver
from gemma3_ray.utils.checks import Check, Warn
from gemma3_ray.utils.errors import UserError, call_google

DriverVersion = gke.GPUDriverInstallationConfig.GPUDriverVersion
CHART_DRIVER_DEFAULT = "latest"  # the chart's workers.gpuDriverVersion default


def _driver_check(name: str, gke_version: str, accelerator: str, label: str,
                  fetch: Callable[[str], str] | None) -> Check:
    need = gpu_driver.requirement()
    if need is None:
        return Check(name, True, "no torch pin with a known CUDA build to check the driver against")
    label = label.upper()
    if label == "INSTALLATION_DISABLED":
        return Warn(name, True, f"GKE does not install the driver here (INSTALLATION_DISABLED): the one you install must "
                    f"be >= {need.min_driver} ({need.text()}); or recreate the pool with gpu-driver-version=latest")
    if label in {"", "GPU_DRIVER_VERSION_UNSPECIFIED"}:
        return Warn(name, True, f"the pool does not say which driver GKE installs (unset: DEFAULT on recent GKE versions, "
                    f"none on old ones); {need.text()}: recreate the pool with gpu-driver-version=latest")
    resolved = gpu_driver.resolve(gke_version, accelerator, label, fetch)
    if resolved.major is None:
        return Warn(name, True, f"could not tell which driver {label} gives ({resolved.how}); {need.text()}: check "
                        "`nvidia-smi` on a node, and prefer LATEST")
    if resolved.major >= need.min_driver:
        return Check(name, True, f"driver {resolved.version} ({resolved.how}) satisfies {need.text()}")
    fix = "use LATEST (workers.gpuDriverVersion: latest, or the pool's gpu-driver-version=latest)" if label != "LATEST" \
        else "upgrade the cluster to a GKE version whose LATEST driver is new enough"
    return Warn(name, True, f"driver {resolved.version} ({resolved.how}) is below what {need.text()}: {fix}")


def driver_checks(cluster: gke.Cluster, values: dict[str, Any] | None,
                  fetch: Callable[[str], str] | None = None) -> list[Check]:
    """One check per GPU node pool (Standard), or for the chart's workers (Autopilot)."""
    version = cluster.current_node_version or cluster.current_master_version
    if cluster.autopilot.enabled:
        workers = (values or {}).get("workers") or {}
        accelerator = workers.get("accelerator") or "nvidia-b200"  # the chart's default
        if accelerator == "none":
            return []
        # the chart's node selector cloud.google.com/gke-gpu-driver-version; omitted, Autopilot installs DEFAULT
        label = str(workers.get("gpuDriverVersion", CHART_DRIVER_DEFAULT) or "default")
        return [_driver_check(f"GPU driver ({accelerator}, Autopilot)", version, accelerator, label, fetch)]
    out = []
    for pool in cluster.node_pools:
        for accel in pool.config.accelerators:
            setting = DriverVersion(accel.gpu_driver_installation_config.gpu_driver_version).name
            out.append(_driver_check(f"GPU driver (node pool {pool.name})", pool.version or version,
                                     accel.accelerator_type, setting, fetch))
    return out


def checks(dep: Deployment, clients: Clients, values: dict[str, Any] | None = None,
           fetch: Callable[[str], str] | None = None) -> list[Check]:
    name = "GKE cluster"
    spec = gke_cluster.spec_from(dep, standard=False)
    if not dep.cluster:
        return [Check(name, False, "no cluster named (no GKE kube context, no --cluster): create one with "
                      "`gemma3-ray cluster create`, or pass --cluster")]
    try:
        cluster = gke_cluster.get(clients.get_container(), spec)
    except UserError as exc:
        return [Check(name, False, str(exc))]
    if cluster is None:
        return [Check(name, False, f"{spec.path} does not exist: run `gemma3-ray cluster create` (plan) and "
                      "`gemma3-ray cluster create --apply`")]
    state = gke.Cluster.Status(cluster.status).name
    out = [Check(name, cluster.status == gke.Cluster.Status.RUNNING,
                 f"{spec.name} in {cluster.location}: {state}, GKE {cluster.current_master_version}")]
    missing = [g for g in gke_cluster.gaps(cluster, spec) if g != "Workload Identity"]
    out.append(Check("Ray operator add-on", not missing,
                     "enabled, with Ray cluster logging and monitoring" if not missing else
                     f"{', '.join(missing)} off: run `gemma3-ray cluster create --apply --cluster {spec.name}` "
                     "(it only enables what is missing)"))
    pool = cluster.workload_identity_config.workload_pool
    out.append(Check("Workload pool", pool == spec.workload_pool, f"{pool}" if pool == spec.workload_pool else
                     f"{pool or 'none'} (want {spec.workload_pool}): Workload Identity is off, so the Ray pods cannot act "
                     f"as the Google service account; run `gemma3-ray cluster create --apply --cluster {spec.name}`"))
    out += driver_checks(cluster, values, fetch)
    return out + image_checks(dep, clients, values)


def image_checks(dep: Deployment, clients: Clients, values: dict[str, Any] | None) -> list[Check]:
    """The training image the values name, when it is this project's Artifact Registry repository: it exists,
    it is the build of the current sources, and the cluster's nodes may pull it."""
    from gemma3_ray.gcp import artifact_registry, image_build

    name = "training image"
    image = ((values or {}).get("workers") or {}).get("image") or {}
    reg = artifact_registry.registry_of(dep)
    repository, tag = str(image.get("repository") or ""), str(image.get("tag") or "")
    if not repository.startswith(reg.host + "/"):
        return []  # the runtime env, or an image elsewhere: nothing of ours to check
    try:
        state = image_build.image_state(clients, reg, tag)
        if state != "built":
            return [Check(name, False, f"{repository}:{tag} does not exist: run `gemma3-ray image build --apply`"
                          + (" after `gemma3-ray prereqs --apply --image`" if state == "no-repository" else ""))]
        out = [Check(name, True, f"{repository}:{tag} exists")]
        try:
            current = image_build.context().tag
        except UserError:
            current = tag  # no Dockerfile beside the plugin: nothing to compare
        if current != tag:
            out.append(Warn("training image sources", True, f"the values use {tag}, the Dockerfile and pins here "
                                f"build {current}: run `gemma3-ray image build --apply` and `gemma3-ray values --image`"))
        pullers, _ = artifact_registry.node_pull_identities(dep, clients)
        registry = clients.get_artifact_registry()
        policy = call_google("read the IAM policy of", reg.path,
                                         lambda: registry.get_iam_policy(request={"resource": reg.path}))
        readers = {m for b in policy.bindings if b.role == artifact_registry.READER for m in b.members}
        lacking = [sa for sa in pullers if f"serviceAccount:{sa}" not in readers]
        out.append(Check("image pull access", not lacking, f"{', '.join(pullers)} may read {reg.host}" if not lacking
                         else f"{', '.join(lacking)} cannot read {reg.host}: run `gemma3-ray prereqs --apply --image`"))
        return out
    except UserError as exc:
        return [Check(name, False, str(exc))]
