"""`kueue setup`: its flags, and the handler that runs the plan (or applies it) with them."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gemma3_ray.config.clients import Kube
from gemma3_ray.kueue import objects as ko
from gemma3_ray.kueue import setup as kueue_setup
from gemma3_ray.kueue.setup import DEFAULT_QUEUE, Out
from gemma3_ray.utils import names


def cmd_setup(args: argparse.Namespace, _clients: Any = None, out: Out = print) -> int:
    flags = kueue_setup.Flags(namespace=args.namespace, values=tuple(args.values or ()), queue=args.queue,
                              cluster_queue=args.cluster_queue, jobs=args.jobs, priority_value=args.priority_value,
                              queued=args.queued, release=args.release, chart=args.chart, apply=args.apply)
    return kueue_setup.run(flags, Kube(kubeconfig=args.kubeconfig, context=args.kube_context), out)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("kueue", help="the Kueue objects a platform admin makes for this chart", allow_abbrev=False)
    verbs = p.add_subparsers(dest="kueue_command", metavar="VERB", required=True)
    s = verbs.add_parser("setup", allow_abbrev=False, help="plan (default) or --apply: ResourceFlavors, a ClusterQueue "
                         "with quota for the job the values render, the namespace's LocalQueue (and with --queued the "
                         "ProvisioningRequestConfig and AdmissionCheck)")
    s.add_argument("-n", "--namespace", default=os.environ.get("HELM_NAMESPACE") or None,
                   help="the namespace the releases run in (default: $HELM_NAMESPACE, i.e. helm's -n, else default)")
    s.add_argument("-f", "--values", action="append", help="values files of the releases (the quota is what their job asks)")
    s.add_argument("--queue", help=f"LocalQueue name (default: the values' kueue.queueName, else {DEFAULT_QUEUE})")
    s.add_argument("--cluster-queue", help="ClusterQueue name (default: NAMESPACE-QUEUE, one per namespace; another "
                   "namespace's is refused)")
    s.add_argument("--jobs", type=int, default=1, help="jobs the queue runs at once (quota = jobs x one job; default 1)")
    s.add_argument("--priority-value", type=int, default=ko.DEFAULT_PRIORITY_VALUE,
                   help="value of the WorkloadPriorityClass the values name (kueue.priorityClass) when setup creates it "
                   f"(default {ko.DEFAULT_PRIORITY_VALUE}; one that exists is left as it is)")
    s.add_argument("--queued", action="store_true", help="flex-start with queued provisioning (capacity.type=queued): "
                   "adds the ProvisioningRequest admission check")
    s.add_argument("--release", help=f"release name to render with (default: {names.PRODUCT})")
    s.add_argument("--chart", help="chart path (default: the chart beside the plugin)")
    s.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None, help="kubeconfig file")
    s.add_argument("--kube-context", default=os.environ.get("HELM_KUBECONTEXT") or None,
                   help="kube context (default: the current one)")
    s.add_argument("--apply", action="store_true",
                   help="create or update the objects (default: print the plan only, change nothing)")
    s.set_defaults(handler=cmd_setup)
