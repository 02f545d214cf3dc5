"""`doctor`: checks a deployment end to end and says how to fix each problem."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gemma3_ray.config import fits
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gcp import bucket_setup
from gemma3_ray.kube import cluster, kuberay_crd
from gemma3_ray.kueue import check as kueue_check
from gemma3_ray.release import doctor_gke, prereqs
from gemma3_ray.utils import names
from gemma3_ray.utils.checks import Check, Warn, guard
from gemma3_ray.utils.errors import ConfigError, UserError, call_google, unreachable

WI_ANNOTATION = "iam.gke.io/gcp-service-account"


@dataclass
class Kube:
    """The Kubernetes APIs doctor reads (any may be None when there is no cluster to talk to)."""

    core: Any = None
    api_ext: Any = None
    custom: Any = None  # CustomObjectsApi (Kueue's objects)
    context: str | None = None


def cluster_apis(clients: Clients) -> Kube:
    """What doctor reads of the cluster: the kube context in use and, when there is one, its APIs."""
    from gemma3_ray.config.kube_context import current_context

    kube = Kube(context=current_context(clients.kube.kubeconfig, clients.kube.context))
    if kube.context:
        kube.core, kube.api_ext, kube.custom = clients.kube.get_core(), clients.kube.get_api_ext(), clients.kube.get_custom()
    return kube


def check_auth(dep: Deployment, clients: Clients) -> Check:
    def run() -> Check:
        clients.credentials()
        who = dep.account or "application default credentials"
        return Check("gcloud auth", True, f"credentials found ({who})")

    return guard("gcloud auth", run)


def check_permissions(dep: Deployment, clients: Clients) -> Check:
    """The testIamPermissions preflight of `prereqs`: what the caller lacks on the project."""
    def run() -> Check:
        from gemma3_ray.gcp import iam_preflight

        pre = iam_preflight.check(clients, dep.project, prereqs.PERMISSIONS)
        return Check("permissions", not pre.missing, pre.line().removeprefix("permissions: "))

    return guard("permissions", run)


def check_context(dep: Deployment, kube: Kube) -> Check:
    if not kube.context:
        return Check("kube context", False, "no current kube context: run `gcloud container clusters get-credentials "
                     f"{dep.cluster or 'CLUSTER'} --location {dep.region} --project {dep.project}`")
    from gemma3_ray.config.kube_context import parse_gke_context

    gke = parse_gke_context(kube.context)
    if gke is None:
        return Check("kube context", False, f"{kube.context!r} is not a GKE context (gke_PROJECT_LOCATION_NAME): "
                     "switch with `kubectl config use-context` or pass --kube-context")
    if (gke.project, gke.name) != (dep.project, dep.cluster or gke.name):
        return Check("kube context", False, f"{kube.context} is cluster {gke.name} of {gke.project}, not "
                     f"{dep.cluster} of {dep.project}: switch context or pass --project/--cluster")
    return Check("kube context", True, f"cluster {gke.name} in {gke.location} ({gke.project})")


def check_crds(kube: Kube, values: dict[str, Any] | None = None) -> list[Check]:
    if kube.api_ext is None:
        return [Check("KubeRay CRDs", False, "no cluster connection")]
    out = []
    for name in (cluster.RAYCLUSTER_CRD, cluster.RAYJOB_CRD):
        obj = _guard_crd(kube, name)
        if isinstance(obj, Check):
            out.append(obj)
            continue
        if name == cluster.RAYJOB_CRD:
            try:
                report = kuberay_crd.rayjob_spec_fields(obj)
            except ValueError as exc:
                out.append(Check(name, False, f"{exc}: upgrade the KubeRay operator"))
                continue
            if report.missing_required:
                out.append(Check(name, False, f"too old, lacks {', '.join(report.missing_required)}: upgrade KubeRay"))
                continue
            known = [f.values_key for f in kuberay_crd.OPTIONAL_FIELDS if report.supports(f.path)]
            unknown = [f"{f.values_key} ({f.since}+)" for f in kuberay_crd.OPTIONAL_FIELDS if not report.supports(f.path)]
            detail = f"v1 served; values newer than KubeRay 1.4 it supports: {', '.join(known) or 'none'}"
            if unknown:
                detail += f"; not known, keep these values at their defaults: {', '.join(unknown)}"
            bad = kuberay_crd.refusals(report, values or {})
            if bad:
                out.append(Check(name, False, "; ".join(bad)))
            else:
                out.append(Check(name, True, detail))
        else:
            out.append(Check(name, True, "installed"))
    return out


def _guard_crd(kube: Kube, name: str) -> dict[str, Any] | Check:
    try:
        obj = cluster.crd(kube.api_ext, name)
    except UserError as exc:
        return Check(name, False, str(exc))
    if obj is None:
        return Check(name, False, "not installed: install the KubeRay operator (GKE: enable the Ray Operator add-on, "
                     "`gcloud container clusters update CLUSTER --update-addons=RayOperator=ENABLED`)")
    return obj


def check_hf_secret(dep: Deployment, kube: Kube) -> Check:
    name = "Hugging Face Secret"
    if kube.core is None:
        return Check(name, False, "no cluster connection")
    try:
        secret = cluster.read_secret(kube.core, dep.namespace, dep.hf_secret)
    except UserError as exc:
        return Check(name, False, str(exc))
    if secret is None:
        return Check(name, False, f"Secret {dep.namespace}/{dep.hf_secret} is missing: run `gemma3-ray prereqs --apply "
                     f"-n {dep.namespace} --hf-token-file -` (it asks for the token without echo)")
    if dep.hf_secret_key not in (secret.data or {}):
        return Check(name, False, f"Secret {dep.namespace}/{dep.hf_secret} has no key {dep.hf_secret_key!r}: "
                     "pass --hf-secret-key with the key it has, or recreate it")
    return Check(name, True, f"{dep.namespace}/{dep.hf_secret} has key {dep.hf_secret_key}")


def check_bucket(dep: Deployment, clients: Clients) -> Check:
    def run() -> Check:
        bucket = bucket_setup.read(dep, clients)  # raises RegionMismatch / BucketOwnedElsewhere with the fix
        if bucket is None:
            return Check("bucket", False, f"gs://{dep.bucket} does not exist: run `gemma3-ray prereqs --apply`")
        return Check("bucket", True, f"gs://{dep.bucket} in {bucket.location}, cluster in {dep.region}")

    return guard("bucket", run)


def check_bucket_grants(dep: Deployment, clients: Clients) -> Check:
    """The release's own grants on the bucket (its prefix; `prereqs` makes them)."""
    name = "bucket grants"

    def run() -> Check:
        from gemma3_ray.gcp import grants, iam_policy

        if bucket_setup.read(dep, clients) is None:
            return Check(name, False, f"gs://{dep.bucket} does not exist: run `gemma3-ray prereqs --apply`")
        access = iam_policy.bucket_policy(clients.get_storage().bucket(dep.bucket))
        policy = call_google("read the IAM policy of", f"gs://{dep.bucket}", access.read)
        wanted = grants.for_release(dep.bucket, dep.prefix, dep.namespace, dep.release, dep.gsa_member)
        missing = [g.role for g in wanted if not grants.has(policy, g)]
        if missing:
            return Check(name, False, f"{dep.gsa_email} lacks {', '.join(missing)} on gs://{dep.bucket}/{dep.prefix}/: "
                         f"run `gemma3-ray prereqs --apply -n {dep.namespace} --release {dep.release}`")
        return Check(name, True, f"{dep.gsa_email} may use gs://{dep.bucket}/{dep.prefix}/ only")

    return guard(name, run)


def check_workload_identity(dep: Deployment, clients: Clients, kube: Kube) -> list[Check]:
    out = []

    def binding() -> Check:
        from gemma3_ray.gcp import iam_policy

        if prereqs.Prereqs(dep, clients).read_gsa() is None:
            return Check("Workload Identity binding", False, f"{dep.gsa_email} does not exist: run `gemma3-ray "
                         f"prereqs --apply -n {dep.namespace} --release {dep.release}`")
        access = iam_policy.service_account_policy(clients.get_iam(), dep.gsa_resource)
        policy = call_google("read the IAM policy of", dep.gsa_email, access.read)
        if access.has(policy, prereqs.WORKLOAD_IDENTITY_ROLE, dep.wi_member):
            return Check("Workload Identity binding", True, f"{dep.wi_member} may act as {dep.gsa_email}")
        return Check("Workload Identity binding", False, f"{dep.wi_member} lacks {prereqs.WORKLOAD_IDENTITY_ROLE} on "
                     f"{dep.gsa_email}: run `gemma3-ray prereqs --apply -n {dep.namespace} --ksa {dep.ksa}`")

    out.append(guard("Workload Identity binding", binding))
    if kube.core is None:
        out.append(Check("KSA annotation", False, "no cluster connection"))
        return out
    from kubernetes.client.exceptions import ApiException

    try:
        ksa = kube.core.read_namespaced_service_account(dep.ksa, dep.namespace)
    except ApiException as exc:
        if exc.status == cluster.HTTP_NOT_FOUND:
            out.append(Check("KSA annotation", False, f"ServiceAccount {dep.namespace}/{dep.ksa} does not exist yet: the "
                             "chart creates it (`helm install ... -f values.yaml`)"))
            return out
        raise
    annotation = (ksa.metadata.annotations or {}).get(WI_ANNOTATION)
    if annotation == dep.gsa_email:
        out.append(Check("KSA annotation", True, f"{WI_ANNOTATION}={annotation}"))
    else:
        out.append(Check("KSA annotation", False, f"ServiceAccount {dep.namespace}/{dep.ksa} has {WI_ANNOTATION}="
                         f"{annotation or '(none)'}, expected {dep.gsa_email}: set serviceAccount.gcpServiceAccount "
                         "(`gemma3-ray values`) and upgrade the release"))
    return out


def check_fit(values: dict[str, Any] | None) -> list[Check]:
    """The release's model, recipe and micro-batch against the measured fit table (config/fits.toml): one failing
    check naming the fix when the values need more memory than was measured on their GPU."""
    if values is None:
        return []
    workers, training = values.get("workers") or {}, values.get("training") or {}
    accelerator = workers.get("accelerator") or "nvidia-b200"  # the chart's default
    if accelerator == "none":
        return []
    try:
        size = fits.size_of(training.get("model_id"))
    except ConfigError as exc:
        return [Warn("model fit", True, f"{exc} (doctor cannot check the fit)")]
    problem = fits.check_values(size, accelerator, training.get("recipe"), training.get("per_device_train_batch_size"))
    if problem:
        return [Check("model fit", False, problem)]
    cell = fits.table().cell(size, accelerator)
    detail = (f"Gemma 3 {size.upper()} on {accelerator}: within the fit table's {cell.recipe} x {cell.micro_batch}"
              if cell else f"no fit table class for {accelerator}")
    return [Check("model fit", True, detail) if cell else Warn("model fit", True, detail)]


def run_checks(dep: Deployment, clients: Clients, kube: Kube, values: dict[str, Any] | None = None) -> list[Check]:
    names.project_id(dep.project)
    groups: list[tuple[str, Callable[[], list[Check]]]] = [
        ("model fit", lambda: check_fit(values)),
        ("gcloud auth", lambda: [check_auth(dep, clients)]),
        ("permissions", lambda: [check_permissions(dep, clients)]),
        ("kube context", lambda: [check_context(dep, kube)]),
        ("GKE cluster", lambda: doctor_gke.checks(dep, clients, values)),
        ("KubeRay CRDs", lambda: check_crds(kube, values)),
        ("Hugging Face Secret", lambda: [check_hf_secret(dep, kube)]),
        ("bucket", lambda: [check_bucket(dep, clients)]),
        ("bucket grants", lambda: [check_bucket_grants(dep, clients)]),
        ("Workload Identity", lambda: check_workload_identity(dep, clients, kube)),
        ("Kueue", lambda: kueue_check.doctor_checks(dep.namespace, dep.release, kube.custom, kube.api_ext, values,
                                                             kube.core)),
    ]
    out: list[Check] = []
    for name, run in groups:
        try:
            out += run()
        except Exception as exc:  # a server that cannot be reached fails its checks, never the report
            net = unreachable(exc)
            if net is None:
                raise
            out.append(Check(name, False, str(net)))
    return out
