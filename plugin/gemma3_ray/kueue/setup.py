"""`kueue setup`: plan (default) or apply (--apply) the Kueue objects an admin makes for a namespace.

`kueue setup`: plan (default) or apply (--apply) the Kueue objects a platform admin makes for this
chart's releases in a namespace: ResourceFlavors of the GPU pool (and the CPU nodes of the head), a
ClusterQueue with quota for the rendered job, the namespace's LocalQueue and, for queued
provisioning, the ProvisioningRequestConfig and AdmissionCheck.

Idempotent: an object already as wanted is left alone. Objects carry the ownership label
``app.kubernetes.io/managed-by=gemma3-ray-kueue-setup``; a same-named object without it is never
changed (the plan refuses before anything is applied).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemma3_ray.config.clients import Kube
from gemma3_ray.kueue import objects as ko
from gemma3_ray.utils import names
from gemma3_ray.utils import plan as plans
from gemma3_ray.utils.errors import EXIT_USAGE, ClusterError, UserError
from gemma3_ray.utils.plan import Action, Plan

Out = Callable[[str], None]
HTTP_NOT_FOUND = 404
DEFAULT_QUEUE = names.PRODUCT


@dataclass(frozen=True)
class Flags:
    """What `kueue setup` is asked (its flags, parsed; None: not given)."""

    namespace: str | None = None
    values: tuple[str, ...] = ()  # the releases' values files
    queue: str | None = None
    cluster_queue: str | None = None
    jobs: int = 1
    priority_value: int = ko.DEFAULT_PRIORITY_VALUE
    queued: bool = False
    release: str | None = None
    chart: str | None = None
    apply: bool = False


class ForeignObject(UserError):
    """A same-named Kueue object exists that `kueue setup` did not create."""

    exit_code = EXIT_USAGE


def _where(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']} {meta['namespace'] + '/' if meta.get('namespace') else ''}{meta['name']}"


class Api:
    """Kueue objects through ``kubernetes.client.CustomObjectsApi``."""

    def __init__(self, custom: Any) -> None:
        self.custom = custom

    def _args(self, obj: dict[str, Any]) -> tuple[Any, ...]:
        return ko.GROUP, ko.VERSION, ko.PLURALS[obj["kind"]]

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        meta = obj["metadata"]
        try:
            if meta.get("namespace"):
                return self.custom.get_namespaced_custom_object(ko.GROUP, ko.VERSION, meta["namespace"],
                                                                ko.PLURALS[obj["kind"]], meta["name"])
            return self.custom.get_cluster_custom_object(*self._args(obj), meta["name"])
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                if "page not found" in str(exc.body or "").lower() or "404 page" in str(exc.body or ""):
                    raise ClusterError(f"Kueue's CRDs are not installed ({obj['kind']}): install Kueue first "
                                       "(https://kueue.sigs.k8s.io/docs/installation/).") from None
                return None
            raise _error(exc, f"read {_where(obj)}") from None

    def create(self, obj: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = obj["metadata"]
        try:
            if meta.get("namespace"):
                self.custom.create_namespaced_custom_object(ko.GROUP, ko.VERSION, meta["namespace"],
                                                            ko.PLURALS[obj["kind"]], obj)
            else:
                self.custom.create_cluster_custom_object(*self._args(obj), obj)
        except ApiException as exc:
            raise _error(exc, f"create {_where(obj)}") from None

    def patch(self, obj: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = obj["metadata"]
        body = {"metadata": {"labels": meta["labels"]}, "spec": obj["spec"]}
        try:
            if meta.get("namespace"):
                self.custom.patch_namespaced_custom_object(ko.GROUP, ko.VERSION, meta["namespace"],
                                                           ko.PLURALS[obj["kind"]], meta["name"], body)
            else:
                self.custom.patch_cluster_custom_object(*self._args(obj), meta["name"], body)
        except ApiException as exc:
            raise _error(exc, f"update {_where(obj)}") from None


def _error(exc: Any, what: str) -> UserError:
    from gemma3_ray.kube.cluster import api_error

    reason = ""
    try:
        import json

        reason = json.loads(exc.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        pass
    if reason and getattr(exc, "status", None) not in (401, 403):
        return ClusterError(f"Could not {what}: {reason}.")
    return api_error(exc, what)


def owned(live: dict[str, Any]) -> bool:
    return ((live.get("metadata") or {}).get("labels") or {}).get(ko.OWNER_LABEL) == ko.OWNER


class TakenByAnotherNamespace(UserError):
    """The ClusterQueue named is one `kueue setup` made for another namespace (another team's queue and quota)."""

    exit_code = EXIT_USAGE


def plan(api: Api | None, wanted: list[dict[str, Any]], namespace: str = "") -> Plan:
    """What to create or update; refuses (ForeignObject) a same-named object it did not create and
    (TakenByAnotherNamespace) a ClusterQueue it made for another namespace. A WorkloadPriorityClass that
    exists is left as it is, whoever made it: every queue whose jobs name it shares it."""
    p = Plan()
    for obj in wanted:
        text = _where(obj)
        if api is None:
            p.actions.append(Action(f"create {text}  [not checked]", lambda: None))
            continue
        live = api.get(obj)
        if live is None:
            p.actions.append(Action(f"create {text}", lambda o=obj: api.create(o)))
        elif obj["kind"] == "WorkloadPriorityClass":
            p.in_place.append(f"{text} (exists, value {live.get('value')}; shared by the jobs that name it, not changed)")
        elif not owned(live):
            raise ForeignObject(f"{text} exists and was not created by `{names.PRODUCT} kueue setup` (no label "
                                f"{ko.OWNER_LABEL}={ko.OWNER}): nothing was changed; pick other names (--queue, "
                                "--cluster-queue) or let its owner change it.")
        elif obj["kind"] == "ClusterQueue" and (live.get("spec") or {}).get("namespaceSelector") != \
                obj["spec"]["namespaceSelector"]:
            raise _taken(text, live, namespace)
        elif ko.contains(live.get("spec") or {}, obj["spec"]):
            p.in_place.append(f"{text} (as wanted)")
        else:
            p.actions.append(Action(f"update {text}", lambda o=obj: api.patch(o)))
    return p


def _taken(text: str, live: dict[str, Any], namespace: str) -> TakenByAnotherNamespace:
    selector = (live.get("spec") or {}).get("namespaceSelector")
    other = ((selector or {}).get("matchLabels") or {}).get(ko.NAMESPACE_NAME_LABEL)
    whose = f"namespace {other}'s" if other else f"another namespace's (its namespaceSelector is {selector})"
    return TakenByAnotherNamespace(
        f"{text} is {whose} queue, made by `{names.PRODUCT} kueue setup`, and setting it up for namespace "
        f"{namespace} would take that team's queue and quota, so nothing was changed: leave out --cluster-queue "
        f"(each namespace gets its own ClusterQueue) or pass another one than {live['metadata']['name']}.")


def setup_from(flags: Flags, rayjob: dict[str, Any], capacity: str,
               values: list[dict[str, Any]] | None = None) -> ko.Setup:
    namespace = flags.namespace or "default"
    names.dns_label("namespace", namespace, "--namespace")
    labels = rayjob["metadata"]["labels"]
    queue = labels[ko.QUEUE_LABEL]
    cluster_queue = flags.cluster_queue or names.cluster_queue(namespace, queue)
    for flag, value in (("--queue", queue), ("--cluster-queue", cluster_queue)):
        names.dns_label("queue", value, flag)
    if flags.jobs < 1:
        raise UserError("--jobs must be at least 1 (how many such jobs the queue admits at once).")
    fallback: tuple[str, ...] = ()
    reservation = _last(values or [], "capacity", "reservation") or ""
    if capacity == "fallback":
        # What the chart accepted for these values (its schema: each kind once, of FALLBACK_KINDS).
        listed = next((v["capacity"]["fallback"] for v in reversed(values or [])
                       if isinstance(v.get("capacity"), dict) and "fallback" in v["capacity"]), None)
        fallback = tuple(listed) if listed else ko.FALLBACK_KINDS
    return ko.Setup(namespace=namespace, queue=queue, cluster_queue=cluster_queue,
                    sets=tuple(ko.pod_sets(rayjob)), capacity=capacity, jobs=flags.jobs,
                    priority=labels.get(ko.PRIORITY_LABEL, ""),
                    priority_value=flags.priority_value,
                    fallback=fallback, reservation=reservation)


def _last(values: list[dict[str, Any]], section: str, key: str) -> Any:
    return next((v[section][key] for v in reversed(values) if isinstance(v.get(section), dict) and v[section].get(key)), None)


def rendered_job(flags: Flags) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """The RayJob the chart renders from these values (with this queue), its capacity.type and the values."""
    from gemma3_ray.config import render
    from gemma3_ray.kube import helm_release

    values = [render.load_plain(Path(f)) for f in flags.values or []]
    capacity = "queued" if flags.queued else (_last(values, "capacity", "type") or "none")
    queue = flags.queue or _last(values, "kueue", "queueName") or DEFAULT_QUEUE
    values.append({"kueue": {"queueName": queue}, "capacity": {"type": capacity}})
    helm = helm_release.client(None, None)
    docs = helm_release.template(helm, flags.release or names.PRODUCT, helm_release.chart_path(flags.chart), values,
                            flags.namespace or "default")
    jobs = [d for d in docs if d.get("kind") == "RayJob"]
    if len(jobs) != 1:
        raise UserError(f"The chart rendered {len(jobs)} RayJobs from these values, expected one.")
    return jobs[0], capacity, values


def run(flags: Flags, kube: Kube, out: Out) -> int:
    rayjob, capacity, values = rendered_job(flags)
    setup = setup_from(flags, rayjob, capacity, values)
    wanted = ko.objects(setup)
    out(f"Kueue objects for queue {setup.namespace}/{setup.queue} (ClusterQueue {setup.cluster_queue}), for "
        f"{setup.jobs} job(s) at once; one job asks for:")
    for s in setup.sets:
        out(f"    pod set {s.name}: {s.count} x ({ko.describe(s.requests)})")
    if setup.fallback:
        out(f"  capacity that falls back: Kueue tries {', '.join(setup.fallback_flavor(k) for k in setup.fallback)} in "
            "that order and admits the job on the first with quota left, putting that flavor's node labels on "
            f"{'the GPU pods' if setup.gpu_sets else 'its pods'}.")
    if setup.queued:
        r = ko.RETRY_STRATEGY
        out(f"  queued provisioning: the ProvisioningRequestConfig merges pod sets with the same scheduling "
            f"requirements (podSetMergePolicy {ko.POD_SET_MERGE_POLICY}: GKE's ProvisioningRequest takes one pod "
            f"set) and retries a request GKE cannot fill {r['backoffLimitCount']} times, "
            f"{r['backoffBaseSeconds']} s apart and doubling, at most {r['backoffMaxSeconds']} s (retryStrategy).")
    api, reason = _api(kube, flags.apply)
    p = plan(api, wanted, setup.namespace)
    for line in p.lines():
        out(line)
    if api is None:
        out(f"  ? which of these exist: not checked ({reason})")
    if not p.actions:
        out(f"Nothing to do. Users install with --set kueue.queueName={setup.queue} -n {setup.namespace}.")
        return 0
    if not flags.apply:
        out(plans.dry_run(len(p.actions), apply=f"{names.PRODUCT} kueue setup --apply"))
        return 0
    if api is None:
        raise ClusterError(f"Cannot apply: {reason}.")
    for action in p.actions:
        out(f"  ... {action.text}")
        action.run()
    out(f"Done: {len(p.actions)} change(s) applied. Users install with --set kueue.queueName={setup.queue} "
        f"-n {setup.namespace}.")
    return 0


def _api(kube: Kube, apply: bool) -> tuple[Api | None, str]:
    try:
        custom = kube.get_custom()
    except UserError as exc:
        if apply:
            raise
        return None, f"no cluster connection: {str(exc).rstrip('.')}"
    return Api(custom), ""
