"""Whether an OCI registry already holds a chart version, and with which contents (`release`'s check before a push).

Two readers, one answer (``Held``): the plan's reads the registry anonymously over the OCI distribution API
(a manifest, then the chart layer; an anonymous bearer token where the registry offers one; never credentials, never
helm), so it works without a login and says when it could not check; ``--apply``'s runs ``helm pull`` (helm's own
login) just before the push. The contents compared are ``chart_digest.archive_digest`` of the chart layer, not the
manifest digest, which changes with each ``helm package`` of the same chart.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gemma3_ray.config import chart_digest

CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
READ_TIMEOUT_S = 10
MAX_CHART_BYTES = 50_000_000  # a chart layer larger than this is not read (this chart's is ~200 kB)
HELM_PULL_S = 300


@dataclass(frozen=True)
class Held:
    """What the registry holds at NAME:VERSION: ``exists`` None when it could not be checked (``why`` says why)."""

    exists: bool | None
    contents: str | None = None  # the chart_digest of what it holds
    why: str = ""


def oci_tag(version: str) -> str:
    """The tag Helm pushes a version under (OCI tags have no '+': Helm writes '_')."""
    return version.replace("+", "_")


def _bearer(challenge: str, scheme: str) -> str | None:
    """An anonymous token from the registry's Bearer challenge (realm, service, scope), or None."""
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    if not realm.startswith(("https://", "http://" if scheme == "http" else "https://")):
        return None
    url = f"{realm}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as resp:  # noqa: S310 (scheme checked above)
        doc = json.loads(resp.read(65536))
    return doc.get("token") or doc.get("access_token")


def _get(url: str, accept: str, limit: int) -> bytes:
    """GET ``url``; on 401 once more with an anonymous bearer token; the body (at most ``limit`` bytes)."""
    headers = {"Accept": accept}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=READ_TIMEOUT_S) as resp:  # noqa: S310
            return bytes(resp.read(limit + 1))
    except urllib.error.HTTPError as exc:
        token = _bearer(exc.headers.get("WWW-Authenticate", ""), url.split(":", 1)[0]) if exc.code == 401 else None
        if token is None:
            raise
    req = urllib.request.Request(url, headers={**headers, "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=READ_TIMEOUT_S) as resp:  # noqa: S310
        return bytes(resp.read(limit + 1))


def read_anonymously(repo_url: str, version: str, plain_http: bool) -> Held:
    """``repo_url`` is oci://HOST[:PORT]/PATH/NAME; what it holds at ``version``, read with no credentials."""
    host, _, repo = repo_url.removeprefix("oci://").partition("/")
    base = f"{'http' if plain_http else 'https'}://{host}/v2/{repo}"
    try:
        manifest = json.loads(_get(f"{base}/manifests/{oci_tag(version)}", MANIFEST, 1_000_000))
        layers = [x for x in manifest.get("layers") or [] if x.get("mediaType") == CHART_LAYER]
        if len(layers) != 1 or int(layers[0].get("size", 0)) > MAX_CHART_BYTES:
            return Held(None, why="its manifest has no chart layer this command reads")
        blob = _get(f"{base}/blobs/{layers[0]['digest']}", "*/*", MAX_CHART_BYTES)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return Held(False)
        return Held(None, why=f"the registry answered HTTP {exc.code} without credentials")
    except urllib.error.URLError as exc:  # unreachable, TLS
        return Held(None, why=f"the registry could not be reached: {exc.reason}")
    except (OSError, ValueError) as exc:  # a timeout, not JSON
        return Held(None, why=f"the registry's answer could not be read ({type(exc).__name__})")
    if f"sha256:{hashlib.sha256(blob).hexdigest()}" != layers[0]["digest"]:
        return Held(None, why="the chart layer it sent does not match its digest")
    return Held(True, _contents(blob))


def read_with_helm(helm: str, repo_url: str, version: str, plain_http: bool) -> Held:
    """What ``repo_url`` holds at ``version``, by ``helm pull`` (helm's registry login)."""
    with tempfile.TemporaryDirectory(prefix="gemma3-ray-pull-") as tmp:
        argv = [helm, "pull", repo_url, "--version", version, "--destination", tmp,
                *(["--plain-http"] if plain_http else [])]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=HELM_PULL_S, check=False)
        except subprocess.TimeoutExpired:
            return Held(None, why=f"helm pull did not finish in {HELM_PULL_S} s")
        said = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
        last = said[-1].removeprefix("Error: ") if said else "no output"
        if done.returncode != 0:
            return Held(False) if last.endswith(": not found") else Held(None, why=f"helm pull failed: {last}")
        (tgz,) = Path(tmp).glob("*.tgz")
        return Held(True, chart_digest.archive_digest(tgz))


def _contents(blob: bytes) -> str:
    with tempfile.TemporaryDirectory(prefix="gemma3-ray-layer-") as tmp:
        path = Path(tmp) / "chart.tgz"
        path.write_bytes(blob)
        return chart_digest.archive_digest(path)
