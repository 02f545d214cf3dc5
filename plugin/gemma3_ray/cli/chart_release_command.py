"""`release`: the chart as a versioned OCI artifact — its flags, and the handler that plans (or pushes) with them."""

from __future__ import annotations

import argparse
from typing import Any

from gemma3_ray.cli import apply_flag
from gemma3_ray.kube import chart_publish


def cmd_release(args: argparse.Namespace, _clients: Any = None, out: chart_publish.Out = print) -> int:
    flags = chart_publish.Flags(registry=args.registry, chart=args.chart, key=args.key, keyring=args.keyring,
                                destination=args.destination, plain_http=args.plain_http,
                                apply=apply_flag.applying(args, "release"))
    chart_publish.run(flags, out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("release", help="the chart as an OCI artifact: version rule checked, helm package (signed with "
                       "--key), helm push, the digest and its `helm install oci://…@sha256:…`: plan (default) or --apply")
    p.add_argument("--registry", help="the OCI registry to push to: oci://HOST[:PORT]/PATH (log in first with "
                   "`helm registry login HOST`)")
    p.add_argument("--key", help="sign with this key (its name in --keyring): Helm's provenance file NAME-VERSION.tgz.prov "
                   "is pushed with the chart (a passphrase is read from $HELM_KEY_PASSPHRASE or the terminal)")
    p.add_argument("--keyring", help="the GnuPG secret keyring holding --key, in the legacy format Helm reads "
                   "(`gpg --export-secret-keys > secring.gpg`)")
    p.add_argument("--chart", help="chart path (default: the chart beside the plugin)")
    p.add_argument("--destination", help="keep the .tgz (and .prov) in this folder (default: a temporary one, removed)")
    p.add_argument("--plain-http", action="store_true", help="the registry speaks HTTP, not HTTPS (a local registry)")
    apply_flag.add(p, "package, sign and push the chart")
    p.set_defaults(handler=cmd_release)
