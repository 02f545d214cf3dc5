"""`image build`: the training image built by Cloud Build, and the image reference `values --image` writes.

`image build`: the training image built by Cloud Build (no local Docker) and pushed to the Artifact
Registry repository `prereqs --image` creates; and the image reference `values --image` writes.

The build context is exactly what the Dockerfile copies (its COPY/ADD sources, plus the Dockerfile),
packed as a reproducible tarball; the image tag is ``src-`` + the first 12 hex digits of the sha256
of those files, so the same pins always give the same tag, and "is it built?" is one tag lookup.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shlex
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.api_core import exceptions as gexc

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gcp import iam_preflight
from gemma3_ray.gcp.artifact_registry import Registry, build_account, registry_of
from gemma3_ray.utils import names, plan, poll
from gemma3_ray.utils.errors import NotFound, NotLoggedIn, UserError, call_google
from gemma3_ray.utils.paths import REPO_ROOT
from gemma3_ray.utils.tokens import shown

DOCKERFILE = "images/trainer/Dockerfile"
REQUIREMENTS = "trainer/requirements.txt"
BASE_IMAGE_ARG = "BASE_IMAGE"  # the Dockerfile's required build argument (images/trainer/README.md)
RAY_IMAGE = "rayproject/ray"
PYTHON_TAG = "py311"  # the chart's image.pythonTag default: the Python the trainer is tested with
_RAY_PIN = re.compile(r"^ray(?:\[[^\]]*\])?==(\S+)\s*$", re.M)
BUILDER = "gcr.io/cloud-builders/docker"
BUILD_TIMEOUT_S = 3600
BUILD_DISK_GB = 200  # the Ray GPU base image and torch's CUDA wheels need room to unpack
POLL_INTERVAL_S = 10.0
LOG_TAIL_LINES = 20
TAG_DIGITS = 12
PERMISSIONS = ("cloudbuild.builds.create", "cloudbuild.builds.get", "storage.objects.create",
               "artifactregistry.repositories.get", "artifactregistry.tags.get",
               "iam.serviceAccounts.actAs")  # the build runs as the build's own service account
Out = Callable[[str], None]


def repo_root() -> Path:
    return REPO_ROOT


@dataclass(frozen=True)
class Context:
    root: Path
    dockerfile: str
    files: tuple[str, ...]  # relative POSIX paths, sorted, the Dockerfile included
    build_args: tuple[tuple[str, str], ...] = ()

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for rel in self.files:
            h.update(rel.encode() + b"\0" + hashlib.sha256((self.root / rel).read_bytes()).digest())
        for key, value in self.build_args:
            h.update(f"--build-arg {key}={value}\0".encode())
        return h.hexdigest()

    @property
    def tag(self) -> str:
        return f"src-{self.digest[:TAG_DIGITS]}"

    def tarball(self) -> bytes:
        """A reproducible .tar.gz of the context (fixed times, owners and order)."""
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for rel in self.files:
                data = (self.root / rel).read_bytes()
                info = tarfile.TarInfo(rel)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()


def _copy_sources(text: str) -> list[str]:
    """The local sources of every COPY/ADD (not ``--from=`` stages) in a Dockerfile."""
    sources: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) < 2 or parts[0].upper() not in {"COPY", "ADD"}:  # noqa: PLR2004
            continue
        flags = re.match(r"^((?:--\S+\s+)*)(.*)$", parts[1])
        assert flags is not None  # the pattern matches any string
        if "--from" in flags.group(1):
            continue
        args = flags.group(2).strip()
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
        sources += words[:-1]
    return sources


def base_image(root: Path) -> str:
    """``rayproject/ray:<ray pin>-<python tag>-gpu``: the stock GPU image of the pinned Ray (images/trainer/README.md)."""
    req = root / REQUIREMENTS
    m = _RAY_PIN.search(req.read_text(encoding="utf-8")) if req.is_file() else None
    if not m:
        raise NotFound(f"No exact ray pin (ray[...]==X.Y.Z) in {REQUIREMENTS} under {root}: the base image is chosen "
                       "from it; pass --base-image.")
    return f"{RAY_IMAGE}:{m.group(1)}-{PYTHON_TAG}-gpu"


def _required_args(text: str) -> list[str]:
    """``ARG NAME`` lines without a default (the build must pass them)."""
    return [m.group(1) for m in re.finditer(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", text, re.M | re.I)]


def context(root: Path | None = None, dockerfile: str = DOCKERFILE, base: str | None = None) -> Context:
    root = root or repo_root()
    path = root / dockerfile
    if not path.is_file():
        raise NotFound(f"No Dockerfile at {shown(dockerfile)} (under {shown(root)}): pass --dockerfile with the training image's "
                       "Dockerfile.")
    text = path.read_text(encoding="utf-8")
    build_args: list[tuple[str, str]] = []
    for arg in _required_args(text):
        if arg != BASE_IMAGE_ARG:
            raise NotFound(f"{shown(dockerfile)} needs the build argument {arg}, which `image build` does not know: give it a "
                           "default in the Dockerfile.")
        build_args.append((arg, base or base_image(root)))
    files = {dockerfile}
    for src in _copy_sources(text):
        matches = sorted(root.glob(src.lstrip("/"))) if any(c in src for c in "*?[") else [root / src.lstrip("/")]
        if not matches or not all(m.exists() for m in matches):
            raise NotFound(f"{shown(dockerfile)} copies {shown(src)}, which does not exist under {shown(root)}: fix the Dockerfile.")
        for m in matches:
            files |= {p.relative_to(root).as_posix() for p in ([m] if m.is_file() else m.rglob("*")) if p.is_file()}
    return Context(root, dockerfile, tuple(sorted(files)), tuple(build_args))


def image_state(clients: Clients, reg: Registry, tag: str) -> str:
    """'built', 'missing' (repository there, tag not) or 'no-repository'."""
    registry = clients.get_artifact_registry()
    try:
        call_google("read", reg.tag_path(tag), lambda: registry.get_tag(request={"name": reg.tag_path(tag)}), not_found=True)
    except gexc.NotFound:
        try:
            call_google("read", reg.path, lambda: registry.get_repository(request={"name": reg.path}), not_found=True)
        except gexc.NotFound:
            return "no-repository"
        return "missing"
    return "built"


def existing_image(dep: Deployment, clients: Clients, ctx: Context | None = None) -> str:
    """The image reference of the current sources, if it is built (else one sentence saying how to build it)."""
    ctx = ctx or context()
    reg = registry_of(dep)
    state = image_state(clients, reg, ctx.tag)
    if state == "built":
        return reg.image(ctx.tag)
    how = "`gemma3-ray prereqs --apply --image`, then `gemma3-ray image build --apply`" if state == "no-repository" \
        else "`gemma3-ray image build --apply`"
    raise NotFound(f"The training image {reg.image(ctx.tag)} (built from {ctx.dockerfile} as it is now) does not exist: "
                   f"build it with {how}, or leave out --image to install dependencies through the runtime env.")


def values(dep: Deployment, clients: Clients) -> list[Any]:
    """The chart values of the built training image (`values --image`, `up --image`): keys render owns."""
    from gemma3_ray.config import render

    repository, tag = existing_image(dep, clients).rsplit(":", 1)
    return [render.Value(render.DEPENDENCIES, "image", "the trainer's packages come in the training image: nothing is "
                         "installed at job start"),
            render.Value(render.IMAGE_REPOSITORY, repository,
                         "the training image `gemma3-ray image build` pushed (dependencies baked in)"),
            render.Value(render.IMAGE_TAG, tag, "src-<sha256 of the Dockerfile and the files it copies>")]


def build_request(reg: Registry, ctx: Context) -> Any:
    from google.cloud.devtools import cloudbuild_v1 as cb
    from google.protobuf import duration_pb2

    image = reg.image(ctx.tag)
    return cb.Build(
        source=cb.Source(storage_source=cb.StorageSource(bucket=reg.staging_bucket, object_=f"source/{ctx.tag}.tgz")),
        steps=[cb.BuildStep(name=BUILDER, args=["build", "--file", ctx.dockerfile,
                                                *[f for k, v in ctx.build_args for f in ("--build-arg", f"{k}={v}")],
                                                "--tag", image, "."])],
        images=[image],
        logs_bucket=f"gs://{reg.staging_bucket}/logs",
        options=cb.BuildOptions(logging=cb.BuildOptions.LoggingMode.GCS_ONLY,
                                machine_type=cb.BuildOptions.MachineType.E2_HIGHCPU_8, disk_size_gb=BUILD_DISK_GB),
        timeout=duration_pb2.Duration(seconds=BUILD_TIMEOUT_S),
        tags=[names.PRODUCT],
        service_account=f"projects/{reg.project}/serviceAccounts/{build_account(reg.project)}",
    )


def _log_tail(clients: Clients, reg: Registry, build_id: str) -> list[str]:
    try:
        blob = clients.get_storage().bucket(reg.staging_bucket).get_blob(f"logs/log-{build_id}.txt")
        return blob.download_as_text().splitlines()[-LOG_TAIL_LINES:] if blob is not None else []
    except Exception:  # the log is a courtesy: its absence must not hide the build's own error
        return []


def follow(clients: Clients, reg: Registry, build: Any, out: Out) -> Any:
    """Poll a Cloud Build build until it ends, printing each state change and a line every minute."""
    from google.cloud.devtools import cloudbuild_v1 as cb

    cbc = clients.get_cloud_build()
    name = f"projects/{reg.project}/locations/{reg.region}/builds/{build.id}"
    request = {"name": name, "project_id": reg.project, "id": build.id}
    done = {cb.Build.Status.SUCCESS, cb.Build.Status.FAILURE, cb.Build.Status.INTERNAL_ERROR, cb.Build.Status.TIMEOUT,
            cb.Build.Status.CANCELLED, cb.Build.Status.EXPIRED}
    # Cloud Build ends the build itself at its own timeout (BUILD_TIMEOUT_S): no deadline of ours.
    build = poll.until(lambda: call_google("follow build", name, lambda: cbc.get_build(request=request)),
                       lambda b: cb.Build.Status(b.status) in done, first=build, interval=POLL_INTERVAL_S, timeout=None,
                       describe=lambda b: f"      build {b.id}: {cb.Build.Status(b.status).name}", out=out)
    state = cb.Build.Status(build.status)
    if state != cb.Build.Status.SUCCESS:
        for line in _log_tail(clients, reg, build.id):
            out(f"      | {line}")
        detail = build.failure_info.detail or build.status_detail or state.name
        raise UserError(f"Cloud Build {build.id} ended {state.name}: {detail}; nothing was pushed. Its log: {build.log_url}")
    return build


def run(dep: Deployment, clients: Clients, out: Out, *, apply: bool, root: Path | None = None,
        dockerfile: str = DOCKERFILE, base: str | None = None) -> int:
    """`image build`: the plan (what exists, what would be uploaded and built), and with ``apply`` the build,
    followed until it ends (``root``: the build context; ``base``: the Dockerfile's BASE_IMAGE)."""
    ctx = context(root, dockerfile, base)
    reg = registry_of(dep)
    image = reg.image(ctx.tag)
    args_text = "".join(f" --build-arg {k}={v}" for k, v in ctx.build_args)
    out(f"Training image for project {dep.project}, region {dep.region}:")
    out(f"  = {ctx.dockerfile}: build context of {len(ctx.files)} file(s) ({', '.join(ctx.files)}), tag {ctx.tag}")
    try:
        pre = iam_preflight.check(clients, dep.project, PERMISSIONS)
        state = image_state(clients, reg, ctx.tag)
    except NotLoggedIn:
        if apply:
            raise
        out(f"  ? Artifact Registry repository {reg.host}, image {image}: not checked (not logged in)")
        out(f"  + upload the build context to gs://{reg.staging_bucket}/source/{ctx.tag}.tgz")
        out(f"  + Cloud Build in {dep.region}, as {build_account(dep.project)}: docker build --file {ctx.dockerfile}"
            f"{args_text} . -> push {image}")
        out("  ? permissions: not checked (not logged in)")
        out(plan.offline())
        return 0
    if state == "built":
        out(f"  = image {image}")
        out(f"Nothing to do: the image of these sources exists. Write it into your values: "
            f"`gemma3-ray values --image -o {dep.release}-values.yaml`.")
        return 0
    ready = state != "no-repository"
    out(f"  {'=' if ready else '!'} Artifact Registry repository {reg.host}"
        + ("" if ready else " MISSING: create it with `gemma3-ray prereqs --apply --image`"))
    storage = clients.get_storage()
    try:
        call_google("read", f"gs://{reg.staging_bucket}", lambda: storage.get_bucket(reg.staging_bucket), not_found=True)
        staged = True
    except gexc.NotFound:
        staged = False
    out(f"  {'=' if staged else '!'} build staging bucket gs://{reg.staging_bucket}"
        + ("" if staged else " MISSING: create it with `gemma3-ray prereqs --apply --image`"))
    out(f"  + upload the build context ({len(ctx.tarball()) / 1024:.1f} KiB) to gs://{reg.staging_bucket}/source/{ctx.tag}.tgz")
    builder = build_account(dep.project)
    iam = clients.get_iam()
    sa = f"projects/{dep.project}/serviceAccounts/{builder}"
    try:
        call_google("read", sa, lambda: iam.get_service_account(request={"name": sa}), not_found=True)
        has_builder = True
    except gexc.NotFound:
        has_builder = False
    out(f"  + Cloud Build in {dep.region}, as {builder}"
        + ("" if has_builder else " (MISSING: create it with `gemma3-ray prereqs --apply --image`)")
        + f": docker build --file {ctx.dockerfile}{args_text} . -> push {image} (log: gs://{reg.staging_bucket}/logs/)")
    out(f"  {pre.mark} {pre.line()}")
    if not apply:
        out(plan.dry_run(verb="Build", apply="gemma3-ray image build --apply"))
        return 0
    if not (ready and staged and has_builder):
        what = (f"The Artifact Registry repository {reg.path}" if not ready else
                f"The build staging bucket gs://{reg.staging_bucket}" if not staged else f"The build's service account {builder}")
        raise NotFound(f"{what} does not exist: run `gemma3-ray prereqs --apply --image` first.")
    pre.require(dep.project)
    out(f"  ... uploading gs://{reg.staging_bucket}/source/{ctx.tag}.tgz")
    blob = storage.bucket(reg.staging_bucket).blob(f"source/{ctx.tag}.tgz")
    call_google("upload to", f"gs://{reg.staging_bucket}", lambda: blob.upload_from_string(ctx.tarball(), "application/gzip"))
    out(f"  ... submitting the build of {image}")
    cbc = clients.get_cloud_build()
    op = call_google("start a build in", f"projects/{dep.project}", lambda: cbc.create_build(request={
        "parent": f"projects/{dep.project}/locations/{dep.region}", "project_id": dep.project,
        "build": build_request(reg, ctx)}))
    build = follow(clients, reg, op.metadata.build, out)
    digest = build.results.images[0].digest if build.results.images else ""
    out(f"Done: pushed {image}{'@' + digest if digest else ''}. Next: "
        f"`gemma3-ray values --image -o {dep.release}-values.yaml`.")
    return 0
