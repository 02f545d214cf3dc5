"""`up`: the release's values rendered by the chart and checked against the cluster; with --apply installed.

`up`: plan by default — the values rendered by the chart (its schema and templates), the cluster's
KubeRay asked whether it keeps every value, the prerequisites planned, nothing written. With
``apply``: the previous chart's RayJobs cleared, the values file written, the prerequisites applied,
``helm upgrade --install``, and the RayJob followed until it ends.

The flow enters each module it uses once, down the layers, in this order (``tests/plugin/
test_up_walk.py`` measures it): the kube context (``config.kube_context``), the training image
(``gcp.image_build``), the values (``config.render``), the chart (``kube.helm_release``: rendered
now; its install prepared here and run in its turn), the cluster's one connection
(``config.clients``) and its KubeRay CRD (``kube.kuberay_crd``), the RayJobs Helm does not manage
(``release.down``), the prerequisites (``release.prereqs``), the RayJob followed (``kube.cluster``).
Nothing changes before every check has passed; the changes then run in that order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gemma3_ray.config import kube_context, render
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gcp import image_build
from gemma3_ray.kube import cluster, helm_release, kuberay_crd
from gemma3_ray.release import down, prereqs
from gemma3_ray.utils import plan, tokens
from gemma3_ray.utils.errors import EXIT_FAILURE, ClusterError, MissingSetting

APPLY = "gemma3-ray up --apply"


@dataclass(frozen=True)
class Up:
    """What `up` is asked to do (its flags, parsed)."""

    apply: bool = False
    hf_token: str | None = None  # the Secret's token (read by the CLI, never from argv)
    chart: str | None = None  # the chart's directory (None: the one beside the plugin)
    values_file: str | None = None  # None: RELEASE-values.yaml
    extra_values: tuple[str, ...] = ()  # -f files, applied after the generated one
    image: bool = False  # the training image `image build` made, written into the values
    follow: bool = True  # follow the RayJob until it ends
    model_size: str | None = None  # the model's Gemma 3 size when its id does not name it (the fit table's cell)


def _check_context(dep: Deployment, clients: Clients) -> None:
    """`up` acts on the cluster the kube context names: it must be the deployment's (before any change)."""
    current = kube_context.current_context(clients.kube.kubeconfig, clients.kube.context)
    gke = kube_context.parse_gke_context(current) if current else None
    if gke is not None and (gke.project, gke.name) != (dep.project, dep.cluster):
        raise ClusterError(f"The kube context {current} is cluster {gke.name} of project {gke.project}, not {dep.cluster} "
                           f"of {dep.project}: switch with `gcloud container clusters get-credentials {dep.cluster} "
                           f"--location {dep.region} --project {dep.project}` (or pass --kube-context); nothing was "
                           "changed.")


def run(dep: Deployment, clients: Clients, want: Up, out: Callable[[str], None]) -> int:
    if not dep.cluster:
        raise MissingSetting("No cluster: switch to the GKE kube context or pass --cluster.")
    _check_context(dep, clients)
    # The final values, rendered by the chart (its schema and templates, `helm template`) before
    # anything changes in Google Cloud, the cluster or the values file.
    path = Path(want.values_file or f"{dep.release}-values.yaml")
    image = image_build.values(dep, clients) if want.image else []
    existing = render.load(path)
    extra = [render.load_plain(Path(f)) for f in want.extra_values]
    # the model the release trains (the -f files win, as in helm) picks the fit table's recipe and micro-batch
    size = render.model_size([dict(existing), *extra], want.model_size)
    text = render.render(dep, existing, image, size)
    values = [render.parse_plain(text, path), *extra]
    chart = helm_release.chart_path(want.chart)
    helm = helm_release.client(clients.kube.kubeconfig, clients.kube.context)  # helm on PATH, checked before any write
    objects = helm_release.template(helm, dep.release, chart, values, dep.namespace)
    out(f"Chart {chart.name} renders with these values ({len(objects)} objects; schema and templates checked).")

    def install() -> None:
        rev = helm_release.upgrade_install(helm, dep.release, chart, values, dep.namespace)
        out(f"Release {dep.release}: revision {getattr(rev, 'revision', '?')} in namespace {dep.namespace}.")

    # KubeRay before 1.5.1/1.6.0 would silently drop (or break on) some values: refuse them first.
    api_ext, custom = clients.kube.get_api_ext(), clients.kube.get_custom()
    out(kuberay_crd.check_before_install(api_ext, values))

    def clear() -> None:
        for line in down.remove_unmanaged(custom, dep):
            out(line)

    def write() -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        out(f"Values: {tokens.shown(path)}")

    if not want.apply:
        prereqs.run(dep, clients, dry_run=True, hf_token=want.hf_token, out=out, apply_hint=APPLY)
        out(f"  + write {tokens.shown(path)}; helm upgrade --install {dep.release} {chart.name} -n {dep.namespace}")
        out(plan.dry_run(why="the cluster answered; the values render", apply=APPLY))
        return 0
    clear()
    write()
    rc = prereqs.run(dep, clients, dry_run=False, hf_token=want.hf_token, out=out)
    if rc:
        return rc
    install()
    if not want.follow:
        return 0
    state = cluster.follow(custom, dep.namespace, dep.release, out)
    return 0 if state.job_status == "SUCCEEDED" else EXIT_FAILURE
