"""Kueue as `status` and `doctor` see it: a queued RayJob's Workload, and whether its queue can admit it.

Kueue as `status` and `doctor` see it: the Workload of a queued RayJob (admitted, waiting and why,
evicted), and whether the values' queue can ever admit their job (CRDs, LocalQueue, ClusterQueue
flavors and nominal quota for every pod set: head, workers, submitter).

The Workload is the one Kueue made for the RayJob: labelled ``kueue.x-k8s.io/job-uid=<RayJob uid>``
and owned by it (pkg/controller/jobframework/reconciler.go, ``ConstructWorkload``). Its conditions
QuotaReserved, Admitted and Evicted (apis/kueue/v1beta2/workload_types.go) tell the state.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from gemma3_ray.kueue import objects as ko
from gemma3_ray.utils.checks import Check
from gemma3_ray.utils.errors import UserError

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
CRDS = ("workloads", "localqueues", "clusterqueues", "resourceflavors")
HTTP_NOT_FOUND = 404


def _conditions(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (workload.get("status") or {}).get("conditions") or []}


def workload_state(workload: dict[str, Any]) -> str:
    """One sentence: admitted, evicted (why), waiting for quota (why) or for its admission checks."""
    cond = _conditions(workload)

    def why(c: dict[str, Any]) -> str:
        text = f"{c.get('reason') or '?'}"
        return text + (f": {c['message']}" if c.get("message") else "")

    if cond.get("Finished", {}).get("status") == "True":
        return f"finished ({why(cond['Finished'])})"
    if cond.get("Evicted", {}).get("status") == "True":
        return f"evicted ({why(cond['Evicted'])}); Kueue suspended the job and queues it again"
    if cond.get("Admitted", {}).get("status") == "True":
        return f"admitted{admitted_on(workload)}: the job runs"
    reserved = cond.get("QuotaReserved", {})
    if reserved.get("status") == "True":
        checks = (workload.get("status") or {}).get("admissionChecks") or []
        pending = ", ".join(f"{c.get('name')} {c.get('state')}" + (f" ({c['message']})" if c.get("message") else "")
                            for c in checks if c.get("state") != "Ready")
        return "quota reserved, waiting for admission checks" + (f": {pending}" if pending else "")
    if reserved:
        return f"waiting in the queue ({why(reserved)})"
    return "waiting in the queue (not yet considered by Kueue)"


def admitted_on(workload: dict[str, Any]) -> str:
    """" on flavor F" (or " on flavors F (pod sets a, b), G (c)"): the ResourceFlavors Kueue assigned at admission
    (status.admission.podSetAssignments[].flavors, one per resource), which say which capacity the job got."""
    by_flavor: dict[str, list[str]] = {}
    for a in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        for flavor in dict.fromkeys((a.get("flavors") or {}).values()):
            by_flavor.setdefault(flavor, []).append(a.get("name", "?"))
    if not by_flavor:
        return ""
    if len(by_flavor) == 1:
        return f" on flavor {next(iter(by_flavor))}"
    return " on flavors " + ", ".join(f"{f} (pod sets {', '.join(sets)})" for f, sets in by_flavor.items())


def find_workload(custom: Any, rayjob: dict[str, Any]) -> dict[str, Any] | None:
    meta = rayjob["metadata"]
    items = custom.list_namespaced_custom_object(ko.GROUP, ko.VERSION, meta["namespace"], "workloads",
                                                 label_selector=f"{JOB_UID_LABEL}={meta['uid']}").get("items", [])
    if not items:  # older Kueue: the owner reference only
        items = [w for w in custom.list_namespaced_custom_object(ko.GROUP, ko.VERSION, meta["namespace"], "workloads")
                 .get("items", []) if any(r.get("uid") == meta["uid"] for r in w["metadata"].get("ownerReferences") or [])]
    return max(items, key=lambda w: w["metadata"].get("creationTimestamp") or "") if items else None


def status_lines(custom: Any, rayjob: dict[str, Any]) -> list[str]:
    """The Kueue line of `status` for a RayJob with a queue ([] without one)."""
    labels = rayjob["metadata"].get("labels") or {}
    queue = labels.get(ko.QUEUE_LABEL)
    if not queue:
        return []
    ns = rayjob["metadata"]["namespace"]
    try:
        workload = find_workload(custom, rayjob)
    except Exception as exc:  # its own line: the RayJob's state above stays shown
        if getattr(exc, "status", None) == HTTP_NOT_FOUND:
            return [f"Kueue: the RayJob names queue {queue}, but Kueue's CRDs are not installed: it stays suspended "
                    "(`gemma3-ray doctor --values ...`)"]
        return [f"Kueue: unknown (could not list Workloads in {ns}: {getattr(exc, 'reason', None) or exc})"]
    if workload is None:
        return [f"Kueue: no Workload yet for queue {ns}/{queue} (is Kueue running? `kubectl get localqueue -n {ns} {queue}`)"]
    name = workload["metadata"]["name"]
    return [f"Kueue Workload {ns}/{name} (queue {queue}): {workload_state(workload)}; "
            f"details: kubectl describe workload -n {ns} {name}"]


# -- doctor ---------------------------------------------------------------------------------------

def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _fits(pod: dict[str, Any], flavor: dict[str, Any]) -> bool:
    """Kueue's flavor match: no conflict with the flavor's node labels, every NoSchedule/NoExecute taint tolerated."""
    spec = flavor.get("spec") or {}
    selector = pod.get("nodeSelector") or {}
    if any(k in selector and selector[k] != v for k, v in (spec.get("nodeLabels") or {}).items()):
        return False
    taints = [t for t in spec.get("nodeTaints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
    tolerations = (pod.get("tolerations") or []) + (spec.get("tolerations") or [])
    return all(_tolerates(tolerations, t) for t in taints)


def assign(sets: list[tuple[ko.PodSet, dict[str, Any]]], cluster_queue: dict[str, Any],
           flavors: dict[str, dict[str, Any]]) -> list[str]:
    """Problems keeping the ClusterQueue from ever admitting these pod sets ([] = it can), trying
    flavors in order per pod set as Kueue's flavor assigner does (no borrowing, no preemption)."""
    groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
    left: dict[tuple[str, str], Decimal] = {}
    for g in groups:
        for f in g.get("flavors") or []:
            for r in f.get("resources") or []:
                left[(f["name"], r["name"])] = ko.quantity(r.get("nominalQuota", 0))
    problems = []
    for ps, pod in sets:
        need = ps.total()
        for resource in sorted(need):
            group = next((g for g in groups if resource in (g.get("coveredResources") or [])), None)
            if group is None and need[resource]:
                problems.append(f"no resource group covers {resource}, which pod set {ps.name} requests")
        for g in groups:
            wanted = {r: v for r, v in need.items() if r in (g.get("coveredResources") or []) and v}
            if not wanted:
                continue
            ok = None
            for f in g.get("flavors") or []:
                flavor = flavors.get(f["name"])
                if flavor is None or not _fits(pod, flavor):
                    continue
                if all(left.get((f["name"], r), Decimal(0)) >= v for r, v in wanted.items()):
                    ok = f["name"]
                    break
            if ok is None:
                problems.append(f"no flavor fits pod set {ps.name} ({ps.count} x {ko.describe(ps.requests)}) "
                                "with enough nominal quota left")
                continue
            for r, v in wanted.items():
                left[(ok, r)] -= v
    return problems


def _get(custom: Any, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    try:
        if namespace:
            return custom.get_namespaced_custom_object(ko.GROUP, ko.VERSION, namespace, plural, name)
        return custom.get_cluster_custom_object(ko.GROUP, ko.VERSION, plural, name)
    except Exception as exc:
        if getattr(exc, "status", None) == HTTP_NOT_FOUND:
            return None
        raise


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector's match (nil selects nothing, {} everything), as the ClusterQueue's namespaceSelector."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def checks(custom: Any, api_ext: Any, namespace: str, rayjob: dict[str, Any], core: Any = None) -> list[Check]:
    """Doctor's Kueue checks for the RayJob the values render ([] when it names no queue)."""
    labels = rayjob["metadata"].get("labels") or {}
    queue = labels.get(ko.QUEUE_LABEL)
    if not queue:
        return []
    if custom is None or api_ext is None:
        return [Check("Kueue", False, "no cluster connection")]
    missing = []
    for plural in CRDS:
        try:
            api_ext.read_custom_resource_definition(f"{plural}.{ko.GROUP}")
        except Exception as exc:
            if getattr(exc, "status", None) != HTTP_NOT_FOUND:
                raise
            missing.append(plural)
    if missing:
        return [Check("Kueue CRDs", False, f"{', '.join(missing)}.{ko.GROUP} not installed: install Kueue "
                      "(https://kueue.sigs.k8s.io/docs/installation/) or unset kueue.queueName")]
    out = [Check("Kueue CRDs", True, "installed")]
    lq = _get(custom, "localqueues", queue, namespace)
    if lq is None:
        return [*out, Check("Kueue LocalQueue", False, f"{namespace}/{queue} does not exist: the job would wait "
                            f"forever; ask the cluster admin (`gemma3-ray kueue setup -n {namespace} --queue {queue}`)")]
    cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
    out.append(Check("Kueue LocalQueue", True, f"{namespace}/{queue} -> ClusterQueue {cq_name}"))
    cq = _get(custom, "clusterqueues", cq_name)
    if cq is None:
        return [*out, Check("Kueue ClusterQueue", False, f"{cq_name} (of LocalQueue {namespace}/{queue}) does not exist")]
    if core is not None:
        ns_labels = core.read_namespace(namespace).metadata.labels or {}
        if not selects((cq.get("spec") or {}).get("namespaceSelector"), ns_labels):
            return [*out, Check("Kueue ClusterQueue", False, f"{cq_name}'s namespaceSelector does not select namespace "
                                f"{namespace}: Kueue would never admit its jobs; ask the admin for this namespace's own queue "
                                f"(`gemma3-ray kueue setup -n {namespace} -f VALUES --apply`)")]
    flavors = {}
    for g in (cq.get("spec") or {}).get("resourceGroups") or []:
        for f in g.get("flavors") or []:
            flavors[f["name"]] = _get(custom, "resourceflavors", f["name"]) or {}
    sets = ko.pod_sets(rayjob)
    pods = _pod_specs(rayjob)
    problems = assign([(s, pods.get(s.name, {})) for s in sets], cq, flavors)
    demand = ko.describe(ko.add(*(s.total() for s in sets)))
    if problems:
        out.append(Check("Kueue ClusterQueue", False, f"{cq_name} can never admit this job ({demand}): "
                         f"{'; '.join(problems)}; ask the admin to raise it (`gemma3-ray kueue setup -f VALUES --apply`)"))
    else:
        out.append(Check("Kueue ClusterQueue", True, f"{cq_name} has flavors and nominal quota for the whole job ({demand})"))
    priority = labels.get(ko.PRIORITY_LABEL)
    if priority:
        found = _get(custom, "workloadpriorityclasses", priority)
        out.append(Check("Kueue WorkloadPriorityClass", found is not None,
                         priority if found else f"{priority} does not exist: create it or unset kueue.priorityClass"))
    return out


def _pod_specs(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = rayjob["spec"].get("rayClusterSpec") or {}
    out = {"head": cluster.get("headGroupSpec", {}).get("template", {}).get("spec", {})}
    for g in cluster.get("workerGroupSpecs") or []:
        out[g["groupName"].lower()] = g["template"].get("spec", {})
    out["submitter"] = (rayjob["spec"].get("submitterPodTemplate") or {}).get("spec", {})
    return out


def guarded(fn: Any) -> list[Check]:
    try:
        return list(fn())
    except UserError as exc:
        return [Check("Kueue", False, str(exc))]
    except Exception as exc:  # an API error: one failed check, never a traceback
        return [Check("Kueue", False, f"could not read Kueue's objects: {getattr(exc, 'reason', None) or exc}")]


def doctor_checks(namespace: str, release_name: str, custom: Any, api_ext: Any,
                  values: dict[str, Any] | None, core: Any = None) -> list[Check]:
    """Doctor's Kueue group: [] unless the values name a queue; else the job they render, checked."""
    queue = ((values or {}).get("kueue") or {}).get("queueName")
    if not queue:
        return []
    from gemma3_ray.kube import helm_release

    docs = helm_release.template(helm_release.client(None, None), release_name, helm_release.chart_path(None), [values or {}], namespace)
    jobs = [d for d in docs if d.get("kind") == "RayJob"]
    if len(jobs) != 1:
        return [Check("Kueue", False, f"the values render {len(jobs)} RayJobs, expected one")]
    return guarded(lambda: checks(custom, api_ext, namespace, jobs[0], core))
