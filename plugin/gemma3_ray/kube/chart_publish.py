"""`gemma3-ray release`: the chart's version rule checked, the plan printed; with apply packaged, signed, pushed.

Every check (the registry URL, the signing flags, the chart's version fields, whether the registry already holds
the version with other contents) runs before anything is written. The plan runs no helm and reads the registry
anonymously only (``chart_registry``), so it works without credentials (then it says it could not check);
``--apply`` checks again with ``helm pull`` (helm's login) and refuses a version the registry holds with other
contents, or one it could not check.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gemma3_ray.config import chart_digest, chart_version
from gemma3_ray.kube import chart_package, chart_registry, helm_release
from gemma3_ray.utils import plan
from gemma3_ray.utils.errors import UserError

Out = Callable[[str], None]


class AlreadyReleased(UserError):
    """The registry holds this chart version with other contents (or could not be asked): nothing is pushed."""


@dataclass(frozen=True)
class Flags:
    registry: str | None
    chart: str | None = None
    key: str | None = None
    keyring: str | None = None
    destination: str | None = None
    plain_http: bool = False
    apply: bool = False


@dataclass(frozen=True)
class Pushed:
    ref: str  # oci://HOST[:PORT]/PATH/NAME@sha256:...
    digest: str
    package: Path | None  # the .tgz kept with --destination, else None (it was in a folder now removed)


# Helm 3.17 and 4.1 cannot --verify a digest reference: the download is named after the digest, which the
# provenance's file name (NAME-VERSION.tgz) is not (helm/helm#32546). So provenance is checked by version, and
# the Digest that pull prints must be the pinned one.
def install_line(ref: str, plain_http: bool) -> str:
    """The `helm install` a team runs: the chart pinned by digest."""
    return f"helm install gemma3-ray {ref}{' --plain-http' if plain_http else ''}"


def verify_line(chart: str, version: str, plain_http: bool) -> str:
    """The `helm pull --verify` that checks the provenance (by version: see above); it prints the Digest."""
    return f"helm pull {chart} --version {version}{' --plain-http' if plain_http else ''} --verify --keyring PUBRING.gpg"


def registry_line(held: chart_registry.Held, target: str, version: str, ours: str, applying: bool) -> str:
    """The plan's line on what the registry holds at ``version``; a refusal (raised) when pushing would change a
    released version, or, with ``applying``, when that could not be checked."""
    where = f"{target}:{version}"
    if held.exists is None:
        if applying:
            raise AlreadyReleased(f"Could not check whether {where} is already released ({held.why}): log in with "
                                  "`helm registry login HOST` (or pass --plain-http for a registry that speaks HTTP) "
                                  "and run again; nothing was pushed.")
        return (f"  ? {where}: could not check whether the registry holds it ({held.why}); --apply checks with "
                "helm's login before it pushes")
    if held.exists and held.contents != ours:
        raise AlreadyReleased(f"{where} is already released with other contents ({held.contents}; this chart: "
                              f"{ours}): a released version never changes, so bump `version` in Chart.yaml and add "
                              "its CHANGELOG.md entry; nothing was pushed.")
    if held.exists:
        return f"  = {where} is already in the registry with these contents: pushing again only re-tags them"
    return f"  = {where} is not in the registry yet"


def run(flags: Flags, out: Out) -> Pushed | None:
    """The plan (``apply`` False: returns None) or the push; every refusal is raised before anything is written."""
    where = chart_package.registry(flags.registry)
    sign = chart_package.signing(flags.key, flags.keyring)
    chart = helm_release.chart_path(flags.chart)
    meta = chart_version.check(chart)
    target = where.chart(meta.name)
    out(f"Release of chart {meta.name} {meta.version} (appVersion {meta.app_version}: the trainer's Ray pin) "
        f"from {chart}:")
    signed = f", signed with key {sign.key!r} of {sign.keyring} (provenance {meta.package}.prov)" if sign else \
        " (unsigned: --key NAME --keyring FILE signs it)"
    helm = helm_release.helm_executable() if flags.apply else ""
    held = chart_registry.read_with_helm(helm, target, meta.version, flags.plain_http) if flags.apply else \
        chart_registry.read_anonymously(target, meta.version, flags.plain_http)
    out(registry_line(held, target, meta.version, chart_digest.content_digest(chart), flags.apply))
    out(f"  + helm package: {meta.package}{signed}")
    out(f"  + helm push to {target}:{meta.version}{' with its provenance' if sign else ''}")
    if not flags.apply:
        out(plan.dry_run(2, apply="gemma3-ray release --apply"))
        return None
    with tempfile.TemporaryDirectory(prefix="gemma3-ray-release-") as tmp:
        dest = Path(flags.destination).expanduser() if flags.destination else Path(tmp)
        dest.mkdir(parents=True, exist_ok=True)
        tgz = chart_package.package(helm, chart, dest, meta.package, sign)
        out(f"packaged {tgz.name}{' and ' + tgz.name + '.prov' if sign else ''}")
        digest = chart_package.push(helm, tgz, where, flags.plain_http)
    pushed = Pushed(f"{target}@{digest}", digest, tgz if flags.destination else None)
    out(f"pushed {target}:{meta.version}")
    out(f"Digest: {digest}")
    out("Install it by digest:")
    out(f"  {install_line(pushed.ref, flags.plain_http)}")
    if sign:
        out("Verify its provenance (the Digest it prints must be the one above; Helm cannot --verify a digest "
            "reference, helm/helm#32546):")
        out(f"  {verify_line(target, meta.version, flags.plain_http)}")
    return pushed
