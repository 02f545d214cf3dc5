"""In-process fakes of the Container (GKE) API and Resource Manager's testIamPermissions, with the
real APIs' semantics where the plugin depends on them:

- long-running operations: create/update/delete return an ``Operation`` (short ``name``, PENDING);
  each ``get_operation`` (or ``get_cluster`` of its cluster: time passes while one polls) moves it on
  (PENDING -> RUNNING -> DONE, ``polls_per_state`` polls each);
  only when DONE does the change take effect, and a failed operation is DONE with ``error`` set (a
  ``google.rpc.Status``) while the cluster goes to ERROR;
- one operation at a time per cluster: a second mutation meanwhile is FAILED_PRECONDITION (400);
- ``ClusterUpdate`` takes exactly one ``desired_*`` field (INVALID_ARGUMENT otherwise);
- 409 ALREADY_EXISTS on create, 404 NOT_FOUND, 403 PERMISSION_DENIED naming the permission;
- Autopilot clusters get Workload Identity (``PROJECT.svc.id.goog``) whatever the request says and
  refuse ``node_pools``.
- a flex-start pool (``config.flex_start``) or a queued-provisioning one (``queued_provisioning``,
  which also needs flex-start here) is INVALID_ARGUMENT unless it is what GKE's guides require for
  them (dws-flex-start-training, provisioningrequest): no reservation (NO_RESERVATION), autoscaling
  on from zero nodes (initial_node_count 0, total_min_node_count 0) with location policy ANY, and
  auto-repair off.
Every call is recorded, so tests can assert that a dry run mutated nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import container_v1 as gke
from google.iam.v1 import iam_policy_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from tests.plugin.gcp_fakes import ALL, _denied
from tests.plugin.gcp_fakes import _req as _plain


def check_pool(pool: gke.NodePool) -> None:
    """The Container API's refusals of a flex-start / queued-provisioning node pool."""
    flex, queued = pool.config.flex_start, pool.queued_provisioning.enabled
    if not (flex or queued):
        return
    what = "queued provisioning" if queued else "flex-start"
    if queued and not flex:
        raise gexc.InvalidArgument(f"Node pool {pool.name}: queued provisioning needs flex-start (config.flex_start).")
    if pool.config.reservation_affinity.consume_reservation_type != gke.ReservationAffinity.Type.NO_RESERVATION:
        raise gexc.InvalidArgument(f"Node pool {pool.name}: {what} needs reservation affinity NO_RESERVATION.")
    a = pool.autoscaling
    if not a.enabled or a.total_min_node_count or a.min_node_count or pool.initial_node_count:
        raise gexc.InvalidArgument(f"Node pool {pool.name}: {what} needs autoscaling enabled from 0 nodes.")
    if a.location_policy != gke.NodePoolAutoscaling.LocationPolicy.ANY:
        raise gexc.InvalidArgument(f"Node pool {pool.name}: {what} needs autoscaling location policy ANY.")
    if pool.management.auto_repair:
        raise gexc.InvalidArgument(f"Node pool {pool.name}: {what} does not support node auto-repair.")


def _req(request: Any, kind: Any = None) -> dict[str, Any]:
    """The request as a dict, once the real request type accepted it (an unknown field is an error, as it is
    for the real client)."""
    data = _plain(request)
    if kind is not None:
        kind(data) if hasattr(kind, "pb") else kind(**data)  # proto-plus types, or raw protobuf ones
    return data


GKE_VERSION = "1.33.5-gke.1080000"


def _service_disabled(service: str, number: str) -> gexc.PermissionDenied:
    info = error_details_pb2.ErrorInfo(reason="SERVICE_DISABLED", domain="googleapis.com",
                                       metadata={"service": service, "consumer": f"projects/{number}"})
    return gexc.PermissionDenied(f"{service} has not been used in project {number} before or it is disabled.",
                                 details=[info], error_info=info)  # as from_grpc_error builds it
S = gke.Operation.Status


@dataclass
class _Op:
    op: gke.Operation
    cluster: str  # full cluster name
    effect: Any  # called when the operation finishes successfully
    error: tuple[int, str] | None = None
    polls: int = 0


@dataclass
class FakeContainer:
    """The subset of ``container_v1.ClusterManagerClient`` the plugin calls."""

    project: str
    allowed: set[str] | str = ALL
    polls_per_state: int = 1
    version: str = GKE_VERSION
    fail_next: tuple[int, str] | None = None  # (google.rpc code, message) for the next operation's outcome
    usage: Any = None  # a FakeServiceUsage: every call is SERVICE_DISABLED until container.googleapis.com is on
    clusters: dict[str, gke.Cluster] = field(default_factory=dict)
    operations: dict[str, _Op] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)

    MUTATING = ("create_cluster", "update_cluster", "create_node_pool", "delete_cluster")

    # -- helpers ---------------------------------------------------------------------------------
    def _check(self, permission: str, resource: str) -> None:
        if self.usage is not None and "container.googleapis.com" not in self.usage.enabled:
            raise _service_disabled("container.googleapis.com", self.usage.project_number)
        if self.allowed != ALL and permission not in self.allowed:
            raise _denied(permission, resource)

    def _cluster(self, name: str) -> gke.Cluster:
        try:
            return self.clusters[name]
        except KeyError:
            raise gexc.NotFound(f"Not found: {name}.") from None

    def _busy(self, name: str) -> None:
        for o in self.operations.values():
            if o.cluster == name and o.op.status != S.DONE:
                raise gexc.FailedPrecondition(
                    f"Cluster is running incompatible operation {o.op.name}. Please wait and try again.")

    def _start(self, cluster: str, kind: gke.Operation.Type, effect: Any) -> gke.Operation:
        parts = cluster.split("/")
        op_id = f"operation-{len(self.operations) + 1:04d}-fake"
        op = gke.Operation(name=op_id, operation_type=kind, status=S.PENDING, location=parts[3],
                           self_link=f"https://container.googleapis.com/v1/projects/{parts[1]}/locations/{parts[3]}/"
                                     f"operations/{op_id}",
                           target_link=f"https://container.googleapis.com/v1/{cluster}")
        self.operations[f"projects/{parts[1]}/locations/{parts[3]}/operations/{op_id}"] = _Op(
            op, cluster, effect, error=self.fail_next)
        self.fail_next = None
        return gke.Operation(op)

    # -- the API -----------------------------------------------------------------------------------
    def get_cluster(self, request: Any = None) -> gke.Cluster:
        name = _req(request, gke.GetClusterRequest)["name"]
        self.calls.append(("get_cluster", name))
        self._check("container.clusters.get", name)
        cluster = gke.Cluster(self._cluster(name))
        for o in list(self.operations.values()):  # a cluster read is a poll too: its operations move on
            if o.cluster == name:
                self._advance(o)
        return cluster

    def create_cluster(self, request: Any = None) -> gke.Operation:
        r = _req(request, gke.CreateClusterRequest)
        parent, cluster = r["parent"], gke.Cluster(r["cluster"])
        name = f"{parent}/clusters/{cluster.name}"
        self.calls.append(("create_cluster", name))
        self._check("container.clusters.create", parent)
        if not cluster.name:
            raise gexc.InvalidArgument("Cluster.name is required.")
        if cluster.autopilot.enabled and cluster.node_pools:
            raise gexc.InvalidArgument("Autopilot clusters do not support node pools in the create request.")
        if not cluster.autopilot.enabled and not cluster.node_pools and not cluster.initial_node_count:
            raise gexc.InvalidArgument("Cluster.initial_node_count must be greater than zero.")
        if name in self.clusters:
            raise gexc.AlreadyExists(f"Already exists: {name}.")
        if cluster.autopilot.enabled:
            cluster.workload_identity_config.workload_pool = f"{self.project}.svc.id.goog"
            cluster.monitoring_config.managed_prometheus_config.enabled = True
        cluster.location = parent.rsplit("/", 1)[-1]
        cluster.status = gke.Cluster.Status.PROVISIONING
        cluster.current_master_version = self.version
        cluster.current_node_version = self.version
        cluster.self_link = f"https://container.googleapis.com/v1/{name}"
        for pool in cluster.node_pools:
            check_pool(pool)
        for pool in cluster.node_pools:
            pool.status = gke.NodePool.Status.PROVISIONING
            pool.version = self.version
        self.clusters[name] = cluster

        def done() -> None:
            cluster.status = gke.Cluster.Status.RUNNING
            for pool in cluster.node_pools:
                pool.status = gke.NodePool.Status.RUNNING

        return self._start(name, gke.Operation.Type.CREATE_CLUSTER, done)

    def update_cluster(self, request: Any = None) -> gke.Operation:
        r = _req(request, gke.UpdateClusterRequest)
        name, update = r["name"], gke.ClusterUpdate(r["update"])
        self.calls.append(("update_cluster", name))
        self._check("container.clusters.update", name)
        cluster = self._cluster(name)
        given = [f.name for f, _ in gke.ClusterUpdate.pb(update).ListFields()]
        if len(given) != 1:
            raise gexc.InvalidArgument(f"Exactly one update can be applied to a cluster with each request; got {given}.")
        self._busy(name)
        cluster.status = gke.Cluster.Status.RECONCILING

        def done() -> None:
            if "desired_addons_config" in given:
                gke.AddonsConfig.pb(cluster.addons_config).MergeFrom(gke.AddonsConfig.pb(update.desired_addons_config))
            if "desired_workload_identity_config" in given:
                cluster.workload_identity_config = update.desired_workload_identity_config
            if "desired_monitoring_config" in given:
                cluster.monitoring_config = update.desired_monitoring_config
            cluster.status = gke.Cluster.Status.RUNNING

        return self._start(name, gke.Operation.Type.UPDATE_CLUSTER, done)

    def create_node_pool(self, request: Any = None) -> gke.Operation:
        r = _req(request, gke.CreateNodePoolRequest)
        parent, pool = r["parent"], gke.NodePool(r["node_pool"])
        self.calls.append(("create_node_pool", f"{parent}/nodePools/{pool.name}"))
        self._check("container.clusters.update", parent)
        cluster = self._cluster(parent)
        if cluster.autopilot.enabled:
            raise gexc.InvalidArgument("Autopilot clusters manage their own node pools.")
        if any(p.name == pool.name for p in cluster.node_pools):
            raise gexc.AlreadyExists(f"Already exists: {parent}/nodePools/{pool.name}.")
        check_pool(pool)
        self._busy(parent)
        pool.status = gke.NodePool.Status.PROVISIONING
        pool.version = self.version
        cluster.node_pools.append(pool)

        def done() -> None:
            for p in cluster.node_pools:
                p.status = gke.NodePool.Status.RUNNING

        return self._start(parent, gke.Operation.Type.CREATE_NODE_POOL, done)

    def delete_cluster(self, request: Any = None) -> gke.Operation:
        name = _req(request, gke.DeleteClusterRequest)["name"]
        self.calls.append(("delete_cluster", name))
        self._check("container.clusters.delete", name)
        cluster = self._cluster(name)
        self._busy(name)
        cluster.status = gke.Cluster.Status.STOPPING
        return self._start(name, gke.Operation.Type.DELETE_CLUSTER, lambda: self.clusters.pop(name, None))

    def get_operation(self, request: Any = None) -> gke.Operation:
        name = _req(request, gke.GetOperationRequest)["name"]
        self.calls.append(("get_operation", name))
        self._check("container.operations.get", name)
        try:
            o = self.operations[name]
        except KeyError:
            raise gexc.NotFound(f"Not found: {name}.") from None
        self._advance(o)
        return gke.Operation(o.op)

    def _advance(self, o: _Op) -> None:
        """Time passes while someone polls: the operation moves one poll towards DONE."""
        if o.op.status != S.DONE:
            o.polls += 1
            if o.polls >= self.polls_per_state:
                o.polls = 0
                o.op.status = S.RUNNING if o.op.status == S.PENDING else S.DONE
                if o.op.status == S.DONE:
                    self._finish(o)

    def _finish(self, o: _Op) -> None:
        if o.error is None:
            o.effect()
            return
        code, message = o.error
        o.op.error = status_pb2.Status(code=code, message=message)
        o.op.status_message = message
        if o.cluster in self.clusters:
            self.clusters[o.cluster].status = gke.Cluster.Status.ERROR
            self.clusters[o.cluster].status_message = message

    def mutations(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in self.MUTATING]

    def ready(self, location: str, cluster: gke.Cluster) -> gke.Cluster:
        """Create ``cluster`` (as someone else would have) and let its operation finish."""
        op = self.create_cluster(request={"parent": f"projects/{self.project}/locations/{location}", "cluster": cluster})
        name = f"projects/{self.project}/locations/{location}/operations/{op.name}"
        while self.get_operation(request={"name": name}).status != S.DONE:
            pass
        return self.clusters[f"projects/{self.project}/locations/{location}/clusters/{cluster.name}"]


RESOURCE_EXHAUSTED = code_pb2.RESOURCE_EXHAUSTED


@dataclass
class FakeResourceManager:
    """``resourcemanager_v3.ProjectsClient.test_iam_permissions``: answers the subset of the asked
    permissions the caller holds on the project; 403 for a project the caller cannot see; 400 for a
    malformed permission name (the real API checks each is ``service.resource.verb``)."""

    project: str
    granted: set[str] | str = ALL
    number: str = "123456789012"
    api_disabled: bool = False  # cloudresourcemanager.googleapis.com off in the project
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def get_project(self, request: Any = None) -> Any:
        from google.cloud import resourcemanager_v3

        name = _req(request, resourcemanager_v3.GetProjectRequest)["name"]
        self.calls.append(("get_project", name))
        if name not in (f"projects/{self.project}", f"projects/{self.number}"):
            raise gexc.PermissionDenied(f"The caller does not have permission on {name}.")
        return resourcemanager_v3.Project(name=f"projects/{self.number}", project_id=self.project)

    def test_iam_permissions(self, request: Any = None) -> iam_policy_pb2.TestIamPermissionsResponse:
        r = _req(request, iam_policy_pb2.TestIamPermissionsRequest)
        resource, permissions = r["resource"], list(r["permissions"])
        self.calls.append(("test_iam_permissions", resource, *permissions))
        if self.api_disabled:
            raise _service_disabled("cloudresourcemanager.googleapis.com", self.number)
        if resource != f"projects/{self.project}":
            raise gexc.PermissionDenied(f"The caller does not have permission on {resource}.")
        bad = [p for p in permissions if p.count(".") != 2]  # noqa: PLR2004
        if bad:
            raise gexc.InvalidArgument(f"Permission {bad[0]} is not valid.")
        held = permissions if self.granted == ALL else [p for p in permissions if p in self.granted]
        return iam_policy_pb2.TestIamPermissionsResponse(permissions=held)
