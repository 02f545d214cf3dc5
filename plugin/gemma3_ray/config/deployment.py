"""Everything a deployment is named by, resolved once: flags > kube context > gcloud configuration.

The project, region and cluster come from the first source that has them: a flag, the GKE kube
context (``gke_PROJECT_LOCATION_NAME``: the cluster's own project and location win over gcloud's,
because the bucket and the Workload Identity pool must be the cluster's), then the active gcloud
configuration. All names are validated here, before any API call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from gemma3_ray.config import kube_context as kube
from gemma3_ray.config import machine_shapes
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.gcloud_state import GcloudState, read_gcloud_state
from gemma3_ray.config.kube_context import GkeCluster
from gemma3_ray.config.machine_shapes import Shape
from gemma3_ray.utils import names
from gemma3_ray.utils.errors import MissingSetting

DEFAULT_NAMESPACE = "default"
DEFAULT_RELEASE = names.PRODUCT
# The release's folder in the bucket defaults to gemma3-ray/NAMESPACE/RELEASE: releases of the same
# name in two namespaces never share a folder (the chart alone, without a namespace, uses
# gemma3-ray/RELEASE). Identities are per release by default: the Kubernetes service account is the
# chart's default (the release's full name), the Google service account names.release_gsa_id().
# The tutorial's Secret (kubectl create secret generic hf-secret --from-literal=hf_api_token=...).
DEFAULT_HF_SECRET = "hf-secret"
DEFAULT_HF_SECRET_KEY = "hf_api_token"
DEFAULT_REPLICAS = 1


@dataclass(frozen=True)
class Sources:
    """Where the resolved settings came from (written as a comment into the values file)."""

    gcloud_configuration: str | None = None
    kube_context: str | None = None
    flags: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Deployment:
    project: str
    region: str
    zone: str | None
    cluster: str | None
    namespace: str
    release: str
    bucket: str
    prefix: str
    gsa_id: str
    ksa: str
    hf_secret: str
    hf_secret_key: str
    replicas: int
    shape: Shape | None
    reservation: str | None
    account: str | None
    sources: Sources

    @property
    def gsa_email(self) -> str:
        return names.gsa_email(self.gsa_id, self.project)

    @property
    def gsa_resource(self) -> str:
        return f"projects/{self.project}/serviceAccounts/{self.gsa_email}"

    @property
    def wi_member(self) -> str:
        return names.workload_identity_member(self.project, self.namespace, self.ksa)

    @property
    def gsa_member(self) -> str:
        return f"serviceAccount:{self.gsa_email}"

    @property
    def owner(self) -> str:
        """The release, as named in what `prereqs` creates for it."""
        return f"{self.namespace}/{self.release}"


@dataclass
class Overrides:
    """Values given on the command line (None = not given)."""

    project: str | None = None
    region: str | None = None
    zone: str | None = None
    cluster: str | None = None
    namespace: str | None = None
    release: str | None = None
    bucket: str | None = None
    prefix: str | None = None
    gsa_name: str | None = None
    ksa: str | None = None
    hf_secret: str | None = None
    hf_secret_key: str | None = None
    replicas: int | None = None
    reservation: str | None = None
    machine_type: str | None = None
    accelerator: str | None = None
    gpus_per_node: int | None = None

    def given(self) -> tuple[str, ...]:
        return tuple(k for k, v in vars(self).items() if v is not None)


def resolve(
    flags: Overrides,
    gcloud: GcloudState | None,
    gke: GkeCluster | None,
    shape: Shape | None = None,
    kube_context: str | None = None,
    given: tuple[str, ...] | None = None,
) -> Deployment:
    project = flags.project or (gke.project if gke else None) or (gcloud.project if gcloud else None)
    if not project:
        raise MissingSetting("No Google Cloud project: pass --project (`make prereqs ARGS=\"--project P --region R\"`) "
                             "or run `gcloud config set project PROJECT_ID`.")
    names.project_id(project)

    zone = flags.zone
    if zone is None and gke and gke.location != gke.region:
        zone = gke.location
    if zone is None and gcloud:
        zone = gcloud.zone
    if zone is not None:
        names.zone(zone)

    region = flags.region or (gke.region if gke else None) or (gcloud.region if gcloud else None)
    if not region and zone:
        region = names.region_of_location(zone)
    if not region:
        raise MissingSetting("No region: pass --region (`make prereqs ARGS=\"--region us-central1\"`) or run "
                             "`gcloud config set compute/region REGION`.")
    names.region(region)
    if zone and names.region_of_location(zone) != region:
        raise names.InvalidName(f"Zone {zone} is not in region {region}: pass a --zone inside {region}.")

    cluster = flags.cluster or (gke.name if gke else None) or (gcloud.cluster if gcloud else None)
    if cluster:
        names.cluster(cluster)

    release = names.release(flags.release or DEFAULT_RELEASE)
    replicas = DEFAULT_REPLICAS if flags.replicas is None else flags.replicas
    if replicas < 1:
        raise names.InvalidName(f"Invalid --replicas {replicas}: a training run needs at least one worker node.")
    if flags.reservation:
        names.reservation(flags.reservation)
    namespace = names.namespace(flags.namespace or DEFAULT_NAMESPACE)
    return Deployment(
        project=project,
        region=region,
        zone=zone,
        cluster=cluster,
        namespace=namespace,
        release=release,
        bucket=names.bucket(flags.bucket) if flags.bucket else names.default_bucket(project),
        prefix=names.prefix(flags.prefix if flags.prefix is not None else f"{names.PRODUCT}/{namespace}/{release}"),
        gsa_id=names.gsa_account_id(flags.gsa_name) if flags.gsa_name else names.release_gsa_id(namespace, release),
        ksa=names.ksa(flags.ksa or names.chart_fullname(release)),
        hf_secret=names.secret_name(flags.hf_secret or DEFAULT_HF_SECRET),
        hf_secret_key=names.secret_key(flags.hf_secret_key or DEFAULT_HF_SECRET_KEY),
        replicas=replicas,
        shape=shape,
        reservation=flags.reservation,
        account=gcloud.account if gcloud else None,
        sources=Sources(
            gcloud_configuration=gcloud.configuration if gcloud else None,
            kube_context=kube_context if gke else None,
            flags=flags.given() if given is None else given,
        ),
    )


# -- from what the command was given ------------------------------------------------------------------

def _check_shape(flags: Overrides) -> None:
    """The machine-shape flags, validated before anything else."""
    if flags.accelerator or flags.gpus_per_node is not None:
        if not (flags.accelerator and flags.gpus_per_node is not None):
            raise names.InvalidName("--accelerator and --gpus-per-node go together: pass both.")
        if flags.machine_type:
            names.machine_type(flags.machine_type)
        machine_shapes.custom_shape(flags.machine_type, flags.accelerator, flags.gpus_per_node)
    elif flags.machine_type:
        machine_shapes.shape_for_machine_type(flags.machine_type)


def _shape(flags: Overrides, dep: Deployment, clients: Clients) -> Shape | None:
    if flags.accelerator:
        return machine_shapes.custom_shape(flags.machine_type, flags.accelerator, flags.gpus_per_node)
    if flags.machine_type:
        return machine_shapes.shape_for_machine_type(flags.machine_type)
    if flags.reservation:
        machine_shapes.check_reservation_lookup(dep.zone, flags.reservation)  # before credentials are looked for
        return machine_shapes.shape_for_reservation(clients.get_reservations(), dep.project, dep.zone, flags.reservation)
    return None


def load(flags: Overrides, clients: Clients | None = None, *, configuration: str | None = None,
         kubeconfig: str | None = None, kube_context: str | None = None,
         use_kube_context: bool = True) -> tuple[Deployment, Clients]:
    """Resolve every setting (names validated first), then the machine shape (may call the Compute API); the
    clients (``clients``, else new ones) are pointed at ``kubeconfig``/``kube_context`` for the cluster."""
    gcloud = read_gcloud_state(configuration=configuration)
    context = kube.current_context(kubeconfig, kube_context) if use_kube_context else None
    gke = kube.parse_gke_context(context) if context else None
    _check_shape(flags)
    given = flags.given()
    if flags.namespace is None and os.environ.get("HELM_NAMESPACE"):  # `helm -n NS gemma3-ray ...`
        flags = replace(flags, namespace=os.environ["HELM_NAMESPACE"])
    dep = resolve(flags, gcloud, gke, kube_context=context, given=given)
    if clients is None:
        clients = Clients(project=dep.project)
    clients.kube.point_at(kubeconfig, kube_context)
    shape = _shape(flags, dep, clients)
    if shape is not None:
        dep = replace(dep, shape=shape)
    return dep, clients
