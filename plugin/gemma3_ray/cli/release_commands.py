"""The flags of prereqs, doctor, up, status, logs and down, and their handlers (each parses, then calls the work)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gemma3_ray.cli import apply_flag, common
from gemma3_ray.config.clients import Clients
from gemma3_ray.utils import names
from gemma3_ray.utils.errors import EXIT_FAILURE


def _out(line: str) -> None:
    print(line, flush=True)


def cmd_prereqs(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.release import prereqs

    hf_token = common.hf_token(args)
    dep, clients = common.resolve(args, clients)
    apply = apply_flag.applying(args, "prereqs")
    return prereqs.run(dep, clients, dry_run=not apply, hf_token=hf_token, out=_out, image=args.image,
                       use_kube_context=not args.no_kube_context)


def cmd_doctor(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.config import render
    from gemma3_ray.release import doctor

    dep, clients = common.resolve(args, clients)
    kube = doctor.cluster_apis(clients)
    values = render.load_values(Path(v) for v in args.values) if args.values else None
    checks = doctor.run_checks(dep, clients, kube, values)
    for c in checks:
        _out(c.line())
    failed = sum(not c.ok for c in checks)
    _out(f"{len(checks) - failed} passed, {failed} failed" if failed else "All checks passed.")
    return EXIT_FAILURE if failed else 0


def cmd_up(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.release import up

    apply = apply_flag.applying(args, "up")
    hf_token = common.hf_token(args)
    dep, clients = common.resolve(args, clients)
    return up.run(dep, clients, up.Up(apply=apply, hf_token=hf_token, chart=args.chart, values_file=args.values_file,
                                      extra_values=tuple(args.extra_values or ()), image=args.image,
                                      follow=not args.no_follow, model_size=args.model_size), _out)


def cmd_status(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.release import status

    dep, clients = common.resolve(args, clients)
    for line in status.lines(dep, clients):
        _out(line)
    return 0


def cmd_logs(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.kube import cluster

    dep, clients = common.resolve(args, clients)
    state = cluster.rayjob_state(cluster.find_rayjob(clients.kube.get_custom(), dep.namespace, dep.release))
    for chunk in cluster.driver_log(clients.kube.get_core(), dep.namespace, state.name, follow=args.follow):
        sys.stdout.write(chunk)  # a line at a time (the redaction sees whole words), as it ends
    return 0


def cmd_down(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.release import down

    dry_run = not apply_flag.applying(args, "down")  # down.run plans unless applying
    dep, clients = common.resolve(args, clients)
    return down.run(dep, clients, _out, dry_run=dry_run, uninstall=args.uninstall, with_prereqs=args.prereqs,
                    delete_data=args.delete_data)


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
    common.add_token_flags(p)
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
    p.add_argument("--model-size", choices=("4b", "12b", "27b"), help="the Gemma 3 size of training.model_id when the "
                   "id does not name it (the fit table picks the recipe and micro-batch by it)")
    common.add_token_flags(p)
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
