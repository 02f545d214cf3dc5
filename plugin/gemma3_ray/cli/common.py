"""The flags several commands share — where, names, machine shape, the HF token — and what they resolve to."""

from __future__ import annotations

import argparse
import os

from gemma3_ray.config import deployment
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment, Overrides
from gemma3_ray.utils import tokens


def add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where (default: kube context, then gcloud configuration)")
    g.add_argument("--project", help="Google Cloud project ID")
    g.add_argument("--region", help="region of the cluster and the bucket (e.g. us-central1)")
    g.add_argument("--zone", help="zone (for zonal reservations)")
    g.add_argument("--cluster", help="GKE cluster name")
    g.add_argument("--configuration", help="gcloud configuration to read instead of the active one")
    g.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None, help="kubeconfig file")
    g.add_argument("--kube-context", default=os.environ.get("HELM_KUBECONTEXT") or None,
                   help="kube context (default: the current one)")
    g.add_argument("--no-kube-context", action="store_true", help="ignore the kube context")
    n = p.add_argument_group("names")
    n.add_argument("-n", "--namespace", help="Kubernetes namespace (default: $HELM_NAMESPACE, i.e. helm's -n, else default)")
    n.add_argument("--release", help="Helm release name (default: gemma3-ray)")
    n.add_argument("--bucket", help="bucket name, shared by the releases (default: PROJECT-gemma3-ray)")
    n.add_argument("--prefix", help="folder in the bucket for this release (default: gemma3-ray/NAMESPACE/RELEASE)")
    n.add_argument("--gsa-name", help="Google service account ID (default: g3r-RELEASE-HASH, one per namespace/release)")
    n.add_argument("--ksa", help="Kubernetes service account (default: the chart's, the release's full name)")
    n.add_argument("--hf-secret", help="Secret holding the Hugging Face token (default: hf-secret)")
    n.add_argument("--hf-secret-key", help="key in that Secret (default: hf_api_token)")
    s = p.add_argument_group("machine shape")
    s.add_argument("--machine-type", help="GPU machine type, e.g. a3-ultragpu-8g")
    s.add_argument("--reservation", help="reservation NAME or projects/P/reservations/NAME, either optionally "
                   "ending in /reservationBlocks/BLOCK (read via the Compute API in --zone)")
    s.add_argument("--accelerator", help="GKE accelerator label, with --gpus-per-node, for shapes not listed")
    s.add_argument("--gpus-per-node", type=int, help="GPUs per node (1, 2, 4 or 8), with --accelerator")
    s.add_argument("--replicas", type=int, help="GPU worker nodes (default: 1)")


def add_token_flags(p: argparse.ArgumentParser) -> None:
    """--hf-token-from-env VAR | --hf-token-file PATH|- (the Secret is created from either; never the token itself)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--hf-token-from-env", metavar="VAR",
                   help="create the Hugging Face token Secret from environment variable VAR (its name, never the token)")
    g.add_argument("--hf-token-file", metavar="PATH",
                   help="create the Hugging Face token Secret from the file PATH, or '-' for stdin "
                   "(prompts without echo on a terminal)")


def hf_token(args: argparse.Namespace) -> str | None:
    """The HF token from --hf-token-from-env VAR or --hf-token-file PATH|- (never from argv)."""
    return tokens.read(getattr(args, "hf_token_from_env", None), getattr(args, "hf_token_file", None))


def overrides(args: argparse.Namespace) -> Overrides:
    return Overrides(
        project=args.project, region=args.region, zone=args.zone, cluster=args.cluster,
        namespace=args.namespace, release=args.release, bucket=args.bucket, prefix=args.prefix,
        gsa_name=args.gsa_name, ksa=args.ksa, hf_secret=args.hf_secret, hf_secret_key=args.hf_secret_key,
        replicas=args.replicas, reservation=args.reservation,
        machine_type=args.machine_type, accelerator=args.accelerator, gpus_per_node=args.gpus_per_node,
    )


def resolve(args: argparse.Namespace, clients: Clients | None) -> tuple[Deployment, Clients]:
    """The command's Deployment and its clients (pointed at --kubeconfig/--kube-context), from the shared flags."""
    return deployment.load(overrides(args), clients, configuration=args.configuration, kubeconfig=args.kubeconfig,
                           kube_context=args.kube_context, use_kube_context=not args.no_kube_context)
