"""The GKE cluster the chart runs on, through the Container API: plan, create (or complete), delete.

The default is the tutorial's Autopilot cluster (``gcloud container clusters create-auto
--enable-ray-operator --enable-ray-cluster-logging --enable-ray-cluster-monitoring``): the Ray
operator add-on with Ray cluster logging and monitoring, and Workload Identity, in the region of the
deployment (the reservation's). ``standard=True`` makes a Standard cluster instead: a CPU pool for
the Ray head and a GPU node pool of the machine shape, with GKE's driver installation (LATEST) and,
given a reservation, affinity to that specific reservation in its zone.

``plan()`` makes only read calls. Create, update and delete are long-running operations: each is
polled until DONE, with its progress printed, and an error inside a finished operation is an error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import container_v1 as gke

from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gke import flex_start
from gemma3_ray.utils import names, poll
from gemma3_ray.utils.errors import ClusterError, InvalidName, MissingSetting, UserError, call_google
from gemma3_ray.utils.plan import Action, Plan

DEFAULT_CLUSTER = names.PRODUCT
SERVICE = "container.googleapis.com"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"  # GKE's key for a specific reservation
# The Standard cluster's CPU pool holds the Ray head: the chart's head asks 24 CPU / 64Gi.
DEFAULT_CPU_MACHINE_TYPE = "e2-standard-32"
# The scopes gcloud gives a node pool when --scopes is not passed (its "gke-default" alias); the Container
# API adds none of its own, and without devstorage.read_only the nodes cannot pull from Artifact Registry.
GKE_DEFAULT_SCOPES = tuple(f"https://www.googleapis.com/auth/{s}" for s in (
    "devstorage.read_only", "logging.write", "monitoring", "service.management.readonly", "servicecontrol",
    "trace.append"))
GPU_POOL = "gpu-pool"
MANAGEMENT = gke.NodeManagement(auto_repair=True, auto_upgrade=True)  # gcloud's defaults for a node pool
CPU_POOL = "cpu-pool"
RELEASE_CHANNEL = gke.ReleaseChannel.Channel.REGULAR  # create-auto's default channel
POLL_INTERVAL_S = 10.0
OPERATION_TIMEOUT_S = 3600.0

PERMISSIONS = {
    "create": ("container.clusters.get", "container.clusters.create", "container.clusters.update",
               "container.operations.get"),
    "delete": ("container.clusters.get", "container.clusters.delete", "container.operations.get"),
}
_SA_EMAIL = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}@[a-z0-9][a-z0-9.:-]*\.gserviceaccount\.com$")
_BUSY_STATES = {gke.Cluster.Status.PROVISIONING, gke.Cluster.Status.RECONCILING}
_BAD_STATES = {gke.Cluster.Status.ERROR, gke.Cluster.Status.STOPPING, gke.Cluster.Status.DEGRADED}


@dataclass(frozen=True)
class ClusterSpec:
    project: str
    region: str
    name: str
    standard: bool = False
    machine_type: str | None = None
    accelerator: str | None = None
    gpus_per_node: int = 0
    gpu_nodes: int = 1
    zone: str | None = None
    reservation: str | None = None
    cpu_machine_type: str = DEFAULT_CPU_MACHINE_TYPE
    node_service_account: str | None = None  # None: GKE's default (the Compute Engine default account)
    capacity: str = "none"  # the GPU pool: none | flex-start | queued (gke_flex_start)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def path(self) -> str:
        return f"{self.parent}/clusters/{self.name}"

    @property
    def workload_pool(self) -> str:
        return f"{self.project}.svc.id.goog"

    @property
    def kind(self) -> str:
        return "Standard" if self.standard else "Autopilot"

    def credentials_command(self) -> str:
        return f"gcloud container clusters get-credentials {self.name} --location {self.region} --project {self.project}"


def spec_from(dep: Deployment, *, standard: bool, cpu_machine_type: str = DEFAULT_CPU_MACHINE_TYPE,
              node_service_account: str | None = None, capacity: str = "none") -> ClusterSpec:
    """The cluster of a deployment; a Standard one needs the GPU machine shape and the zone of its pool."""
    name = dep.cluster or DEFAULT_CLUSTER
    shape = dep.shape
    if standard:
        if shape is None or not shape.machine_type:
            raise MissingSetting("A Standard cluster's GPU node pool needs a machine type: pass --machine-type "
                                 "(or --reservation with --zone, which reads it from the reservation).")
        if not dep.zone:
            raise MissingSetting("A Standard cluster's GPU node pool needs its zone (the reservation's, or where the "
                                 "GPUs are): pass --zone.")
        names.dns_label("machine type", cpu_machine_type, "--cpu-machine-type")
        flex_start.check(capacity, shape.accelerator, dep.reservation)
    elif capacity != "none":
        raise InvalidName(f"--capacity {capacity} shapes the GPU node pool of a Standard cluster: add --standard "
                          "(Autopilot makes flex-start nodes for pods that select cloud.google.com/gke-flex-start).")
    if node_service_account and not _SA_EMAIL.match(node_service_account):
        raise InvalidName("Invalid --node-service-account: it must be a service account's email "
                          "(NAME@PROJECT.iam.gserviceaccount.com); pass one, or leave it out for GKE's default.")
    return ClusterSpec(
        project=dep.project, region=dep.region, name=name, standard=standard,
        machine_type=shape.machine_type if shape else None, accelerator=shape.accelerator if shape else None,
        gpus_per_node=shape.gpus_per_node if shape else 0, gpu_nodes=dep.replicas, zone=dep.zone,
        reservation=dep.reservation, cpu_machine_type=cpu_machine_type, node_service_account=node_service_account,
        capacity=capacity,
    )


# -- what the cluster should look like -------------------------------------------------------------

def ray_operator_config() -> gke.RayOperatorConfig:
    return gke.RayOperatorConfig(
        enabled=True,
        ray_cluster_logging_config=gke.RayClusterLoggingConfig(enabled=True),
        ray_cluster_monitoring_config=gke.RayClusterMonitoringConfig(enabled=True),
    )


def gpu_node_pool(spec: ClusterSpec) -> gke.NodePool:
    accelerator = gke.AcceleratorConfig(
        accelerator_count=spec.gpus_per_node, accelerator_type=spec.accelerator,
        gpu_driver_installation_config=gke.GPUDriverInstallationConfig(
            gpu_driver_version=gke.GPUDriverInstallationConfig.GPUDriverVersion.LATEST),
    )
    config = gke.NodeConfig(
        machine_type=spec.machine_type, accelerators=[accelerator], service_account=spec.node_service_account or "",
        oauth_scopes=list(GKE_DEFAULT_SCOPES),
        workload_metadata_config=gke.WorkloadMetadataConfig(mode=gke.WorkloadMetadataConfig.Mode.GKE_METADATA),
    )
    if spec.reservation:
        config.reservation_affinity = gke.ReservationAffinity(
            consume_reservation_type=gke.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key=RESERVATION_KEY, values=[spec.reservation])
    pool = gke.NodePool(name=GPU_POOL, config=config, initial_node_count=spec.gpu_nodes, management=MANAGEMENT,
                        locations=[spec.zone] if spec.zone else [])
    return flex_start.shape(pool, spec.capacity, spec.gpu_nodes)


def desired_cluster(spec: ClusterSpec) -> gke.Cluster:
    cluster = gke.Cluster(
        name=spec.name,
        description=f"{names.PRODUCT}: Ray on GKE (created by `{names.PRODUCT} cluster create`)",
        addons_config=gke.AddonsConfig(ray_operator_config=ray_operator_config()),
        workload_identity_config=gke.WorkloadIdentityConfig(workload_pool=spec.workload_pool),
        release_channel=gke.ReleaseChannel(channel=RELEASE_CHANNEL),
        resource_labels={"managed-by": names.PRODUCT},
    )
    if not spec.standard:
        cluster.autopilot = gke.Autopilot(enabled=True)
        if spec.node_service_account:  # what `create-auto --service-account` sets
            cluster.autoscaling = gke.ClusterAutoscaling(autoprovisioning_node_pool_defaults=gke.AutoprovisioningNodePoolDefaults(
                service_account=spec.node_service_account))
        return cluster
    # Ray cluster monitoring scrapes with Google Cloud Managed Service for Prometheus (on in Autopilot).
    cluster.monitoring_config = gke.MonitoringConfig(managed_prometheus_config=gke.ManagedPrometheusConfig(enabled=True))
    # A regional cluster's pool gets initial_node_count nodes in each of its zones: pin both pools to the
    # GPU zone, so the head is one node next to the GPUs (not one per zone of the region).
    cpu_config = gke.NodeConfig(
        machine_type=spec.cpu_machine_type, service_account=spec.node_service_account or "",
        oauth_scopes=list(GKE_DEFAULT_SCOPES),
        workload_metadata_config=gke.WorkloadMetadataConfig(mode=gke.WorkloadMetadataConfig.Mode.GKE_METADATA))
    cpu = gke.NodePool(name=CPU_POOL, initial_node_count=1, locations=[spec.zone] if spec.zone else [],
                       config=cpu_config, management=MANAGEMENT)
    cluster.node_pools = [cpu, gpu_node_pool(spec)]
    return cluster


def describe(spec: ClusterSpec) -> str:
    text = (f"{spec.kind} cluster {spec.name} in {spec.region} (project {spec.project}): Ray operator add-on with "
            f"Ray cluster logging and monitoring, Workload Identity pool {spec.workload_pool}, "
            f"release channel {RELEASE_CHANNEL.name}, nodes as "
            f"{spec.node_service_account or 'the Compute Engine default service account'}")
    if spec.standard:
        text += f"; node pool {CPU_POOL} (1 × {spec.cpu_machine_type} in {spec.zone}, the Ray head); " + describe_gpu_pool(spec)
    elif spec.reservation:
        text += (f"; GPU nodes come on demand, from reservation {spec.reservation} once the values say so "
                 f"(`gemma3-ray values --reservation {spec.reservation}`)")
    return text


def describe_gpu_pool(spec: ClusterSpec) -> str:
    where = f"in {spec.zone}" + (f", on reservation {spec.reservation} (specific)" if spec.reservation else "")
    return (f"node pool {GPU_POOL} ({spec.gpu_nodes} × {spec.machine_type}, {spec.gpus_per_node} × {spec.accelerator}, "
            f"GKE-installed GPU driver LATEST, {where}{flex_start.describe(spec.capacity, spec.gpu_nodes)})")


def gaps(cluster: gke.Cluster, spec: ClusterSpec) -> list[str]:
    """What an existing cluster lacks of the spec (Ray add-on and its logging/monitoring, workload pool)."""
    ray = cluster.addons_config.ray_operator_config
    out = []
    if not ray.enabled:
        out.append("Ray operator add-on")
    if not ray.ray_cluster_logging_config.enabled:
        out.append("Ray cluster logging")
    if not ray.ray_cluster_monitoring_config.enabled:
        out.append("Ray cluster monitoring")
    if cluster.workload_identity_config.workload_pool != spec.workload_pool:
        out.append("Workload Identity")
    return out


# -- reads and long-running operations ---------------------------------------------------------------

def _busy(exc: Exception) -> UserError | None:
    """The Container API's 400 FAILED_PRECONDITION: another operation holds the cluster."""
    if isinstance(exc, gexc.FailedPrecondition):
        return ClusterError(f"Could not change the cluster: another operation is running on it ({exc.message}); "
                            "wait for it (`gemma3-ray cluster status`) and run this again.")
    return None


def _call(action: str, resource: str, fn: Callable[[], Any], **kw: Any) -> Any:
    return call_google(action, resource, fn, explain=_busy, **kw)


def get(container: Any, spec: ClusterSpec) -> gke.Cluster | None:
    try:
        return _call("read", spec.path, lambda: container.get_cluster(request={"name": spec.path}), not_found=True)
    except gexc.NotFound:
        return None


def wait(container: Any, spec: ClusterSpec, op: gke.Operation, what: str, out: Callable[[str], None]) -> gke.Operation:
    """Poll a Container API operation until DONE, printing each state change and a line every minute."""
    name = f"{spec.parent}/operations/{op.name}"

    def describe(o: gke.Operation) -> str:
        stage = next((s.name for s in o.progress.stages if s.status == gke.Operation.Status.RUNNING), "")
        return f"      {what}: {gke.Operation.Status(o.status).name}{f' ({stage})' if stage else ''}"

    op = poll.until(lambda: _call("follow operation", name, lambda: container.get_operation(request={"name": name})),
                    lambda o: o.status == gke.Operation.Status.DONE, first=op, interval=POLL_INTERVAL_S,
                    timeout=OPERATION_TIMEOUT_S, describe=describe, out=out, on_timeout=lambda _: ClusterError(
                        f"{what} is still running after {OPERATION_TIMEOUT_S:.0f} s (operation {op.name}); "
                        "nothing was rolled back: follow it with `gemma3-ray cluster status`."))
    if op.error.code or op.error.message:
        raise ClusterError(f"{what} failed: {op.error.message or op.status_message} (operation {op.name}); "
                           "see `gemma3-ray cluster status`.")
    return op


def wait_ready(container: Any, spec: ClusterSpec, out: Callable[[str], None]) -> gke.Cluster:
    """Poll the cluster until it is RUNNING (an operation someone else started), with progress."""

    def read() -> gke.Cluster:
        cluster = get(container, spec)
        if cluster is None:
            raise ClusterError(f"Cluster {spec.name} disappeared while waiting for it (deleted meanwhile?): run this again.")
        state = gke.Cluster.Status(cluster.status)
        if state in _BAD_STATES:
            raise ClusterError(f"Cluster {spec.name} is {state.name}: {cluster.status_message or 'see the console'}; "
                               "fix or delete it (`gemma3-ray cluster delete`).")
        return cluster

    return poll.until(read, lambda c: c.status == gke.Cluster.Status.RUNNING, interval=POLL_INTERVAL_S,
                      timeout=OPERATION_TIMEOUT_S, out=out, progress_every=float("inf"),
                      describe=lambda c: f"      cluster {spec.name}: {gke.Cluster.Status(c.status).name}",
                      on_timeout=lambda _: ClusterError(f"Cluster {spec.name} is still not RUNNING after "
                                                        f"{OPERATION_TIMEOUT_S:.0f} s: follow it with "
                                                        "`gemma3-ray cluster status`."))


# -- the plan ------------------------------------------------------------------------------------------

def plan_create(container: Any, spec: ClusterSpec, out: Callable[[str], None]) -> Plan:
    """Every change needed for the cluster to match the spec (read calls only)."""
    plan = Plan()
    cluster = get(container, spec)
    if cluster is None:
        plan.actions.append(Action(f"create {describe(spec)}", lambda: _create(container, spec, out)))
        return plan
    state = gke.Cluster.Status(cluster.status)
    if state in _BAD_STATES:
        raise ClusterError(f"Cluster {spec.name} is {state.name}{': ' + cluster.status_message if cluster.status_message else ''}; "
                           "fix or delete it (`gemma3-ray cluster delete`) before creating it again.")
    kind = "Autopilot" if cluster.autopilot.enabled else "Standard"
    plan.in_place.append(f"{kind} cluster {spec.name} in {cluster.location} ({state.name}, GKE {cluster.current_master_version})")
    if state in _BUSY_STATES:  # another run's (or an interrupted) operation: let it finish before changing anything
        plan.actions.append(Action(f"wait for the operation running on {spec.name} to finish ({state.name})",
                                   lambda: wait_ready(container, spec, out)))
    missing = gaps(cluster, spec)
    if not cluster.autopilot.enabled and "Ray cluster monitoring" in missing \
            and not cluster.monitoring_config.managed_prometheus_config.enabled:
        plan.actions.append(Action(f"enable Managed Service for Prometheus on {spec.name} (Ray cluster monitoring needs it)",
                                   lambda: _update(container, spec, out, "managed Prometheus", desired_monitoring_config=gke.MonitoringConfig(
                                       managed_prometheus_config=gke.ManagedPrometheusConfig(enabled=True)))))
    ray_gaps = [g for g in missing if g.startswith("Ray")]
    if ray_gaps:
        plan.actions.append(Action(f"enable on {spec.name}: {', '.join(ray_gaps)}", lambda: _update(
            container, spec, out, "Ray operator add-on",
            desired_addons_config=gke.AddonsConfig(ray_operator_config=ray_operator_config()))))
    else:
        plan.in_place.append("Ray operator add-on with Ray cluster logging and monitoring")
    if "Workload Identity" in missing:
        plan.actions.append(Action(f"enable Workload Identity on {spec.name} (pool {spec.workload_pool})", lambda: _update(
            container, spec, out, "Workload Identity",
            desired_workload_identity_config=gke.WorkloadIdentityConfig(workload_pool=spec.workload_pool))))
    else:
        plan.in_place.append(f"Workload Identity pool {spec.workload_pool}")
    if spec.standard:
        if cluster.autopilot.enabled:
            plan.in_place.append(f"{spec.name} is Autopilot: it makes GPU nodes itself, no node pool is added")
        elif any(p.name == GPU_POOL for p in cluster.node_pools):
            plan.in_place.append(f"node pool {GPU_POOL}")
        else:
            plan.actions.append(Action(f"add {describe_gpu_pool(spec)}", lambda: _add_pool(container, spec, out)))
    return plan


def _create(container: Any, spec: ClusterSpec, out: Callable[[str], None]) -> None:
    try:
        op = _call("create", spec.path, lambda: container.create_cluster(
            request={"parent": spec.parent, "cluster": desired_cluster(spec)}), expect=(gexc.AlreadyExists,))
    except gexc.AlreadyExists:
        out(f"      cluster {spec.name} was created meanwhile (another run); checking it instead")
        for action in plan_create(container, spec, out).actions:
            action.run()
        return
    wait(container, spec, op, f"create cluster {spec.name}", out)


def _update(container: Any, spec: ClusterSpec, out: Callable[[str], None], what: str, **desired: Any) -> None:
    update = gke.ClusterUpdate(**desired)
    op = _call("update", spec.path, lambda: container.update_cluster(request={"name": spec.path, "update": update}))
    wait(container, spec, op, f"update {spec.name}: {what}", out)


def _add_pool(container: Any, spec: ClusterSpec, out: Callable[[str], None]) -> None:
    try:
        op = _call("add a node pool to", spec.path, lambda: container.create_node_pool(
            request={"parent": spec.path, "node_pool": gpu_node_pool(spec)}), expect=(gexc.AlreadyExists,))
    except gexc.AlreadyExists:
        return  # a concurrent run added it
    wait(container, spec, op, f"create node pool {GPU_POOL}", out)


def wait_gone(container: Any, spec: ClusterSpec, out: Callable[[str], None]) -> None:
    """Poll a cluster someone else is deleting (STOPPING) until it is gone."""
    start = time.monotonic()
    poll.until(lambda: get(container, spec), lambda c: c is None, interval=POLL_INTERVAL_S, timeout=OPERATION_TIMEOUT_S,
               on_timeout=lambda _: ClusterError(f"Cluster {spec.name} is still being deleted after "
                                                 f"{OPERATION_TIMEOUT_S:.0f} s: follow it with `gemma3-ray cluster status`."))
    out(f"      cluster {spec.name}: gone [{time.monotonic() - start:.0f} s]")


def delete(container: Any, spec: ClusterSpec, out: Callable[[str], None]) -> None:
    try:
        op = _call("delete", spec.path, lambda: container.delete_cluster(request={"name": spec.path}), not_found=True)
    except gexc.NotFound:
        return  # deleted meanwhile
    wait(container, spec, op, f"delete cluster {spec.name}", out)


# -- status --------------------------------------------------------------------------------------------

def status_lines(cluster: gke.Cluster, spec: ClusterSpec) -> list[str]:
    ray = cluster.addons_config.ray_operator_config
    on = {True: "on", False: "OFF"}
    lines = [
        f"Cluster {spec.name} ({'Autopilot' if cluster.autopilot.enabled else 'Standard'}) in {cluster.location}: "
        f"{gke.Cluster.Status(cluster.status).name}, GKE {cluster.current_master_version}"
        + (f" ({cluster.status_message})" if cluster.status_message else ""),
        f"  Ray operator add-on: {on[ray.enabled]}; Ray cluster logging: {on[ray.ray_cluster_logging_config.enabled]}; "
        f"monitoring: {on[ray.ray_cluster_monitoring_config.enabled]}",
        f"  Workload Identity pool: {cluster.workload_identity_config.workload_pool or 'none (OFF)'}",
    ]
    for pool in cluster.node_pools:
        accel = ", ".join(
            f"{a.accelerator_count} × {a.accelerator_type} (driver "
            f"{gke.GPUDriverInstallationConfig.GPUDriverVersion(a.gpu_driver_installation_config.gpu_driver_version).name})"
            for a in pool.config.accelerators)
        res = pool.config.reservation_affinity
        lines.append(f"  node pool {pool.name}: {pool.initial_node_count} × {pool.config.machine_type or '?'}"
                     + (f", {accel}" if accel else "")
                     + (f", reservation {', '.join(res.values)}" if res.values else "")
                     + f", {gke.NodePool.Status(pool.status).name}")
    lines.append(f"  kube context: {spec.credentials_command()}")
    return lines
