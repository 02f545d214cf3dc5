"""A Standard cluster's GPU node pool as flex-start VMs or with queued provisioning.

A Standard cluster's GPU node pool as flex-start VMs or flex-start with queued provisioning
(Dynamic Workload Scheduler), with the Container API fields GKE's guides set:

- flex-start (https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training):
  ``gcloud container node-pools create --flex-start --num-nodes 0 --enable-autoscaling
  --total-min-nodes 0 --total-max-nodes N --location-policy ANY --reservation-affinity none
  --no-enable-autorepair``: NodeConfig.flex_start, no reservation, autoscaling from zero (GKE makes a
  node when a pod asks for it), location policy ANY, auto-repair off.
- queued (https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest): the same and
  ``--enable-queued-provisioning`` (NodePool.queued_provisioning.enabled): nodes come only through a
  ProvisioningRequest (Kueue's admission check), all at once.

A flex-start VM runs at most 7 days (NodeConfig.max_run_duration's default and limit).
"""

from __future__ import annotations

from google.cloud import container_v1 as gke

from gemma3_ray.config import machine_shapes
from gemma3_ray.utils.errors import InvalidName

CAPACITIES = ("none", "flex-start", "queued")


def check(capacity: str, accelerator: str | None, reservation: str | None) -> None:
    """Refuse, before any call, what GKE refuses for a flex-start pool."""
    if capacity == "none":
        return
    if reservation:
        raise InvalidName(f"--capacity {capacity} takes no --reservation: flex-start VMs never consume a reservation; "
                          "leave out one of them.")
    machine_shapes.check_flex_start(accelerator or "", "--capacity flex-start/queued: the GPU")


def shape(pool: gke.NodePool, capacity: str, max_nodes: int) -> gke.NodePool:
    """The GPU pool with the fields of ``capacity`` (unchanged for "none")."""
    if capacity == "none":
        return pool
    pool.config.flex_start = True
    pool.config.reservation_affinity = gke.ReservationAffinity(
        consume_reservation_type=gke.ReservationAffinity.Type.NO_RESERVATION)
    pool.initial_node_count = 0
    pool.autoscaling = gke.NodePoolAutoscaling(
        enabled=True, total_min_node_count=0, total_max_node_count=max_nodes,
        location_policy=gke.NodePoolAutoscaling.LocationPolicy.ANY)
    pool.management = gke.NodeManagement(auto_repair=False, auto_upgrade=True)
    if capacity == "queued":
        pool.queued_provisioning = gke.NodePool.QueuedProvisioning(enabled=True)
    return pool


def describe(capacity: str, max_nodes: int) -> str:
    if capacity == "none":
        return ""
    what = "flex-start with queued provisioning (nodes only through Kueue's ProvisioningRequest)" \
        if capacity == "queued" else "flex-start VMs"
    return f", {what}, autoscaled 0..{max_nodes} nodes, at most 7 days per VM, no reservation, auto-repair off"
