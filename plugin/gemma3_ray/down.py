"""`down`: stop the release's job, uninstall it, and (asked) remove its prerequisites — saying exactly
what it removed, what it kept and why; idempotent; a failed step is an error, never a success line.

Order: the RayJob first (a Helm hook, so ``helm uninstall`` never deletes it, and in ephemeral mode
its RayCluster holds the GPUs until the job's deadline), then the release (the ServiceAccount,
Secret and ConfigMap the job used), then the Google Cloud side.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gemma3_ray import cluster, release, teardown
from gemma3_ray.deployment import Deployment
from gemma3_ray.errors import UserError
from gemma3_ray.gcp_clients import Clients
from gemma3_ray.prereqs import Action
from gemma3_ray.teardown import Removal


def _rayjobs(custom: Any, dep: Deployment) -> Removal:
    from kubernetes.client.exceptions import ApiException

    out = Removal()
    selector = f"{cluster.INSTANCE_LABEL}={dep.release}"
    try:
        items = custom.list_namespaced_custom_object(cluster.RAY_GROUP, cluster.RAY_VERSION, dep.namespace,
                                                     cluster.RAYJOB_PLURAL, label_selector=selector)["items"]
    except ApiException as exc:
        if exc.status == cluster.HTTP_NOT_FOUND:
            out.absent.append(f"RayJobs of release {dep.release} (the RayJob CRD is not installed)")
            return out
        raise cluster.api_error(exc, f"list RayJobs in {dep.namespace}") from None
    if not items:
        out.absent.append(f"RayJob of release {dep.release} in namespace {dep.namespace}")
    for obj in items:
        name = obj["metadata"]["name"]
        out.actions.append(Action(
            f"RayJob {dep.namespace}/{name} (stops the training job; KubeRay deletes a RayCluster it created)",
            lambda n=name: cluster.delete_rayjob(custom, dep.namespace, n)))
    return out


def _helm_release(helm: Any, dep: Deployment) -> Removal:
    out = Removal()
    if release.exists(helm, dep.release, dep.namespace):
        out.actions.append(Action(f"Helm release {dep.release} in namespace {dep.namespace} (its ServiceAccount, "
                                  "ConfigMap, Secret and Service)",
                                  lambda: release.uninstall(helm, dep.release, dep.namespace)))
    else:
        out.absent.append(f"Helm release {dep.release} in namespace {dep.namespace}")
    return out


def plan(args: argparse.Namespace, dep: Deployment, clients: Clients) -> Removal:
    """Everything `down` would do, found with reads only."""
    out = Removal()
    if args.uninstall:
        try:
            k8s = cluster.load_config(args.kubeconfig, args.kube_context)
        except UserError as exc:
            raise UserError(f"{str(exc).rstrip('.')}; or pass --no-uninstall to leave the cluster alone.") from exc
        out.extend(_rayjobs(k8s.CustomObjectsApi(), dep))
        out.extend(_helm_release(release.client(args.kubeconfig, args.kube_context), dep))
    else:
        out.kept.append(f"Helm release {dep.release} and its RayJob (--no-uninstall)")
    if args.prereqs:
        out.extend(teardown.plan(dep, clients, delete_data=args.delete_data))
        out.kept.append(f"Secret {dep.namespace}/{dep.hf_secret} (the Hugging Face token, possibly shared in the "
                        f"namespace: `kubectl -n {dep.namespace} delete secret {dep.hf_secret}` removes it)")
    else:
        out.kept.append("Google Cloud prerequisites: service account, grants, bucket (--prereqs removes this "
                        "release's)")
    return out


def run(args: argparse.Namespace, dep: Deployment, clients: Clients, out: Callable[[str], None]) -> int:
    todo = plan(args, dep, clients)
    out(f"Taking down release {dep.owner} (project {dep.project}):")
    for a in todo.actions:
        out(f"  - {'would remove' if args.dry_run else 'remove'} {a.text}")
    for k in todo.kept:
        out(f"  = keep {k}")
    for n in todo.absent:
        out(f"  . nothing to remove: {n}")
    if not todo.actions:
        out("Nothing to remove: everything of this release is already gone (or kept, as listed).")
        return 0
    if args.dry_run:
        out(f"Dry run: nothing changed ({len(todo.actions)} removal(s) planned).")
        return 0
    done = 0
    for a in todo.actions:
        try:
            a.run()
        except UserError as exc:
            out(f"  FAILED to remove {a.text}: {exc}")
            left = len(todo.actions) - done - 1
            raise UserError(f"down stopped after {done} removal(s): removing {a.text} failed ({exc}); "
                            f"{left} more not attempted — fix that and run `gemma3-ray down` again.") from exc
        done += 1
        out(f"  removed {a.text}")
    out(f"Done: removed {done}, kept {len(todo.kept)}.")
    return 0
