"""The `cluster create | delete | status` and `image build` commands (and their registration with the CLI)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gemma3_ray.cli import apply_flag, common
from gemma3_ray.config.clients import Clients
from gemma3_ray.gcp import iam_preflight, services
from gemma3_ray.gke import cluster as gke_cluster
from gemma3_ray.gke import flex_start
from gemma3_ray.utils import plan as plans
from gemma3_ray.utils.errors import EXIT_FAILURE, EXIT_USAGE, NotLoggedIn, UserError
from gemma3_ray.utils.plan import Action, Plan

Out = Callable[[str], None]


class NeedsConfirmation(UserError):
    """A destructive command met no terminal to ask on and no --yes."""

    exit_code = EXIT_USAGE


def _out(line: str) -> None:
    print(line, flush=True)


def _container(clients: Clients, apply: bool) -> object | None:
    """The Container API client, or None for an offline dry run (no credentials)."""
    try:
        return clients.get_container()
    except NotLoggedIn:
        if apply:
            raise
        return None


def cmd_create(args: argparse.Namespace, clients: Clients | None, out: Out = _out) -> int:
    dep, clients = common.resolve(args, clients)
    spec = gke_cluster.spec_from(dep, standard=args.standard, cpu_machine_type=args.cpu_machine_type,
                                 node_service_account=args.node_service_account, capacity=args.capacity)
    out(f"GKE cluster for project {spec.project}, region {spec.region}:")
    container = _container(clients, args.apply)
    if container is None:
        out(f"  + create {gke_cluster.describe(spec)}  [not checked: not logged in]")
        out("  ? permissions: not checked (not logged in)")
        out(plans.offline())
        return 0
    pre = iam_preflight.check(clients, spec.project, gke_cluster.PERMISSIONS["create"])
    if "container.clusters.get" in pre.missing:
        pre.require(spec.project)
    plan = _container_api(clients, spec, container, out)
    if plan is None:
        plan = gke_cluster.plan_create(container, spec, out)
    for line in plan.lines():
        out(line)
    out(f"  {pre.mark} {pre.line()}")
    if not plan.actions:
        out(f"Nothing to do: the cluster is ready. Next: `{spec.credentials_command()}`, then `gemma3-ray prereqs`.")
        return 0
    if not args.apply:
        out(plans.dry_run(len(plan.actions), apply="gemma3-ray cluster create --apply"))
        return 0
    pre.require(spec.project)
    out("Applying (each operation is polled until it is DONE):")
    for action in plan.actions:
        out(f"  ... {action.text}")
        action.run()
    out(f"Done: {len(plan.actions)} change(s) applied. Next: `{spec.credentials_command()}`, then `gemma3-ray prereqs`.")
    return 0


def _container_api(clients: Clients, spec: gke_cluster.ClusterSpec, container: object, out: Out) -> Plan | None:
    """In a project whose Container API is off (a new one): enable it, then create (None: it is on)."""
    if not services.read(clients, spec.project, [gke_cluster.SERVICE]).disabled:
        return None

    def enable() -> None:
        services.enable(clients, spec.project, [gke_cluster.SERVICE])

    plan = Plan()
    plan.actions.append(Action(f"enable API {gke_cluster.SERVICE} (the cluster's state is unknown until it is on)", enable))
    plan.actions.append(Action(f"create {gke_cluster.describe(spec)}", lambda: [
        a.run() for a in gke_cluster.plan_create(container, spec, out).actions]))
    return plan


def _confirm(name: str) -> bool:
    if not sys.stdin.isatty():
        raise NeedsConfirmation(f"Refusing to delete cluster {name} without confirmation: there is no terminal to ask "
                                "on; pass --yes to delete it.")
    answer = input(f"Type the cluster name ({name}) to delete it and everything running in it: ")
    return answer.strip() == name


def cmd_delete(args: argparse.Namespace, clients: Clients | None, out: Out = _out) -> int:
    dry_run = not apply_flag.applying(args, "cluster delete")
    dep, clients = common.resolve(args, clients)
    spec = gke_cluster.spec_from(dep, standard=False)
    container = clients.get_container()
    pre = iam_preflight.check(clients, spec.project, gke_cluster.PERMISSIONS["delete"])
    if "container.clusters.get" in pre.missing:
        pre.require(spec.project)
    cluster = gke_cluster.get(container, spec)
    if cluster is None:
        out(f"Nothing to delete: cluster {spec.name} does not exist in {spec.region} (project {spec.project}).")
        return 0
    if cluster.status == gke_cluster.gke.Cluster.Status.STOPPING:
        out(f"Cluster {spec.name} is already being deleted (STOPPING); waiting for it to go.")
        if not dry_run:
            gke_cluster.wait_gone(container, spec, out)
        return 0
    kind = "Autopilot" if cluster.autopilot.enabled else f"Standard, {len(cluster.node_pools)} node pool(s)"
    out(f"  - delete cluster {spec.path} ({kind}) with every workload, Ray cluster and persistent disk in it")
    out("  = kept: the bucket and its checkpoints, the Google service accounts, the images "
        "(`gemma3-ray down --prereqs` removes the prerequisites)")
    out(f"  {pre.mark} {pre.line()}")
    if dry_run:
        out(plans.dry_run(verb="Delete it", apply="gemma3-ray cluster delete --apply",
                          note="it asks for the name first, --yes skips that"))
        return 0
    pre.require(spec.project)
    if not args.yes and not _confirm(spec.name):
        out("Not deleted: the name did not match.")
        return EXIT_FAILURE
    out(f"  ... deleting cluster {spec.name}")
    gke_cluster.delete(container, spec, out)
    out(f"Deleted cluster {spec.name}.")
    return 0


def cmd_status(args: argparse.Namespace, clients: Clients | None, out: Out = _out) -> int:
    dep, clients = common.resolve(args, clients)
    spec = gke_cluster.spec_from(dep, standard=False)
    cluster = gke_cluster.get(clients.get_container(), spec)
    if cluster is None:
        out(f"Cluster {spec.name} does not exist in {spec.region} (project {spec.project}): create it with "
            "`gemma3-ray cluster create` (a dry run first).")
        return EXIT_FAILURE
    for line in gke_cluster.status_lines(cluster, spec):
        out(line)
    return 0


def cmd_image_build(args: argparse.Namespace, clients: Clients | None, out: Out = _out) -> int:
    from pathlib import Path

    from gemma3_ray.gcp import image_build

    dep, clients = common.resolve(args, clients)
    return image_build.run(dep, clients, out, apply=args.apply, root=Path(args.context) if args.context else None,
                           dockerfile=args.dockerfile, base=args.base_image)


def register(sub: argparse._SubParsersAction, add_common: Callable[[argparse.ArgumentParser], None]) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cluster", help="create, delete or show the GKE cluster (Ray operator add-on, Workload Identity)",
                       allow_abbrev=False)
    verbs = p.add_subparsers(dest="cluster_command", metavar="VERB", required=True)

    c = verbs.add_parser("create", allow_abbrev=False, help="plan (default) or --apply: the tutorial's Autopilot cluster "
                         "with the Ray operator add-on, or --standard with a GPU node pool")
    add_common(c)
    apply_flag.add(c, "make the changes")
    c.add_argument("--standard", action="store_true",
                   help="a Standard cluster with a GPU node pool of --machine-type/--reservation in --zone "
                        "(default: Autopilot, which makes GPU nodes on demand)")
    c.add_argument("--cpu-machine-type", default=gke_cluster.DEFAULT_CPU_MACHINE_TYPE,
                   help=f"machine type of the Standard cluster's CPU pool for the Ray head (default: "
                        f"{gke_cluster.DEFAULT_CPU_MACHINE_TYPE})")
    c.add_argument("--node-service-account", metavar="EMAIL",
                   help="the service account the nodes run as (default: GKE's, the Compute Engine default one); "
                        "it needs roles/container.defaultNodeServiceAccount")
    c.add_argument("--capacity", choices=flex_start.CAPACITIES, default="none",
                   help="with --standard, the GPU pool as flex-start VMs or flex-start with queued provisioning "
                        "(Kueue's ProvisioningRequest; then `gemma3-ray kueue setup --queued`); default: none")
    c.set_defaults(handler=cmd_create)

    d = verbs.add_parser("delete", allow_abbrev=False, help="plan (default) or --apply: delete the cluster (asks "
                         "first; --yes to skip)")
    add_common(d)
    d.add_argument("--yes", action="store_true", help="with --apply: do not ask (needed without a terminal)")
    apply_flag.add(d, "delete the cluster", dry_run_alias=True)
    d.set_defaults(handler=cmd_delete)

    s = verbs.add_parser("status", allow_abbrev=False, help="the cluster's state, Ray add-on, workload pool, node pools")
    add_common(s)
    s.set_defaults(handler=cmd_status)

    from gemma3_ray.gcp.image_build import DOCKERFILE

    p = sub.add_parser("image", help="build the training image with Cloud Build (no local Docker)", allow_abbrev=False)
    verbs = p.add_subparsers(dest="image_command", metavar="VERB", required=True)
    b = verbs.add_parser("build", allow_abbrev=False, help="plan (default) or --apply: Cloud Build builds the Dockerfile "
                         "and pushes it to the repository `prereqs --image` made")
    add_common(b)
    apply_flag.add(b, "upload the context and build")
    b.add_argument("--dockerfile", default=DOCKERFILE, help=f"Dockerfile, relative to the context (default: {DOCKERFILE})")
    b.add_argument("--context", help="build context directory (default: the repository holding the plugin)")
    b.add_argument("--base-image", help="the Dockerfile's BASE_IMAGE (default: rayproject/ray:<ray pin>-py311-gpu)")
    b.set_defaults(handler=cmd_image_build)
