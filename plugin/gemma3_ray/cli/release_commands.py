"""The commands beyond `values`: prereqs, doctor, up, status, logs, down."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from gemma3_ray.cli import apply_flag
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment, from_args
from gemma3_ray.utils import names, poll, tokens
from gemma3_ray.utils.errors import EXIT_FAILURE, ClusterError, MissingSetting, NotLoggedIn, UserError

IMAGE_PERMISSIONS = ("artifactregistry.repositories.get", "artifactregistry.repositories.create",
                     "artifactregistry.repositories.getIamPolicy", "artifactregistry.repositories.setIamPolicy")
IMAGE_PROJECT_ONLY = ("artifactregistry.repositories.create",)
TERMINAL_JOB_STATES = {"SUCCEEDED", "FAILED", "STOPPED"}
TERMINAL_DEPLOYMENT_STATES = {"Complete", "Failed"}
POLL_INTERVAL_S = 10.0


def _out(line: str) -> None:
    print(line, flush=True)


def _hf_token(args: argparse.Namespace) -> str | None:
    """The HF token from --hf-token-from-env VAR or --hf-token-file PATH|- (never from argv)."""
    return tokens.from_args(args)


def run_prereqs(dep: Deployment, clients: Clients, *, dry_run: bool, hf_token: str | None,
                out: Callable[[str], None] = _out, image: bool = False,
                apply_hint: str = "gemma3-ray prereqs --apply", cluster_unread: str = "") -> int:
    from gemma3_ray.release.prereqs import Prereqs
    from gemma3_ray.utils.plan import Plan

    p = Prereqs(dep, clients, hf_token=hf_token, cluster_unread=cluster_unread)
    header = f"Prerequisites of release {dep.owner} in project {dep.project}, region {dep.region}:"
    try:
        plan = p.plan()
        if image:  # the Artifact Registry repository and build staging bucket `image build` needs
            from gemma3_ray.gcp.artifact_registry import RegistryPrereqs

            RegistryPrereqs(dep, clients).extend(plan)
    except NotLoggedIn:
        if not dry_run:
            raise
        out(header)
        offline = p.offline_plan()
        if image:
            from gemma3_ray.gcp.artifact_registry import RegistryPrereqs

            registry = Plan()
            RegistryPrereqs(dep, clients).offline(registry)
            offline.unchecked += [a.text.removesuffix(" [not checked: not logged in]") for a in registry.actions]
        for line in offline.lines():
            out(line)
        out("Not logged in: nothing in Google Cloud was read or changed. To see what exists and what would change, run "
            "`gcloud auth application-default login` and this command again.")
        return 0
    out(header)
    for line in plan.lines():
        out(line)
    if not plan.actions:
        out("Nothing to do: every prerequisite is in place.")
        return 0
    from gemma3_ray.gcp import iam_preflight
    from gemma3_ray.release import prereqs

    pre = iam_preflight.check(clients, dep.project, prereqs.PERMISSIONS + (IMAGE_PERMISSIONS if image else ()))
    out(f"  {pre.mark} {pre.line()}")
    if not dry_run:
        pre.require(dep.project, only=prereqs.PROJECT_ONLY + (IMAGE_PROJECT_ONLY if image else ()))
    if dry_run:
        out(f"Dry run: nothing changed ({len(plan.actions)} change(s) planned). Apply with `{apply_hint}` (same flags)"
            + (" or `make prereqs APPLY=1`." if apply_hint.startswith("gemma3-ray prereqs") else "."))
        return 0
    out("Applying:")
    p.apply(plan, out)
    out(f"Done: {len(plan.actions)} change(s) applied.")
    return 0


def cmd_prereqs(args: argparse.Namespace, clients: Clients | None) -> int:
    hf_token = _hf_token(args)
    dep, clients = from_args(args, clients)
    apply = apply_flag.applying(args, "prereqs")
    unread = _kube_clients(args, clients, needed=hf_token is not None, planning=not apply)
    return run_prereqs(dep, clients, dry_run=not apply, hf_token=hf_token, image=args.image, cluster_unread=unread)


def _kube_clients(args: argparse.Namespace, clients: Clients, needed: bool, planning: bool = False) -> str:
    """The cluster's client for the HF Secret; a plan goes on without one and gets why ("" when connected)."""
    if not needed or clients.core_v1 is not None:
        return ""
    if planning and args.no_kube_context:
        return "--no-kube-context"
    from gemma3_ray.kube import cluster

    try:
        clients.core_v1 = cluster.core_v1(args.kubeconfig, args.kube_context)
    except UserError as exc:
        if not planning:
            raise
        return str(exc).rstrip(".")
    return ""


def cmd_doctor(args: argparse.Namespace, clients: Clients | None) -> int:
    from pathlib import Path

    from gemma3_ray.config import kube_context, render
    from gemma3_ray.release import doctor

    dep, clients = from_args(args, clients)
    kube = doctor.Kube(context=kube_context.current_context(args.kubeconfig, args.kube_context))
    if kube.context:
        from gemma3_ray.kube import cluster

        k8s = cluster.load_config(args.kubeconfig, args.kube_context)
        kube.core, kube.api_ext, kube.custom = k8s.CoreV1Api(), k8s.ApiextensionsV1Api(), k8s.CustomObjectsApi()
    values = render.load_values(Path(v) for v in args.values) if args.values else None
    checks = doctor.run_checks(dep, clients, kube, values)
    for c in checks:
        _out(c.line())
    failed = sum(not c.ok for c in checks)
    _out(f"{len(checks) - failed} passed, {failed} failed" if failed else "All checks passed.")
    return EXIT_FAILURE if failed else 0


def _load_values(path: str) -> dict[str, Any]:
    from pathlib import Path

    from gemma3_ray.config import render

    return render.load_plain(Path(path))


def cmd_up(args: argparse.Namespace, clients: Clients | None) -> int:
    from pathlib import Path

    from gemma3_ray.config import render
    from gemma3_ray.gcp import image_build
    from gemma3_ray.kube import helm_release

    apply = apply_flag.applying(args, "up")
    hf_token = _hf_token(args)
    dep, clients = from_args(args, clients)
    _kube_clients(args, clients, needed=hf_token is not None)
    if not dep.cluster:
        raise MissingSetting("No cluster: switch to the GKE kube context or pass --cluster.")
    _check_context(args, dep)
    chart = helm_release.chart_path(args.chart)
    # The final values, rendered by the chart (its schema and templates, `helm template`) before
    # anything changes in Google Cloud, the cluster or the values file.
    path = Path(args.values_file or f"{dep.release}-values.yaml")
    text = render.render(dep, render.load(path), image_build.values(dep, clients) if args.image else [])
    values = [render.parse_plain(text, path)] + [_load_values(f) for f in args.extra_values or []]
    helm = helm_release.client(args.kubeconfig, args.kube_context)  # helm on PATH, checked before anything is written
    objects = helm_release.template(helm, dep.release, chart, values, dep.namespace)
    _out(f"Chart {chart.name} renders with these values ({len(objects)} objects; schema and templates checked).")
    from gemma3_ray.kube import cluster, kuberay_crd

    # KubeRay before 1.5.1/1.6.0 would silently drop (or break on) some values: refuse them first.
    _out(kuberay_crd.check_before_install(cluster.load_config(args.kubeconfig, args.kube_context).ApiextensionsV1Api(),
                                          values))
    if not apply:
        run_prereqs(dep, clients, dry_run=True, hf_token=hf_token, apply_hint="gemma3-ray up --apply")
        _out(f"  + write {tokens.shown(path)}; helm upgrade --install {dep.release} {chart.name} -n {dep.namespace}")
        _out("Dry run: nothing changed (the cluster answered; the values render). Apply with `gemma3-ray up --apply` "
             "(same flags).")
        return 0
    from gemma3_ray.release import down

    for line in down.remove_unmanaged(cluster.load_config(args.kubeconfig, args.kube_context).CustomObjectsApi(), dep):
        _out(line)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    _out(f"Values: {tokens.shown(path)}")
    rc = run_prereqs(dep, clients, dry_run=False, hf_token=hf_token)
    if rc:
        return rc
    rev = helm_release.upgrade_install(helm, dep.release, chart, values, dep.namespace)
    _out(f"Release {dep.release}: revision {getattr(rev, 'revision', '?')} in namespace {dep.namespace}.")
    if args.no_follow:
        return 0
    return follow(args, dep)


def _check_context(args: argparse.Namespace, dep: Deployment) -> None:
    """`up` acts on the cluster the kube context names: it must be the deployment's (before any change)."""
    from gemma3_ray.config import kube_context

    current = kube_context.current_context(args.kubeconfig, args.kube_context)
    gke = kube_context.parse_gke_context(current) if current else None
    if gke is not None and (gke.project, gke.name) != (dep.project, dep.cluster):
        raise ClusterError(f"The kube context {current} is cluster {gke.name} of project {gke.project}, not {dep.cluster} "
                           f"of {dep.project}: switch with `gcloud container clusters get-credentials {dep.cluster} "
                           f"--location {dep.region} --project {dep.project}` (or pass --kube-context); nothing was "
                           "changed.")


def follow(args: argparse.Namespace, dep: Deployment) -> int:
    from gemma3_ray.kube import cluster

    k8s = cluster.load_config(args.kubeconfig, args.kube_context)
    custom = k8s.CustomObjectsApi()

    def ended(s: cluster.RayJobState) -> bool:
        return s.job_status in TERMINAL_JOB_STATES or s.deployment_status in TERMINAL_DEPLOYMENT_STATES

    state = poll.until(lambda: cluster.rayjob_state(cluster.find_rayjob(custom, dep.namespace, dep.release)), ended,
                       interval=POLL_INTERVAL_S, timeout=None, out=_out, progress_every=float("inf"),
                       describe=lambda s: f"RayJob {s.name}: {s.deployment_status} / {s.job_status} {s.message}".rstrip())
    return 0 if state.job_status == "SUCCEEDED" else EXIT_FAILURE


def cmd_status(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.release import status

    dep, clients = from_args(args, clients)
    for line in status.lines(args, dep, clients):
        _out(line)
    return 0


def cmd_logs(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.kube import cluster

    dep, _ = from_args(args, clients)
    k8s = cluster.load_config(args.kubeconfig, args.kube_context)
    state = cluster.rayjob_state(cluster.find_rayjob(k8s.CustomObjectsApi(), dep.namespace, dep.release))
    for chunk in cluster.driver_log(k8s.CoreV1Api(), dep.namespace, state.name, follow=args.follow):
        sys.stdout.write(chunk)  # a line at a time (the redaction sees whole words), as it ends
    return 0


def cmd_down(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.release import down

    args.dry_run = not apply_flag.applying(args, "down")  # down.run plans unless applying
    dep, clients = from_args(args, clients)
    return down.run(args, dep, clients, _out)


class _Gone(argparse.Action):
    """--delete-bucket: never an alias of --delete-data (which keeps the bucket); refused with the right flag."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.error("--delete-bucket is not an option: `down` never deletes the bucket the releases share; "
                     "--delete-data deletes this release's objects (its prefix only); delete an unused bucket with "
                     "`gcloud storage rm --recursive gs://BUCKET`")


def register(sub: argparse._SubParsersAction, add_common: Callable[[argparse.ArgumentParser], None]) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("prereqs", help="the GCP prerequisites Helm cannot create: plan (default) or --apply")
    add_common(p)
    apply_flag.add(p, "create what the plan lists", dry_run_alias=True)
    tokens.add_arguments(p)
    p.add_argument("--image", action="store_true", help="also the Artifact Registry repository and build staging "
                   "bucket for `image build` (the cluster's nodes may read it, Cloud Build may write it)")
    p.set_defaults(handler=cmd_prereqs)

    p = sub.add_parser("doctor", help="check gcloud auth, the cluster, KubeRay, the Secret, bucket and Workload Identity")
    add_common(p)
    p.add_argument("-f", "--values", action="append", help="values file to check the release against (its KubeRay "
                   "fields, its Kueue queue); several are merged as helm merges its -f files, the later winning")
    p.set_defaults(handler=cmd_doctor)

    p = sub.add_parser("up", help="prereqs, values, helm upgrade --install, then follow the RayJob")
    add_common(p)
    p.add_argument("--chart", help="chart directory (default: charts/gemma3-ray beside the plugin)")
    p.add_argument("--values-file", help=f"values file to write/update (default: RELEASE-values.yaml, e.g. {names.PRODUCT}-values.yaml)")
    p.add_argument("-f", "--extra-values", action="append", help="more values files, applied after the generated one")
    tokens.add_arguments(p)
    p.add_argument("--no-follow", action="store_true", help="return after helm instead of following the RayJob")
    p.add_argument("--image", action="store_true", help="use the training image `image build` made (as `values --image`); "
                   "without it, image keys an earlier --image wrote are removed")
    apply_flag.add(p, "write the values file, apply the prerequisites, helm upgrade --install")
    p.set_defaults(handler=cmd_up)

    p = sub.add_parser("status", help="the RayJob's state, the Ray dashboard's job status, the newest checkpoint")
    add_common(p)
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("logs", help="the job's driver log")
    add_common(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    p.set_defaults(handler=cmd_logs)

    p = sub.add_parser("down", help="delete the RayJob, helm uninstall; with --prereqs also this release's GCP grants")
    add_common(p)
    p.add_argument("--no-uninstall", dest="uninstall", action="store_false", help="keep the Helm release and its RayJob (change nothing in the cluster)")
    p.add_argument("--prereqs", action="store_true",
                   help="also remove what `prereqs` made for this release (its grants, its service account unless "
                   "another release uses it); the shared bucket is kept")
    p.add_argument("--delete-data", action="store_true",
                   help="with --prereqs: also delete this release's objects (its prefix only, never the bucket)")
    p.add_argument("--delete-bucket", action=_Gone, nargs=0, help=argparse.SUPPRESS)
    apply_flag.add(p, "remove what the plan lists", dry_run_alias=True)
    p.set_defaults(handler=cmd_down)
