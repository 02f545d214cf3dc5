"""`down`: uninstall the release, wait until its RayJobs are gone, and (asked) remove its prerequisites.

`down`: uninstall the release, wait until its RayJobs are gone, and (asked) remove its
prerequisites — saying exactly what it removed, what it kept and why; idempotent; a failed step, or a
RayJob that stays, is an error, never a success line.

Order: RayJobs of the release that Helm does not manage (a hook RayJob of an earlier chart version,
which no `helm uninstall` deletes), then the release (`helm uninstall` deletes its RayJob with the
ServiceAccount, Secret and ConfigMap it used), then a bounded wait until no RayJob of the release is
left (KubeRay's finalizer stops each job; a job's cluster goes with it), then the Google Cloud side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.kube import cluster, helm_release
from gemma3_ray.release import teardown
from gemma3_ray.release.teardown import Removal
from gemma3_ray.utils import plan as plans
from gemma3_ray.utils import poll
from gemma3_ray.utils.errors import ClusterError, UserError
from gemma3_ray.utils.plan import Action

HELM_RELEASE_ANNOTATION = "meta.helm.sh/release-name"
HELM_NAMESPACE_ANNOTATION = "meta.helm.sh/release-namespace"
KUBERAY_FINALIZER = "ray.io/rayjob-finalizer"
GONE_TIMEOUT_S = 180.0
GONE_POLL_S = 2.0


@dataclass
class RayJobs:
    """The release's RayJobs as `down` found them."""

    by_helm: list[str] = field(default_factory=list)  # in the release: `helm uninstall` deletes them
    unmanaged: list[str] = field(default_factory=list)  # `down` deletes them itself
    terminating: list[str] = field(default_factory=list)  # deleted already, not gone yet


def _list_rayjobs(custom: Any, dep: Deployment) -> list[dict[str, Any]] | None:
    """The RayJobs labelled with this release (None: the RayJob CRD is not installed)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return custom.list_namespaced_custom_object(cluster.RAY_GROUP, cluster.RAY_VERSION, dep.namespace,
                                                    cluster.RAYJOB_PLURAL,
                                                    label_selector=f"{cluster.INSTANCE_LABEL}={dep.release}")["items"]
    except ApiException as exc:
        if exc.status == cluster.HTTP_NOT_FOUND:
            return None
        raise cluster.api_error(exc, f"list RayJobs in {dep.namespace}") from None


def _managed_by_helm(obj: dict[str, Any], dep: Deployment) -> bool:
    ann = obj["metadata"].get("annotations") or {}
    return ann.get(HELM_RELEASE_ANNOTATION) == dep.release and ann.get(HELM_NAMESPACE_ANNOTATION) == dep.namespace


def _rayjobs(custom: Any, dep: Deployment, release_exists: bool) -> tuple[Removal, RayJobs]:
    out, found = Removal(), RayJobs()
    items = _list_rayjobs(custom, dep)
    if items is None:
        out.absent.append(f"RayJobs of release {dep.release} (the RayJob CRD is not installed)")
        return out, found
    if not items:
        out.absent.append(f"RayJob of release {dep.release} in namespace {dep.namespace}")
    for obj in items:
        name = obj["metadata"]["name"]
        if obj["metadata"].get("deletionTimestamp"):
            found.terminating.append(name)
        elif release_exists and _managed_by_helm(obj, dep):
            found.by_helm.append(name)
        else:  # e.g. the hook RayJob of an earlier chart version: Helm never deletes it
            found.unmanaged.append(name)
            out.actions.append(Action(
                f"RayJob {dep.namespace}/{name} (not managed by Helm: stops the training job; KubeRay deletes a "
                "RayCluster it created)", lambda n=name: cluster.delete_rayjob(custom, dep.namespace, n)))
    return out, found


def remove_unmanaged(custom: Any, dep: Deployment) -> list[str]:
    """Before `up` installs: delete the release's RayJobs Helm does not manage (the hook RayJob of an
    earlier chart version, which would keep running, holding its GPUs, beside the new job), and wait
    until none of the release's RayJobs is being deleted (Helm would apply the new revision's RayJob
    onto a terminating one of the same name, which then goes: no job). One line per RayJob deleted."""
    lines = []
    for obj in _list_rayjobs(custom, dep) or []:
        name = obj["metadata"]["name"]
        if obj["metadata"].get("deletionTimestamp") or _managed_by_helm(obj, dep):
            continue
        cluster.delete_rayjob(custom, dep.namespace, name)
        lines.append(f"Deleted RayJob {dep.namespace}/{name}: a RayJob of release {dep.release} that Helm does not "
                     "manage (the hook of an earlier chart version), which would keep running beside the new job.")
    wait_gone(custom, dep, only_terminating=True, again="gemma3-ray up")
    return lines


def _cluster_side(dep: Deployment, clients: Clients, custom: Any) -> Removal:
    """RayJobs Helm does not manage, then the release, then a wait until no RayJob of it is left."""
    helm = helm_release.client(clients.kube.kubeconfig, clients.kube.context)
    exists = helm_release.exists(helm, dep.release, dep.namespace)
    out, found = _rayjobs(custom, dep, exists)
    if exists:
        out.actions.append(Action(f"Helm release {dep.release} in namespace {dep.namespace} (its RayJob, "
                                  "ServiceAccount, ConfigMap, Secret and Service)",
                                  lambda: helm_release.uninstall(helm, dep.release, dep.namespace)))
    else:
        out.absent.append(f"Helm release {dep.release} in namespace {dep.namespace}")
    waited = [*found.unmanaged, *found.by_helm, *found.terminating]
    if waited:
        names = ", ".join(waited)
        what = "already being deleted: " if found.terminating and not found.by_helm else ""
        out.actions.append(Action(f"RayJob {names} ({what}waits until KubeRay has stopped the job and it is gone, "
                                  f"at most {GONE_TIMEOUT_S:.0f} s)", lambda: wait_gone(custom, dep)))
    return out


def _stuck(dep: Deployment, left: list[dict[str, Any]], waited: float, again: str = "gemma3-ray down") -> UserError:
    obj = left[0]
    name = obj["metadata"]["name"]
    others = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
    fix = (f"kubectl -n {dep.namespace} patch rayjob {name} --type=merge -p '{{\"metadata\":{{\"finalizers\":null}}}}'")
    if obj["metadata"].get("deletionTimestamp") and KUBERAY_FINALIZER in (obj["metadata"].get("finalizers") or []):
        return ClusterError(f"RayJob {dep.namespace}/{name}{others} is still there {waited:.0f} s after its deletion: "
                            f"KubeRay's finalizer holds it until the operator stops the job (is the KubeRay operator "
                            f"running?); without an operator, clear it with `{fix}` (its cluster then goes with it) and "
                            f"run `{again} --apply` again.")
    return ClusterError(f"RayJob {dep.namespace}/{name}{others} is still there {waited:.0f} s after `down` removed the "
                        f"release (finalizers: {', '.join(obj['metadata'].get('finalizers') or []) or 'none'}): check "
                        f"`kubectl -n {dep.namespace} get rayjob {name} -o yaml` and run `{again} --apply` again.")


class _StillThere(UserError):
    def __init__(self, waited: float) -> None:
        super().__init__(f"still there after {waited:.0f} s")
        self.waited = waited


def wait_gone(custom: Any, dep: Deployment, only_terminating: bool = False, again: str = "gemma3-ray down") -> None:
    """Return once no RayJob of the release (``only_terminating``: none being deleted) is left; past
    GONE_TIMEOUT_S, a UserError naming what holds one."""
    def left() -> list[dict[str, Any]]:
        items = _list_rayjobs(custom, dep) or []
        return [o for o in items if o["metadata"].get("deletionTimestamp")] if only_terminating else items

    try:
        poll.until(left, lambda items: not items, interval=GONE_POLL_S, timeout=GONE_TIMEOUT_S, on_timeout=_StillThere)
    except _StillThere as exc:
        still = left()
        if still:
            raise _stuck(dep, still, exc.waited, again) from None


def plan(dep: Deployment, clients: Clients, *, uninstall: bool = True, with_prereqs: bool = False,
         delete_data: bool = False) -> Removal:
    """Everything `down` would do, found with reads only (``uninstall``: the cluster side; ``with_prereqs``:
    the Google Cloud side, ``delete_data`` with it)."""
    out = Removal()
    if uninstall:
        try:
            custom = clients.kube.get_custom()
        except UserError as exc:
            raise UserError(f"{str(exc).rstrip('.')}; or pass --no-uninstall to leave the cluster alone.") from exc
        out.extend(_cluster_side(dep, clients, custom))
    else:
        out.kept.append(f"Helm release {dep.release} and its RayJob (--no-uninstall)")
    if with_prereqs:
        out.extend(teardown.plan(dep, clients, delete_data=delete_data))
        out.kept.append(f"Secret {dep.namespace}/{dep.hf_secret} (the Hugging Face token, possibly shared in the "
                        f"namespace: `kubectl -n {dep.namespace} delete secret {dep.hf_secret}` removes it)")
    else:
        out.kept.append("Google Cloud prerequisites: service account, grants, bucket (--prereqs removes this "
                        "release's)")
    return out


def run(dep: Deployment, clients: Clients, out: Callable[[str], None], *, dry_run: bool, uninstall: bool = True,
        with_prereqs: bool = False, delete_data: bool = False) -> int:
    """`down`: the plan printed (what it removes, keeps and finds gone), then, unless ``dry_run``, applied."""
    todo = plan(dep, clients, uninstall=uninstall, with_prereqs=with_prereqs, delete_data=delete_data)
    out(f"Taking down release {dep.owner} (project {dep.project}):")
    for a in todo.actions:
        out(f"  - {'would remove' if dry_run else 'remove'} {a.text}")
    for k in todo.kept:
        out(f"  = keep {k}")
    for n in todo.absent:
        out(f"  . nothing to remove: {n}")
    if not todo.actions:
        out("Nothing to remove: everything of this release is already gone (or kept, as listed).")
        return 0
    if dry_run:
        out(plans.dry_run(len(todo.actions), what="removal"))
        return 0
    done = 0
    for a in todo.actions:
        try:
            a.run()
        except UserError as exc:
            out(f"  FAILED to remove {a.text}: {exc}")
            left = len(todo.actions) - done - 1
            raise UserError(f"down stopped after {done} removal(s): removing {a.text} failed ({exc}); "
                            f"{left} more not attempted — fix that and run `gemma3-ray down --apply` again.") from exc
        done += 1
        out(f"  removed {a.text}")
    out(f"Done: removed {done}, kept {len(todo.kept)}.")
    return 0
